"""Data-parallel scaling of one trial: the same trial on 1 and on 2 torchrun ranks (gloo, one torch thread each).

    python benchmarks/scaling.py [--teacher digits-ar-c2i] [--method ar] [--n-samples 512] [--batch-size 8]

Both runs go through the CLI (`python -m torch.distributed.run --nproc-per-node N -m cli run ...`) one after
the other, into one temporary MLflow store and one cache (the teacher is trained or taken from the zoo before the
first timed run). Reported per run: the trial's `samples_per_sec` (the ranks' throughputs summed, each rank's from
its own timed batches: `core.timing.latency_stats`) for the method and the reference arm, and the wall time of the
whole command (start-up, loading and scoring included). Goal: >= 1.8x throughput on 2 ranks of a 2-core machine.
The sample hashes of the two runs are compared too: data parallelism must not change a sample.

Measured here (2-core AMD EPYC, nothing else running; `--n-samples 2048`, `ar` on digits-ar-c2i, batch 8):

| ranks | method samples/s | ref samples/s | command wall s |
|---:|---:|---:|---:|
| 1 | 176.5 | 176.5 | 32.5 |
| 2 | 339.5 | 337.4 | 21.6 |

2 vs 1 rank: 1.92x the method's throughput, 1.91x the reference's, 1.50x the whole command (start-up, loading the
teacher and scoring run once per trial); the two runs drew the same samples. With 512 samples: 1.85x and 1.86x.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from mlflow.tracking import MlflowClient


def run(ranks: int, args, tmp: Path, store: str) -> tuple[float, object]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}", "-m",
           "cli", "run", "--teacher", args.teacher, "--method", args.method, "--n-samples", str(args.n_samples),
           "--batch-size", str(args.batch_size), "--threads", "1", "--no-progress", "--tracking-uri", store,
           "--cache-dir", str(tmp / "cache"), "--experiment", f"ranks{ranks}"]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, env={**os.environ, "OMP_NUM_THREADS": "1"})
    wall = time.perf_counter() - t0
    client = MlflowClient(store)
    (found,) = client.search_runs([client.get_experiment_by_name(f"ranks{ranks}").experiment_id])
    return wall, found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--teacher", default="digits-ar-c2i")
    ap.add_argument("--method", default="ar")
    ap.add_argument("--n-samples", type=int, default=512)
    ap.add_argument("--batch-size", type=int, default=8)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        tmp = Path(folder)
        store = f"sqlite:///{tmp}/mlflow.db"
        subprocess.run([sys.executable, "-m", "cli", "run", "--teacher", args.teacher, "--method", args.method,
                        "--n-samples", "1", "--no-progress", "--tracking-uri", store, "--cache-dir",
                        str(tmp / "cache"), "--experiment", "prepare"], check=True, stdout=subprocess.DEVNULL)
        results = {ranks: run(ranks, args, tmp, store) for ranks in (1, 2)}
    print(f"{args.method} on {args.teacher}: {args.n_samples} samples in batches of {args.batch_size}, "
          f"1 thread per rank")
    print("| ranks | method samples/s | ref samples/s | command wall s |")
    print("|---:|---:|---:|---:|")
    for ranks, (wall, r) in results.items():
        m = r.data.metrics
        print(f"| {ranks} | {m['samples_per_sec']:.1f} | {m['ref/samples_per_sec']:.1f} | {wall:.1f} |")
    (w1, r1), (w2, r2) = results[1], results[2]
    m1, m2 = r1.data.metrics, r2.data.metrics
    print(f"scaling 2 vs 1 rank: method {m2['samples_per_sec'] / m1['samples_per_sec']:.2f}x, "
          f"ref {m2['ref/samples_per_sec'] / m1['ref/samples_per_sec']:.2f}x, "
          f"whole command {w1 / w2:.2f}x")
    same = all(r1.data.tags[k] == r2.data.tags[k] for k in r1.data.tags if k.startswith("samples_sha256."))
    print(f"same samples on 1 and 2 ranks: {same}")


if __name__ == "__main__":
    main()
