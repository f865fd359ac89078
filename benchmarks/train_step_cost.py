"""What one training iteration of each trainer in a suite costs at full size on this device, without the weights
(random ones): the cost mode's own timing (`bench.cost.time_training`: `Method.train_step`, the loss, optimiser and
EMA update `fit` runs), each distinct (teacher, `Training.kind`) once, at `--batch` samples (a CPU cannot hold the
papers' batches in reasonable time: the dry run prices a larger batch at this one's cost per sample, an upper bound).
Prints the `training:` entries of the teachers' cost-table blocks (bench/costs/<machine>-fp32.yaml).

    python benchmarks/train_step_cost.py suites/papers/ard-table1.yaml [--batch 1] [--threads 2] [--repeats 3]
"""
from __future__ import annotations

import argparse
import gc
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.cost import time_training  # noqa: E402
from bench.suite import load_suite  # noqa: E402
from core import files  # noqa: E402
from core.cache import Cache  # noqa: E402
from core.latency import LatencyProtocol  # noqa: E402
from core.timing import cost_arguments  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("suite", type=Path)
    ap.add_argument("--batch", type=int, default=1, help="samples per timed iteration, at most (default 1)")
    ap.add_argument("--cache-dir", type=Path, default=ROOT / ".cache", help="for a zoo teacher's files")
    args, device = cost_arguments(ap)
    with files.audit():  # nothing is read: the teachers are built at random
        suite = load_suite(str(args.suite), checkpoints=ROOT / "checkpoints",
                           fields={"metrics": [], "device": str(device)})
    protocol = LatencyProtocol(warmup=1, min_count=args.repeats, min_seconds=0.0, max_count=args.repeats)
    seen = set()
    for p in suite.plans:
        training = p.method_cls.training(p.config, p.teacher_cls.family, 0)
        if training is None or (p.trial.teacher, training.kind) in seen:
            continue
        seen.add((p.trial.teacher, training.kind))
        train = time_training(p, protocol, cache=Cache(args.cache_dir), at_most=args.batch)
        per_sample = train.latency.median / train.latency.batch
        print(f"{p.trial.teacher}: training: {train.latency.batch}: {training.kind!r}: {per_sample:.3g}  "
              f"# median of {args.repeats}, {args.threads} threads, {device}", flush=True)
        del train
        gc.collect()


if __name__ == "__main__":
    main()
