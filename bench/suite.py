"""A suite: a YAML list of trials (× seeds) run into one MLflow experiment, resumable by trial key."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import yaml
from tqdm import tqdm

from bench.cache import Cache
from bench.errors import UserError
from bench.runner import RunOptions, plan, run_trial
from bench.tracking import Tracker
from bench.trial import Trial

SUITE_FIELDS = {"experiment", "seeds", "defaults", "trials"}


@dataclass(frozen=True)
class Suite:
    experiment: str
    trials: tuple[Trial, ...]  # resolved (every knob filled in), one per (entry, seed)


def load_suite(path: str) -> Suite:
    """Parse and validate every trial of the file before anything runs."""
    try:
        with open(path) as fh:
            data = yaml.safe_load(fh)
    except OSError as exc:
        raise UserError(f"cannot read suite file {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise UserError(f"suite file {path} is not valid YAML: {str(exc).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise UserError(f"suite file {path}: expected a mapping with {', '.join(sorted(SUITE_FIELDS))}")
    unknown = sorted(set(data) - SUITE_FIELDS)
    if unknown:
        raise UserError(f"suite file {path}: unknown field {unknown[0]!r}; valid: {', '.join(sorted(SUITE_FIELDS))}")
    experiment = data.get("experiment")
    if not isinstance(experiment, str) or not experiment:
        raise UserError(f"suite file {path}: 'experiment' must be a non-empty string")
    seeds = data.get("seeds", [0])
    if not isinstance(seeds, list) or not seeds or not all(isinstance(s, int) and s >= 0 for s in seeds):
        raise UserError(f"suite file {path}: 'seeds' must be a non-empty list of non-negative integers")
    defaults = data.get("defaults", {})
    entries = data.get("trials")
    if not isinstance(defaults, dict) or not isinstance(entries, list) or not entries:
        raise UserError(f"suite file {path}: 'defaults' must be a mapping and 'trials' a non-empty list")
    trials = []
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise UserError(f"suite file {path}: trial {i} must be a mapping")
        for seed in seeds:
            merged: dict[str, Any] = {**defaults, **entry, "seed": seed}
            try:
                trials.append(plan(Trial.from_mapping(merged)).trial)
            except UserError as exc:
                raise UserError(f"suite file {path}: trial {i}: {exc}") from None
    return Suite(experiment, tuple(trials))


def finished_keys(tracker: Tracker) -> set[str]:
    runs = tracker.client.search_runs([tracker.experiment_id],
                                      "tags.`accelbench.kind` = 'trial' and attributes.status = 'FINISHED'",
                                      max_results=50000)
    return {r.data.tags.get("trial_key") for r in runs}


def run_suite(suite: Suite, *, tracker: Tracker, cache: Cache, opts: RunOptions, force: bool = False) -> tuple[int, int]:
    """Run every trial that has no finished run in the experiment yet; returns (ran, skipped)."""
    done = set() if force else finished_keys(tracker)
    todo = [t for t in suite.trials if t.key() not in done]
    for trial in tqdm(todo, desc=f"suite {suite.experiment}", unit="trial", disable=not opts.progress):
        run_trial(trial, cache=cache, tracker=tracker, opts=opts)
    return len(todo), len(suite.trials) - len(todo)
