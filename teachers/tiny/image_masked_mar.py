"""A tiny MAR pair (Li et al., arXiv:2406.11838) on scikit-learn's digits: the embedded teacher of the masked
continuous-token AR family, CSpD's setting (arXiv:2411.11925: a MAR target verifying a smaller MAR draft) at CPU scale.

Tokens are 2 x 2 pixel patches in [-1, 1] of 16 x 16 digits, 64 of them, as `digits-mar-c2i`
(`teachers.tiny.patch_pair`). Both models are MAR's own network (`teachers.networks.mar`:
bidirectional encoder-decoder, class buffer, `fake_latent` for CFG, the DiffLoss head) at two small sizes, trained as
MAR trains: per batch one mask ratio from a normal at 1 (std 0.25) truncated to [mask_ratio_min, 1], that many
positions masked in a random order per image, the head's loss (eps MSE + the variational bound for the learned
variance) on the masked tokens, `head_batch_mul` diffusion steps each; the class replaced by `fake_latent` with
probability `cond_dropout`. Both are cached together on first use.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import ClassVar

import torch

from core.cache import Cache
from teachers.families import masked_ar
from teachers.networks.mar import MAR, MARConfig
from teachers.tiny.patch_pair import PatchPairTeacher


@dataclass(frozen=True)
class ModelSize:
    width: int  # encoder and decoder
    depth: int  # blocks of the encoder, and of the decoder
    heads: int
    head_width: int
    head_depth: int


@dataclass(frozen=True)
class MaskedMARRecipe:
    dataset: str = "digits"
    image_size: int = 16
    patch: int = 2
    buffer_size: int = 4
    target: ModelSize = ModelSize(width=96, depth=2, heads=4, head_width=64, head_depth=2)
    draft: ModelSize = ModelSize(width=48, depth=1, heads=2, head_width=32, head_depth=1)
    steps: int = 2000
    batch_size: int = 32
    head_batch_mul: int = 2  # MAR's diffusion_batch_mul (4 in its release)
    lr: float = 1e-3
    cond_dropout: float = 0.1
    mask_ratio_min: float = 0.7  # MAR's
    seed: int = 0


class MaskedMARTeacher(PatchPairTeacher):
    family: ClassVar = masked_ar.FAMILY
    recipe: ClassVar[MaskedMARRecipe]

    def __init__(self, name: str, target: MAR, draft: MAR, info: dict):
        self._setup(name, info)
        self.target, self.draft = masked_ar.NetworkModel(target), masked_ar.NetworkModel(draft)

    @classmethod
    def load(cls, name: str, *, cache: Cache, device: torch.device):
        blob = cls.cached_blob(name, cache)
        models = {}
        for which in ("target", "draft"):
            models[which] = MAR(MARConfig(**blob[which]["config"]))
            models[which].load_state_dict(blob[which]["state_dict"])
        return cls(name, models["target"].to(device), models["draft"].to(device), blob["info"])

    @classmethod
    def _model(cls, size: ModelSize, n_classes: int) -> MAR:
        r = cls.recipe
        return MAR(MARConfig(seq_len=(r.image_size // r.patch) ** 2, token_dim=r.patch * r.patch,
                             encoder_width=size.width, encoder_depth=size.depth, encoder_heads=size.heads,
                             decoder_width=size.width, decoder_depth=size.depth, decoder_heads=size.heads,
                             buffer_size=r.buffer_size, class_rows=n_classes, head_width=size.head_width,
                             head_depth=size.head_depth, head_clip=1.0))

    @classmethod
    def _describe(cls, model: MAR) -> dict:
        return {"config": dataclasses.asdict(model.cfg)}

    @classmethod
    def _loss(cls, model: MAR, tokens, labels, mul: int, cond_dropout: float, generator) -> torch.Tensor:
        """MAR's training loss on a batch (B, N, D): masked in a random order, the head's loss on the masked tokens."""
        r, (B, N, _) = cls.recipe, tokens.shape
        ratio = torch.nn.init.trunc_normal_(torch.empty(1), 1.0, 0.25, r.mask_ratio_min, 1.0, generator=generator)
        order = torch.rand(B, N, generator=generator).argsort(1)
        masked = torch.zeros(B, N, dtype=torch.bool).scatter_(1, order[:, : math.ceil(N * float(ratio))], True)
        emb = model.class_embedding(labels, B)
        if cond_dropout:
            drop = torch.rand(B, generator=generator) < cond_dropout
            emb = torch.where(drop[:, None], model.class_embedding(None, B), emb)
        z = model(tokens, ~masked, emb)  # (B, N, d)
        return model.head.loss(tokens[masked].repeat(mul, 1), z[masked].repeat(mul, 1), generator)
