"""The masked-diffusion LM family (MDLM, Sahoo et al. 2024, arXiv:2406.07524): the protocol methods use, the
log-linear absorbing-state schedule, the SUBS parameterisation, the NELBO and the ancestral sampler.

The teacher family of SDTT (arXiv:2410.21035). Definitions follow docs/methods/sdtt.md (MDLM):
a token is masked with probability 1 - alpha_t = (1 - eps) t; the denoiser is not time-conditioned, so one forward
pass on z gives x_theta(z) whatever t is; a sampler step from t to s unmasks each masked token with probability
(t - s) / t, drawing it from x_theta(z), and never changes an unmasked one.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Callable, ClassVar, Literal, Protocol

import torch
import torch.nn.functional as F

from core.cache import Cache
from core.samples import Samples
from teachers.families import Family
from teachers.families.ar_token import draw
# MDLM's DiT, the network of MDLM-OWT and of SDTT's released students: methods build and check those from here
from teachers.networks.mdlm_dit import MDLMDiT, MDLMDiTConfig  # noqa: F401

SCHEDULE_EPS = 1e-3  # the log-linear schedule's eps: alpha_t = 1 - (1 - eps) t
SAMPLING_EPS = 1e-5  # the sampler's last time and the smallest training time
NEG = -1e6  # SUBS' "impossible" log-probability, finite (as in MDLM's code) so that 0 * NEG stays 0 in divergences


def released_draw(q: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """The released samplers' draw from unnormalised q (..., V): argmax of q / E with E = 1e-10 - log(U + 1e-10), U
    uniform, in float32 (MDLM's `_sample_categorical`, kuleshov-group/mdlm c112c52 diffusion.py:24-28; SDTT's
    `sample_categorical`, jdeschena/sdtt 9172b86 src/sdtt/core/sampling/ancestral.py:5-9; q is float32 there: the
    exp of the network's float32 log-probs). An exponential race, exact in real numbers; in float32 its rounding
    truncates the race, which lowers the diversity of the draws and the generative perplexity (Zheng et al. 2024a, the
    reason SDTT's App. A samples in float64). -> (...)"""
    q = q.float()
    u = torch.rand(q.shape, generator=generator, device=q.device)
    return (q / (1e-10 - (u + 1e-10).log())).argmax(-1)


# Each step's draw of the tokens it unmasks: "exact", the float64 inverse-CDF draw (`ar_token.draw`), or
# "released-fp32", the released samplers' float32 race (`released_draw`), as SDTT's paper runs sample (§4: bf16
# networks, this draw; its App. A float64 runs are what "exact" stands for)
Draw = Literal["exact", "released-fp32"]
DRAWS: dict[str, Callable] = {"exact": draw, "released-fp32": released_draw}


@dataclass(frozen=True)
class SamplingConfig:
    steps: int = 64  # T ancestral steps from t = 1 to t = SAMPLING_EPS
    # MDLM's ddpm_cache: the denoiser ignores t, so after a step that unmasks nothing the next forward pass would
    # return the same x_theta; reuse it (fewer NFE, the same samples). SDTT samples without it.
    cache: bool = False
    # `DRAWS`: one setting for every arm of a trial (the reference arm samples with this config, SDTT's student and
    # same-step arms with a copy of it), so a comparison never pits one draw's precision against another's
    draw: Draw = "exact"

    def __post_init__(self):
        if self.steps < 1:
            raise ValueError(f"steps must be >= 1, got {self.steps}")
        if self.draw not in DRAWS:
            raise ValueError(f"draw must be one of {', '.join(DRAWS)}, got {self.draw!r}")


class MaskedDiffusionLM(Protocol):
    family: ClassVar[Family]
    modality: ClassVar[str]  # "text": decode -> B strings
    seq_len: int  # L
    vocab_size: int  # V real tokens; id V is MASK
    mask_id: int
    companion_lm: str  # the registered causal LM trained on the same data and tokenizer (the AR baseline)
    # The denoiser, z (B, L) ids -> (B, L, V + 1) logits (`teachers.networks.mdlm.MDLMNet`): SDTT students are copies
    network: torch.nn.Module

    def denoise(self, z: torch.Tensor) -> torch.Tensor: ...  # (B, L) ids -> (B, L, V + 1) SUBS log-probs
    def training_chunks(self, cache: Cache) -> torch.Tensor: ...  # (n, L) the data the teacher was trained on
    def conditions(self, n: int, generator: torch.Generator) -> torch.Tensor: ...
    def decode(self, tokens: torch.Tensor) -> list[str]: ...
    def encode(self, texts: list[str]) -> list[list[int]]: ...
    # and, for the text metrics, `reference_texts()` (MAUVE's held-out side)


def mask_prob(t: torch.Tensor) -> torch.Tensor:
    """1 - alpha_t: the probability that a token is masked at time t."""
    return (1 - SCHEDULE_EPS) * t


def subs(logits: torch.Tensor, z: torch.Tensor, mask_id: int) -> torch.Tensor:
    """SUBS (MDLM §3.2): logits (B, L, V + 1) at z (B, L) -> log-probs with no mass on MASK and unmasked tokens
    copied (log-prob 0 on the observed token, NEG elsewhere)."""
    logits = logits.float().clone()
    logits[..., mask_id] = NEG
    logp = F.log_softmax(logits, dim=-1)
    unmasked = z != mask_id
    copied = torch.full_like(logp, NEG).scatter_(-1, z.unsqueeze(-1), 0.0)
    return torch.where(unmasked.unsqueeze(-1), copied, logp)


def corrupt(x: torch.Tensor, t: torch.Tensor, mask_id: int, generator: torch.Generator | None) -> torch.Tensor:
    """q(z_t | x): mask every token of x (B, L) independently with probability 1 - alpha_t, t (B,)."""
    u = torch.rand(x.shape, generator=generator, device=x.device)
    return torch.where(u < mask_prob(t)[:, None], torch.full_like(x, mask_id), x)


def antithetic_times(batch: int, generator: torch.Generator | None, device=None) -> torch.Tensor:
    """MDLM's low-discrepancy training times: (u + i / B) mod 1, scaled into [SAMPLING_EPS, 1]. (B,)"""
    u = torch.rand((), generator=generator, device=device)
    t = (u + torch.arange(batch, device=device) / batch) % 1
    return (1 - SAMPLING_EPS) * t + SAMPLING_EPS


def nelbo(logits: torch.Tensor, x: torch.Tensor, z: torch.Tensor, t: torch.Tensor, mask_id: int) -> torch.Tensor:
    """The continuous-time NELBO (MDLM Eq. 10, log-linear schedule) from the denoiser's raw logits (B, L, V + 1): per
    sequence (1/t) * sum over masked positions of -log x_theta(z)[x], averaged over the L positions as MDLM's code
    does. (B,)

    Only masked positions carry loss, and there SUBS is a softmax over the real tokens; so the cross-entropy runs on
    those rows alone, without building the full SUBS tensor (training spends most of its time otherwise in it)."""
    masked = z == mask_id  # (B, L)
    nll = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    nll[masked] = F.cross_entropy(logits[masked][:, :mask_id].float(), x[masked], reduction="none")
    return nll.mean(-1) / t


def reverse_step(logp: torch.Tensor, z: torch.Tensor, t: float | torch.Tensor, s: float | torch.Tensor, mask_id: int,
                 generator: torch.Generator | None, draw_fn: Callable = draw) -> torch.Tensor:
    """One ancestral step z_t -> z_s (MDLM Eq. 7 with SUBS): a masked token stays masked with probability
    (1 - alpha_s) / (1 - alpha_t), else takes a token drawn from x_theta; unmasked tokens are carried over.
    t and s are floats or per-sequence (B,) tensors. `draw_fn(q, generator)` draws from the unnormalised q (one of
    `DRAWS`; default: the exact float64 draw)."""
    mc_t, mc_s = (torch.as_tensor(mask_prob(torch.as_tensor(v, dtype=torch.float64)), device=z.device)
                  .reshape(-1, 1, 1) for v in (t, s))  # (B or 1, 1, 1)
    q = logp.double().exp() * (mc_t - mc_s)  # (B, L, V + 1), unnormalised by mc_t (the draw normalises)
    q[..., mask_id] = mc_s[..., 0]
    return torch.where(z == mask_id, draw_fn(q, generator), z)


def time_grid(steps: int) -> torch.Tensor:
    """The sampler's times 1 = t_0 > ... > t_T = SAMPLING_EPS. (T + 1,)"""
    return torch.linspace(1.0, SAMPLING_EPS, steps + 1, dtype=torch.float64)


@torch.inference_mode()
def sample_ancestral(denoise: Callable[[torch.Tensor], torch.Tensor], cond: torch.Tensor, seq_len: int, mask_id: int,
                     s: SamplingConfig, *, generator: torch.Generator) -> Samples:
    """T ancestral steps from all-MASK, then MDLM's "noise removal": if a token is still masked, one more forward pass
    fills every masked token with its argmax. NFE counts real forward passes (fewer than T with `cache`).

    `cond` (B, P) is a prompt, P = 0 for unconditional samples: its tokens fill the first P positions from the start,
    unmasked, so SUBS carries them through every step (the in-painting of SDTT's `project_fn`, which writes the
    prompt back after each step, gives the same samples). Each step draws as `s.draw` says."""
    batch, device = len(cond), cond.device
    z = torch.full((batch, seq_len), mask_id, dtype=torch.long, device=device)
    z[:, : cond.shape[1]] = cond
    ts = time_grid(s.steps).tolist()
    nfe, logp = 0, None
    for t, t_next in zip(ts[:-1], ts[1:]):
        if logp is None or not s.cache:
            logp, nfe = denoise(z), nfe + 1
        z_next = reverse_step(logp, z, t, t_next, mask_id, generator, draw_fn=DRAWS[s.draw])
        if s.cache and not torch.equal(z_next, z):
            logp = None
        z = z_next
    masked = z == mask_id
    # on the meta device (the cost mode, `bench.cost`) nothing can be read: the pass is counted, the bound of NFE
    if z.device.type == "meta" or masked.any():
        if logp is None or not s.cache:
            logp, nfe = denoise(z), nfe + 1
        z = torch.where(masked, logp.argmax(-1), z)
    return Samples(z, cond, Counter(nfe=batch * nfe, tokens=batch * (seq_len - cond.shape[1])))


def sample_teacher(teacher: MaskedDiffusionLM, cond: torch.Tensor, s: SamplingConfig, *,
                   generator: torch.Generator) -> Samples:
    """The teacher's own sampler: `sample_ancestral` with the teacher's denoiser."""
    return sample_ancestral(teacher.denoise, cond, teacher.seq_len, teacher.mask_id, s, generator=generator)


FAMILY = Family("masked-diffusion-lm", SamplingConfig, sample_teacher, sampler="mdlm",
                passes=lambda s, n: {"step": s.steps + 1})
