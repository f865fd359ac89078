"""The latency protocol: how a trial's `speedup_wall` and the cost mode's latency are timed (the harness times;
methods never do).

As optimum-benchmark and vLLM's latency benchmark do it: every arm is called at the timed shapes `warmup` times
first (compilation, allocator growth and cache fills land there, reported apart as `warmup_seconds`), then the arms
are called in turn, one call each per round (so a change in the machine's load falls on all of them alike), until
every arm has at least `min_count` timed calls and `min_seconds` of timed calls, or `max_count` calls. CUDA work is
synchronised on both ends of each call (`core.timing.stopwatch`). Each arm's calls give the median, p90 and the
coefficient of variation (CV %, standard deviation over mean); an arm whose CV exceeds `cv_bound` is `noisy`, and a
speed-up between arms of which one is noisy is flagged, not averaged away.

The defaults: 10 warm-up calls (the issue's floor for the cost mode and vLLM's default `--num-iters-warmup`), 10
timed calls and 1 s (vLLM times 30 iterations of a full batch; 10 keep a CPU run of the tiny teachers in seconds),
CV bound 10 %: on this 2-core machine, idle, the tiny teachers' arms measured CV 1-6 %, and 20-60 % with two busy
processes beside them (issue 41's measurements), so 10 % separates the two.
"""
from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass
from typing import Callable

import torch

from core.errors import UserError


@dataclass(frozen=True)
class LatencyProtocol:
    warmup: int = 10  # calls per arm before timing
    min_count: int = 10  # timed calls per arm, at least
    min_seconds: float = 1.0  # timed seconds per arm, at least
    max_count: int = 1000  # timed calls per arm, at most (a floor of seconds on a fast arm stops here)
    cv_bound: float = 10.0  # % : an arm above it is flagged noisy

    def __post_init__(self):
        if self.warmup < 0 or self.min_count < 1 or self.max_count < self.min_count:
            raise UserError(f"latency protocol: warmup must be >= 0 and 1 <= min_count <= max_count, got warmup "
                            f"{self.warmup}, min_count {self.min_count}, max_count {self.max_count}")
        if not (math.isfinite(self.min_seconds) and self.min_seconds >= 0):
            raise UserError(f"latency protocol: min_seconds must be a finite number >= 0, got {self.min_seconds}")
        if not (math.isfinite(self.cv_bound) and self.cv_bound > 0):
            raise UserError(f"latency protocol: cv_bound must be a finite number > 0, got {self.cv_bound}")


@dataclass(frozen=True)
class Latency:
    """One arm's timed calls under the protocol, each of `batch` samples."""

    seconds: tuple[float, ...]
    batch: int
    warmup_seconds: float
    cv_bound: float

    @property
    def median(self) -> float:  # seconds per call
        return float(statistics.median(self.seconds))

    @property
    def p90(self) -> float:
        return percentile(self.seconds, 90)

    @property
    def cv(self) -> float:  # %
        return cv_pct(self.seconds)

    @property
    def noisy(self) -> bool:
        return self.cv > self.cv_bound

    def metrics(self) -> dict[str, float]:
        """The MLflow metrics of the arm (per sample: a call's time over its batch)."""
        return {"latency_per_sample_median": self.median / self.batch,
                "latency_per_sample_p90": self.p90 / self.batch, "latency_cv_pct": self.cv,
                "latency_count": float(len(self.seconds)), "latency_batch": float(self.batch),
                "latency_warmup_seconds": self.warmup_seconds, "latency_noisy": float(self.noisy)}


def measure(arms: dict[str, Callable[[], None]], protocol: LatencyProtocol, device: torch.device, batch: int,
            clock: Callable[[], float] = time.perf_counter) -> dict[str, Latency]:
    """Time each of `arms` (a call draws one batch of `batch` samples) under `protocol`, interleaved. `clock` is the
    timer (a test passes a fake one, to check the stopping rule by counting calls)."""
    def timed(fn) -> float:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = clock()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return clock() - t0

    warm = {name: 0.0 for name in arms}
    for _ in range(protocol.warmup):
        for name, fn in arms.items():
            warm[name] += timed(fn)
    times: dict[str, list[float]] = {name: [] for name in arms}

    def done(t: list[float]) -> bool:
        return len(t) >= protocol.max_count or (len(t) >= protocol.min_count and sum(t) >= protocol.min_seconds)

    while not all(done(t) for t in times.values()):
        for name, fn in arms.items():
            if not done(times[name]):
                times[name].append(timed(fn))
    return {name: Latency(tuple(t), batch, warm[name], protocol.cv_bound) for name, t in times.items()}


def cv_pct(seconds) -> float:
    """The coefficient of variation (%) of a list of times: the spread the protocol flags (the population standard
    deviation, numpy's `std`)."""
    t = [float(s) for s in seconds]
    return 100 * statistics.pstdev(t) / statistics.fmean(t) if len(t) > 1 and statistics.fmean(t) > 0 else 0.0


def percentile(seconds, q: int) -> float:
    """numpy's default `percentile` (linear between the closest ranks) by the standard library's `quantiles`: the
    latency protocol needs no numpy, which a bare GPU box (`make gpu-bench`) may lack."""
    t = [float(s) for s in seconds]
    return t[0] if len(t) == 1 else statistics.quantiles(t, n=100, method="inclusive")[q - 1]
