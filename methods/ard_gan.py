"""ARD's optional discriminator fine-tune, R+D (Kim et al., arXiv:2504.11295, App. B.1; the released
train_ARD_gan.py).

The frozen teacher DiT is the feature extractor: one discriminator head per teacher block reads that block's tokens
and gives token-wise logits (a small spectrally normalised MLP here; the released code's heads are 1-D convolutions
with local batch norm). Hinge loss on the student's final prediction against real images. The generator loss is
L_R + w L_G with the adaptive weight of Esser et al., w = ld * ||grad_W L_R|| / (||grad_W L_G|| + 1e-4) clamped to
[0, 1e4] at the last head's weight W, and w = 0 for the first `warmup` steps (the released code: ld 10, 3000 steps).
Which noise level the teacher sees the images at is not released; here it reads them clean (t = 0), a stated choice.
"""
from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.utils.parametrizations import spectral_norm

from core.rng import seeded
from teachers.families.ode_diffusion import DiTNetwork

GAN_VERSION = 2  # part of an R+D student's cache key; 2: the discriminator's init is seeded (was the process's RNG)


class Discriminator(nn.Module):
    """Token-wise logits from every block of a frozen teacher DiT: (B, C, H, W), y (B,) -> (B, depth * L)."""

    def __init__(self, teacher: DiTNetwork):
        super().__init__()
        self.teacher = teacher.eval().requires_grad_(False)
        d = teacher.cfg.hidden
        self.heads = nn.ModuleList(nn.Sequential(spectral_norm(nn.Linear(d, d)), nn.LeakyReLU(0.2),
                                                 spectral_norm(nn.Linear(d, 1))) for _ in teacher.blocks)
        self.heads.to(teacher.pos_embed.device)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        t = self.teacher
        h, c = t.embed(x), t.cond(torch.zeros_like(y), y)
        logits = []
        for block, head in zip(t.blocks, self.heads):
            h, _ = block(h, c)
            logits.append(head(h)[..., 0])  # (B, L)
        return torch.cat(logits, 1)


def adaptive_weight(loss_r: torch.Tensor, loss_g: torch.Tensor, last: torch.Tensor, scale: float) -> torch.Tensor:
    """scale * ||grad L_R|| / (||grad L_G|| + 1e-4) at the parameter `last`, clamped to [0, 1e4] first."""
    g_r = torch.autograd.grad(loss_r, last, retain_graph=True)[0]
    g_g = torch.autograd.grad(loss_g, last, retain_graph=True)[0]
    return (g_r.norm() / (g_g.norm() + 1e-4)).clamp(0, 1e4).detach() * scale


def finetune(student, teacher: DiTNetwork, n: int, pairs: Callable[[torch.Tensor], tuple[torch.Tensor, ...]], real,
             real_y, *, steps: int, batch: int, lr: float, disc_lr: float, scale: float, warmup: int,
             generator: torch.Generator, seed: int, on_step=None) -> dict[str, float]:
    """R+D: `steps` generator/discriminator steps on the n trajectories (`pairs(idx)`: inputs and targets
    (len(idx), S, C, H, W) and classes of trajectories idx, on the teacher's device) and real images `real`
    (m, C, H, W) in [-1, 1] of classes real_y, on the teacher's device, as `generator`. `on_step(k)` runs after each
    student step."""
    with seeded(seed):  # the heads' init and spectral norm's start vectors draw from the global generators
        disc = Discriminator(teacher)
    device = real.device
    opt_g = torch.optim.AdamW(student.parameters(), lr=lr, weight_decay=0.0)
    opt_d = torch.optim.AdamW(disc.heads.parameters(), lr=disc_lr, weight_decay=0.0)
    last = student.heads[-1].linear.weight
    for k in range(steps):
        inputs, targets, y = pairs(torch.randint(n, (batch,), generator=generator, device=device))
        pred = student(inputs, y)
        loss_r = F.mse_loss(pred, targets)
        loss_g = -disc(pred[:, -1], y).mean()
        w = adaptive_weight(loss_r, loss_g, last, scale) if k >= warmup else torch.zeros(())
        opt_g.zero_grad(set_to_none=True)
        (loss_r + w * loss_g).backward()
        torch.nn.utils.clip_grad_norm_(student.parameters(), 1.0)
        opt_g.step()
        if on_step is not None:
            on_step(k)
        real_idx = torch.randint(len(real), (batch,), generator=generator, device=device)
        loss_d = (F.relu(1 - disc(real[real_idx], real_y[real_idx])).mean()  # hinge loss
                  + F.relu(1 + disc(pred[:, -1].detach(), y)).mean())
        opt_d.zero_grad(set_to_none=True)
        loss_d.backward()
        opt_d.step()
    return {"gan_loss_r": loss_r.item(), "gan_loss_g": loss_g.item(), "gan_loss_d": loss_d.item(),
            "gan_weight": float(w)}
