"""Seeded blocks: what draws from torch's global generators (parameter init, dropout, library code that takes no
generator) is made a function of a seed, and the caller's generators are left as they were."""
from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterator

import torch


@contextlib.contextmanager
def seeded(seed: int) -> Iterator[None]:
    """Seed torch's global CPU and CUDA generators inside the block; restore every one of them after it."""
    with torch.random.fork_rng(devices=range(torch.cuda.device_count())):
        torch.manual_seed(seed)
        yield


def batch_seed(seed: int, index: int) -> int:
    """The seed of a trial's batch `index`: a function of (trial seed, batch index) alone, so the batch draws the same
    noise whichever process draws it (`core.distributed`) and whenever (a resumed trial, `core.spool`). Every arm
    of the trial uses it, so the arms' noise stays coupled batch by batch."""
    digest = hashlib.sha256(f"accelbench-batch:{seed}:{index}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)
