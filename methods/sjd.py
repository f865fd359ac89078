"""`sjd`: Speculative Jacobi Decoding (Teng et al., arXiv:2410.01699, ICLR 2025).

A training-free, distribution-preserving Jacobi loop for AR-token models (image tokens and text alike). Each forward
pass feeds the pending token plus W-1 drafts; a draft is accepted with probability min(1, p/q) (Eq. 1), the first
rejected position is resampled from the residual max(0, p - q) (Eq. 2), later positions are refined with this pass's
samples (Eq. 3) and become the next drafts, the window is refilled by an initialisation scheme, and the KV cache is
rolled back to the committed prefix. Semantics follow the note (shared/notes/sjd_speculative_jacobi_decoding.md
§1.5-1.6): the window includes the pending token, a full accept adds a bonus token, fresh drafts carry a one-hot draft
distribution.

The same loop with the exact-match criterion is Jacobi decoding (`methods/jacobi.py`).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import ClassVar, Literal

import torch

from bench.errors import UserError
from bench.samples import Samples
from methods.base import Method, Passes
from teachers.families import ar_token
from teachers.families.ar_token import draw, process

InitScheme = Literal["random", "repeat-left", "repeat-above", "sample-left", "sample-above"]


@dataclass(frozen=True)
class SJDConfig:
    sampling: ar_token.SamplingConfig = ar_token.SamplingConfig()
    window: int = 16  # W: tokens per forward pass, the pending token included; W = 1 is plain AR
    init: InitScheme = "random"  # how new draft slots are filled (the paper's random / spatial-prior init)
    ar_head: int = 0  # first tokens decoded one per pass
    ar_tail: int = 0  # last tokens decoded one per pass
    refine: bool = True  # Eq. 3; False is the App. F "no refinement" ablation
    # Greedy verification is Jacobi decoding's (`methods.jacobi`); SJD's speculative rule verifies samples.
    greedy_allowed: ClassVar[bool] = False

    def __post_init__(self):
        if self.sampling.greedy and not self.greedy_allowed:
            raise ValueError("greedy must be false: SJD verifies sampled drafts (greedy decoding is method jacobi "
                             "with greedy=true)")
        if self.window < 1:
            raise ValueError(f"window must be >= 1, got {self.window}")
        if self.ar_head < 0 or self.ar_tail < 0:
            raise ValueError(f"ar_head and ar_tail must be >= 0, got {self.ar_head}, {self.ar_tail}")


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Eq. 2, unnormalised: max(0, p - q), to resample from after rejecting a draft drawn from q (target p).

    `draw` normalises by the cumulative sum, so the division is left to it. A rejection implies p(d) < q(d), hence
    q(d) > 0 and, both summing to one, some x with p(x) > q(x): the residual mass is positive.
    """
    return (p - q).clamp(min=0)


def speculative_rule(P, drafts, qs, S, generator):
    """Verify drafts left to right; returns (number accepted, replacement token at the first rejection or None)."""
    p_d = P.gather(1, drafts[:, None]).squeeze(1)
    q_d = qs.gather(1, drafts[:, None]).squeeze(1)
    u = torch.rand(len(drafts), generator=generator, device=P.device)
    rejected = (u * q_d >= p_d).nonzero()  # Eq. 1: accept iff u < min(1, p/q), i.e. u * q < p for u in [0, 1)
    if len(rejected) == 0:
        return len(drafts), None
    n_ok = int(rejected[0])
    return n_ok, draw(residual(P[n_ok], qs[n_ok]), generator)


def exact_match_rule(P, drafts, qs, S, generator):
    """Jacobi decoding: a draft is accepted iff it equals this pass's token at its position (released code)."""
    same = (drafts == S[: len(drafts)]).long()
    n_ok = int(same.cumprod(0).sum())
    return n_ok, (None if n_ok == len(drafts) else S[n_ok])


class _Drafter:
    """Fills new draft slots; fresh drafts carry a one-hot draft distribution, which keeps SJD exact for any rule."""

    def __init__(self, scheme: str, vocab: int, row: int, generator):
        self.scheme, self.vocab, self.row, self.generator = scheme, vocab, row, generator

    def fill(self, start: int, stop: int, seq: torch.Tensor, dists: torch.Tensor) -> None:
        """Write drafts into seq[start:stop] and their one-hot distributions into dists[start:stop]."""
        if self.scheme == "random":
            seq[start:stop] = torch.randint(self.vocab, (stop - start,), generator=self.generator, device=seq.device)
        elif self.scheme == "repeat-left":  # every new draft repeats its left neighbour: the last known token
            seq[start:stop] = seq[start - 1]
        else:  # the source may be a slot filled in this same call, so go left to right
            for pos in range(start, stop):
                above = self.scheme.endswith("above") and pos >= self.row
                src = pos - self.row if above else pos - 1
                seq[pos] = seq[src] if self.scheme.startswith("repeat") else draw(dists[src], self.generator)
                dists[pos].zero_()[seq[pos]] = 1.0
        dists[start:stop] = 0.0
        dists[start:stop].scatter_(1, seq[start:stop, None], 1.0)


@torch.inference_mode()
def jacobi_decode(teacher, cond: torch.Tensor, c: SJDConfig, generator, rule):
    """Decode one sequence (cond: (1, P)); returns tokens (N,) and counters."""
    N, V, s = teacher.seq_len, teacher.vocab_size, c.sampling
    greedy = s.greedy
    drafter = _Drafter(c.init, V, teacher.grid[-1], generator)
    state, logits = teacher.start(cond, cfg=s.cfg)
    P0 = process(logits[0], s)  # (V,)
    # Positions [0, n_out) are committed (their keys/values cached), n_out holds the pending token, and
    # (n_out, n_out + n_drafts] the drafts. dists holds each position's draft distribution q (one-hot for fresh
    # drafts, the predicted distribution for refined ones) and, once decided, its predicted distribution.
    seq = torch.zeros(N, dtype=torch.long, device=P0.device)
    dists = torch.zeros(N, V, device=P0.device)
    seq[0], dists[0] = draw(P0, generator, greedy), P0
    n_out, n_drafts = 0, 0
    counts = Counter(nfe=1, tokens=N)
    while n_out + 1 < N:
        remaining = N - 1 - n_out  # positions after the pending token
        L = 1 if n_out + 1 < c.ar_head else min(c.window, max(1, remaining - c.ar_tail))
        n_drafts = min(n_drafts, L - 1)
        if n_drafts < L - 1:
            drafter.fill(n_out + 1 + n_drafts, n_out + L, seq, dists)
        drafts, qs = seq[n_out + 1 : n_out + L], dists[n_out + 1 : n_out + L]
        P = process(teacher.extend(state, seq[n_out : n_out + L].view(1, L))[0], s)  # (L, V); row t predicts n_out+1+t
        counts["nfe"] += 1
        S = draw(P, generator, greedy)  # this pass's tokens: refinements and the bonus token
        if L > 1:
            n_ok, replacement = rule(P, drafts, qs, S, generator)
            counts["drafts_verified"] += n_ok + (replacement is not None)
            counts["drafts_accepted"] += n_ok
        else:
            n_ok, replacement = 0, None
        pend = n_out + 1 + n_ok  # the pending token and the accepted drafts are committed
        teacher.rollback(state, pend)
        if replacement is None:  # every draft accepted: the last row gives a bonus token
            seq[pend], dists[pend] = S[L - 1], P[L - 1]
            n_drafts = 0
        else:  # Eq. 3: the positions after the rejection take this pass's samples and distributions as drafts
            seq[pend], dists[pend] = replacement, P[n_ok]
            n_drafts = L - 1 - n_ok if c.refine else 0  # rows n_ok+1 .. L-1, the bonus row included
            seq[pend + 1 : pend + 1 + n_drafts] = S[n_ok + 1 : L][:n_drafts]
            dists[pend + 1 : pend + 1 + n_drafts] = P[n_ok + 1 : L][:n_drafts]
        n_out = pend
    return seq, counts


class SJD(Method):
    """Speculative Jacobi Decoding: Jacobi windows verified by speculative sampling (lossless, training-free)."""

    headline = True
    families = (ar_token.FAMILY,)
    Config = SJDConfig
    batch_size_one = True
    key_knobs = ("window", "init")
    rule = staticmethod(speculative_rule)

    @classmethod
    def passes(cls, config: SJDConfig, family, length: int) -> dict[str, Passes]:
        return {"method": Passes({"window": length}, at_most=True)}  # a window commits at least one token

    def __init__(self, teacher, config: SJDConfig):
        super().__init__(teacher, config)
        if config.init.endswith("above") and len(teacher.grid) < 2:
            raise UserError(f"init {config.init!r} reads the token above: teacher {teacher.name!r} has a 1-D grid "
                            f"{teacher.grid}; use random, repeat-left or sample-left")

    def sample(self, cond, *, generator):
        tokens, counts = jacobi_decode(self.teacher, cond, self.config, generator, self.rule)
        return Samples(tokens.view(1, -1), cond, counts)
