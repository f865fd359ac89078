"""Sweep throughput with 1 vs 2 local workers, and the share of trial time spent in MLflow tracking.

    python benchmarks/sweep_scaling.py [--n-trials 12] [--n-samples 40]

Uses the cheap `sjd` spec on the cached digits teacher (trained on first use). Both measurements run in this
process's machine, one after the other; the tracking share is measured in-process by timing every MlflowClient call.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

# A categorical space with more points than trials, so no trial is a repeat served from the MLflow store.
SPEC = {"study": "bench", "base": {"teacher": "digits-ar-t2i", "method": "sjd", "metrics": []},
        "space": {"window": {"type": "int", "low": 2, "high": 64}, "init": {"type": "categorical", "choices": [
            "random", "repeat-left", "repeat-above", "sample-left", "sample-above"]}},
        "objectives": [{"metric": "speedup_wall", "direction": "maximize"}], "seeds": [0]}


def throughput(workers: int, n_trials: int, n_samples: int, tmp: Path) -> tuple[float, float]:
    """(trials/hour over the whole command, trials/hour between the first trial's start and the last one's end)."""
    spec = dict(SPEC, n_trials=n_trials, study=f"bench-{workers}")
    spec["base"] = dict(spec["base"], n_samples=n_samples)
    path = tmp / f"spec{workers}.yaml"
    path.write_text(yaml.safe_dump(spec))
    storage = f"{tmp}/optuna{workers}.journal"
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "cli", "sweep", str(path), "--workers", str(workers),
                    "--storage", f"journal:{storage}", "--tracking-uri", f"sqlite:///{tmp}/mlflow{workers}.db"],
                   check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    import optuna
    from optuna.storages.journal import JournalFileBackend

    trials = optuna.load_study(study_name=spec["study"],
                               storage=optuna.storages.JournalStorage(JournalFileBackend(storage))).trials
    done = [t for t in trials if t.state.name == "COMPLETE"]
    span = (max(t.datetime_complete for t in done) - min(t.datetime_start for t in done)).total_seconds()
    return n_trials / wall * 3600, n_trials / span * 3600


def tracking_share(n_samples: int, tmp: Path) -> float:
    from mlflow.tracking import MlflowClient

    from core.cache import Cache
    from bench.plan import plan
    from bench.runner import RunOptions, run_trial
    from bench.tracking import Tracker
    from core.trial import Trial

    spent = [0.0]
    for name in ("create_run", "log_batch", "log_artifacts", "set_terminated", "get_experiment_by_name"):
        original = getattr(MlflowClient, name)

        def timed(self, *a, _original=original, **k):
            t0 = time.perf_counter()
            try:
                return _original(self, *a, **k)
            finally:
                spent[0] += time.perf_counter() - t0

        setattr(MlflowClient, name, timed)
    tracker = Tracker(f"sqlite:///{tmp}/share.db", "share")
    # a tiny teacher: nothing is read from the checkpoints folder
    trial = plan(Trial("digits-ar-t2i", "sjd", {"window": 16}, n_samples=n_samples), checkpoints=tmp)
    run_trial(trial, cache=Cache(), tracker=tracker, opts=RunOptions(progress=False))  # warm: store created
    spent[0] = 0.0
    t0 = time.perf_counter()
    run_trial(trial, cache=Cache(), tracker=tracker, opts=RunOptions(progress=False))
    return spent[0] / (time.perf_counter() - t0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n-trials", type=int, default=12)
    ap.add_argument("--n-samples", type=int, default=40)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        one = throughput(1, args.n_trials, args.n_samples, tmp)
        two = throughput(2, args.n_trials, args.n_samples, tmp)
        share = tracking_share(args.n_samples, tmp)
    print(f"trials/hour, whole command (process start-up included): 1 worker {one[0]:.0f}, 2 workers {two[0]:.0f}, "
          f"ratio {two[0] / one[0]:.2f}x")
    print(f"trials/hour, first trial start to last trial end: 1 worker {one[1]:.0f}, 2 workers {two[1]:.0f}, "
          f"ratio {two[1] / one[1]:.2f}x")
    print(f"share of trial wall time in MLflow calls: {100 * share:.2f} %")


if __name__ == "__main__":
    main()
