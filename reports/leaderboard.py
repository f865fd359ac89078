"""A leaderboard per teacher: every (method, setting) run on it, whatever its family, ranked by wall speed-up among the
settings whose quality drift from the teacher arm is within a tolerance, the others below (`docs/guide/reports.md`).

A pure function of the runs, as `reports.tables` is. A row is one setting (method, the knobs that tell it apart, the
reference arm's sampling, batch size, sample count) over its seeds: NFE per sample, the speed-ups in steps, FLOPs and
wall time (⚠ where an arm's timings spread, as the tables mark it), the headline quality of both arms, the drift
(method arm − teacher arm of the same run, averaged over seeds, worse-signed: positive is worse) and the method's
lossless verdict for that setting (`Method.lossless`: certified by a named test, refuted or lossy with the measured
distance, or unchecked).

The tolerance is in the headline metric's units. By default it is twice the teacher arm's standard deviation over
the seeds: a drift below it is within what redrawing the teacher's own samples moves the metric by, so a row inside
it is not shown to be worse than the teacher (one seed gives no spread: the tolerance is then 0, and only rows at
least as good as the teacher arm rank first).
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from core.errors import UserError
from core.names import NFE_PER_SAMPLE, SPEEDUP_FLOPS, SPEEDUP_STEPS, SPEEDUP_WALL
from core.registry import METHODS
from reports.plots import speedup_vs_drift
from reports.tables import NOISY, TrialRun, _fmt, _header, headline_quality, natural, shown_knobs

TOLERANCE_SIGMAS = 2.0  # the default tolerance, in standard deviations of the teacher arm's headline metric


@dataclass(frozen=True)
class Entry:
    """One setting of one teacher's leaderboard, over its seeds."""

    method: str
    knobs: str
    batch: int
    runs: tuple[TrialRun, ...]
    drift: list[float]  # per seed, worse-signed (positive: the method arm is worse than the teacher arm)
    lossless: str

    @property
    def wall(self) -> float:
        return statistics.fmean(r.metrics[SPEEDUP_WALL] for r in self.runs)

    @property
    def mean_drift(self) -> float | None:
        return statistics.fmean(self.drift) if self.drift else None


def verdict(method: str, knobs: dict) -> str:
    """The method's lossless verdict for these knobs, "unchecked" where none was measured (or the method is not
    registered in this install)."""
    try:
        cls = METHODS.get(method)
    except UserError:  # a plugin's method, its plugin not loaded here: no verdict to read
        return "unchecked"
    return cls.lossless(knobs) or "unchecked"


def entries(runs: list[TrialRun]) -> tuple[list[Entry], tuple[str, bool] | None]:
    """The settings of one teacher's runs, and its headline quality (metric key, higher is better)."""
    quality = headline_quality(runs)
    groups: dict = {}
    for r in runs:
        key = (r.method, shown_knobs(r, runs), r.batch_size, r.n_samples, tuple(sorted(r.ref_knobs.items())),
               tuple(sorted(r.knobs.items())))
        groups.setdefault(key, {}).setdefault(r.seed, r)  # one run per seed: the first in the store's order
    out = []
    for (method, knobs, batch, *_), seeds in sorted(groups.items(), key=lambda kv: natural(str(kv[0]))):
        rs = tuple(seeds[s] for s in sorted(seeds) if SPEEDUP_WALL in seeds[s].metrics)
        if not rs:
            continue
        drift = []
        if quality:
            key, higher = quality
            sign = -1.0 if higher else 1.0
            drift = [sign * (r.metrics[key] - r.metrics[f"ref/{key}"]) for r in rs
                     if key in r.metrics and f"ref/{key}" in r.metrics]
        out.append(Entry(method, knobs, batch, rs, drift, verdict(method, rs[0].knobs)))
    return out, quality


def default_tolerance(runs: list[TrialRun], quality: tuple[str, bool] | None) -> float:
    """TOLERANCE_SIGMAS standard deviations of the teacher arm's headline metric over seeds (each seed once)."""
    if not quality:
        return 0.0
    by_seed = {}
    for r in runs:
        if f"ref/{quality[0]}" in r.metrics:
            by_seed.setdefault(r.seed, r.metrics[f"ref/{quality[0]}"])
    return TOLERANCE_SIGMAS * statistics.stdev(by_seed.values()) if len(by_seed) > 1 else 0.0


def within(entry: Entry, tolerance: float) -> bool:
    """Whether the setting's drift is within the tolerance (a setting without a quality measure is not)."""
    return entry.mean_drift is not None and entry.mean_drift <= tolerance


def ranked(items: list[Entry], tolerance: float) -> list[Entry]:
    """The settings within the tolerance by wall speed-up, fastest first; then the others, by wall speed-up."""
    return sorted(items, key=lambda e: (not within(e, tolerance), -e.wall))


class Board(NamedTuple):
    """One teacher's leaderboard: its markdown table, the ranked settings, the tolerance used and the headline
    quality (metric key, higher is better) the drift is measured in."""

    lines: list[str]
    order: list[Entry]
    tolerance: float
    quality: tuple[str, bool] | None


def leaderboard(runs: list[TrialRun], tolerance: float | None = None) -> Board:
    """One teacher's leaderboard, the tolerance given or its default (`default_tolerance`)."""
    items, quality = entries(runs)
    tol = default_tolerance(runs, quality) if tolerance is None else tolerance
    order = ranked(items, tol)
    name = _header(*quality) if quality else "quality"
    head = ["rank", "method", "knobs", "batch", "seeds", "NFE", "speed-up wall ↑", "speed-up steps ↑",
            "speed-up FLOPs ↑", f"{name}: method arm", "teacher arm", "drift (worse +)", "lossless"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for i, e in enumerate(order):
        rs = e.runs
        inside = within(e, tol)
        noisy = " ⚠" if any(r.metrics.get(NOISY) for r in rs) else ""
        cells = [str(i + 1) if inside else "—", e.method, e.knobs, str(e.batch), str(len(rs)),
                 _fmt([r.metrics[NFE_PER_SAMPLE] for r in rs if NFE_PER_SAMPLE in r.metrics], 1),
                 _fmt([r.metrics[SPEEDUP_WALL] for r in rs], 2, "×") + noisy,
                 _fmt([r.metrics[SPEEDUP_STEPS] for r in rs if SPEEDUP_STEPS in r.metrics], 2, "×"),
                 _fmt([r.metrics[SPEEDUP_FLOPS] for r in rs if SPEEDUP_FLOPS in r.metrics], 2, "×")]
        if quality:
            key = quality[0]
            cells += [_fmt([r.metrics[key] for r in rs if key in r.metrics], 2),
                      _fmt([r.metrics[f"ref/{key}"] for r in rs if f"ref/{key}" in r.metrics], 2),
                      _fmt(e.drift, 2)]
        else:
            cells += ["", "", ""]
        lines.append("| " + " | ".join(cells + [e.lossless]) + " |")
    return Board(lines, order, tol, quality)


def paper_block(runs: list[TrialRun]) -> list[str]:
    """The papers' own numbers for this teacher's settings (a paper suite's `paper:`), one row per paper row: their
    GPUs', not this run's."""
    rows = {}
    for r in runs:
        if r.paper:
            rows.setdefault(r.paper.get("source", ""), (r, r.paper))
    if not rows:
        return []
    keys = sorted({k for _, p in rows.values() for k in p if k not in ("source", "note")})
    lines = ["| method | knobs | " + " | ".join(keys) + " | source |", "|" + "---|" * (len(keys) + 3)]
    for source, (r, p) in sorted(rows.items(), key=lambda kv: natural(kv[0])):
        lines.append("| " + " | ".join([r.method, shown_knobs(r, runs), *(str(p.get(k, "—")) for k in keys),
                                        source]) + " |")
    return lines


INTRO = ("One table per teacher: every setting run on it, ranked by wall speed-up among those whose headline "
         "quality drifted from the teacher arm by no more than the tolerance (rank —: beyond it, or unmeasured), each "
         "speed-up against the teacher arm of the same runs. Drift is method arm − teacher arm per seed, signed so "
         "that positive is worse, mean ± std over seeds. Lossless: certified by the named exactness test, refuted or "
         "lossy with the distance measured (docs/guide/lossless.md), or unchecked.")


def leaderboard_sections(runs: list[TrialRun], tolerance: float | None = None, out: Path | None = None) -> list[str]:
    """A section per teacher ("## <teacher>"): the tolerance and how it was set, the table, the papers' block and,
    with `out`, the speed-up vs drift plot drawn there (`reports.plots.speedup_vs_drift`)."""
    lines = []
    for teacher in sorted({r.teacher for r in runs}):
        mine = [r for r in runs if r.teacher == teacher]
        board = leaderboard(mine, tolerance)
        how = (f"{tolerance:g}, as given" if tolerance is not None
               else f"{board.tolerance:.3g}: {TOLERANCE_SIGMAS:g} × the teacher arm's std over seeds")
        lines += [f"## {teacher}", "", f"Tolerance on the drift: {how}.", "", *board.lines, ""]
        if block := paper_block(mine):
            lines += ["The papers' own numbers for these settings, from their GPUs (not measured here):", "", *block,
                      ""]
        if out is not None and (plot := speedup_vs_drift(board.order, board.quality, board.tolerance, teacher, out)):
            lines += [f"![{plot.stem}]({plot.name})", ""]
    return lines


def leaderboard_markdown(sections: list[str], title: str) -> str:
    """LEADERBOARD.md from `leaderboard_sections`."""
    return "\n".join([f"# {title}", "", INTRO, "", *sections])
