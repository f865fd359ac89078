"""Latency statistics from per-batch wall times (the harness times; methods never do)."""
from __future__ import annotations

import argparse
import time
from contextlib import contextmanager

import numpy as np
import torch


@contextmanager
def stopwatch(device: torch.device, out: list[float]):
    """Append the wall time of the block to `out`, waiting for queued device work on both ends."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    yield
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    out.append(time.perf_counter() - t0)


def cost_arguments(ap: argparse.ArgumentParser) -> tuple[argparse.Namespace, torch.device]:
    """The options every full-size cost script shares (--device, --threads, --repeats) added and parsed; torch's
    thread count set. Returns the parsed arguments and the device."""
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    return args, torch.device(args.device)


def median_seconds(fn, repeats: int, device: torch.device) -> float:
    """The median wall time of `fn()` over `repeats` calls after one warm-up call (the benchmark scripts')."""
    fn()
    times: list[float] = []
    for _ in range(repeats):
        with stopwatch(device, times):
            fn()
    return float(np.median(times))


def latency_stats(batch_seconds: list[float], batch_sizes: list[int]) -> dict[str, float]:
    t = np.asarray(batch_seconds, dtype=np.float64)
    per_sample = t / np.asarray(batch_sizes, dtype=np.float64)  # the last batch may be smaller
    return {
        "sec_per_batch_median": float(np.median(t)),
        "sec_per_batch_p90": float(np.percentile(t, 90)),
        "sec_per_sample_median": float(np.median(per_sample)),
        "sec_per_sample_p90": float(np.percentile(per_sample, 90)),
        "samples_per_sec": float(sum(batch_sizes) / t.sum()),
    }
