"""SJD (arXiv:2410.01699) throughput at batch size 1 / 4 / 16 beside the teacher's own AR sampler.

    python benchmarks/sjd_batch.py [--n-samples 64] [--window 16] [--batches 1 4 16] [--seed 0]

On the tiny teacher `digits-ar-t2i` (from the cache, or the zoo, trained on first use), one torch thread, CPU.
At each batch size both samplers decode the same conditions in this process, one after the other, after one warm-up
batch each. SJD's batches run every row with its own window, acceptance and rollback in shared forward passes (a
ragged KV cache), finished rows leaving the batch; "NFE / sample" counts the passes each sample went through, "batch
forwards / batch" the passes of a batch.

Measured here (2-core AMD EPYC, nothing else running; 128 samples, window 16):

| batch | SJD samples/s | AR samples/s | SJD / AR | SJD NFE / sample | SJD batch forwards / batch |
|---:|---:|---:|---:|---:|---:|
| 1 | 31.79 | 31.03 | 1.02x | 29.7 | 29.7 |
| 4 | 58.48 | 86.28 | 0.68x | 29.7 | 33.1 |
| 16 | 87.08 | 266.86 | 0.33x | 29.6 | 36.6 |

Batching keeps SJD's 2.2x fewer passes per sample and doubles to triples its own throughput, but on a CPU a pass
costs what its tokens cost: a batch of 16 windows of 16 is 256 tokens a pass against AR's 16, so AR gains more from
the batch. SJD's wall-clock gain needs passes whose cost barely grows with the tokens (a GPU at small batch).
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path
from collections import Counter

import torch

from core.cache import Cache
from methods.base import TeacherSampler
from methods.sjd import SJD, SJDConfig
from teachers import load_teacher


def throughput(method, conds: torch.Tensor, batch: int, seed: int) -> tuple[float, Counter, int]:
    """(samples/s, summed counters, batches) of `method` over `conds`, `batch` rows at a time."""
    g = torch.Generator().manual_seed(seed)
    method.sample(conds[:batch], generator=g)  # warm-up
    counts, batches = Counter(), 0
    t0 = time.perf_counter()
    for i in range(0, len(conds), batch):
        counts += method.sample(conds[i : i + batch], generator=g).counters
        batches += 1
    return len(conds) / (time.perf_counter() - t0), counts, batches


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n-samples", type=int, default=64)
    ap.add_argument("--window", type=int, default=16)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.set_num_threads(1)
    device = torch.device("cpu")
    teacher = load_teacher("digits-ar-t2i", cache=Cache(), device=device,
                           checkpoints=Path("checkpoints"))  # a tiny teacher: it reads no files
    config = SJDConfig(window=args.window)
    sjd, ar = SJD(teacher, config), TeacherSampler(teacher, config.sampling)
    conds = teacher.conditions(args.n_samples, torch.Generator().manual_seed(args.seed))
    print(f"digits-ar-t2i: {teacher.seq_len} tokens, window {args.window}, {args.n_samples} samples, 1 thread, CPU")
    print("| batch | SJD samples/s | AR samples/s | SJD / AR | SJD NFE / sample | SJD batch forwards / batch |")
    print("|---:|---:|---:|---:|---:|---:|")
    for batch in args.batches:
        sjd_rate, counts, batches = throughput(sjd, conds, batch, args.seed)
        ar_rate, _, _ = throughput(ar, conds, batch, args.seed)
        print(f"| {batch} | {sjd_rate:.2f} | {ar_rate:.2f} | {sjd_rate / ar_rate:.2f}x | "
              f"{counts['nfe'] / args.n_samples:.1f} | {counts['batch_forwards'] / batches:.1f} |")


if __name__ == "__main__":
    main()
