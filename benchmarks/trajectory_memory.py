"""ARD's `fit` at three trajectory counts: resident memory stays flat while the trajectories on disk grow 100x.

    python benchmarks/trajectory_memory.py [--sizes 4600,46000,460000] [--steps 8]

Each size is one `accelbench run --method ard` (a process of its own, through the CLI) on the tiny DiT of
tests/tiny_recipes.py (16x16 digits, hidden 16: generating a trajectory costs little, so the sizes can be large), K
= `--steps` DDIM steps, 20 training steps at batch 16, into one temporary cache: the trajectories are written as
shards (`core.shards`) and the training batches read from them. Reported per size: the trajectories' bytes on disk,
the process's peak resident memory (the kernel's count, `wait4`'s ru_maxrss) and the command's wall time. A first
run trains the teacher, so that no size pays for it.

Measured here (2-core Intel Xeon, other tests running beside it; K = 8; 8,712 bytes a trajectory):

| trajectories | on disk MB | peak resident MB | wall s |
|---:|---:|---:|---:|
| 4,600 | 38 | 1,242 | 18 |
| 46,000 | 382 | 1,252 | 149 |
| 460,000 | 3,822 | 1,244 | 862 |

100x the trajectories, 100x the disk, the same resident memory (within 10 MB: what the allocator keeps of the
generation's activations); before the shards, `fit` held them all, float16, and their float32 pairs besides.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TRAJECTORIES = "ard-trajectories"


def peak_rss_mb(argv: list[str], env: dict[str, str]) -> float:
    """Run argv to its end (a non-zero exit raises, with the output's tail); its peak resident memory in MB."""
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    out = proc.stdout.read().decode()
    _, status, usage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"{' '.join(argv[:8])} ... failed:\n{out[-3000:]}")
    return usage.ru_maxrss / 1024


def ard_run(tmp: Path, n_traj: int, seed: int, steps: int = 8, *extra: str,
            teacher: str = "digits-dit-c2i") -> list[str]:
    """`accelbench run` of ARD on a tiny DiT (the one of tests/tiny_recipes.py unless `teacher` says) with n_traj
    trajectories of train_seed `seed`, into tmp's cache."""
    return [sys.executable, "-m", "cli", "run", "--teacher", teacher, "--method", "ard",
            "--param", f"n_traj={n_traj}", "--param", f"train_seed={seed}", "--param", f"steps={steps}",
            "--param", "train_steps=20", "--param", "batch=16", "--n-samples", "4", "--batch-size", "4",
            "--cache-dir", str(tmp / "cache"), "--warmup", "0", "--tracking-uri", f"sqlite:///{tmp}/mlflow.db",
            "--no-progress", *extra]


def tiny_env() -> dict[str, str]:
    return {**os.environ, "ACCELBENCH_PLUGINS": "tests.tiny_recipes_plugin", "PYTHONPATH": str(ROOT)}


def bytes_on_disk(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.glob("*.bin"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="4600,46000,460000", help="trajectory counts, comma-separated")
    ap.add_argument("--steps", type=int, default=8, help="K, the teacher's DDIM steps per trajectory")
    args = ap.parse_args()
    env = tiny_env()
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        peak_rss_mb(ard_run(tmp, 500, 99, args.steps), env)  # the teacher, trained once
        print("| trajectories | on disk MB | peak resident MB | wall s |\n|---:|---:|---:|---:|")
        for seed, n in enumerate(int(s) for s in args.sizes.split(",")):
            before = {d: bytes_on_disk(d) for d in (tmp / "cache" / TRAJECTORIES).iterdir()}
            t0 = time.perf_counter()
            peak = peak_rss_mb(ard_run(tmp, n, seed, args.steps), env)
            wall = time.perf_counter() - t0
            new = max(bytes_on_disk(d) for d in (tmp / "cache" / TRAJECTORIES).iterdir() if d not in before)
            print(f"| {n:,} | {new / 2**20:,.0f} | {peak:,.0f} | {wall:.0f} |", flush=True)


if __name__ == "__main__":
    main()
