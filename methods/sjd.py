"""`sjd`: Speculative Jacobi Decoding (Teng et al., arXiv:2410.01699, ICLR 2025).

A training-free, distribution-preserving Jacobi loop for AR-token models (image tokens and text alike). Each forward
pass feeds the pending token plus W-1 drafts; a draft is accepted with probability min(1, p/q) (Eq. 1), the first
rejected position is resampled from the residual max(0, p - q) (Eq. 2), later positions are refined with this pass's
samples (Eq. 3) and become the next drafts, the window is refilled by an initialisation scheme, and the KV cache is
rolled back to the committed prefix. Semantics follow the released code
(tyshiwo1/Accelerating-T2I-AR-with-SJD): the window includes the pending token, a full accept adds a bonus token,
fresh drafts carry a one-hot draft distribution.

The same loop with the exact-match criterion is Jacobi decoding (`methods/jacobi.py`).

A batch runs one such loop per row in shared forward passes: each row has its own committed length, drafts, window
and rollback, and the rules decide per row on random numbers of its own, so each row's tokens follow the teacher's
law exactly as at batch size 1. Windows are padded to the longest live one (padding is never verified nor committed;
the teacher's ragged state masks it from the row's real tokens and the rollback drops it), and a finished row leaves
the batch (`select`), so later passes spend nothing on it.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import ClassVar, Literal

import torch
import torch.nn.functional as F

from core.acceptance import count_prefix
from core.errors import UserError
from core.samples import Samples
from methods.base import Method, Passes
from methods.lantern import relaxed_rule
from methods.verify import draft_masses, verify
from teachers.families import ar_token
from teachers.families.ar_token import draw, process

# `sample-*` draws from the neighbour's stored distribution, as the paper describes the spatial prior (Sec. 4.2);
# `top1-*` takes its most likely token, as the released `sample_horizon` does (it keeps the top-1 of that distribution,
# scheduler/jacobi_iteration_lumina_mgpt.py `get_multi_token_for_preparation`) and eval_model.py:84 defaults to.
InitScheme = Literal["random", "repeat-left", "repeat-above", "sample-left", "sample-above", "top1-left", "top1-above"]
Verify = Literal["exact", "lantern"]


@dataclass(frozen=True)
class SJDConfig:
    sampling: ar_token.SamplingConfig = ar_token.SamplingConfig()
    window: int = 16  # W: tokens per forward pass, the pending token included; W = 1 is plain AR
    init: InitScheme = "random"  # how new draft slots are filled (the paper's random / spatial-prior init)
    ar_head: int = 0  # first tokens decoded one per pass
    ar_tail: int = 0  # last tokens decoded one per pass
    refine: bool = True  # Eq. 3; False is the App. F "no refinement" ablation
    # `lantern`: LANTERN's relaxed acceptance (`methods.lantern`, lossy), its k nearest codes, budget delta, or
    # LANTERN++'s lambda where > 1 (entrypoints/generate_images.py:54-55 of jadohu/LANTERN)
    verify: Verify = "exact"
    lantern_k: int = 1000
    lantern_delta: float = 0.1
    lantern_lambda: float = 0.0
    # Greedy verification is Jacobi decoding's (`methods.jacobi`); SJD's speculative rule verifies samples.
    greedy_allowed: ClassVar[bool] = False
    verify_modes: ClassVar[tuple[str, ...]] = ("exact", "lantern")  # a method with its own rule has only "exact"

    def __post_init__(self):
        if self.sampling.greedy and not self.greedy_allowed:
            raise ValueError("greedy must be false: SJD verifies sampled drafts (greedy decoding is method jacobi "
                             "with greedy=true)")
        if self.verify not in self.verify_modes:
            raise ValueError(f"verify must be one of {', '.join(self.verify_modes)} here, got {self.verify!r}")
        if self.lantern_k < 1 or not 0 <= self.lantern_delta <= 1 or self.lantern_lambda < 0:
            raise ValueError(f"lantern_k must be >= 1, lantern_delta in [0, 1] and lantern_lambda >= 0, got "
                             f"{self.lantern_k}, {self.lantern_delta}, {self.lantern_lambda}")
        if self.window < 1:
            raise ValueError(f"window must be >= 1, got {self.window}")
        if self.ar_head < 0 or self.ar_tail < 0:
            raise ValueError(f"ar_head and ar_tail must be >= 0, got {self.ar_head}, {self.ar_tail}")


def speculative_rule(P, drafts, qs, S, n_valid, generator):
    """Verify each row's drafts left to right (Eq. 1) and resample its first rejection from the residual (Eq. 2).

    P (M, L, V) this pass's distributions (row t predicts the position of draft t), drafts (M, L-1) with their draft
    distributions qs (M, L-1, V), S (M, L) this pass's tokens, n_valid (M,) each row's real drafts (the rest pads the
    window). Returns the drafts accepted per row (M,) and the token at each row's first rejection (M,), meaningful
    where fewer than n_valid were accepted. A rule may also return the tokens (M, L) and draft distributions
    (M, L, V) that refine the positions after the commit in place of S and P (`methods.scd`'s maximal coupling).
    """
    n_ok, replacement, _ = verify(P, drafts, qs, n_valid, generator, *draft_masses(P, drafts, qs))
    return n_ok, replacement


def exact_match_rule(P, drafts, qs, S, n_valid, generator):
    """Jacobi decoding: a draft is accepted iff it equals this pass's token at its position (released code); the
    first mismatch takes this pass's token. Arguments and returns as `speculative_rule`'s."""
    D = drafts.shape[1]
    same = (drafts == S[:, :D]) & (torch.arange(D, device=S.device) < n_valid[:, None])  # (M, D)
    n_ok = same.long().cumprod(1).sum(1)  # (M,)
    return n_ok, S.gather(1, n_ok[:, None]).squeeze(1)


def random_tokens(n: int, vocab: int, pool: torch.Tensor | None, generator, device) -> torch.Tensor:
    """n fresh random drafts (n,): uniform over `pool` (a teacher's `draft_tokens`), or over the whole vocabulary when
    it is None."""
    if pool is None:
        return torch.randint(vocab, (n,), generator=generator, device=device)
    pool = pool.to(device)
    return pool[torch.randint(len(pool), (n,), generator=generator, device=device)]


class _Drafter:
    """Fills new draft slots; fresh drafts carry a one-hot draft distribution, which keeps SJD exact for any rule.
    Random drafts are uniform over `draft` (the teacher's `draft_tokens`: SJD's release draws Chameleon's 8192 image
    tokens, scheduler/jacobi_iteration_lumina_mgpt.py:502-509 with `img_vocab` of :879-886), or over the whole
    vocabulary when it is None."""

    def __init__(self, scheme: str, vocab: int, row: int, generator, draft: torch.Tensor | None = None):
        self.scheme, self.vocab, self.row, self.generator, self.draft = scheme, vocab, row, generator, draft

    def fill(self, start: torch.Tensor, stop: torch.Tensor, seq: torch.Tensor, dists: torch.Tensor) -> None:
        """Per row m, write drafts into seq[m, start[m]:stop[m]] and their one-hot distributions into dists."""
        width = stop - start  # (M,)
        J = int(width.max()) if len(width) else 0
        if J <= 0:
            return
        offset = torch.arange(J, device=seq.device)
        cols = start[:, None] + offset  # (M, J)
        fresh = offset < width[:, None]  # (M, J)
        rows = torch.arange(len(seq), device=seq.device)[:, None].expand_as(cols)
        r, pos = rows[fresh], cols[fresh]
        if self.scheme == "random":
            seq[r, pos] = random_tokens(len(r), self.vocab, self.draft, self.generator, seq.device)
        elif self.scheme == "repeat-left":  # every new draft repeats its left neighbour: the last known token
            seq[r, pos] = seq[r, start[r] - 1]
        else:  # the source may be a slot filled in this same call, so go left to right
            for j in range(J):
                rj = fresh[:, j].nonzero().squeeze(1)
                pj = cols[rj, j]
                src = torch.where(pj >= self.row, pj - self.row, pj - 1) if self.scheme.endswith("above") else pj - 1
                seq[rj, pj] = (seq[rj, src] if self.scheme.startswith("repeat")
                               else draw(dists[rj, src], self.generator, greedy=self.scheme.startswith("top1")))
                dists[rj, pj] = F.one_hot(seq[rj, pj], self.vocab).to(dists.dtype)
        dists[r, pos] = F.one_hot(seq[r, pos], self.vocab).to(dists.dtype)


def batch_refusal(teacher, batch_size: int) -> str | None:
    """One line refusing a batch of more than one sequence on a teacher (class or instance) without a ragged cache:
    its rows cannot hold different lengths."""
    if batch_size == 1 or getattr(teacher, "ragged_cache", False):
        return None
    name = getattr(teacher, "name", None) or getattr(teacher, "__name__", type(teacher).__name__)
    return (f"teacher {name!r} keeps one cache length for every row of a batch: decode it with SJD or Jacobi at "
            f"batch_size 1, got {batch_size}")


class IndependentDraws:
    """How a pass's tokens are drawn: each row of each window independently from its distribution (SJD). A coupled
    scheme (`methods.scd.GumbelDraws`) reuses a position's randomness across passes until the position is decided."""

    def __init__(self, generator, greedy: bool):
        self.generator, self.greedy = generator, greedy

    def first(self, P0: torch.Tensor) -> torch.Tensor:  # (B, V) -> (B,) the first token, from the prefill's logits
        return draw(P0, self.generator, self.greedy)

    def window(self, P: torch.Tensor, n_out: torch.Tensor, L_row: torch.Tensor) -> torch.Tensor:
        return draw(P, self.generator, self.greedy)  # (M, L, V) -> (M, L); row t predicts position n_out + 1 + t

    def decided(self, m: torch.Tensor, L_row: torch.Tensor) -> None:
        """After a pass of windows L_row (M,) that decided m (M,) positions per row."""

    def select(self, live: torch.Tensor) -> None:
        """The rows `live` stay in the batch (`ARTokenTeacher.select`)."""


@torch.inference_mode()
def jacobi_decode(teacher, cond: torch.Tensor, c: SJDConfig, generator, rule, draws=None):
    """Decode a batch of sequences (cond: (B, P)); returns tokens (B, N) and counters: `nfe` the passes each row went
    through, summed over rows (as B sequences decoded one by one would count), `batch_forwards` the passes of the
    batch, `tokens`, `drafts_verified` and `drafts_accepted` summed over rows. `draws` draws each pass's tokens
    (`IndependentDraws` by default)."""
    B, N, V, s = len(cond), teacher.seq_len, teacher.vocab_size, c.sampling
    if refusal := batch_refusal(teacher, B):
        raise UserError(refusal)
    ragged = B > 1  # a lone row needs no per-row lengths
    draws = draws or IndependentDraws(generator, s.greedy)
    drafter = _Drafter(c.init, V, teacher.grid[-1], generator, ar_token.draft_vocabulary(teacher))
    state, logits = teacher.start(cond, cfg=s.cfg, ragged=True) if ragged else teacher.start(cond, cfg=s.cfg)
    P0 = process(logits, s)  # (B, V)
    device = P0.device
    # Per live row m (row rows[m] of the batch): positions [0, n_out[m]) are committed (their keys/values cached),
    # n_out[m] holds the pending token, and (n_out[m], n_out[m] + n_drafts[m]] the drafts. dists holds each
    # position's draft distribution q (one-hot for fresh drafts, the predicted distribution for refined ones) and,
    # once decided, its predicted distribution.
    out = torch.empty(B, N, dtype=torch.long, device=device)
    seq = torch.zeros(B, N, dtype=torch.long, device=device)
    dists = torch.zeros(B, N, V, device=device)
    seq[:, 0], dists[:, 0] = draws.first(P0), P0
    one = torch.ones(B, dtype=torch.long, device=device)
    draws.decided(one, one)  # the prefill is a pass of one position
    rows = torch.arange(B, device=device)
    n_out = torch.zeros(B, dtype=torch.long, device=device)
    n_drafts = torch.zeros_like(n_out)
    counts = Counter(nfe=B, batch_forwards=1, tokens=B * N)
    while True:
        done = n_out + 1 >= N
        if done.any():  # finished rows leave the batch, so no later pass spends compute on them
            out[rows[done]] = seq[done]
            if done.all():
                break
            live = (~done).nonzero().squeeze(1)
            teacher.select(state, live)
            draws.select(live)
            rows, seq, dists, n_out, n_drafts = rows[live], seq[live], dists[live], n_out[live], n_drafts[live]
        M = len(rows)
        remaining = N - 1 - n_out  # (M,) positions after the pending token
        width = (remaining - c.ar_tail).clamp(min=1, max=c.window)
        L_row = torch.where(n_out + 1 < c.ar_head, 1, width)  # (M,) each row's window
        L, n_valid = int(L_row.max()), L_row - 1
        n_drafts = torch.minimum(n_drafts, n_valid)
        drafter.fill(n_out + 1 + n_drafts, n_out + L_row, seq, dists)
        slot = torch.arange(L, device=device)
        idx = (n_out[:, None] + slot).clamp(max=N - 1)  # (M, L); slots past a row's window pad it
        window = seq.gather(1, idx)
        P = process(teacher.extend(state, window), s)  # (M, L, V); row t predicts position n_out + 1 + t
        counts.update(nfe=M, batch_forwards=1)
        S = draws.window(P, n_out, L_row)  # (M, L) this pass's tokens: refinements and the bonus tokens
        refined = P
        if L > 1:
            qs = dists.gather(1, idx[:, 1:, None].expand(M, L - 1, V))  # (M, L-1, V)
            n_ok, replacement, *coupled = rule(P, window[:, 1:], qs, S, n_valid, generator)
            if coupled:
                S, refined = coupled
        else:
            n_ok = replacement = torch.zeros_like(n_out)
        rejected = n_ok < n_valid  # (M,); otherwise every draft was accepted and the last real row gives a bonus
        counts["drafts_verified"] += int((n_ok + rejected).sum())
        counts["drafts_accepted"] += int(n_ok.sum())
        count_prefix(counts, n_ok, n_valid)  # a bonus always fits: the window stops at the sequence's last token
        pend = n_out + 1 + n_ok  # the pending token and the accepted drafts are committed
        teacher.rollback(state, pend if ragged else int(pend))
        # Position pend + j takes this pass's row n_ok + j: j = 0 the decided token (the bonus, or the rejected
        # position's distribution), and with refinement (Eq. 3) j = 1 .. n_valid - n_ok the next drafts, the bonus
        # row included. Padding rows (t >= L_row) are never read.
        take = slot[None] <= (n_valid - n_ok)[:, None] if c.refine else (slot == 0)[None].expand(M, L)
        r, j = take.nonzero(as_tuple=True)
        seq[r, pend[r] + j], dists[r, pend[r] + j] = S[r, n_ok[r] + j], refined[r, n_ok[r] + j]
        hit = rejected.nonzero().squeeze(1)
        seq[hit, pend[hit]] = replacement[hit]  # Eq. 2: the residual sample (or Jacobi's refreshed token)
        n_drafts = torch.where(rejected, n_valid - n_ok, 0) if c.refine else torch.zeros_like(n_out)
        draws.decided(n_ok + 1, L_row)
        n_out = pend
    return out, counts


class SJD(Method):
    """Speculative Jacobi Decoding: Jacobi windows verified by speculative sampling (lossless, training-free). A batch
    of more than one sequence needs a teacher with a ragged cache (`ARTokenTeacher.ragged_cache`)."""

    headline = True
    families = (ar_token.FAMILY,)
    Config = SJDConfig
    key_knobs = ("window", "init", "verify")  # verify: a lantern run is not the paper's headline SJD
    window_knob = "window"  # Jacobi inherits it
    rule = staticmethod(speculative_rule)

    @classmethod
    def batch_refusal(cls, teacher_cls: type, batch_size: int) -> str | None:
        return batch_refusal(teacher_cls, batch_size)

    @classmethod
    def passes(cls, config: SJDConfig, family, length: int) -> dict[str, Passes]:
        # per sample, at any batch size: each window commits at least one token of its row
        return {"method": Passes({"window": length}, at_most=True)}

    @classmethod
    def lossless(cls, knobs):
        if knobs.get("verify") == "lantern":  # docs/guide/lossless.md: the table model, 20,000 draws
            return "lossy: TV 0.03 at k 1000, delta 0.1 (0.03-0.11 as delta grows)"
        return "certified: tests/test_sjd.py"

    def __init__(self, teacher, config: SJDConfig):
        super().__init__(teacher, config)
        if config.verify == "lantern":
            self.rule = relaxed_rule(teacher, config.lantern_k, config.lantern_delta, config.lantern_lambda)
        if config.init.endswith("above") and len(teacher.grid) < 2:
            raise UserError(f"init {config.init!r} reads the token above: teacher {teacher.name!r} has a 1-D grid "
                            f"{teacher.grid}; use random, repeat-left, sample-left or "
                            f"top1-left")

    def draws(self, batch: int, generator) -> IndependentDraws:
        """How each pass's tokens are drawn for a batch of `batch` sequences (a coupled scheme overrides it)."""
        return IndependentDraws(generator, self.config.sampling.greedy)

    def sample(self, cond, *, generator):
        tokens, counts = jacobi_decode(self.teacher, cond, self.config, generator, self.rule,
                                       self.draws(len(cond), generator))
        return Samples(tokens, cond, counts)
