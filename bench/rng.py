"""Seeded blocks: what draws from torch's global generators (parameter init, dropout, library code that takes no
generator) is made a function of a seed, and the caller's generators are left as they were."""
from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


@contextlib.contextmanager
def seeded(seed: int) -> Iterator[None]:
    """Seed torch's global CPU and CUDA generators inside the block; restore every one of them after it."""
    with torch.random.fork_rng(devices=range(torch.cuda.device_count())):
        torch.manual_seed(seed)
        yield
