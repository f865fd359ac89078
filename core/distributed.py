"""Data-parallel trials on torch.distributed: the ranks torchrun starts share one trial's batches.

`torchrun --nproc-per-node N accelbench run ...` starts N copies of the command; each finds its rank in the
environment torchrun sets (RANK, WORLD_SIZE, LOCAL_RANK) and joins one process group: nccl on CUDA, gloo on the CPU
(so the same path runs in the tests here). Batch i of a trial goes to rank i mod N, and its noise is seeded by
(trial seed, i) alone, so N ranks draw exactly the samples one process draws. Every rank spools its batches into the
trial's spool (`core.spool`) under the cache folder, which the ranks therefore share (one node, or a shared file
system); rank 0 alone talks to MLflow and scores the gathered samples.

Without torchrun's variables the world is one process and nothing here touches torch.distributed.
"""
from __future__ import annotations

import atexit
import datetime
import os
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.distributed as dist

from core.cache import Cache
from core.errors import UserError

# How long a rank waits at a barrier: the other ranks wait there while rank 0 trains what a trial needs (a teacher,
# a student, DD's pairs) into the cache, which may take hours at paper scale.
BARRIER_TIMEOUT = datetime.timedelta(hours=24)


@dataclass(frozen=True)
class World:
    rank: int = 0
    size: int = 1
    local_rank: int = 0

    @property
    def main(self) -> bool:
        return self.rank == 0

    def device(self, device: torch.device) -> torch.device:
        """A rank's own GPU on a CUDA trial (cuda -> cuda:LOCAL_RANK); the device as given otherwise."""
        if device.type != "cuda" or self.size == 1:
            return device
        if self.local_rank >= torch.cuda.device_count():
            raise UserError(f"rank {self.rank} has local rank {self.local_rank} but this node has "
                            f"{torch.cuda.device_count()} CUDA device(s): start at most that many processes per node")
        return torch.device("cuda", self.local_rank)

    def barrier(self) -> None:
        if self.size > 1:
            dist.barrier()

    def data_parallel(self, module: torch.nn.Module) -> torch.nn.Module:
        """`module` wrapped in DistributedDataParallel (its gradients averaged over the ranks in `backward`), or itself
        in a one-process world."""
        if self.size == 1:
            return module
        device = next(module.parameters()).device
        return torch.nn.parallel.DistributedDataParallel(module, device_ids=[device] if device.type == "cuda" else None)

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's `obj` on every rank."""
        if self.size == 1:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]


_WORLD = World()


def get_or_build(cache: Cache, kind: str, key: str | None, build: Callable[[], Any], *,
                 together: bool) -> tuple[Any, bool]:
    """A method's trained object: built by every rank at once when `together` (its `ddp`: `build_together`), else
    by this process (`Cache.get_or_build`; in a torchrun trial, rank 0 while the others wait)."""
    return build_together(cache, kind, key, build) if together else cache.get_or_build(kind, key, build)


def build_together(cache: Cache, kind: str, key: str | None, build: Callable[[], Any]) -> tuple[Any, bool]:
    """`Cache.get_or_build` for an object every rank builds together (a student trained with DDP): rank 0 looks in
    the cache and tells the others; if it has no entry every rank builds and rank 0 writes it. Returns (object,
    was_cached) on every rank."""
    w = world()
    if w.size == 1 or key is None:
        return cache.get_or_build(kind, key, build)
    cached = w.broadcast(cache.load(kind, key) is not None if w.main else None)
    if cached:
        w.barrier()  # rank 0 has read it
        return cache.load(kind, key), True
    obj = build()
    if w.main:
        cache.save(kind, key, obj)
    w.barrier()
    return obj, False


def world() -> World:
    return _WORLD


def init(device: str) -> World:
    """Join the process group torchrun describes in the environment (once per process); the one-process world when
    there is none. `device` is the trial's device option: it picks nccl (CUDA) or gloo (CPU)."""
    global _WORLD
    size = int(os.environ.get("WORLD_SIZE", "1"))
    if size == 1 or dist.is_initialized():
        return _WORLD
    rank, local_rank = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    cuda = device.startswith("cuda") or (device == "auto" and torch.cuda.is_available())
    if cuda:
        torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl" if cuda else "gloo", timeout=BARRIER_TIMEOUT)
    atexit.register(shutdown)
    _WORLD = World(rank, size, local_rank)
    return _WORLD


def shutdown() -> None:
    global _WORLD
    if dist.is_initialized():
        dist.destroy_process_group()
    _WORLD = World()
