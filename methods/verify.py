"""The speculative test every SJD-style verifier shares (Teng et al., arXiv:2410.01699, Eq. 1 and 2;
`docs/methods/sjd.md`): SJD's own rule (`methods.sjd.speculative_rule`) and the relaxed ones of its descendants
(`methods.gsd`, `methods.lantern`) differ only in the masses they test a draft with."""
from __future__ import annotations

import torch

from teachers.families.ar_token import draw


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Eq. 2, unnormalised: max(0, p - q), to resample from after rejecting a draft drawn from q (target p).

    `draw` normalises by the cumulative sum, so the division is left to it. A rejection implies p(d) < q(d), hence
    q(d) > 0 and, both summing to one, some x with p(x) > q(x): the residual mass is positive.
    """
    return (p - q).clamp(min=0)


def verify(P, drafts, qs, n_valid, generator, p_d, q_d):
    """Eq. 1 and 2 given each draft's target and draft masses p_d, q_d (M, D): a draft is accepted with probability
    min(1, p_d / q_d), left to right, and each row's first rejection is resampled from the token-level residual.
    SJD's masses are the draft token's own (`speculative_rule`); relaxed rules (`methods.gsd`, `methods.lantern`) pass
    those of a neighbourhood of it. Returns the drafts accepted per row (M,), the token at each row's first rejection
    (M,), meaningful where fewer than n_valid were accepted, and whether each draft passed its test (M, D)."""
    M, D = drafts.shape
    u = torch.rand(M, D, generator=generator, device=P.device)
    padding = torch.arange(D, device=P.device) >= n_valid[:, None]  # (M, D)
    ok = (u * q_d < p_d) & ~padding  # Eq. 1: accept iff u < min(1, p/q), i.e. u * q < p for u in [0, 1)
    n_ok = ok.long().cumprod(1).sum(1)  # (M,) drafts before the first stop
    replacement = torch.zeros_like(n_ok)
    hit = (n_ok < n_valid).nonzero().squeeze(1)
    replacement[hit] = draw(residual(P[hit, n_ok[hit]], qs[hit, n_ok[hit]]), generator)
    return n_ok, replacement, ok


def draft_masses(P, drafts, qs):
    """Each draft's target and draft probability (M, D), D = drafts.shape[1]."""
    D = drafts.shape[1]
    return P[:, :D].gather(2, drafts[..., None]).squeeze(2), qs.gather(2, drafts[..., None]).squeeze(2)
