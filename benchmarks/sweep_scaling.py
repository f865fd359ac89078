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

SPEC = {"study": "bench", "base": {"teacher": "digits-ar-t2i", "method": "sjd", "metrics": []},
        "space": {"window": {"type": "int", "low": 2, "high": 32, "log": True}},
        "objectives": [{"metric": "speedup_wall", "direction": "maximize"}], "seeds": [0]}


def throughput(workers: int, n_trials: int, n_samples: int, tmp: Path) -> float:
    spec = dict(SPEC, n_trials=n_trials, study=f"bench-{workers}")
    spec["base"] = dict(spec["base"], n_samples=n_samples)
    path = tmp / f"spec{workers}.yaml"
    path.write_text(yaml.safe_dump(spec))
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "bench.cli", "sweep", str(path), "--workers", str(workers),
                    "--storage", f"journal:{tmp}/optuna{workers}.journal",
                    "--tracking-uri", f"sqlite:///{tmp}/mlflow{workers}.db"], check=True, stdout=subprocess.DEVNULL)
    return n_trials / (time.perf_counter() - t0) * 3600


def tracking_share(n_samples: int, tmp: Path) -> float:
    from mlflow.tracking import MlflowClient

    from bench.cache import Cache
    from bench.runner import RunOptions, run_trial
    from bench.tracking import Tracker
    from bench.trial import Trial

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
    trial = Trial("digits-ar-t2i", "sjd", {"window": 16}, n_samples=n_samples)
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
    print(f"trials/hour: 1 worker {one:.0f}, 2 workers {two:.0f}, ratio {two / one:.2f}x")
    print(f"share of trial wall time in MLflow calls: {100 * share:.2f} %")


if __name__ == "__main__":
    main()
