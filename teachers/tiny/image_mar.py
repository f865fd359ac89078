"""Tiny MAR-style continuous-token AR image teachers (Li et al., arXiv:2406.11838) for CSpD (arXiv:2411.11925).

Tokens are raw image patches scaled to [-1, 1], in raster order (`teachers.tiny.patch_pair`). A target and a smaller
draft are trained on the same data with the same recipe: a causal transformer (`teachers.networks.gpt`) gives the
condition vector z of every position, MAR's diffusion head (`teachers.networks.diffusion_head`) turns it into the
token; class conditioning with label dropout for CFG. Both models are trained and cached together on first use.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn as nn

from core.cache import Cache
from teachers.families import continuous_ar
from teachers.networks.diffusion_head import DiffusionHead, HeadConfig, HeadOutput, denoise, schedule
from teachers.networks.gpt import GPT, GPTConfig, GuidedState
from teachers.tiny.patch_pair import PatchPairTeacher

NULL = 0  # the unconditional class id; class c is c + 1


@dataclass(frozen=True)
class ModelSize:
    n_layer: int
    n_head: int
    n_embd: int
    head_width: int
    head_depth: int


@dataclass(frozen=True)
class ImageMARRecipe:
    dataset: str
    image_size: int = 16
    patch: int = 2
    target: ModelSize = ModelSize(n_layer=3, n_head=4, n_embd=96, head_width=64, head_depth=2)
    draft: ModelSize = ModelSize(n_layer=1, n_head=2, n_embd=64, head_width=48, head_depth=1)
    steps: int = 2000
    batch_size: int = 32
    head_batch_mul: int = 2  # MAR's diffusion_batch_mul: diffusion steps drawn per token and training step
    lr: float = 1e-3
    cond_dropout: float = 0.1
    seed: int = 0


class DiffusionAR(nn.Module):
    """Transformer + diffusion head; implements `continuous_ar.ContinuousARModel`."""

    def __init__(self, gpt: GPTConfig, head: HeadConfig):
        super().__init__()
        self.gpt, self.head = GPT(gpt), DiffusionHead(head)

    def loss(self, cond, tokens, mul: int, generator) -> torch.Tensor:
        """cond (B, P), tokens (B, N, D): the head's loss on every token, `mul` diffusion steps each."""
        z = self.gpt(cond, tokens)  # (B, N, d)
        return self.head.loss(tokens.flatten(0, 1).repeat(mul, 1), z.flatten(0, 1).repeat(mul, 1), generator)

    @torch.inference_mode()
    def start(self, cond, *, cfg):
        state, z = self.gpt.start(cond, cfg=cfg, null_id=NULL, ragged=True)
        return state, self._branches(state, z)

    @torch.inference_mode()
    def extend(self, state: GuidedState, tokens):
        return self._branches(state, self.gpt.extend_guided(state, tokens))

    def rollback(self, state, lengths):
        lengths = state.cond_len + lengths
        state.cache.truncate(torch.cat([lengths, lengths]) if state.cfg != 1.0 else lengths)

    def select(self, state, rows):
        state.cache.select(torch.cat([rows, rows + state.batch]) if state.cfg != 1.0 else rows)
        state.batch = len(rows)

    @staticmethod
    def _branches(state, z):  # (branches * B, ..., d) -> (B, ..., branches, d)
        return torch.stack(z.split(state.batch), dim=-2)

    def denoise(self, z, x_T, eps, sampling: continuous_ar.SamplingConfig) -> HeadOutput:
        return denoise(self.head, schedule(sampling.steps, str(x_T.device)), z, x_T, eps,
                       temperature=sampling.temperature, cfg=sampling.cfg, final_noise=sampling.final_noise,
                       final_std=sampling.final_std)


class ImageMARTeacher(PatchPairTeacher):
    family: ClassVar = continuous_ar.FAMILY
    recipe: ClassVar[ImageMARRecipe]
    class_offset: ClassVar[int] = 1  # id 0 is NULL

    def __init__(self, name: str, target: DiffusionAR, draft: DiffusionAR, info: dict):
        self._setup(name, info)
        self.target, self.draft = target.eval(), draft.eval()

    @classmethod
    def load(cls, name: str, *, cache: Cache, device: torch.device):
        blob = cls.cached_blob(name, cache)
        models = {}
        for which in ("target", "draft"):
            m = DiffusionAR(GPTConfig(**blob[which]["gpt"]), HeadConfig(**blob[which]["head"]))
            m.load_state_dict(blob[which]["state_dict"])
            models[which] = m.to(device)
        return cls(name, models["target"], models["draft"], blob["info"])

    @classmethod
    def _model(cls, size: ModelSize, n_classes: int) -> DiffusionAR:
        r = cls.recipe
        D, N = r.patch * r.patch, (r.image_size // r.patch) ** 2
        gpt = GPTConfig(vocab_size=0, cond_vocab=n_classes + 1, cond_len=1, seq_len=N, n_layer=size.n_layer,
                        n_head=size.n_head, n_embd=size.n_embd, token_dim=D)
        return DiffusionAR(gpt, HeadConfig(D, size.n_embd, size.head_width, size.head_depth, clip=1.0))

    @classmethod
    def _describe(cls, model: DiffusionAR) -> dict:
        return {"gpt": dataclasses.asdict(model.gpt.cfg), "head": dataclasses.asdict(model.head.cfg)}

    @classmethod
    def _loss(cls, model: DiffusionAR, tokens, labels, mul: int, cond_dropout: float, generator) -> torch.Tensor:
        """The head's loss on every token of a batch (B, N, D), `mul` diffusion steps each; classes dropped to NULL."""
        cond = labels[:, None] + 1
        if cond_dropout:
            cond[torch.rand(len(cond), generator=generator) < cond_dropout] = NULL
        return model.loss(cond, tokens, mul, generator)
