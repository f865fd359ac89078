"""A tiny MAR pair (Li et al., arXiv:2406.11838) on scikit-learn's digits: the embedded teacher of the masked
continuous-token AR family, CSpD's setting (arXiv:2411.11925: a MAR target verifying a smaller MAR draft) at CPU scale.

Tokens are 2 x 2 pixel patches in [-1, 1] of 16 x 16 digits, 64 of them (MAR also runs on patches; no autoencoder
keeps everything deterministic), as `digits-mar-c2i`. Both models are MAR's own network (`teachers.networks.mar`:
bidirectional encoder-decoder, class buffer, `fake_latent` for CFG, the DiffLoss head) at two small sizes, trained as
MAR trains: per batch one mask ratio from a normal at 1 (std 0.25) truncated to [mask_ratio_min, 1], that many
positions masked in a random order per image, the head's loss (eps MSE + the variational bound for the learned
variance) on the masked tokens, `head_batch_mul` diffusion steps each; the class replaced by `fake_latent` with
probability `cond_dropout`. Both are cached together on first use.
"""
from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass
from typing import ClassVar

import torch

from bench.cache import Cache
from bench.training import optimizer_step, training_steps, warmup_cosine
from teachers.data.images import caption_table, from_patches, load_image_dataset, to_patches
from teachers.families import masked_ar
from teachers.networks.mar import MAR, MARConfig
from teachers.tiny.recipes import RecipeTeacher


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


class MaskedMARTeacher(RecipeTeacher):
    family: ClassVar = masked_ar.FAMILY
    modality: ClassVar[str] = "image"
    supports_cfg: ClassVar[bool] = True  # trained with class dropout
    recipe: ClassVar[MaskedMARRecipe]

    def __init__(self, name: str, target: MAR, draft: MAR, info: dict):
        self.name, self.info = name, info
        self.target, self.draft = masked_ar.NetworkModel(target), masked_ar.NetworkModel(draft)
        r = self.recipe
        self.grid = (r.image_size // r.patch, r.image_size // r.patch)
        self.seq_len, self.token_dim = self.grid[0] * self.grid[1], r.patch * r.patch
        self.dataset_name, self.image_size = r.dataset, r.image_size
        self.n_classes = len(caption_table(r.dataset))

    @classmethod
    def load(cls, name: str, *, cache: Cache, device: torch.device):
        blob = cls.cached_blob(name, cache)
        models = {}
        for which in ("target", "draft"):
            models[which] = MAR(MARConfig(**blob[which]["config"]))
            models[which].load_state_dict(blob[which]["state_dict"])
        return cls(name, models["target"].to(device), models["draft"].to(device), blob["info"])

    @classmethod
    def config(cls, size: ModelSize, n_classes: int) -> MARConfig:
        r = cls.recipe
        return MARConfig(seq_len=(r.image_size // r.patch) ** 2, token_dim=r.patch * r.patch, encoder_width=size.width,
                         encoder_depth=size.depth, encoder_heads=size.heads, decoder_width=size.width,
                         decoder_depth=size.depth, decoder_heads=size.heads, buffer_size=r.buffer_size,
                         class_rows=n_classes, head_width=size.head_width, head_depth=size.head_depth, head_clip=1.0)

    @classmethod
    def _fit(cls, name: str, cache: Cache) -> dict:
        r, t0 = cls.recipe, time.perf_counter()
        train = load_image_dataset(r.dataset, "train", r.image_size)
        test = load_image_dataset(r.dataset, "test", r.image_size)
        blob, info = {}, {}
        for which in ("target", "draft"):
            config = cls.config(getattr(r, which), len(train.class_names))
            model = MAR(config)
            train_loss = cls._fit_model(name, which, model, to_patches(train.images, r.patch), train.labels)
            model.eval()
            with torch.no_grad():
                g = torch.Generator().manual_seed(r.seed)
                test_loss = cls.loss(model, to_patches(test.images, r.patch), test.labels, 4, 0.0, g).item()
            blob[which] = {"config": dataclasses.asdict(config), "state_dict": model.state_dict()}
            info |= {f"{which}_train_loss": train_loss, f"{which}_test_loss": test_loss,
                     f"{which}_n_params": sum(p.numel() for p in model.parameters())}
        blob["info"] = info | {"train_seconds": time.perf_counter() - t0}
        return blob

    @classmethod
    def loss(cls, model: MAR, tokens: torch.Tensor, labels: torch.Tensor, mul: int, cond_dropout: float,
             generator: torch.Generator) -> torch.Tensor:
        """MAR's training loss on a batch (B, N, D): masked in a random order, the head's loss on the masked tokens."""
        r, (B, N, _) = cls.recipe, tokens.shape
        ratio = torch.nn.init.trunc_normal_(torch.empty(1), 1.0, 0.25, r.mask_ratio_min, 1.0, generator=generator)
        order = torch.rand(B, N, generator=generator).argsort(1)
        masked = torch.zeros(B, N, dtype=torch.bool).scatter_(1, order[:, : math.ceil(N * float(ratio))], True)
        emb = model.class_embedding(labels, B)
        drop = torch.rand(B, generator=generator) < cond_dropout
        emb = torch.where(drop[:, None], model.class_embedding(None, B), emb)
        z = model(tokens, ~masked, emb)  # (B, N, d)
        return model.head.loss(tokens[masked].repeat(mul, 1), z[masked].repeat(mul, 1), generator)

    @classmethod
    def _fit_model(cls, name: str, which: str, model: MAR, tokens: torch.Tensor, labels: torch.Tensor) -> float:
        r = cls.recipe
        g = torch.Generator().manual_seed(r.seed)
        opt = torch.optim.AdamW(model.parameters(), lr=r.lr, weight_decay=0.0, betas=(0.9, 0.95))
        sched = warmup_cosine(opt, r.steps)
        model.train()
        for _ in training_steps(r.steps, f"training {which} of {name}"):
            idx = torch.randint(len(tokens), (r.batch_size,), generator=g)
            loss = cls.loss(model, tokens[idx], labels[idx], r.head_batch_mul, r.cond_dropout, g)
            optimizer_step(loss, opt, sched, model.parameters())
        return loss.item()

    def decode(self, tokens: torch.Tensor) -> torch.Tensor:
        """(B, N, p*p) -> (B, 1, H, W) images in [0, 1]."""
        return from_patches(tokens, self.recipe.patch, self.image_size)

    def conditions(self, n: int, generator: torch.Generator) -> torch.Tensor:
        """n uniformly drawn classes (n, 1), on the generator's device."""
        return torch.randint(self.n_classes, (n, 1), generator=generator, device=generator.device)

    def captions(self, cond: torch.Tensor) -> list[str]:
        table = caption_table(self.dataset_name)
        return [table[c][0] for c in cond[:, 0].tolist()]
