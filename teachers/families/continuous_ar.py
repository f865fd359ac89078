"""The continuous-token AR teacher family (MAR-style, as in CSpD, arXiv:2411.11925): protocol, noise, AR sampler.

A teacher holds two models of the same kind, `target` and `draft` (a smaller one trained on the same data). Each is a
raster-order causal transformer (`teachers.networks.gpt`, continuous tokens in, a condition vector z per position out)
and a per-token diffusion head (`teachers.networks.diffusion_head`). A method talks to a model only through
`ContinuousARModel`: `start` (prefill the condition, CFG branches included), `extend` (append tokens per row, get the z
of the next positions), `rollback` (per-row cache lengths), `select` (drop finished rows) and `denoise` (run the head
on given noise).

All randomness of a token's denoising chain is drawn up front per image and position (`TokenNoise`), so the draft and
the target can run the same chain on the same noise (CSpD's trajectory alignment) and the target-alone sampler
(`sample_ar`) consumes a generator exactly as a speculative sampler that accepts everything would.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import ClassVar, Protocol

import torch

from core.samples import Samples
from teachers.families import Family
from teachers.networks.diffusion_head import HeadOutput  # what `denoise` returns: methods import it from here


@dataclass(frozen=True)
class SamplingConfig:
    """The teacher's sampling settings; every method on this family shares them with the reference arm."""

    steps: int = 20  # diffusion sampling steps of the head (respaced from 1000)
    temperature: float = 1.0  # multiplies every step's std (MAR's temperature)
    cfg: float = 1.0  # classifier-free guidance on the head's eps; 1 = conditional only
    final_noise: bool = True  # sample the last diffusion step; False = MAR's x_0 = mean (no density: no exact CSpD)
    # > 0: the last step's std is at least this (token units), i.e. that much output noise. The learned last-step std
    # is ~0.006 (cosine schedule, t = 0); a draft's token must land that close to the target's mean to be accepted
    # by an exact test, so this trades output noise for acceptance, for the reference arm and CSpD alike.
    final_std: float = 0.0

    def __post_init__(self):
        if not 1 <= self.steps <= 1000:
            raise ValueError(f"steps must be in [1, 1000], got {self.steps}")
        if not self.temperature > 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")
        if self.cfg < 0:
            raise ValueError(f"cfg must be >= 0, got {self.cfg}")
        if self.final_std < 0:
            raise ValueError(f"final_std must be >= 0, got {self.final_std}")


@dataclass
class TokenNoise:
    """x_T (B, N, D) and the per-step noise eps (B, N, K, D) of every image and position."""

    x_T: torch.Tensor
    eps: torch.Tensor

    @classmethod
    def draw(cls, B: int, N: int, D: int, steps: int, generator: torch.Generator, device) -> "TokenNoise":
        return cls(torch.randn(B, N, D, generator=generator, device=device),
                   torch.randn(B, N, steps, D, generator=generator, device=device))

    def at(self, rows: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The noise of (rows[j], positions[j]) pairs: x_T (M, D), eps (M, K, D)."""
        return self.x_T[rows, positions], self.eps[rows, positions]


class ModelState(Protocol):
    length: torch.Tensor  # (B,) image tokens cached per row


class ContinuousARModel(Protocol):
    def start(self, cond: torch.Tensor, *, cfg: float) -> tuple[ModelState, torch.Tensor]:
        """Prefill the condition (B, P); returns the state and z of the first token, (B, branches, d)."""

    def extend(self, state: ModelState, tokens: torch.Tensor) -> torch.Tensor:
        """Append tokens (B, L, D) after each row's cached ones; z (B, L, branches, d), row t for the token after t."""

    def rollback(self, state: ModelState, lengths: torch.Tensor) -> None:
        """Keep the first lengths[b] image tokens of row b."""

    def select(self, state: ModelState, rows: torch.Tensor) -> None:
        """Keep only these rows (B',) of the batch, in this order."""

    def denoise(self, z: torch.Tensor, x_T: torch.Tensor, eps: torch.Tensor, sampling: SamplingConfig) -> HeadOutput:
        """The head's chain for M tokens: z (M, branches, d), x_T (M, D), eps (M, K, D)."""


class ContinuousARTeacher(Protocol):
    family: ClassVar[Family]
    modality: ClassVar[str]  # "image": decode -> (B, C, H, W) in [0, 1]
    seq_len: int  # N tokens
    token_dim: int  # D
    grid: tuple[int, int]
    target: ContinuousARModel
    draft: ContinuousARModel

    def conditions(self, n: int, generator: torch.Generator) -> torch.Tensor: ...
    def decode(self, tokens: torch.Tensor) -> torch.Tensor: ...
    def captions(self, cond: torch.Tensor) -> list[str]: ...


def sample_ar(teacher: ContinuousARTeacher, cond: torch.Tensor, s: SamplingConfig, *,
              generator: torch.Generator, model: str = "target") -> Samples:
    """Token by token with one model: one transformer pass and one head chain per token."""
    m: ContinuousARModel = getattr(teacher, model)
    B, N, D = len(cond), teacher.seq_len, teacher.token_dim
    noise = TokenNoise.draw(B, N, D, s.steps, generator, cond.device)
    state, z = m.start(cond, cfg=s.cfg)  # (B, branches, d)
    tokens = torch.empty(B, N, D, device=cond.device)
    for i in range(N):
        tokens[:, i] = m.denoise(z, noise.x_T[:, i], noise.eps[:, i], s).x0
        if i + 1 < N:
            z = m.extend(state, tokens[:, i : i + 1])[:, 0]
    return Samples(tokens, cond, Counter(nfe=B * N, tokens=B * N, head_chains=B * N))


FAMILY = Family("continuous-ar", SamplingConfig, sample_ar, sampler="ar",
                passes=lambda s, n: {"step": n, "head_chain": n})
