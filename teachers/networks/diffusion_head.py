"""MAR's per-token diffusion head ("DiffLoss", Li et al., arXiv:2406.11838) as used by CSpD (arXiv:2411.11925).

A small MLP with adaptive layer norm (MAR's `SimpleMLPAdaLN`) predicts, for one continuous token x_t in R^D at
diffusion step t and the transformer's condition vector z, the noise eps and a variance interpolation v (IDDPM's
learned-range variance, Nichol & Dhariwal 2021): log sigma_t^2 = frac * log beta_t + (1 - frac) * log beta~_t with
frac = (v + 1) / 2. Cosine schedule over 1000 training steps, respaced to K sampling steps as IDDPM's
`space_timesteps`. Loss: MSE on eps plus the variational bound (bits per dim, eps frozen in it), MAR's hybrid.

Sampling (`denoise`) follows MAR's DDPM loop: temperature multiplies every step's std, CFG mixes eps only
(eps_u + w (eps_c - eps_u); the variance comes from the conditional branch), and MAR adds no noise at the last step
(x_0 = mean); `final_noise=True` samples it, which makes the token's law a proper density (CSpD's `exact` mode needs
it). The noise is an input, so two heads can share it (CSpD's trajectory alignment).
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
import torch.nn as nn

TRAIN_STEPS = 1000  # diffusion steps of the training schedule (MAR, IDDPM)


def cosine_alpha_bar(T: int, s: float = 0.008) -> torch.Tensor:
    """(T,) cumulative alpha of the cosine schedule, betas clipped at 0.999 as IDDPM."""
    f = lambda t: math.cos((t / T + s) / (1 + s) * math.pi / 2) ** 2  # noqa: E731
    betas = torch.tensor([min(1 - f(i + 1) / f(i), 0.999) for i in range(T)], dtype=torch.float64)
    return torch.cumprod(1 - betas, 0)


class Schedule:
    """The cosine schedule respaced to `steps` sampling steps; index k = 0 is the last (least noisy) step."""

    def __init__(self, steps: int = TRAIN_STEPS, device: str = "cpu"):
        if not 1 <= steps <= TRAIN_STEPS:
            raise ValueError(f"diffusion steps must be in [1, {TRAIN_STEPS}], got {steps}")
        full = cosine_alpha_bar(TRAIN_STEPS)
        stride = (TRAIN_STEPS - 1) / max(steps - 1, 1)
        self.timesteps = torch.tensor(sorted({round(i * stride) for i in range(steps)}))  # (K,) training t of step k
        ab = full[self.timesteps]
        ab_prev = torch.cat([torch.ones(1, dtype=ab.dtype), ab[:-1]])
        betas = 1 - ab / ab_prev
        post_var = betas * (1 - ab_prev) / (1 - ab)
        as_f = lambda t: t.float().to(device)  # noqa: E731  (float64 for the algebra above, float32 for the models)
        self.alpha_bar, self.sqrt_ab, self.sqrt_1mab = as_f(ab), as_f(ab.sqrt()), as_f((1 - ab).sqrt())
        self.log_beta = as_f(betas.log())
        # IDDPM clips the posterior variance of the last step (0) to the next one's
        self.log_post_var = as_f(torch.cat([post_var[1:2], post_var[1:]]).log()) if steps > 1 else self.log_beta
        self.post_coef_x0 = as_f(betas * ab_prev.sqrt() / (1 - ab))
        self.post_coef_xt = as_f((1 - ab_prev) * (1 - betas).sqrt() / (1 - ab))
        self.steps = len(self.timesteps)

    def q_sample(self, x0, k, noise):
        return self.sqrt_ab[k, None] * x0 + self.sqrt_1mab[k, None] * noise

    def posterior(self, x0, xt, k):
        """q(x_{k-1} | x_k, x_0): mean and log variance."""
        return self.post_coef_x0[k, None] * x0 + self.post_coef_xt[k, None] * xt, self.log_post_var[k, None]

    def p_mean_log_std(self, eps, v, xt, k, clip: float = 0.0):
        """The reverse step p(x_{k-1} | x_k): mean and per-dimension log std, from eps and the variance output v;
        clip > 0 clamps the implied x_0 to [-clip, clip] first (IDDPM's clip_denoised)."""
        frac = (v + 1) / 2
        log_var = frac * self.log_beta[k, None] + (1 - frac) * self.log_post_var[k, None]
        x0 = (xt - self.sqrt_1mab[k, None] * eps) / self.sqrt_ab[k, None]
        if clip:
            x0 = x0.clamp(-clip, clip)
        return self.posterior(x0, xt, k)[0], log_var / 2


def _gauss_log_prob(x, mean, log_std):
    return -0.5 * ((x - mean) / log_std.exp()) ** 2 - log_std - 0.5 * math.log(2 * math.pi)


class TimestepEmbedder(nn.Module):
    """Sinusoidal features of the diffusion step, then an MLP (DiT, MAR)."""

    def __init__(self, width: int, freq: int = 256):
        super().__init__()
        self.freq = freq
        self.mlp = nn.Sequential(nn.Linear(freq, width), nn.SiLU(), nn.Linear(width, width))

    def forward(self, t):  # (N,) -> (N, width)
        half = self.freq // 2
        f = torch.exp(-math.log(10000) * torch.arange(half, device=t.device) / half)
        a = t.float()[:, None] * f
        return self.mlp(torch.cat([a.cos(), a.sin()], -1))


class _ResBlock(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.norm = nn.LayerNorm(width, eps=1e-6)
        self.mlp = nn.Sequential(nn.Linear(width, width), nn.SiLU(), nn.Linear(width, width))
        self.ada = nn.Sequential(nn.SiLU(), nn.Linear(width, 3 * width))

    def forward(self, x, y):
        shift, scale, gate = self.ada(y).chunk(3, -1)
        return x + gate * self.mlp(self.norm(x) * (1 + scale) + shift)


@dataclass(frozen=True)
class HeadConfig:
    token_dim: int  # D
    cond_dim: int  # the transformer's width (z)
    width: int = 128
    depth: int = 2
    # Sampling clamps the implied x_0 to [-clip, clip] (0: never, as MAR on unbounded latents). Bounded tokens
    # (pixels in [-1, 1]) need it: at t = 999 of the cosine schedule x_0 = (x_t - sqrt(1 - ab) eps) / sqrt(ab)
    # multiplies the eps error by 2e4.
    clip: float = 0.0


class DiffusionHead(nn.Module):
    """SimpleMLPAdaLN: (x_t (N, D), training step t (N,), z (N, cond_dim)) -> (eps (N, D), v (N, D))."""

    def __init__(self, cfg: HeadConfig):
        super().__init__()
        self.cfg = cfg
        w = cfg.width
        self.time_emb, self.cond_emb = TimestepEmbedder(w), nn.Linear(cfg.cond_dim, w)
        self.inp = nn.Linear(cfg.token_dim, w)
        self.blocks = nn.ModuleList(_ResBlock(w) for _ in range(cfg.depth))
        self.norm = nn.LayerNorm(w, elementwise_affine=False, eps=1e-6)
        self.final_ada = nn.Sequential(nn.SiLU(), nn.Linear(w, 2 * w))
        self.out = nn.Linear(w, 2 * cfg.token_dim)
        for m in [b.ada[-1] for b in self.blocks] + [self.final_ada[-1], self.out]:  # adaLN-Zero: start as identity
            nn.init.zeros_(m.weight)
            nn.init.zeros_(m.bias)

    def forward(self, x, t, z):
        return self.body(x, self.time_emb(t) + self.cond_emb(z))

    def body(self, x, y):
        """The MLP given the adaLN condition y = time_emb(t) + cond_emb(z), (N or 1, width)."""
        h = self.inp(x)
        for block in self.blocks:
            h = block(h, y)
        shift, scale = self.final_ada(y).chunk(2, -1)
        return self.out(self.norm(h) * (1 + scale) + shift).chunk(2, -1)

    def loss(self, x0, z, generator: torch.Generator | None = None) -> torch.Tensor:
        """MAR's hybrid loss on tokens x0 (N, D) with conditions z (N, cond_dim): MSE(eps) + VLB (bits/dim)."""
        sched = schedule(TRAIN_STEPS, str(x0.device))
        k = torch.randint(TRAIN_STEPS, (len(x0),), generator=generator, device=x0.device)
        noise = torch.randn(x0.shape, generator=generator, device=x0.device)
        xt = sched.q_sample(x0, k, noise)
        eps, v = self(xt, k, z)
        mean, log_std = sched.p_mean_log_std(eps.detach(), v, xt, k)  # the VLB trains the variance only
        true_mean, true_log_var = sched.posterior(x0, xt, k)
        kl = 0.5 * (2 * log_std - true_log_var + (true_log_var.exp() + (true_mean - mean) ** 2)
                    / (2 * log_std).exp() - 1)
        nll = -_gauss_log_prob(x0, mean, log_std)  # the last step: a decoder likelihood (continuous tokens)
        vb = torch.where((k == 0)[:, None], nll, kl).mean(-1) / math.log(2)
        return ((eps - noise) ** 2).mean() + vb.mean()


@functools.lru_cache(maxsize=None)
def schedule(steps: int, device: str) -> Schedule:
    return Schedule(steps, device)


@dataclass
class HeadOutput:
    """One denoising trajectory per token: the token and its last step's Gaussian (what CSpD's ratio reads)."""

    x0: torch.Tensor  # (N, D) the token
    mean: torch.Tensor  # (N, D) mean of p(x_0 | x_1)
    log_std: torch.Tensor  # (N, D) log std of p(x_0 | x_1), temperature included
    log_std_sum: torch.Tensor  # (N,) sum over the steps before the last of sum_d log sigma: log prod sqrt|Sigma_t|


@torch.inference_mode()
def denoise(head: DiffusionHead, sched: Schedule, z: torch.Tensor, x_T: torch.Tensor, eps: torch.Tensor, *,
            temperature: float, cfg: float | torch.Tensor, final_noise: bool, final_std: float = 0.0) -> HeadOutput:
    """Run the head's reverse chain. z (N, branches, d) with the unconditional branch second when guided, cfg one
    scale or one per token (N,);
    x_T (N, D) and eps (N, K, D) the starting point and per-step noise (eps[:, i] for the i-th step taken);
    final_std > 0 floors the last step's std (output noise, see `continuous_ar.SamplingConfig`)."""
    N, D = x_T.shape
    guided = z.shape[1] == 2
    w = cfg[:, None] if isinstance(cfg, torch.Tensor) else cfg
    zz = torch.cat([z[:, 0], z[:, 1]]) if guided else z[:, 0]
    x, log_std_sum, log_t = x_T, torch.zeros(N, device=x_T.device), math.log(temperature)
    c = head.cond_emb(zz)  # the chain's condition is fixed: embed it once, the step embedding once per step
    t_emb = head.time_emb(sched.timesteps.to(x.device))  # (K, width)
    for i, k in enumerate(range(sched.steps - 1, -1, -1)):
        e, v = head.body(torch.cat([x, x]) if guided else x, c + t_emb[k])
        if guided:
            e = e[N:] + w * (e[:N] - e[N:])
            v = v[:N]
        mean, log_std = sched.p_mean_log_std(e, v, x, k, head.cfg.clip)
        log_std = log_std + log_t
        if k > 0:
            x = mean + log_std.exp() * eps[:, i]
            log_std_sum = log_std_sum + log_std.sum(-1)
        else:
            if final_std:
                log_std = log_std.clamp(min=math.log(final_std))
            x = mean + log_std.exp() * eps[:, i] if final_noise else mean
    return HeadOutput(x, mean, log_std, log_std_sum)
