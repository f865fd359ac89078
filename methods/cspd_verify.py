"""CSpD's verification (Wang et al., arXiv:2411.11925), shared by its two family loops (`methods.cspd_causal`,
`methods.cspd_masked`).

A draft token x is accepted with probability min(1, r), r = Sigma * p(x | x_1^p) / q(x | x_1^q) (the last denoising
step's Gaussians, Eq. 9), Sigma being 1 (`exact`), Eq. 8's (`paper`) or its reciprocal with the exponent divided by
`inner_temperature` (`released`); a rejected token is resampled from max(0, Sigma p - q) by acceptance-rejection with
the target's last-step Gaussian as the proposal (Eq. 10-13). Two rules apply the test to a window: Leviathan's
truncation at the first rejection, with a bonus token when every draft is accepted (`exact`, `paper`), and the
released code's accept-or-replace of every draft on its own (`released`); docs/methods/cspd.md, 'Modes and knobs'.
The rules take the method's config (`methods.cspd.CSpDConfig`: `mode`, `inner_temperature`, `max_tries`).
Where the released code returns a zero token after `max_tries` failed proposals, every mode here returns the last
proposal (a draw from the target's last step) and counts the row in `resample_exhausted`.
Both rules add ||x^q - x^p||^2 of every draft and the target's own token at its position to `draft_target_sqdist`
(Table 4's E||x^q - x^p||^2 is it divided by the `drafts` counter).
"""
from __future__ import annotations

import math
from collections import Counter
from typing import Callable

import torch

from core.acceptance import NO_BONUS, count_each, count_prefix
from teachers.families.continuous_ar import HeadOutput


def log_density(x: torch.Tensor, mean: torch.Tensor, log_std: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    """log N(x; mean, diag(exp(log_std))^2) over the last dim, the exponent divided by scale^2; (...,)."""
    z = (x - mean) / (log_std.exp() * scale)
    return (-0.5 * z**2 - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)


def log_sigma(p: HeadOutput, q: HeadOutput, mode: str) -> torch.Tensor:
    """log Sigma of each token (M,): 0 (exact), Eq. 8 (paper) or its reciprocal (released)."""
    if mode == "exact":
        return torch.zeros_like(p.log_std_sum)
    return (q.log_std_sum - p.log_std_sum) * (1 if mode == "paper" else -1)


def acceptance_log_ratio(x, p: HeadOutput, q: HeadOutput, mode: str, inner_temperature: float) -> torch.Tensor:
    """log r for draft tokens x (M, D): r = Sigma p(x | x_1^p) / q(x | x_1^q), the released code's exponent / 42."""
    scale = inner_temperature if mode == "released" else 1.0
    return log_sigma(p, q, mode) + log_density(x, p.mean, p.log_std, scale) - log_density(x, q.mean, q.log_std, scale)


def residual_keep(log_p: torch.Tensor, log_q: torch.Tensor, log_sig: torch.Tensor) -> torch.Tensor:
    """alpha_s = max(0, Sigma p - q) / (Sigma p) of proposals x from p, given log p(x), log q(x) and log Sigma
    (Eq. 13)."""
    return (1 - torch.exp(log_q - log_p - log_sig)).clamp(min=0)


def residual_sample(propose: Callable[[int], torch.Tensor], log_p: Callable, log_q: Callable, log_sig: torch.Tensor,
                    generator: torch.Generator, max_tries: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Draw from max(0, Sigma p - q) / Z by acceptance-rejection with proposal p (Eq. 10-13), for M rows at once.

    propose(m) draws m proposals from p; log_p / log_q map (m, D) proposals to (m,) log densities; log_sig (M,).
    A proposal x is kept with probability alpha_s = max(0, 1 - q(x) / (Sigma p(x))). Returns the samples (M, D),
    the proposals each row used (M,), and which rows ran out of tries (their last proposal is returned).
    """
    M = len(log_sig)
    out, tries = None, torch.zeros(M, dtype=torch.long, device=log_sig.device)
    todo = torch.arange(M, device=log_sig.device)
    for _ in range(max_tries):
        x = propose(M)
        if out is None:
            out = x.clone()
        keep_p = residual_keep(log_p(x), log_q(x), log_sig)
        ok = torch.rand(M, generator=generator, device=x.device) < keep_p
        pending = torch.zeros(M, dtype=torch.bool, device=x.device)
        pending[todo] = True
        out[pending] = x[pending]  # rows still searching hold their latest proposal
        tries += pending
        todo = todo[~ok[todo]]
        if len(todo) == 0:
            break
    exhausted = torch.zeros(M, dtype=torch.bool, device=log_sig.device)
    exhausted[todo] = True
    return out, tries, exhausted


def truncate(config, drafts, p: HeadOutput, q: HeadOutput, room: torch.Tensor, bonus: Callable, generator,
             c: Counter) -> tuple[torch.Tensor, torch.Tensor]:
    """Leviathan's rule (exact, paper): accept the drafts up to the first rejection, then one more token, the
    residual sample at the rejected position or, where a row has `room` (M,) for it, the target's own bonus
    token (`bonus(rows)` -> (m, D)). Returns new tokens (M, g+1, D) and how many of them each row commits (M,)."""
    M, g, _ = drafts.shape
    _count_distance(drafts, p, c)
    log_r = acceptance_log_ratio(drafts, p, q, config.mode, config.inner_temperature)  # (M, g)
    ok = torch.rand(M, g, generator=generator, device=drafts.device).log() < log_r
    n = ok.long().cumprod(1).sum(1)  # accepted prefix
    new = torch.cat([drafts, torch.zeros_like(drafts[:, :1])], 1)
    rej = (n < g).nonzero().squeeze(1)
    new[rej, n[rej]] = _residual(config, at_rows(p, rej, n[rej]), at_rows(q, rej, n[rej]), generator, c)
    extra = ((n == g) & room).nonzero().squeeze(1)
    if len(extra):
        new[extra, g] = bonus(extra)
        c["head_chains"] += len(extra)
    c.update(drafts_verified=int(torch.where(n < g, n + 1, n).sum()), drafts_accepted=int(n.sum()),
             bonus_tokens=len(extra))
    count_prefix(c, n, torch.full_like(n, g))
    c[NO_BONUS] += int(((n == g) & ~room).sum())
    return new, torch.where((n < g) | room, n + 1, n)


def accept_each(config, x, p: HeadOutput, q: HeadOutput, generator, c: Counter) -> tuple[torch.Tensor, torch.Tensor]:
    """The released code's rule on drafts x (..., D): each accepted with probability min(1, r) or replaced by a
    residual sample, on its own. Returns the tokens and which drafts were accepted (...)."""
    _count_distance(x, p, c)
    log_r = acceptance_log_ratio(x, p, q, config.mode, config.inner_temperature)
    ok = torch.rand(log_r.shape, generator=generator, device=x.device).log() < log_r
    new, rejected = x.clone(), (~ok).nonzero(as_tuple=True)
    new[rejected] = _residual(config, at_rows(p, *rejected), at_rows(q, *rejected), generator, c)
    c.update(drafts_verified=ok.numel(), drafts_accepted=int(ok.sum()))
    return new, ok


def replace_each(config, drafts, p: HeadOutput, q: HeadOutput, generator, c: Counter) -> tuple[torch.Tensor, int]:
    """`accept_each` on a causal window: every row commits all g. Returns the tokens (M, g+1, D) (the last slot
    unused) and the first slot the models must re-read (the first any row replaced; at most g-1, so one token is
    always pending)."""
    new, ok = accept_each(config, drafts, p, q, generator, c)
    replaced = (~ok).nonzero(as_tuple=True)[1]
    M, g = ok.shape
    count_each(c, torch.arange(1, g + 1, device=ok.device).repeat(M), ok.flatten(), M)
    first = min(int(replaced.min()) if len(replaced) else g, g - 1)
    return torch.cat([new, torch.zeros_like(new[:, :1])], 1), first


def _count_distance(drafts: torch.Tensor, p: HeadOutput, c: Counter) -> None:
    """Add the squared distances ||x^q - x^p||^2 of drafts (..., D) to the target's own tokens at their positions
    (Table 4), summed in float32 (a half-precision sum over a batch's drafts overflows)."""
    c["draft_target_sqdist"] += float((drafts.float() - p.x0.float()).square().sum())


def _residual(config, p: HeadOutput, q: HeadOutput, generator, c: Counter) -> torch.Tensor:
    """Residual samples for rejected tokens (rows of p, q)."""
    propose = lambda m: p.mean + p.log_std.exp() * torch.randn(p.mean.shape, generator=generator,  # noqa: E731
                                                               device=p.mean.device)
    x, tries, exhausted = residual_sample(propose, lambda x: log_density(x, p.mean, p.log_std),
                                          lambda x: log_density(x, q.mean, q.log_std), log_sigma(p, q, config.mode),
                                          generator, config.max_tries)
    c.update(resampled=len(x), resample_tries=int(tries.sum()), resample_exhausted=int(exhausted.sum()))
    return x


def stack(outs: list[HeadOutput]) -> HeadOutput:
    """Head outputs of successive tokens (each (M, ...)) as one (M, len(outs), ...)."""
    return HeadOutput(*(torch.stack([getattr(o, f) for o in outs], 1) for f in HeadOutput.__dataclass_fields__))


def unflatten(out: HeadOutput, M: int) -> HeadOutput:
    return HeadOutput(*(getattr(out, f).unflatten(0, (M, -1)) for f in HeadOutput.__dataclass_fields__))


def at_rows(out: HeadOutput, *index: torch.Tensor) -> HeadOutput:
    return HeadOutput(*(getattr(out, f)[index] for f in HeadOutput.__dataclass_fields__))
