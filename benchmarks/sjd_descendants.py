"""SJD and its training-free descendants side by side with the teacher's AR sampler, at window 16.

    python benchmarks/sjd_descendants.py [--teacher llamagen-b-256] [--seeds 0 1 2] [--n-samples 1] [--threads 2]

On LlamaGen-B (256 x 256 px, 256 tokens, 16,384 codes, CFG 4.0, top-k 0) at full size with seeded random weights
(`LlamaGenC2I.random`, no file read), or on a tiny zoo teacher (`--teacher digits-ar-t2i`). Per method and seed,
the samples are drawn after one warm-up sample, right after the AR sampler's at the same seed, in this process: NFE
per sample (step compression = tokens / NFE) and the wall-time ratio AR / method. A random network's next-token laws
are near uniform over its codes, so drafts are almost never accepted: the step compression here is the random
weights', not the trained model's; what this measures at full size is each method's per-pass overhead (the tiny
trained teacher's numbers are the ones that compare methods' acceptance: REPORT.md of `make demo`).
"""
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from core.cache import Cache
from core.config import build_config
from core.registry import METHODS, TEACHERS
from methods.base import TeacherSampler
from teachers import load_teacher

METHODS_AT_16 = [  # (label, method, knobs)
    ("sjd", "sjd", {}),
    ("scd gumbel exact", "scd", {"mode": "exact"}),
    ("scd maximal exact", "scd", {"coupling": "maximal", "mode": "exact"}),
    ("gsd", "gsd", {}),
    ("sjd verify=lantern", "sjd", {"verify": "lantern"}),
    # K = 3, D = 3 (13 tree nodes) is the widest three-level tree a window of 16 holds (the paper's K = 4 needs 21)
    ("sjd-pac K=3 D=3 released", "sjd-pac", {"tree_width": 3, "tree_depth": 3}),
    ("sjd-pac K=3 D=3 exact", "sjd-pac", {"tree_width": 3, "tree_depth": 3, "mode": "exact"}),
]


def timed(sampler, conds: torch.Tensor, seed: int) -> tuple[float, float]:
    """(seconds per sample, NFE per sample) over `conds`, one at a time, after a warm-up sample."""
    g = torch.Generator().manual_seed(seed)
    sampler.sample(conds[:1], generator=g)
    nfe, t0 = 0, time.perf_counter()
    for i in range(len(conds)):
        nfe += sampler.sample(conds[i : i + 1], generator=g).counters["nfe"]
    return (time.perf_counter() - t0) / len(conds), nfe / len(conds)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--teacher", default="llamagen-b-256")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--n-samples", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--cfg", type=float, default=4.0)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    cpu = torch.device("cpu")
    cls = TEACHERS.get(args.teacher)
    teacher = (cls.random(args.teacher, cpu) if hasattr(cls, "random")
               else load_teacher(args.teacher, cache=Cache(), device=cpu, checkpoints=Path("checkpoints")))
    print(f"{args.teacher}: {teacher.seq_len} tokens, {teacher.vocab_size} codes, window 16, CFG {args.cfg}, "
          f"{args.n_samples} sample(s) x seeds {args.seeds}, {args.threads} threads, CPU\n")
    print("| method | NFE / sample | step compression | wall speed-up (AR / method) |")
    print("|---|---:|---:|---:|")
    for label, name, knobs in METHODS_AT_16:
        method_cls = METHODS.get(name)
        method = method_cls(teacher, build_config(method_cls.Config, {"window": 16, "cfg": args.cfg, **knobs},
                                                  owner=name))
        ar = TeacherSampler(teacher, method.config.sampling)
        nfe, speedup = [], []
        for seed in args.seeds:
            conds = teacher.conditions(args.n_samples, torch.Generator().manual_seed(seed))
            ar_s, _ = timed(ar, conds, seed)
            s, n = timed(method, conds, seed)
            nfe.append(n)
            speedup.append(ar_s / s)
        spread = statistics.stdev(speedup) if len(speedup) > 1 else 0.0
        print(f"| {label} | {statistics.mean(nfe):.1f} | {teacher.seq_len / statistics.mean(nfe):.2f}x | "
              f"{statistics.mean(speedup):.2f}x +- {spread:.2f} |", flush=True)


if __name__ == "__main__":
    main()
