"""`scd`: Speculative Coupled Decoding (So et al., arXiv:2510.24211, ICML 2026; v1 "MC-SJD"), `docs/methods/scd.md`.

SJD (`methods.sjd`) with drafts coupled across Jacobi iterations: a position's draft in one pass and its sample in the
next are drawn with shared randomness, so a draft whose context did not change is drawn again unchanged, the later
positions' contexts stay put, and their drafts converge. Acceptance at one position is still 1 - TV(p, q), as SJD's;
the gain is in how stable the window is. Two couplings, as the release (junhyukso/SCD @ 7322379) implements them for
Lumina-mGPT:

- `gumbel` (lumina1/scheduler/jacobi_iteration_lumina_mgpt_GS.py): every token of a pass is argmax(log p + G) with G
  the Gumbel transform of a uniform vector kept per window slot (GS:36-53 the draw, :1096 the table made once per
  generation, :1192-1195 the table shifted by the committed count after a pass). Verification is SJD's, with fresh
  uniforms and a residual draw (GS:281-349).
- `maximal` (lumina1/scheduler/jacobi_iteration_lumina_mgpt_SCDMC.py): the verifier goes on past the first rejection
  (MC:248-322, SJD's `break` removed): every draft is kept with probability min(1, p/q) or redrawn from the residual,
  which is the maximal coupling of q and p; commits still stop at the first rejection, and the coupled tokens after it
  are the next drafts.

Each as released, and exact, is a `mode` (our reading of the release, with the enumeration behind it:
`docs/methods/scd.md`):

- `released` `gumbel`: a pass of one position (the prefill, `ar_head`, `ar_tail`, a window cut to one at the end) does
  not shift the table (GS:1193), so consecutive positions decoded one per pass reuse slot 0's noise: correlated, not
  the teacher's law. `exact` keys the noise by position: a position keeps its noise until it is decided, then it is
  dropped, in every pass.
- `released` `maximal`: a kept draft carries its old draft distribution q as its next draft distribution (MC:290-293),
  a redrawn one p (MC:315); the law of the coupled token is p either way, so the next verification compares with the
  wrong q and the committed law drifts from the teacher's. `exact` stores p for both (as the release's Cosmos sampler
  does, cosmos/cosmos1/models/autoregressive/sjd/speculative_sampler.py:121-150).

The window defaults to 32, the release's (lumina1/test_SCD_GS.py:64; its SJD baseline runs 16,
jacobi_iteration_lumina_mgpt_sjd.py:413-424). Batches run as SJD's: each row has its own noise table and decisions.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from methods.sjd import SJD, IndependentDraws, SJDConfig
from methods.verify import draft_masses, residual, verify
from teachers.families.ar_token import draw

Coupling = Literal["gumbel", "maximal"]
Mode = Literal["released", "exact"]


@dataclass(frozen=True)
class SCDConfig(SJDConfig):
    window: int = 32  # lumina1/test_SCD_GS.py:64 (`max_num_new_tokens`), the pending token included
    coupling: Coupling = "gumbel"  # the paper's cheaper coupling; `maximal` is v1's MC-SJD
    mode: Mode = "released"  # `exact`: the fix of each coupling's departure from the teacher's law (module doc)
    verify_modes = ("exact",)  # its own rule


def gumbel_argmax(P: torch.Tensor, U: torch.Tensor) -> torch.Tensor:
    """argmax(log P + G), G = -log(-log U): an exact draw from P given uniforms U of P's shape (the Gumbel-max trick;
    a zero-probability token scores -inf and never wins). The release adds 1e-9 inside both logs (GS:45); U here is
    drawn in (0, 1), where the transform is finite, so nothing is added."""
    return (P.log() - (-U.log()).log()).argmax(-1)


class GumbelDraws(IndependentDraws):
    """Each row's noise: a table of W uniform vectors over the vocabulary, slot (base + t) % W read by window row t
    (position n_out + 1 + t). After a pass that decided m positions the base moves on by m and the m slots it left
    get fresh uniforms, so a position keeps its noise from the pass that first reads it until it is decided (GS:1096,
    1192-1195). `shift_alone` False is the release's: a pass of one position moves nothing (GS:1193)."""

    def __init__(self, batch: int, window: int, vocab: int, generator, *, shift_alone: bool):
        super().__init__(generator, greedy=False)
        self.W, self.shift_alone = window, shift_alone
        self.device = generator.device
        self.table = self._uniforms((batch, window, vocab))  # (M, W, V)
        self.base = torch.zeros(batch, dtype=torch.long, device=self.device)

    def _uniforms(self, shape) -> torch.Tensor:
        # torch.rand is in [0, 1): 0 would make an infinite Gumbel; one draw in 2^24 moved to the smallest float
        return torch.rand(shape, generator=self.generator, device=self.device).clamp_(min=torch.finfo().tiny)

    def _slots(self, L: int) -> torch.Tensor:  # (M, L) the slot each window row reads
        return (self.base[:, None] + torch.arange(L, device=self.device)) % self.W

    def first(self, P0):
        rows = torch.arange(len(P0), device=self.device)
        return gumbel_argmax(P0, self.table[rows, self.base % self.W])

    def window(self, P, n_out, L_row):
        M, L, V = P.shape  # L <= W: the window knob sizes both
        U = self.table.gather(1, self._slots(L)[..., None].expand(M, L, V))  # (M, L, V)
        return gumbel_argmax(P, U)

    def decided(self, m, L_row):
        if not self.shift_alone:
            m = torch.where(L_row > 1, m, 0)
        left = (torch.arange(self.W, device=self.device)[None] - self.base[:, None]) % self.W < m[:, None]  # (M, W)
        r, slot = left.nonzero(as_tuple=True)
        self.table[r, slot] = self._uniforms((len(r), self.table.shape[-1]))
        self.base = self.base + m

    def select(self, live):
        self.table, self.base = self.table[live], self.base[live]


def maximal_coupling_rule(stale_q: bool):
    """The verifier of SCD's maximal coupling: SJD's accept-or-resample at every draft, not only up to the first
    rejection (MC:248-322). Returns SJD's commit (the accepted prefix and the first rejection's residual sample) and
    the coupled tokens and their draft distributions, which refine the positions after the commit: a coupled token
    is the kept draft or a residual draw, of law p either way; `stale_q` stores a kept draft's old q instead, as the
    release does (MC:290-293)."""

    def rule(P, drafts, qs, S, n_valid, generator):
        M, D = drafts.shape
        n_ok, replacement, ok = verify(P, drafts, qs, n_valid, generator, *draft_masses(P, drafts, qs))
        coupled, dists = S.clone(), P.clone()  # (M, L), (M, L, V): the bonus row and padding as this pass drew them
        redraw = ~ok & (torch.arange(D, device=P.device) < n_valid[:, None])  # (M, D) real drafts not kept
        coupled[:, :D] = torch.where(ok, drafts, coupled[:, :D])
        r, t = redraw.nonzero(as_tuple=True)
        coupled[r, t] = draw(residual(P[r, t], qs[r, t]), generator)
        hit = (n_ok < n_valid).nonzero().squeeze(1)
        coupled[hit, n_ok[hit]] = replacement[hit]  # the first rejection's draw is the one committed
        if stale_q:
            dists[:, :D] = torch.where(ok[..., None], qs, dists[:, :D])
        return n_ok, replacement, coupled, dists

    return rule


class SCD(SJD):
    """Speculative Coupled Decoding: SJD whose drafts are coupled across Jacobi iterations (Gumbel noise kept per
    position, or the maximal coupling of each draft with its target); lossless in `mode: exact`."""

    headline = False
    Config = SCDConfig
    key_knobs = ("window", "coupling", "mode")

    @classmethod
    def lossless(cls, knobs):
        if knobs.get("mode") == "exact":
            return "certified: tests/test_sjd_descendants.py"
        # benchmarks/lossless_audit.py, 20,000 draws on the table model (docs/guide/lossless.md)
        return ("not lossless: TV 0.040, p 3e-38" if knobs.get("coupling") == "maximal"
                else "not lossless: TV 0.30, p 0")

    def __init__(self, teacher, config: SCDConfig):
        super().__init__(teacher, config)
        if config.coupling == "maximal":
            self.rule = maximal_coupling_rule(stale_q=config.mode == "released")

    def draws(self, batch, generator):
        if self.config.coupling == "maximal":
            return super().draws(batch, generator)
        return GumbelDraws(batch, self.config.window, self.teacher.vocab_size, generator,
                           shift_alone=self.config.mode == "exact")
