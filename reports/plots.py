"""PNG plots from MLflow trial runs: quality vs wall time with the Pareto front, acceptance vs window, acceptance by
draft position, and each teacher's leaderboard (speed-up against quality drift).

Pure functions of the runs (see `reports.tables.TrialRun`); one figure per teacher. PNG metadata carries no
software version or date, so the same store gives the same files.
"""
from __future__ import annotations

import re
import statistics
from pathlib import Path
from typing import NamedTuple

import matplotlib

from core.acceptance import rates
from core.names import SEC_PER_SAMPLE, SPEEDUP_WALL
from core.registry import METHODS
from reports.tables import TrialRun, extra_arms, headline_quality, natural, shown_knobs

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402 (after the backend is chosen)

MARKERS = "os^Dv"


def _save(fig, out: Path, name: str) -> Path:
    """Save as `out/name` with a file-safe name: a teacher may be named by a path (`hf:/data/gpt2-large`)."""
    path = out / re.sub(r"[^A-Za-z0-9._-]+", "_", name)
    fig.savefig(path, dpi=110, bbox_inches="tight", metadata={"Software": None})
    plt.close(fig)
    return path


def pareto_front(points: list[tuple[float, float]], higher_is_better: bool) -> list[tuple[float, float]]:
    """The points no other point beats on both time (lower) and quality; sorted by time."""
    sign = -1.0 if higher_is_better else 1.0
    front, best = [], float("inf")
    for t, q in sorted(points, key=lambda p: (p[0], sign * p[1])):
        if sign * q < best:
            front.append((t, q))
            best = sign * q
    return front


def _label(r: TrialRun, runs: list[TrialRun], exclude=()) -> str:
    """The run's method and every knob and sampling setting that tells it apart from the method's other runs (as the
    table's knobs and sampling columns do): runs with one label differ only in their seed, and are averaged."""
    sampling = sorted({k for o in runs if o.method == r.method for k, v in o.ref_knobs.items()
                       if v != r.ref_knobs.get(k) and k not in exclude})
    parts = [p for p in (shown_knobs(r, runs, exclude), ", ".join(f"{k}={r.ref_knobs[k]}" for k in sampling))
             if p and p != "—"]
    return " ".join([r.method, ", ".join(parts)]) if parts else r.method


class Point(NamedTuple):
    """A plotted setting: means over its seeds and their spread (sample standard deviation; 0 for one seed)."""

    ms: float
    quality: float
    ms_std: float
    quality_std: float


def _spread(values: list[float]) -> float:
    return statistics.stdev(values) if len(values) > 1 else 0.0


def _point(values: list[tuple[float, float]]) -> Point:
    ts, qs = [t for t, _ in values], [q for _, q in values]
    return Point(statistics.fmean(ts), statistics.fmean(qs), _spread(ts), _spread(qs))


def quality_points(runs: list[TrialRun], key: str) -> dict[str, Point]:
    """label -> its point (ms / sample, quality, and their seed spreads); the teacher per sampling setting, and each
    extra baseline arm of a method's runs as "<method's label> ↳ <arm>" (the table's `↳` rows). Runs share a label
    only when they differ in the seed alone (`_label`), so no point averages two settings."""
    varying = sorted({k for r in runs for k, v in r.ref_knobs.items() if any(o.ref_knobs.get(k) != v for o in runs)})
    groups: dict = {}
    for r in runs:
        label = _label(r, runs)
        for arm in ("", *extra_arms(r.metrics)):
            prefix = f"{arm}/" if arm else ""
            if prefix + key in r.metrics:
                groups.setdefault(f"{label} ↳ {arm}" if arm else label, []).append(
                    (1000 * r.metrics[prefix + SEC_PER_SAMPLE], r.metrics[prefix + key]))
        if f"ref/{key}" in r.metrics:
            setting = "".join(f", {k}={r.ref_knobs[k]}" for k in varying)
            by_seed = groups.setdefault(f"{r.reference} (teacher{setting})", {})  # one reference arm per seed
            by_seed.setdefault(r.seed, (1000 * r.metrics["ref/" + SEC_PER_SAMPLE], r.metrics[f"ref/{key}"]))
    return {label: _point(list(v.values()) if isinstance(v, dict) else v)
            for label, v in sorted(groups.items(), key=lambda kv: natural(kv[0]))}


def quality_vs_time(runs: list[TrialRun], teacher: str, out: Path) -> Path | None:
    """Quality against ms / sample, one panel per batch size: a point is only ever plotted beside the teacher sampling
    at its own batch size (a batched sampler's time per sample says nothing about a sequential one's). The quality is
    the teacher's headline metric (`headline_quality`), so the plot and the tables agree on which setting is better."""
    quality = headline_quality(runs)
    if not quality:
        return None
    key, higher = quality
    sizes = sorted({r.batch_size for r in runs})
    fig, axes = plt.subplots(1, len(sizes), figsize=(6 * len(sizes), 4), squeeze=False)
    for ax, size in zip(axes[0], sizes):
        points = quality_points([r for r in runs if r.batch_size == size], key)
        for i, (label, p) in enumerate(points.items()):  # error bars: the spread over seeds
            ax.errorbar([p.ms], [p.quality], xerr=[p.ms_std], yerr=[p.quality_std], label=label, capsize=2, lw=0.8,
                        fmt=MARKERS[i // 10 % len(MARKERS)])  # the colour cycle repeats at 10
        front = pareto_front([(p.ms, p.quality) for p in points.values()], higher)
        ax.plot([t for t, _ in front], [q for _, q in front], "k--", lw=1, label="Pareto front")
        ax.set_xlabel("ms / sample (median; mean ± std over seeds)")
        ax.set_ylabel(f"{key} ({'higher' if higher else 'lower'} is better)")
        ax.set_title(f"{teacher}: quality vs wall time, batch {size}")
        ax.legend(fontsize=7)
    return _save(fig, out, f"quality_vs_time_{teacher}.png")


def speedup_vs_drift(items, quality: tuple[str, bool] | None, tolerance: float, teacher: str,
                     out: Path) -> Path | None:
    """One teacher's leaderboard as a picture (`reports.leaderboard.Board`'s settings, `items`): each setting's wall
    speed-up against its quality drift from the teacher arm, mean ± std over seeds, labelled; the Pareto frontier (no
    other setting both faster and drifting less) dashed, the tolerance a vertical line. None without a drift."""
    items = [e for e in items if e.drift]
    if not quality or not items:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.5))
    points = []
    for i, e in enumerate(items):
        walls = [r.metrics[SPEEDUP_WALL] for r in e.runs]
        x, y = statistics.fmean(e.drift), statistics.fmean(walls)
        points.append((x, y))
        ax.errorbar([x], [y], xerr=[_spread(e.drift)], yerr=[_spread(walls)], capsize=2, lw=0.8,
                    fmt=MARKERS[i // 10 % len(MARKERS)])
        ax.annotate(" ".join([e.method, e.knobs if e.knobs != "—" else ""]).strip(), (x, y), fontsize=6,
                    xytext=(3, 3), textcoords="offset points")
    front = pareto_front(points, higher_is_better=True)  # drift the lower the better, speed-up the higher
    ax.plot([x for x, _ in front], [y for _, y in front], "k--", lw=1, label="Pareto frontier")
    ax.axvline(tolerance, color="grey", lw=0.8, ls=":", label=f"tolerance {tolerance:.3g}")
    ax.axhline(1.0, color="grey", lw=0.5)
    ax.set_xlabel(f"drift of {quality[0]} from the teacher arm (positive: worse)")
    ax.set_ylabel("wall speed-up (× the teacher arm)")
    ax.set_title(f"{teacher}: speed-up against quality drift")
    ax.legend(fontsize=7)
    return _save(fig, out, f"leaderboard_{teacher}.png")


def _window_knob(method: str) -> str | None:
    """The method's `window_knob`; None for a method this install does not register (a plugin's not loaded)."""
    return METHODS.get(method).window_knob if method in METHODS.names() else None


def acceptance_vs_window(runs: list[TrialRun], teacher: str, out: Path) -> Path | None:
    """Accepted tokens per pass against the window, a line per run group; None unless some group was run at two
    windows or more: isolated dots show no trend, and the table's NFE and step speed-up give each setting's figure."""
    series: dict = {}
    for r in runs:
        knob = _window_knob(r.method)
        if knob not in r.knobs:
            continue
        label = _label(r, runs, exclude=(knob,))
        series.setdefault((label, knob), {}).setdefault(float(r.knobs[knob]), []).append(r.metrics["step_compression"])
    if all(len(by_w) < 2 for by_w in series.values()):
        return None
    fig, ax = plt.subplots(figsize=(6, 4))
    for (label, knob), by_w in sorted(series.items()):
        ws = sorted(by_w)
        ax.plot(ws, [statistics.fmean(by_w[w]) for w in ws], "o-", label=f"{label} (vs {knob})")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("window W / draft length γ")
    ax.set_ylabel("accepted tokens per forward pass")
    ax.set_title(f"{teacher}: acceptance vs window")
    ax.legend(fontsize=7)
    return _save(fig, out, f"acceptance_{teacher}.png")


def position_rates(runs: list[TrialRun]) -> dict[str, dict[int, tuple[float, float]]]:
    """label -> draft position k -> (conditional, marginal) acceptance rate (`core.acceptance`), each the mean over the
    label's seeds; runs without acceptance counts (every method but SJD, Jacobi and CSpD) are left out."""
    groups: dict = {}
    for r in runs:
        for k, rate in rates(r.metrics, "_per_sample").items():
            groups.setdefault(_label(r, runs), {}).setdefault(k, []).append(rate)
    return {label: {k: (statistics.fmean(c for c, _ in v), statistics.fmean(m for _, m in v))
                    for k, v in sorted(by_k.items())}
            for label, by_k in sorted(groups.items(), key=lambda kv: natural(kv[0]))}


def acceptance_by_position(runs: list[TrialRun], teacher: str, out: Path) -> Path | None:
    """Conditional (accepted / reached) and marginal (accepted / rounds) acceptance rate at each draft position, one
    line per run group."""
    series = position_rates(runs)
    if not series:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    for i, (label, by_k) in enumerate(series.items()):
        for which, ax in enumerate(axes):
            ax.plot(list(by_k), [v[which] for v in by_k.values()], MARKERS[i // 10 % len(MARKERS)] + "-", label=label)
    for ax, title in zip(axes, ("conditional: P(accepted | reached)", "marginal: accepted per round")):
        ax.set_xlabel("draft position k")
        ax.set_ylabel("acceptance rate")
        ax.set_ylim(bottom=0)  # a masked released window step may draft several tokens: a marginal above 1
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.set_title(f"{teacher}: {title}")
        ax.legend(fontsize=7)
    return _save(fig, out, f"acceptance_by_position_{teacher}.png")


def study_history(name: str, objective: str, direction: str, trials: dict[int, float], out: Path) -> Path:
    """Objective per Optuna trial number and the best value so far."""
    numbers = sorted(trials)
    values = [trials[n] for n in numbers]
    pick = max if direction == "maximize" else min
    best = [pick(values[: i + 1]) for i in range(len(values))]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.scatter(numbers, values, s=12, label=objective)
    ax.step(numbers, best, where="post", color="k", lw=1, label=f"best so far ({direction})")
    ax.set_xlabel("trial number")
    ax.set_ylabel(objective)
    ax.set_title(f"study {name}: history")
    ax.legend(fontsize=7)
    return _save(fig, out, f"study_history_{name}.png")


def study_importances(name: str, objective: str, importances: dict[str, float], out: Path) -> Path:
    fig, ax = plt.subplots(figsize=(6, 0.6 + 0.4 * len(importances)))
    knobs = sorted(importances, key=importances.get)
    ax.barh(knobs, [importances[k] for k in knobs])
    ax.set_xlabel(f"importance for {objective} (fANOVA, Optuna)")
    ax.set_title(f"study {name}: knob importances")
    return _save(fig, out, f"study_importances_{name}.png")
