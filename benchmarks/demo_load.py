"""The demo's wall speed-ups on an idle machine and beside busy processes, at each torch thread count: what the
thread default of `make demo` is chosen from (the Makefile states the figures).

    python benchmarks/demo_load.py [--threads 1 2] [--busy 0 2] [--seeds 0] [--suite suites/default.yaml]

Each configuration runs the suite (its seeds replaced by --seeds) in a fresh MLflow store, with `busy` processes
spinning on the CPU beside it the whole time, and prints per trial the mean wall speed-up over seeds, the number of
runs flagged `speedup_wall_noisy`, and each configuration's wall time. The configurations run one after another in
this process's machine; the cache (teachers, students) is the default one, shared.
"""
from __future__ import annotations

import argparse
import multiprocessing
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml


def spin() -> None:
    while True:
        pass


def run_suite(suite: dict, threads: int, busy: int, tmp: Path) -> tuple[float, list]:
    """(seconds, the finished trial runs) of the suite at `threads` with `busy` spinning processes beside it."""
    from mlflow.tracking import MlflowClient

    name = f"t{threads}-b{busy}"
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump({**suite, "experiment": name}))
    store = f"sqlite:///{tmp}/{name}.db"
    spinners = [multiprocessing.Process(target=spin, daemon=True) for _ in range(busy)]
    for p in spinners:
        p.start()
    try:
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "cli", "suite", str(path), "--threads", str(threads), "--warmup", "1",
                        "--no-progress", "--tracking-uri", store, "--out", str(tmp / name)],
                       check=True, stdout=subprocess.DEVNULL)
        seconds = time.perf_counter() - t0
    finally:
        for p in spinners:
            p.terminate()
    client = MlflowClient(store)
    experiment = client.get_experiment_by_name(name)
    runs = client.search_runs([experiment.experiment_id], "attributes.status = 'FINISHED'", max_results=10_000)
    return seconds, [r for r in runs if "speedup_wall" in r.data.metrics]


def label(run) -> str:
    """The run's name less its seed: method, key knobs, teacher (`bench.plan.run_name`)."""
    return run.info.run_name.rsplit(" s", 1)[0]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--suite", default="suites/default.yaml")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--busy", type=int, nargs="+", default=[0, 2])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    args = ap.parse_args()
    suite = {**yaml.safe_load(Path(args.suite).read_text()), "seeds": args.seeds}
    table: dict[str, dict[str, list[float]]] = {}
    noisy: dict[str, int] = {}
    walls: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for busy in args.busy:
            for threads in args.threads:
                config = f"{threads} thread{'s' * (threads > 1)}, {busy} busy"
                walls[config], runs = run_suite(suite, threads, busy, Path(tmp))
                noisy[config] = sum(r.data.metrics.get("speedup_wall_noisy", 0) > 0 for r in runs)
                for r in runs:
                    table.setdefault(label(r), {}).setdefault(config, []).append(r.data.metrics["speedup_wall"])
                print(f"{config}: {walls[config]:.0f} s", file=sys.stderr)
    configs = list(walls)
    print("| trial | " + " | ".join(configs) + " |")
    print("|---|" + "---|" * len(configs))
    for trial in sorted(table):
        cells = [f"{statistics.mean(table[trial][c]):.2f}×" if c in table[trial] else "" for c in configs]
        print(f"| {trial} | " + " | ".join(cells) + " |")
    print("| runs flagged noisy | " + " | ".join(str(noisy[c]) for c in configs) + " |")
    print("| suite wall time | " + " | ".join(f"{walls[c]:.0f} s" for c in configs) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
