"""Latency statistics from per-batch wall times (the harness times; methods never do)."""
from __future__ import annotations

import argparse
import time
from contextlib import contextmanager

import numpy as np
import torch

from bench.names import SEC_PER_SAMPLE


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


def latency_stats(batch_seconds: list[float], batch_sizes: list[int],
                  ranks: list[int] | None = None) -> dict[str, float]:
    """An arm's speed from its batches' wall times. With several ranks (`ranks[i]` drew batch i, in parallel with the
    others): the per-sample and per-batch medians are the median of each rank's own median, the throughput is the
    ranks' throughputs summed (`samples_per_sec`) and each rank's (`samples_per_sec_rank<r>`); p90s pool every batch."""
    t = np.asarray(batch_seconds, dtype=np.float64)
    sizes = np.asarray(batch_sizes, dtype=np.float64)
    per_sample = t / sizes  # the last batch may be smaller
    owner = np.zeros(len(t), dtype=np.int64) if ranks is None else np.asarray(ranks)
    by_rank = {int(r): owner == r for r in np.unique(owner)}
    throughput = {r: float(sizes[m].sum() / t[m].sum()) for r, m in by_rank.items()}
    stats = {
        "sec_per_batch_median": float(np.median([np.median(t[m]) for m in by_rank.values()])),
        "sec_per_batch_p90": float(np.percentile(t, 90)),
        SEC_PER_SAMPLE: float(np.median([np.median(per_sample[m]) for m in by_rank.values()])),
        "sec_per_sample_p90": float(np.percentile(per_sample, 90)),
        "samples_per_sec": sum(throughput.values()),
    }
    if len(by_rank) > 1:
        stats.update({f"samples_per_sec_rank{r}": v for r, v in throughput.items()})
    return stats
