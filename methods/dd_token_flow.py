"""Per-token flow matching from Gaussian noise to a categorical over codebook vectors (Distilled Decoding, Sec. 3.2).

DD (Liu et al., arXiv:2412.17153) makes an AR teacher's token draw a deterministic function of a noise vector:
q_i = FM(eps_i, p(. | q_<i)) (Eq. 4), the solution of the rectified-flow ODE x_t = (1-t) eps + t x_1 whose target is
the mixture of Diracs sum_j p_j delta(c_j), snapped to the nearest codebook vector.

The velocity is the corrected form of Eq. 3 (docs/methods/dd.md, Eq. 3): the printed exponent has
the wrong sign and lacks the 1/2 and the t on c_j. `field="printed"` keeps the printed form only so a test can show
that it does not reproduce p.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch

Solver = Literal["euler", "dpm++2m", "dpm++3m"]
Field = Literal["corrected", "printed"]


@dataclass(frozen=True)
class FlowConfig:
    solver: Solver = "dpm++3m"  # the paper: 10-NFE multistep DPM-Solver++ of order 3 (App. C)
    steps: int = 10  # velocity evaluations per token
    field: Field = "corrected"
    # The paper does not say where the solve stops; the field is singular at t = 1. 1 - 1e-3 leaves the state within
    # 1e-3 * |eps - c| of its code, far below the spacing of any codebook, so snapping decides nothing.
    t_end: float = 1 - 1e-3
    # DPM-Solver++ only: the lambda = log(t / (1 - t)) window its inner steps are spread over (the paper does not give
    # its time steps). The posterior over codes resolves at lambda ~ -log(code spacing): about 0.3 for 32 random
    # unit codes, 2-3 for the digits teachers' pixel-patch codes (spacing 0.04-0.12). Measured against 1000-step
    # Euler, [-1, 4] is the best fixed window for both (t-uniform steps are fine for the first, poor for the second).
    log_snr: tuple[float, float] = (-1.0, 4.0)

    def __post_init__(self):
        if self.solver not in ("euler", "dpm++2m", "dpm++3m"):
            raise ValueError(f"solver must be one of euler, dpm++2m, dpm++3m, got {self.solver!r}")
        if self.field not in ("corrected", "printed"):
            raise ValueError(f"field must be corrected or printed, got {self.field!r}")
        if self.steps < 1:
            raise ValueError(f"steps must be >= 1, got {self.steps}")
        if not 0.5 < self.t_end < 1:
            raise ValueError(f"t_end must be in (0.5, 1), got {self.t_end}")
        lo, hi = self.log_snr
        if not lo < hi < math.log(self.t_end / (1 - self.t_end)):
            raise ValueError(f"log_snr must be (lo, hi) with lo < hi < log(t_end / (1 - t_end)), got {self.log_snr}")


def denoise(x: torch.Tensor, t: float, logp: torch.Tensor, codebook: torch.Tensor, field: Field) -> torch.Tensor:
    """The posterior mean of the data token, E[x_1 | x_t = x] = sum_j w_j c_j: (B, C).

    x (B, C), logp (B, V) with -inf for codes outside the support, codebook (V, C), all float64.
    Corrected: w = softmax_j(log p_j - |x - t c_j|^2 / (2 (1-t)^2)); |x|^2 is the same for every j and is dropped,
    which keeps the logits O(|x||c| / (1-t)^2) rather than a difference of two such terms.
    """
    s = 1.0 - t
    if field == "corrected":
        logits = logp + (t * (x @ codebook.T) - 0.5 * t * t * (codebook * codebook).sum(-1)) / (s * s)
    else:  # printed Eq. 3: exp(+|x - c_j|^2 / (1-t)^2)
        logits = logp + torch.cdist(x, codebook).square() / (s * s)
    return torch.softmax(logits, dim=-1) @ codebook


def velocity(x: torch.Tensor, t: float, probs: torch.Tensor, codebook: torch.Tensor,
             field: Field = "corrected") -> torch.Tensor:
    """V(x, t) = (E[x_1 | x_t = x] - x) / (1 - t): (B, C) for x (B, C), probs (B, V), codebook (V, C)."""
    x, probs, codebook = x.double(), probs.double(), codebook.double()
    return (denoise(x, t, probs.log(), codebook, field) - x) / (1.0 - t)


def _euler(x, logp, codebook, cfg: FlowConfig):
    ts = torch.linspace(0.0, cfg.t_end, cfg.steps + 1, dtype=torch.float64).tolist()
    for t, t_next in zip(ts[:-1], ts[1:]):
        x = x + (t_next - t) * (denoise(x, t, logp, codebook, cfg.field) - x) / (1.0 - t)
    return x


def _dpm_solver_pp(x, logp, codebook, cfg: FlowConfig, order: int):
    """Multistep DPM-Solver++ (Lu et al. 2022, data prediction) in the rectified-flow schedule.

    DPM time s = 1 - t: alpha = t, sigma = 1 - t, lambda = log(t / (1 - t)); the data prediction is `denoise`, i.e.
    x - (1 - t) eps_hat with the paper's noise-prediction wrapper eps_hat = x - t V. The times are t = 0, `steps - 1`
    points uniform in lambda over `cfg.log_snr`, then t_end: at t = 0 the data prediction is exactly sum_j p_j c_j,
    and past the window the posterior has collapsed onto one code, so the first and last steps (exact for a constant
    data prediction) carry no error. As in the official multistep solver, the first steps warm up with lower orders,
    and the last ones fall back to lower orders ("lower_order_final"; a third-order step into the long final jump
    diverges).
    """
    lo, hi = cfg.log_snr
    lams = [-math.inf, *torch.linspace(lo, hi, cfg.steps - 1, dtype=torch.float64).tolist(),
            math.log(cfg.t_end / (1 - cfg.t_end))]
    ts = [1 / (1 + math.exp(-lam)) for lam in lams]
    history: list[tuple[float, torch.Tensor]] = []  # (lambda, data prediction) at earlier times, newest last
    for k in range(cfg.steps):
        t, t_next, h = ts[k], ts[k + 1], lams[k + 1] - lams[k]
        history = [*history, (lams[k], denoise(x, t, logp, codebook, cfg.field))][-order:]
        n = min(len(history), order, cfg.steps - k)
        phi1 = math.expm1(-h)  # -1 for the first step, where h is infinite
        lam0, d0 = history[-1]
        step = -phi1 * d0
        if n >= 2:
            lam1, d1 = history[-2]
            r0 = (lam0 - lam1) / h
            D1_0 = (d0 - d1) / r0
            if n == 2:
                step = step - 0.5 * phi1 * D1_0
            else:
                lam2, d2 = history[-3]
                r1 = (lam1 - lam2) / h
                D1_1 = (d1 - d2) / r1
                phi2 = phi1 / h + 1.0
                phi3 = phi2 / h - 0.5
                step = step + phi2 * (D1_0 + r0 / (r0 + r1) * (D1_0 - D1_1)) - phi3 * (D1_0 - D1_1) / (r0 + r1)
        x = (1 - t_next) / (1 - t) * x + t_next * step
    return x


@torch.inference_mode()
def flow_map(noise: torch.Tensor, probs: torch.Tensor, codebook: torch.Tensor, cfg: FlowConfig) -> torch.Tensor:
    """Eq. 4: noise (B, C) and next-token probabilities (B, V) -> token ids (B,), deterministically.

    Solves the ODE from t = 0 to t_end in float64 and snaps to the nearest codebook vector among the codes with
    p > 0 (the paper snaps to the nearest of all codes; restricting to the support keeps a top-k cut exact).
    """
    x, logp, cb = noise.double(), probs.double().log(), codebook.double()
    if cfg.solver == "euler":
        x = _euler(x, logp, cb, cfg)
    else:
        x = _dpm_solver_pp(x, logp, cb, cfg, order=int(cfg.solver[5]))
    dist = torch.cdist(x, cb).masked_fill(probs <= 0, math.inf)  # (B, V)
    return dist.argmin(-1)
