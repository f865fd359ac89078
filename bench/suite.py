"""A suite: a YAML list of trials (× seeds) run into one MLflow experiment, resumable by trial key.

An entry may carry the paper's numbers for its setting (`paper:`, see `core.paper`); they travel with the trial's
plan into its run's tags, never into the trial key. An entry with `tasks:` (lm-eval task names, `metrics.lambada`)
is scored on those tasks instead of sampled (`bench.runner.run_lambada`, as `accelbench lambada` does): its
`n_samples` is the documents per task, at most, and its paper keys are the tasks' metric keys (`arc_easy.acc`).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core import distributed
from core.cache import Cache
from core.config import check_seeds, knobs, read_yaml_mapping
from core.errors import UserError
from core.names import KIND_TAG, LAMBADA, TRIAL
from core.paper import check_paper
from core.registry import METHODS, TEACHERS
from bench.plan import Plan, plan
from bench.runner import RunOptions, run_lambada, run_trial
from bench.tracking import Tracker
from core.trial import Trial
from metrics import lambada

SUITE_FIELDS = {"experiment", "seeds", "defaults", "trials"}


@dataclass(frozen=True)
class Suite:
    experiment: str
    plans: tuple[Plan, ...]  # planned (every knob resolved), one per (entry, seed)


def _overridden(entry: dict[str, Any], overrides: dict[str, Any], used: set[str]) -> dict[str, Any]:
    """`entry` with the `overrides` that are knobs of its method on its teacher's family set in its params."""
    if not overrides or not isinstance(entry.get("method"), str) or not isinstance(entry.get("teacher"), str):
        return entry
    config_cls = METHODS.get(entry["method"]).config_class(TEACHERS.get(entry["teacher"]).family)
    mine = {k: v for k, v in overrides.items() if k in knobs(config_cls)}
    used.update(mine)
    return {**entry, "params": {**entry.get("params", {}), **mine}} if mine else entry


def load_suite(path: str, *, checkpoints: Path, n_samples: int | None = None, overrides: dict[str, Any] | None = None,
               fields: dict[str, Any] | None = None) -> Suite:
    """Parse and validate every trial of the file before anything runs. `n_samples` replaces every trial's sample
    count, `overrides` sets knobs in every trial whose method has them (a quick pass over a paper suite, e.g. with
    a few training steps) and `fields` the trial fields device, dtype, tf32 and compile of every trial; the trial
    keys change with them."""
    data = read_yaml_mapping(path, "suite file", SUITE_FIELDS)
    experiment = data.get("experiment")
    if not isinstance(experiment, str) or not experiment:
        raise UserError(f"suite file {path}: 'experiment' must be a non-empty string")
    seeds = check_seeds(data.get("seeds", [0]), f"suite file {path}")
    defaults = data.get("defaults", {})
    entries = data.get("trials")
    if not isinstance(defaults, dict) or not isinstance(entries, list) or not entries:
        raise UserError(f"suite file {path}: 'defaults' must be a mapping and 'trials' a non-empty list")
    plans, used, first = [], set(), {}
    if n_samples is not None and (isinstance(n_samples, bool) or n_samples <= 0):
        raise UserError(f"--n-samples must be a positive integer, got {n_samples}")
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise UserError(f"suite file {path}: trial {i} must be a mapping")
        entry, where = dict(entry), f"suite file {path}: trial {i}"
        tasks = entry.pop("tasks", defaults.get("tasks", ()))
        try:
            keys = lambada.directions(tasks) if tasks else None
        except UserError as exc:
            raise UserError(f"{where}: {exc}") from None
        paper = check_paper(entry.pop("paper"), where, keys) if "paper" in entry else {}
        for seed in seeds:
            merged: dict[str, Any] = _overridden({**defaults, **entry, "seed": seed}, overrides or {}, used)
            merged.pop("tasks", None)
            if n_samples is not None:
                merged["n_samples"] = n_samples
            merged.update(fields or {})
            try:
                plans.append(plan(Trial.from_mapping(merged), checkpoints=checkpoints, paper=paper, tasks=tasks))
            except UserError as exc:
                raise UserError(f"suite file {path}: trial {i}: {exc}") from None
            # the same trial against another paper row is deliberate (SJD's Table 4 C and D); else it would run once
            # and be reported as two rows, or a repeated seed
            if (twin := first.setdefault((plans[-1].key(), repr(sorted(paper.items()))), i)) != i:
                raise UserError(f"suite file {path}: trial {i} is trial {twin} again (the same trial key)")
    if unused := sorted(set(overrides or {}) - used):
        raise UserError(f"suite file {path}: --param {unused[0]} is a knob of none of its trials' methods")
    return Suite(experiment, tuple(plans))


def finished_keys(tracker: Tracker) -> set[str]:
    """The keys (`Plan.key`) of the trials and lm-eval rows with a finished run in the experiment."""
    runs = [r for kind in (TRIAL, LAMBADA) for r in tracker.client.search_runs(
        [tracker.experiment_id], f"tags.`{KIND_TAG}` = '{kind}' and attributes.status = 'FINISHED'", max_results=50000)]
    return {r.data.tags.get("trial_key") for r in runs}


def run_suite(suite: Suite, *, tracker: Tracker, cache: Cache, opts: RunOptions,
              force: bool = False) -> tuple[int, int]:
    """Run every trial that has no finished run in the experiment yet; returns (ran, skipped). Under torchrun every
    rank runs the same trials, in rank 0's order (`core.distributed`)."""
    from tqdm import tqdm  # here: `make gpu-bench` loads suites without tqdm

    world = distributed.world()
    done = world.broadcast(set() if force or not world.main else finished_keys(tracker))
    todo = [p for p in suite.plans if p.key() not in done]
    for p in tqdm(todo, desc=f"suite {suite.experiment}", unit="trial", disable=not opts.progress or not world.main):
        (run_lambada if p.tasks else run_trial)(p, cache=cache, tracker=tracker, opts=opts)
    return len(todo), len(suite.plans) - len(todo)
