"""Markdown results tables from MLflow trial runs, in the shape of the seed papers' tables.

A pure function of the runs: one table per teacher, a teacher row per sampling setting and batch size (from the
reference arm every run carries) and a row per (method, knobs, batch size), each cell the mean ± std over seeds.
Speed-ups are the in-run ratios (method vs. its own reference arm at the same batch size, measured side by side),
averaged over seeds. Runs of a paper suite carry the paper's numbers (`core.paper`): a measured column that has any
gets a "paper" column and the difference (ours − paper) beside it, and a row whose paper numbers carry a `note` is
marked [k], the note printed under its table.
"""
from __future__ import annotations

import functools
import re
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone

from core.paper import SPEED_KEYS, from_tags
from core.trial import MAX_COUNT
from core.names import (HEADLINE_TAG, KNOBS_TAG, NFE_PER_SAMPLE, SEC_PER_SAMPLE, SPEEDUP_FLOPS, SPEEDUP_STEPS,
                        SPEEDUP_WALL)

SAMPLING_ORDER = ("top_k", "temperature", "cfg", "greedy")  # how the sampling column lists the usual knobs first
HEADLINE_METRICS = ("fid", "gen_ppl", "clip", "mauve")  # the headline's quality column: the first of these a run has


@dataclass(frozen=True)
class TrialRun:
    """What a report needs from one MLflow run (see `from_mlflow`)."""

    teacher: str
    method: str
    seed: int
    n_samples: int
    knobs: dict  # method knobs, resolved (defaults filled in)
    ref_knobs: dict  # the reference arm's sampling settings
    reference: str
    metrics: dict
    tags: dict
    start_time_ms: int = 0
    key_knobs: tuple = field(default=())
    warmup: str = "unknown"  # warm-up batches per arm before timing
    batch_size: int = 1
    world_size: str = "1"  # torchrun ranks that drew the samples
    end_time_ms: int = 0  # when the run ended: with start_time_ms, the time a suite's runs span

    @functools.cached_property  # read from the tags once per run
    def paper(self) -> dict:
        """The paper's numbers for this run's setting (a paper suite's `paper:`), empty for other runs."""
        return from_tags(self.tags)

    @classmethod
    def from_mlflow(cls, run) -> "TrialRun":
        p, tags = run.data.params, run.data.tags
        if KNOBS_TAG in tags:  # knobs logged under their own names
            knobs = {k: p[k] for k in tags[KNOBS_TAG].split(",") if k in p}
        else:  # a store written before knobs had their own names: "params.<knob>"
            knobs = {k[len("params."):]: v for k, v in p.items() if k.startswith("params.")}
        ref = {k[len("ref."):]: v for k, v in p.items() if k.startswith("ref.")}
        key_knobs = tuple(k for k in tags.get("key_knobs", "").split(",") if k)
        return cls(p["teacher"], p["method"], int(p["seed"]), int(p["n_samples"]), knobs, ref, p.get("reference", "ar"),
                   dict(run.data.metrics), dict(tags), run.info.start_time or 0, key_knobs, p.get("warmup", "unknown"),
                   int(p.get("batch_size", 1)), p.get("world_size", "1"), run.info.end_time or 0)


def natural(text: str) -> tuple:
    """Sort key that orders "window=4" before "window=16"."""
    return tuple(int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text))


def _fmt(values: list[float], digits: int, suffix: str = "") -> str:
    if not values:
        return ""
    mean = statistics.fmean(values)
    if len(values) == 1:
        return f"{mean:.{digits}f}{suffix}"
    return f"{mean:.{digits}f}{suffix} ± {statistics.stdev(values):.{digits}f}"


def _knob_text(knobs: dict, names) -> str:
    """"k=v, ..." of `names`; a knob left empty (a file knob unset, e.g. `student`) says nothing and is left out."""
    return ", ".join(f"{k}={knobs[k]}" for k in names if knobs.get(k, "") != "") or "—"


def shown_knobs(r: TrialRun, runs: list[TrialRun], exclude=()) -> str:
    """The knobs that tell `r` apart: its method's key knobs and any knob that varies among the method's runs (the
    reference arm's sampling settings have their own column)."""
    varying = sorted({k for o in runs if o.method == r.method for k in o.knobs
                      if o.knobs[k] != r.knobs.get(k) and k not in r.ref_knobs})
    names = [k for k in r.key_knobs if k not in r.ref_knobs] + [k for k in varying if k not in r.key_knobs]
    return _knob_text(r.knobs, [k for k in names if k not in exclude])


def _quality(tag_sets: Iterable[Mapping[str, str]]) -> dict[str, bool]:
    """metric key -> higher is better, for every quality metric the runs with these tags logged."""
    head = "higher_is_better."
    return {t[len(head):]: v == "true" for tags in tag_sets for t, v in tags.items() if t.startswith(head)}


def quality_columns(runs: list[TrialRun]) -> list[tuple[str, bool]]:
    """(metric key, higher is better) for every quality metric any run logged, in a fixed order."""
    return sorted(_quality(r.tags for r in runs).items())


def headline_of(tag_sets: Iterable[Mapping[str, str]]) -> tuple[str, bool] | None:
    """(metric key, higher is better) of the headline quality of the runs with these tags: the first of
    `HEADLINE_METRICS` any run logged, else the first quality column; None without any. The headline table, each
    teacher's quality plot and the MLflow UI's saved views (`accelbench ui`) all lead with it, so a plot never ranks
    methods by a metric the tables do not lead with (entropy beside gen-PPL)."""
    rank = {name: i for i, name in enumerate(HEADLINE_METRICS)}
    return min(sorted(_quality(tag_sets).items()), key=lambda kh: rank.get(kh[0].split(".")[0], len(rank)),
               default=None)


def headline_quality(runs: list[TrialRun]) -> tuple[str, bool] | None:
    """`headline_of` the runs."""
    return headline_of(r.tags for r in runs)


def extra_arms(metrics: dict) -> set[str]:
    """The baseline arms a run logged besides its reference arm (SDTT's `same_steps` and `ar`), under "<arm>/"."""
    return {k.split("/")[0] for k in metrics if k.endswith("/" + NFE_PER_SAMPLE)} - {"ref", "fit"}


def _header(key: str, higher: bool) -> str:
    name, _, extractor = key.partition(".")
    arrow = "↑" if higher else "↓"
    return f"{name.upper()} {arrow} ({extractor})" if extractor else f"{name} {arrow}"


def paper_value(paper: dict, key: str) -> float | None:
    """The paper's number for a measured column: a speed column under its paper key (`nfe`), a quality column under
    its full key or its metric's name (`fid` for `fid.inception-v3-tf1.adm-in256`)."""
    speed = {metric: name for name, metric in SPEED_KEYS.items()}
    if key in speed:
        return paper.get(speed[key])
    return paper.get(key, paper.get(key.split(".")[0]))


@dataclass(frozen=True)
class Column:
    header: str
    key: str  # the run metric (the reference arm's under "ref/", a baseline arm's under "<arm>/")
    scale: float = 1.0
    digits: int = 2
    suffix: str = ""


WALL_HEADER = "speed-up wall ↑"
NOISY = SPEEDUP_WALL + "_noisy"  # a run's flag: an arm's timing CV above the latency protocol's bound


def _columns(quality) -> list[Column]:
    return [Column("NFE / sample ↓", NFE_PER_SAMPLE, digits=1),
            Column("ms / sample ↓", SEC_PER_SAMPLE, 1000),
            Column(WALL_HEADER, SPEEDUP_WALL, suffix="×"),
            Column("speed-up steps ↑", SPEEDUP_STEPS, suffix="×"),
            Column("speed-up FLOPs ↑", SPEEDUP_FLOPS, suffix="×"),
            *(Column(_header(k, h), k) for k, h in quality)]


def teacher_table(runs: list[TrialRun]) -> tuple[list[str], bool]:
    """Markdown lines of one teacher's table, and whether any quality cell is blank.

    Rows are never compared across batch sizes: a batched sampler's time per sample is not a sequential one's, so the
    teacher has a row per batch size, and every speed-up is against the teacher arm of the same run."""
    quality = quality_columns(runs)
    columns = _columns(quality)
    with_paper = {c.key for c in columns if any(paper_value(r.paper, c.key) is not None for r in runs)}
    head = ["method", "knobs", "sampling", "batch", "n", "seeds"]
    for c in columns:
        head += [c.header, *(["paper", "Δ"] if c.key in with_paper else [])]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    blank = False
    quality_keys = {k for k, _ in quality}

    def cells_of(values_of, paper: dict | None) -> list[str]:
        """The measured cells (and paper, Δ where the table has them) from `values_of(column)`: one value per seed."""
        nonlocal blank
        out = []
        for c in columns:
            values = [c.scale * v for v in values_of(c)]
            blank |= c.key in quality_keys and not values
            out.append(_fmt(values, c.digits, c.suffix))
            if c.key in with_paper:
                ref = paper_value(paper or {}, c.key)
                if ref is None or not values:
                    out += ["—" if ref is None else f"{ref:.{c.digits}f}{c.suffix}", "—"]
                else:
                    out += [f"{ref:.{c.digits}f}{c.suffix}", f"{statistics.fmean(values) - ref:+.{c.digits}f}"]
        return out

    def sampling(knobs):  # the reference arm's settings: whatever its config has (every family its own)
        return _knob_text(knobs, [k for k in SAMPLING_ORDER if k in knobs] +
                          sorted(k for k in knobs if k not in SAMPLING_ORDER))

    # Teacher rows: the reference arms of all runs, by sampling settings, batch size and sample count. Runs with the
    # same seed drew the same teacher samples, so each seed counts once; a metric comes from the first run of the seed
    # that has it.
    by_ref: dict = {}
    for r in runs:
        by_ref.setdefault((r.reference, sampling(r.ref_knobs), r.batch_size, r.n_samples), {}).setdefault(
            r.seed, []).append(r)
    for (ref, samp, batch, n), seeds in sorted(by_ref.items(), key=lambda kv: natural(str(kv[0]))):

        def per_seed(c: Column):
            if c.key.startswith("speedup_"):
                return [1.0]
            key = f"ref/{c.key}"
            found = ([r.metrics[key] for r in seeds[s] if key in r.metrics] for s in sorted(seeds))
            return [vals[0] for vals in found if vals]

        lines.append("| " + " | ".join([f"{ref} (teacher)", "—", samp, str(batch), str(n), str(len(seeds)),
                                         *cells_of(per_seed, None)]) + " |")

    groups: dict = {}
    for r in runs:
        # a setting run against two paper rows (SJD's Anole C and D: one trial) is two rows, each with its numbers
        key = (r.method, shown_knobs(r, runs), sampling(r.ref_knobs), r.batch_size, r.n_samples,
               tuple(sorted(r.knobs.items())), r.paper.get("source", ""))
        groups.setdefault(key, {}).setdefault(r.seed, r)  # one run per seed: the first in the store's order
    notes: list[str] = []  # the paper notes (`core.paper`), each the footnote of its row
    for (method, knobs, samp, batch, n, *_), seeds in sorted(groups.items(), key=lambda kv: natural(str(kv[0]))):
        rs = [seeds[s] for s in sorted(seeds)]
        cells = [method, knobs, samp, str(batch), str(n), str(len(rs)), *cells_of(
            lambda c: [r.metrics[c.key] for r in rs if c.key in r.metrics], rs[0].paper)]
        if any(r.metrics.get(NOISY) for r in rs):  # an arm's timings spread too widely: flagged, not averaged away
            cells[head.index(WALL_HEADER)] += " ⚠"
        if note := rs[0].paper.get("note"):
            notes.append(f"- [{len(notes) + 1}] {rs[0].paper['source']}: {note}")
            cells[0] += f" [{len(notes)}]"
        lines.append("| " + " | ".join(cells) + " |")
        lines += _baseline_rows(rs, knobs, samp, batch, n, cells_of)
    return lines + (["", *notes] if notes else []), blank


def _baseline_rows(rs: list[TrialRun], knobs: str, samp: str, batch: int, n: int, cells_of) -> list[str]:
    """A row per extra baseline arm the method's runs carry (e.g. SDTT's teacher at the student's step count and the AR
    LM), its speed-ups against the same runs' reference arms."""
    rows = []
    arms = sorted(set().union(*(extra_arms(r.metrics) for r in rs)))
    for arm in arms:
        m = [r.metrics for r in rs if f"{arm}/{NFE_PER_SAMPLE}" in r.metrics]
        ratios = {SPEEDUP_WALL: [x["ref/" + SEC_PER_SAMPLE] / x[f"{arm}/{SEC_PER_SAMPLE}"] for x in m],
                  SPEEDUP_STEPS: [x["ref/" + NFE_PER_SAMPLE] / x[f"{arm}/{NFE_PER_SAMPLE}"] for x in m]}

        def values(c: Column, m=m, ratios=ratios, arm=arm):
            return ratios.get(c.key) or [x[f"{arm}/{c.key}"] for x in m if f"{arm}/{c.key}" in x]

        rows.append("| " + " | ".join([f"↳ {arm}", knobs, samp, str(batch), str(n), str(len(m)),
                                       *cells_of(values, None)]) + " |")
    return rows


def report_order(runs: Iterable[TrialRun]) -> list[TrialRun]:
    """The runs in the order the report reads them: of two runs of one seed and setting, a table shows the first."""
    return sorted(runs, key=lambda r: (r.teacher, r.method, sorted(r.knobs.items()), r.n_samples, r.seed,
                                       r.start_time_ms))


def headline_table(runs: list[TrialRun]) -> list[str]:
    """A row per paper method (runs tagged `accelbench.headline`: the method at its default key knobs), on the teacher
    and setting with the most seeds: the speed-ups and the first quality metric of both arms, over seeds. REPORT.md
    opens with it, and README.md shows `make demo`'s (`scripts/readme_headline.py`)."""
    best: dict = {}
    for r in report_order(runs):
        if r.tags.get(HEADLINE_TAG) != "true":
            continue
        key = (r.teacher, shown_knobs(r, runs), r.batch_size, tuple(sorted(r.ref_knobs.items())), r.n_samples)
        best.setdefault(r.method, {}).setdefault(key, {}).setdefault(r.seed, r)
    if not best:
        return []
    lines = ["| method | teacher | knobs | batch | seeds | speed-up wall ↑ | speed-up steps ↑ | quality | method arm "
             "| teacher arm |", "|---|---|---|---|---|---|---|---|---|---|"]
    for method in sorted(best):
        (teacher, knobs, batch, _, _), seeds = max(best[method].items(),
                                                   key=lambda kv: (len(kv[1]), natural(str(kv[0]))))
        rs = [seeds[s] for s in sorted(seeds)]
        quality = headline_quality(rs)
        name, cells = "—", ["", ""]
        if quality:
            key, higher = quality
            name = _header(key, higher)
            cells = [_fmt([r.metrics[key] for r in rs if key in r.metrics], 2),
                     _fmt([r.metrics[f"ref/{key}"] for r in rs if f"ref/{key}" in r.metrics], 2)]
        noisy = " ⚠" if any(r.metrics.get(NOISY) for r in rs) else ""
        lines.append("| " + " | ".join([method, teacher, knobs, str(batch), str(len(rs)),
                                        _fmt([r.metrics[SPEEDUP_WALL] for r in rs], 2, "×") + noisy,
                                        _fmt([r.metrics[SPEEDUP_STEPS] for r in rs], 2, "×"), name, *cells]) + " |")
    return lines


def lm_eval_table(runs: list[TrialRun]) -> list[str]:
    """lm-eval runs (`accelbench lambada`, a suite's lm-eval rows): a row per (teacher, method, knobs, documents), a
    column per task metric (`arc_easy.acc`), each with the paper's number and Δ where any run carries one."""
    columns = quality_columns(runs)
    with_paper = {k for k, _ in columns if any(paper_value(r.paper, k) is not None for r in runs)}
    head = ["teacher", "method", "knobs", "n", "seeds"]
    for key, higher in columns:
        head += [_header(key, higher), *(["paper", "Δ"] if key in with_paper else [])]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    groups: dict = {}
    for r in runs:
        key = (r.teacher, r.method, shown_knobs(r, runs), r.n_samples, tuple(sorted(r.knobs.items())))
        groups.setdefault(key, {}).setdefault(r.seed, r)  # one run per seed: the first in the store's order
    for (teacher, method, knobs, n, _), seeds in sorted(groups.items(), key=lambda kv: natural(str(kv[0]))):
        rs = [seeds[s] for s in sorted(seeds)]
        cells = [teacher, method, knobs, "all" if n == MAX_COUNT else str(n), str(len(rs))]
        for key, _ in columns:
            values = [r.metrics[key] for r in rs if key in r.metrics]
            cells.append(_fmt(values, 4))
            if key in with_paper:
                ref = paper_value(rs[0].paper, key)
                cells += ["—" if ref is None else f"{ref:.4f}",
                          "—" if ref is None or not values else f"{statistics.fmean(values) - ref:+.4f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def tag_values(runs: Iterable[TrialRun], tag: str) -> str:
    """Every value the runs give `tag`, sorted, comma-separated ("unknown" for a run without it)."""
    return ", ".join(sorted({r.tags.get(tag, "unknown") for r in runs}))


def environment_footer(runs: list[TrialRun]) -> list[str]:
    values = functools.partial(tag_values, runs)
    warmups = ", ".join(sorted({r.warmup for r in runs}))
    ranks = ", ".join(sorted({r.world_size for r in runs}))

    libs = sorted({t for r in runs for t in r.tags if t.endswith("_version")})
    dates = sorted(datetime.fromtimestamp(r.start_time_ms / 1000, tz=timezone.utc).date().isoformat() for r in runs)
    lines = ["## Run environment", "",
             f"- runs: {len(runs)}, dated {dates[0]} to {dates[-1]} (UTC)",
             f"- git: {values('git_sha')}",
             "- libraries: " + "; ".join(f"{t[: -len('_version')]} {values(t)}" for t in libs),
             f"- CPU: {values('cpu')}; device: {values('device')}; torch threads: {values('torch_threads')}; "
             f"python: {values('python')}; warm-up batches per arm: {warmups}",
             f"- numerics: {values('precision')}; ranks per trial (torchrun): {ranks}"]
    return lines


def build_markdown(runs: list[TrialRun], title: str, evaluations: list[TrialRun] = ()) -> str:
    """The report of trial `runs` and lm-eval runs (`evaluations`)."""
    runs = report_order(runs)
    out = [f"# {title}", ""]
    if not runs and not evaluations:
        return "\n".join(out + ["No finished trial runs matched.", ""])
    headline = headline_table(runs)
    if headline:
        out += ["## Headline", "", "Each paper's method at its default setting, against its teacher's own sampler in "
                "the same runs, at the same batch size (the sections below have every setting and baseline).", "",
                *headline, ""]
    any_blank = False
    for teacher in sorted({r.teacher for r in runs}):
        lines, blank = teacher_table([r for r in runs if r.teacher == teacher])
        any_blank |= blank
        out += [f"## {teacher}", "", *lines, ""]
    if evaluations:
        out += ["## lm-eval tasks", "", "Each model scored by lm-eval (0-shot; `accelbench lambada`): n documents per "
                "task at most (`<task>.documents` in the run has the count scored); a masked-diffusion model's "
                "log-likelihood is a NELBO bound and its LAMBADA accuracy single-pass decoding (docs/methods/sdtt.md).",
                "", *lm_eval_table(evaluations), ""]
    out += ["Cells are mean ± sample standard deviation over seeds (a single seed has no ±). Speed-ups are measured "
            "in each run against its own teacher arm, side by side in one process, then averaged. NFE counts "
            "forward passes per sample; n is the number of samples per arm and batch the samples per sampler call (a "
            "row's speed-ups are against the teacher at the same batch size); ↑/↓ mark the better direction; the "
            "extractor of each metric is in parentheses. Where a paper suite gave the paper's number for a row, "
            "\"paper\" is that number (the run's tag `paper.source` names the table and row) and Δ is ours − paper. "
            "Speed-up FLOPs: the teacher arm's FLOPs per sample over the method's, counted on one reference sample "
            "(seed 0; torch's FLOP formulas), which no machine's load moves. ⚠ after a wall speed-up: in some run an "
            "arm's times per forward pass spread with a CV above 10 % (core/latency.py), so that wall speed-up is not "
            "to be trusted on that machine; the FLOPs and steps speed-ups still are.",
            "",
            "Reproducibility: a trial (teacher, method, knobs, n, seed) rerun on the same machine and software gives "
            "identical samples, NFE, acceptance and quality metrics. On another machine (CPU model, BLAS, torch "
            "version, thread count, device) samples and quality metrics may differ within seed-to-seed spread, since "
            "floating-point reductions round differently; wall times and wall speed-ups vary with the machine and its "
            "load on every run. Step speed-ups and NFE depend only on the samples."]
    if any_blank:
        out += ["", "Blank cells: the metric was not computed for that row (not requested, or not applicable)."]
    unavailable = {(tag[len("unavailable."):], reason) for r in runs for tag, reason in r.tags.items()
                   if tag.startswith("unavailable.")}
    out += ["", *(f"Requested but unavailable where it ran, so not computed: `{metric}` ({reason})."
                  for metric, reason in sorted(unavailable))] if unavailable else []
    out += ["", *environment_footer([*runs, *evaluations]), ""]
    return "\n".join(out)
