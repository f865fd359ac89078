"""The ODE-diffusion teacher family (DiT with a deterministic PF-ODE sampler, as distilled by ARD, arXiv:2504.11295):
protocol, schedule and the DDIM (eta = 0) sampler that returns the whole trajectory.

DiT's diffusion: 1000 training steps, linear betas from 1e-4 to 0.02, eps-prediction; K sampling steps at DiT's
respacing (training steps round(k * 999 / (K - 1))); classifier-free guidance on eps. A trajectory holds the K + 1
states x_T .. x_0 and the K x_0-predictions E[x_0 | x_t] made at the states before each step.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Callable, ClassVar, Protocol

import torch

from core.samples import Samples
from teachers.families import Family

TRAIN_STEPS = 1000


@dataclass(frozen=True)
class SamplingConfig:
    """The teacher's sampler; methods on this family share it with the reference arm."""

    steps: int = 25  # DDIM steps K
    cfg: float = 1.5  # classifier-free guidance scale on eps; 1 = conditional only

    def __post_init__(self):
        if not 1 <= self.steps <= TRAIN_STEPS:
            raise ValueError(f"steps must be in [1, {TRAIN_STEPS}], got {self.steps}")
        if self.cfg < 0:
            raise ValueError(f"cfg must be >= 0, got {self.cfg}")


def alpha_bar() -> torch.Tensor:
    """(1000,) cumulative alphas of DiT's linear schedule."""
    return torch.cumprod(1 - torch.linspace(1e-4, 0.02, TRAIN_STEPS, dtype=torch.float64), 0)


def ddim_timesteps(steps: int) -> list[int]:
    """The training steps a K-step sampler visits, noisiest first (DiT's `space_timesteps(1000, str(K))`)."""
    stride = (TRAIN_STEPS - 1) / max(steps - 1, 1)
    return sorted({round(i * stride) for i in range(steps)}, reverse=True)


@dataclass
class Trajectory:
    states: torch.Tensor  # (K + 1, B, C, H, W): x_T, then the state after each step; states[K] is the sample
    x0_preds: torch.Tensor  # (K, B, C, H, W): E[x_0 | states[j]]
    timesteps: list[int]  # (K,) the training step of states[j]


@torch.inference_mode()
def ddim(eps: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], x_T: torch.Tensor, steps: int) -> Trajectory:
    """DDIM with eta = 0: x_prev = sqrt(ab_prev) x0_hat + sqrt(1 - ab_prev) eps_hat. eps(x, t (B,)) -> eps_hat."""
    ab = alpha_bar().to(x_T.device)
    ts = ddim_timesteps(steps)
    states, preds, x = [x_T], [], x_T
    for j, t in enumerate(ts):
        e = eps(x, torch.full((len(x),), t, device=x.device))
        a, a_prev = ab[t].float(), (ab[ts[j + 1]].float() if j + 1 < len(ts) else torch.tensor(1.0, device=x.device))
        x0 = (x - (1 - a).sqrt() * e) / a.sqrt()  # DiT: clip_denoised=False
        x = a_prev.sqrt() * x0 + (1 - a_prev).sqrt() * e
        states.append(x)
        preds.append(x0)
    return Trajectory(torch.stack(states), torch.stack(preds), ts)


class DiTNetwork(Protocol):
    """What a distillation student builds on (ARD's student and discriminator, `methods.ard_student`,
    `methods.ard_gan`): a DiT's parts, reused block by block. A teacher loaded from a checkpoint can be distilled if
    its network has these (`teachers.networks.dit.DiT` is the reference implementation)."""

    cfg: "DiTShape"
    x_embedder: torch.nn.Module  # (B, C, H, W) -> (B, d, h, w) patch embedding
    t_embedder: torch.nn.Module  # (B,) training steps -> (B, d)
    y_embedder: torch.nn.Module  # (B,) class ids (n_classes = null) -> (B, d)
    blocks: torch.nn.ModuleList  # block(h (B, L, d), c (B, d) or (B, L, d), mask, history) -> (h, (k, v))
    final_layer: torch.nn.Module  # (h, c) -> (B, L, p * p * C_out); C_out = 2C for a learned-sigma DiT, eps first
    pos_embed: torch.Tensor  # (L, d) fixed positions

    def embed(self, x: torch.Tensor) -> torch.Tensor: ...  # (B, C, H, W) -> (B, L, d), positions added
    def cond(self, t: torch.Tensor, y: torch.Tensor) -> torch.Tensor: ...  # (B,), (B,) -> (B, d)
    def unpatchify(self, out: torch.Tensor) -> torch.Tensor: ...  # (B, L, p * p * C_out) -> (B, C_out, H, W)


class DiTShape(Protocol):
    channels: int  # C, the image's (or latent's) channels
    depth: int
    hidden: int
    tokens: int  # L


class ODEDiffusionTeacher(Protocol):
    family: ClassVar[Family]
    modality: ClassVar[str]  # "image"
    network: DiTNetwork  # students are initialised from it
    image_shape: tuple[int, int, int]  # (C, H, W)
    n_classes: int

    def conditions(self, n: int, generator: torch.Generator) -> torch.Tensor: ...
    def eps(self, x: torch.Tensor, t: torch.Tensor, cond: torch.Tensor, *, cfg: float) -> torch.Tensor: ...
    def decode(self, x: torch.Tensor) -> torch.Tensor: ...
    def captions(self, cond: torch.Tensor) -> list[str]: ...


class RealImagesTeacher(ODEDiffusionTeacher, Protocol):
    """A teacher trained here from a dataset also gives its real images (ARD's R+D fine-tune reads them); a teacher
    loaded from a checkpoint (DiT-XL/2) has none at hand."""

    def real_images(self, split: str) -> tuple[torch.Tensor, torch.Tensor]:
        """The split's images in the sampler's space [-1, 1] (N, C, H, W) and their class ids (N,), on the CPU."""


def sample_ddim(teacher: ODEDiffusionTeacher, cond: torch.Tensor, s: SamplingConfig, *,
                generator: torch.Generator) -> Samples:
    """The teacher's own sampler: K DDIM steps from x_T ~ N(0, I); one (CFG-batched) forward pass per step."""
    x_T = torch.randn(len(cond), *teacher.image_shape, generator=generator, device=cond.device)
    traj = ddim(lambda x, t: teacher.eps(x, t, cond, cfg=s.cfg), x_T, s.steps)
    return Samples(traj.states[-1], cond, Counter(nfe=len(cond) * len(traj.timesteps), tokens=len(cond)))


FAMILY = Family("ode-diffusion", SamplingConfig, sample_ddim, sampler="ddim",
                passes=lambda s, n: {"step": s.steps})
