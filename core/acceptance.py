"""Acceptance by draft position for the speculative methods (SJD, CSpD; docs/methods/sjd.md and cspd.md, "Acceptance
by position"): counter names, the counting of a verification round, and the rates derived from the counts.

In a verification round with g drafts, for each position k = 1..g, `accept_pos_kNN_reached` counts the rounds in
which draft k was judged and `accept_pos_kNN_accepted` those in which it was accepted; `accept_pos_rounds` counts the
rounds. Conditional rate at k: accepted_k / reached_k (P(draft k accepted | judged)); marginal rate at k:
accepted_k / rounds. Under Leviathan's truncation (accept up to the first rejection, then one more token: the
residual sample or the bonus) draft k is reached iff drafts 1..k-1 were accepted, so the accepted prefix n of a round
is sum_k [n >= k], and the tokens a round decides, n + 1, average 1 + sum_k marginal_k exactly, in integer counts.
A round that accepts all its drafts where the sequence has no room for a bonus token decides one token fewer:
those are counted in `accept_pos_no_bonus`. A rule that judges each draft on its own (CSpD `released`) reaches every
draft: reached_k counts the drafts at position k (on the masked family, the tokens of the window's k-th step, maybe
several), and a round commits all its drafts, accepted or replaced, so the identity is not about that rule.
"""
from __future__ import annotations

import re
from collections import Counter
from typing import Mapping

import torch

# No dot in the names: a dotted metric key reads as a quality metric's (`fid.inception`) to the console's table.
PREFIX = "accept_pos"
ROUNDS = f"{PREFIX}_rounds"
NO_BONUS = f"{PREFIX}_no_bonus"  # rounds that accepted every draft at the end of the sequence: no bonus token


def position_key(k: int, what: str) -> str:
    """The counter of position k (1-based): `what` is "reached" or "accepted" (`accept_pos_k03_reached`)."""
    return f"{PREFIX}_k{k:02d}_{what}"


def _add(c: Counter, reached: torch.Tensor, accepted: torch.Tensor) -> None:
    for k, (r, a) in enumerate(zip(reached.tolist(), accepted.tolist()), 1):
        if r:
            c[position_key(k, "reached")] += r
            c[position_key(k, "accepted")] += a


def count_prefix(c: Counter, accepted: torch.Tensor, drafted: torch.Tensor) -> None:
    """Count rounds verified by truncation: `accepted` (M,) each round's accepted prefix, `drafted` (M,) its drafts
    (a round may have none)."""
    c[ROUNDS] += len(accepted)
    if not len(accepted) or int(drafted.max()) == 0:
        return
    k = torch.arange(1, int(drafted.max()) + 1, device=accepted.device)  # one sync for the whole round
    judged = drafted[:, None] >= k
    _add(c, (judged & (accepted[:, None] >= k - 1)).sum(0), (judged & (accepted[:, None] >= k)).sum(0))


def count_each(c: Counter, position: torch.Tensor, ok: torch.Tensor, rounds: int) -> None:
    """Count `rounds` rounds whose drafts are judged each on its own: `position` (T,) each judged draft's position in
    its round (1-based), `ok` (T,) whether it was accepted."""
    c[ROUNDS] += rounds
    if len(position):
        size = int(position.max()) + 1
        _add(c, torch.bincount(position, minlength=size)[1:], torch.bincount(position[ok], minlength=size)[1:])


_KEY = re.compile(rf"^{PREFIX}_k(\d+)_(reached|accepted)(.*)$")


def rates(values: Mapping[str, float], suffix: str = "") -> dict[int, tuple[float, float]]:
    """Position k -> (conditional, marginal) rate, from the counters of a method's `Samples` (suffix "") or from an
    arm's logged metrics, where each counter is divided by the samples and carries `suffix` ("_per_sample"): the
    ratios are the same."""
    rounds = values.get(ROUNDS + suffix)
    by_k: dict[int, dict[str, float]] = {}
    for key, v in values.items():
        m = _KEY.match(key)
        if m and m.group(3) == suffix:
            by_k.setdefault(int(m.group(1)), {})[m.group(2)] = v
    return {k: (d["accepted"] / d["reached"], d["accepted"] / rounds)
            for k, d in sorted(by_k.items()) if d.get("reached") and rounds}
