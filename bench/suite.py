"""A suite: a YAML list of trials (× seeds) run into one MLflow experiment, resumable by trial key."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tqdm import tqdm

from bench.cache import Cache
from bench.config import check_seeds, read_yaml_mapping
from bench.errors import UserError
from bench.runner import Plan, RunOptions, plan, run_trial
from bench.tracking import Tracker
from bench.trial import Trial

SUITE_FIELDS = {"experiment", "seeds", "defaults", "trials"}


@dataclass(frozen=True)
class Suite:
    experiment: str
    plans: tuple[Plan, ...]  # planned (every knob resolved), one per (entry, seed)


def load_suite(path: str) -> Suite:
    """Parse and validate every trial of the file before anything runs."""
    data = read_yaml_mapping(path, "suite file", SUITE_FIELDS)
    experiment = data.get("experiment")
    if not isinstance(experiment, str) or not experiment:
        raise UserError(f"suite file {path}: 'experiment' must be a non-empty string")
    seeds = check_seeds(data.get("seeds", [0]), f"suite file {path}")
    defaults = data.get("defaults", {})
    entries = data.get("trials")
    if not isinstance(defaults, dict) or not isinstance(entries, list) or not entries:
        raise UserError(f"suite file {path}: 'defaults' must be a mapping and 'trials' a non-empty list")
    plans = []
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise UserError(f"suite file {path}: trial {i} must be a mapping")
        for seed in seeds:
            merged: dict[str, Any] = {**defaults, **entry, "seed": seed}
            try:
                plans.append(plan(Trial.from_mapping(merged)))
            except UserError as exc:
                raise UserError(f"suite file {path}: trial {i}: {exc}") from None
    return Suite(experiment, tuple(plans))


def finished_keys(tracker: Tracker) -> set[str]:
    runs = tracker.client.search_runs([tracker.experiment_id],
                                      "tags.`accelbench.kind` = 'trial' and attributes.status = 'FINISHED'",
                                      max_results=50000)
    return {r.data.tags.get("trial_key") for r in runs}


def run_suite(suite: Suite, *, tracker: Tracker, cache: Cache, opts: RunOptions, force: bool = False) -> tuple[int, int]:
    """Run every trial that has no finished run in the experiment yet; returns (ran, skipped)."""
    done = set() if force else finished_keys(tracker)
    todo = [p for p in suite.plans if p.trial.key() not in done]
    for p in tqdm(todo, desc=f"suite {suite.experiment}", unit="trial", disable=not opts.progress):
        run_trial(p, cache=cache, tracker=tracker, opts=opts)
    return len(todo), len(suite.plans) - len(todo)
