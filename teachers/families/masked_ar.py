"""The masked continuous-token AR family (MAR, Li et al., arXiv:2406.11838): CSpD's real teachers (arXiv:2411.11925).

A teacher holds two models, `target` and `draft` (CSpD's pair: MAR-H or MAR-L and MAR-B; a tiny pair trained on
digits). Each is a bidirectional encoder-decoder that, given the known tokens of an image, gives every position a
condition vector z, and a per-token diffusion head (`teachers.networks.diffusion_head`) that turns a z into a token.
A method talks to a model only through `MaskedARModel`: `condition` (z of every position given a known set, CFG
branches included) and `denoise` (the head's chain on given noise).

The official sampler (`sample_mar`, MAR's `sample_tokens`; docs/checkpoints.md, 'MAR'): a random generation order per
image; `num_iter` steps; after step k the first mask_len_k positions of the order stay masked, mask_len_k =
max(1, min(#masked - 1, floor(N cos(pi/2 (k + 1) / num_iter)))) (the cosine schedule), the last step predicts all the
rest; so positions are predicted from the end of the order towards its start. Every step re-reads the whole known set
(no cache). CFG on the head's eps with MAR's linear schedule cfg_k = 1 + (cfg - 1)(N - mask_len_k)/N (mask_len of
the step's *next* mask, at least 1, so the last step is not quite cfg) or constant. At num_iter = N (MAR's FID
setting, CSpD's) one token is predicted per step: a random-order AR model.

Noise is drawn up front per image and position (`continuous_ar.TokenNoise`), then the order (`GenerationOrder`), so a
speculative sampler that shares both with the target-alone sampler runs the same chains (CSpD's alignment).
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import ClassVar, Protocol

import torch

from core.samples import Samples
from teachers.families import Family
from teachers.families.continuous_ar import TokenNoise
from teachers.networks.diffusion_head import HeadOutput, denoise, schedule

CFG_SCHEDULES = ("linear", "constant")


@dataclass(frozen=True)
class SamplingConfig:
    """The teacher's sampling settings; every method on this family shares them with the reference arm."""

    # Generation steps; 0: one token per step (N), MAR's FID setting (256 for 256 tokens) and CSpD's.
    num_iter: int = 0
    # The head's diffusion steps (respaced from 1000); 20, as `continuous_ar`, so the two families' CSpD runs compare
    # (MAR's release samples with 100).
    steps: int = 20
    temperature: float = 1.0  # multiplies every step's std (MAR's temperature)
    cfg: float = 1.0  # classifier-free guidance on the head's eps; 1 = conditional only
    cfg_schedule: str = "linear"
    # Sample the last diffusion step (`continuous_ar.SamplingConfig`: MAR's x_0 = mean has no density, so no exact
    # CSpD), and floor its std.
    final_noise: bool = True
    final_std: float = 0.0

    def __post_init__(self):
        if self.num_iter < 0:
            raise ValueError(f"num_iter must be >= 0 (0: one token per step), got {self.num_iter}")
        if not 1 <= self.steps <= 1000:
            raise ValueError(f"steps must be in [1, 1000], got {self.steps}")
        if not self.temperature > 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")
        if self.cfg < 0:
            raise ValueError(f"cfg must be >= 0, got {self.cfg}")
        if self.cfg_schedule not in CFG_SCHEDULES:
            raise ValueError(f"cfg_schedule must be one of {', '.join(CFG_SCHEDULES)}, got {self.cfg_schedule!r}")
        if self.final_std < 0:
            raise ValueError(f"final_std must be >= 0, got {self.final_std}")

    def iterations(self, seq_len: int) -> int:
        return self.num_iter or seq_len


def mask_lengths(seq_len: int, num_iter: int) -> list[int]:
    """MAR's mask_len_k of every step k (the tokens masked after it, at least 1; all are predicted at the last)."""
    lengths, masked = [], seq_len
    for k in range(num_iter):
        masked = max(1, min(masked - 1, math.floor(seq_len * math.cos(math.pi / 2 * (k + 1) / num_iter))))
        lengths.append(masked)
    return lengths


@dataclass
class GenerationOrder:
    """Which step predicts each position, `step` (B, N); `mask_len` as `mask_lengths`."""

    step: torch.Tensor
    mask_len: list[int]

    @classmethod
    def draw(cls, batch: int, seq_len: int, num_iter: int, generator: torch.Generator, device) -> "GenerationOrder":
        order = torch.rand(batch, seq_len, generator=generator, device=device).argsort(1)  # (B, N) permutations
        return cls.of(order, num_iter)

    @classmethod
    def of(cls, order: torch.Tensor, num_iter: int) -> "GenerationOrder":
        """The schedule of given orders (B, N) (MAR's `orders`: position order[b, j] is masked while j < mask_len)."""
        B, N = order.shape
        if not 1 <= num_iter <= N:
            raise ValueError(f"num_iter must be in [1, {N}] (the tokens), got {num_iter}")
        lengths = mask_lengths(N, num_iter)
        rank = torch.empty_like(order).scatter_(1, order, torch.arange(N, device=order.device).expand(B, N))
        still = torch.tensor(lengths[:-1], device=order.device)  # after the last step nothing is masked
        return cls((rank[..., None] < still).sum(-1), lengths)

    @property
    def n_steps(self) -> int:
        return len(self.mask_len)

    def cfg_scales(self, s: SamplingConfig, device: torch.device | str | None = None) -> torch.Tensor:
        """(K,) the guidance scale of every step, on `device` (default the order's): MAR's linear schedule on the
        step's mask_len, or constant."""
        N = self.step.shape[1]
        lengths = torch.tensor(self.mask_len, dtype=torch.float32, device=device or self.step.device)
        return torch.full_like(lengths, s.cfg) if s.cfg_schedule == "constant" else 1 + (s.cfg - 1) * (N - lengths) / N


class MaskedARModel(Protocol):
    def condition(self, tokens: torch.Tensor, known: torch.Tensor, cond: torch.Tensor, *,
                  guided: bool, known_count: int | None = None) -> torch.Tensor:
        """z (B, N, branches, d) of every position given tokens (B, N, D) of which `known` (B, N) are read; the
        unconditional branch second when guided. `known_count`: how many are known in every row, where the caller
        knows it is the same in all (MAR's sampler); the meta device, which holds no values, needs it."""

    def denoise(self, z: torch.Tensor, x_T: torch.Tensor, eps: torch.Tensor, sampling: SamplingConfig,
                cfg: float | torch.Tensor) -> HeadOutput:
        """The head's chain for M tokens: z (M, branches, d), x_T (M, D), eps (M, K, D); cfg a scale or (M,)."""


class NetworkModel:
    """`MaskedARModel` of a MAR network (`teachers.networks.mar.MAR`: `class_embedding`, the encoder-decoder, `head`):
    the official teachers' and the tiny ones'. Conditions are class ids (B, 1); unconditional is `fake_latent`."""

    def __init__(self, network):
        self.network = network.eval().requires_grad_(False)

    @torch.inference_mode()
    def condition(self, tokens, known, cond, *, guided, known_count=None):
        B = len(cond)
        emb = self.network.class_embedding(cond[:, 0], B)
        if guided:  # MAR's CFG batch: the same tokens and mask twice, the second half unconditional
            emb = torch.cat([emb, self.network.class_embedding(None, B)])
            tokens, known = torch.cat([tokens, tokens]), torch.cat([known, known])
        return torch.stack(self.network(tokens, known, emb, known_count).split(B), dim=2)  # (B, N, branches, d)

    @torch.inference_mode()
    def denoise(self, z, x_T, eps, sampling: SamplingConfig, cfg) -> HeadOutput:
        return denoise(self.network.head, schedule(sampling.steps, str(x_T.device)), z, x_T, eps,
                       temperature=sampling.temperature, cfg=cfg, final_noise=sampling.final_noise,
                       final_std=sampling.final_std)


class MaskedARTeacher(Protocol):
    family: ClassVar[Family]
    modality: ClassVar[str]  # "image": decode -> (B, C, H, W) in [0, 1]
    seq_len: int  # N tokens
    token_dim: int  # D
    grid: tuple[int, int]
    target: MaskedARModel
    draft: MaskedARModel

    def conditions(self, n: int, generator: torch.Generator) -> torch.Tensor: ...
    def decode(self, tokens: torch.Tensor) -> torch.Tensor: ...
    def captions(self, cond: torch.Tensor) -> list[str]: ...


@torch.inference_mode()
def sample_mar(teacher: MaskedARTeacher, cond: torch.Tensor, s: SamplingConfig, *,
               generator: torch.Generator, model: str = "target") -> Samples:
    """MAR's sampler with one model: per step one encoder-decoder pass over the known tokens and one head chain per
    predicted token."""
    B, N, D = len(cond), teacher.seq_len, teacher.token_dim
    noise = TokenNoise.draw(B, N, D, s.steps, generator, cond.device)
    order = GenerationOrder.draw(B, N, s.iterations(N), generator, cond.device)
    tokens = generate(getattr(teacher, model), cond, s, noise, order)
    return Samples(tokens, cond, Counter(nfe=B * order.n_steps, tokens=B * N, head_chains=B * N))


@torch.inference_mode()
def generate(m: MaskedARModel, cond: torch.Tensor, s: SamplingConfig, noise: TokenNoise,
             order: GenerationOrder) -> torch.Tensor:
    """MAR's `sample_tokens` on given noise and order: the tokens (B, N, D)."""
    B, N, D = noise.x_T.shape
    tokens = torch.zeros(B, N, D, device=cond.device)
    known = torch.zeros(B, N, dtype=torch.bool, device=cond.device)
    scales = order.cfg_scales(s, "cpu")  # read a step at a time as a float: on the CPU, also under a meta count
    for k in range(order.n_steps):
        n_known = N - order.mask_len[k - 1] if k else 0  # the same in every row
        z = m.condition(tokens, known, cond, guided=s.cfg != 1, known_count=n_known)  # (B, N, branches, d)
        now = order.step == k
        # the positions predicted now, each row's in ascending order as `now.nonzero()` lists them, found with static
        # shapes (every row predicts as many), so that the sampler also runs on the meta device (the cost mode)
        n_now = (order.mask_len[k - 1] if k else N) - (order.mask_len[k] if k < order.n_steps - 1 else 0)
        pos = now.to(torch.int8).argsort(dim=1, descending=True, stable=True)[:, :n_now].flatten()
        rows = torch.arange(B, device=pos.device).repeat_interleave(n_now)
        tokens[rows, pos] = m.denoise(z[rows, pos], *noise.at(rows, pos), s, float(scales[k])).x0
        known |= now
    return tokens


FAMILY = Family("masked-ar", SamplingConfig, sample_mar, sampler="mar",
                passes=lambda s, n: {"step": s.num_iter or n, "head_chain": n})
