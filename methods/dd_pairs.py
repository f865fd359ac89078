"""The (noise, data) pair dataset of Distilled Decoding (Liu et al., arXiv:2412.17153, Algorithm 1).

The teacher runs token by token with its KV cache; each token is q_i = FM(eps_i, p(. | q_<i)) (`dd_token_flow.flow_map`)
instead of a random draw, so a sequence is a deterministic function of its noise (n, C) and its condition. On a VAR
teacher (`multiscale_vq`) a step is a scale: all its tokens are mapped at once, each from its own noise and its own
conditional given the earlier scales (docs/methods/dd.md, Eq. 5). The DD
student learns this map; the onestep* and skip-n baselines read the teacher-sample marginals off the same tokens.
"""
from __future__ import annotations

import dataclasses
import shutil
import time
import typing
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch

from core import distributed
from core.cache import Cache, keyed
from core.shards import Field, Shards
from methods.dd_token_flow import FlowConfig, Solver, flow_map
from teachers.families import multiscale_vq
from teachers.families.ar_token import SamplingConfig, process

VERSION = 1  # bump when a change alters the pairs a PairConfig produces
SHARD_BATCHES = 16  # generation batches per noise shard: 356 MB at VAR-d16's 680 tokens x 32 floats, batch 256


@dataclass(frozen=True)
class PairConfig:
    n_pairs: int = 20_000
    flow: FlowConfig = FlowConfig()
    batch: int = 256  # sequences per teacher pass while generating
    seed: int = 0  # draws the conditions and the noise

    def __post_init__(self):
        if self.n_pairs < 1:
            raise ValueError(f"n_pairs must be >= 1, got {self.n_pairs}")
        if self.batch < 1:
            raise ValueError(f"batch must be >= 1, got {self.batch}")


@dataclass(frozen=True)
class PairKnobs:
    """The pair dataset as flat method knobs (the runner and Optuna set scalars), defaulting to PairConfig()'s."""

    n_pairs: int = PairConfig.n_pairs
    solver: Solver = FlowConfig.solver
    solver_steps: int = FlowConfig.steps
    train_seed: int = PairConfig.seed  # of the pairs' conditions and noise (and of DD's training)

    def __post_init__(self):
        if self.n_pairs < 1 or self.solver_steps < 1:
            raise ValueError(f"n_pairs and solver_steps must be >= 1, got {self.n_pairs}, {self.solver_steps}")
        if self.solver not in typing.get_args(Solver):
            raise ValueError(f"solver must be one of {', '.join(typing.get_args(Solver))}, got {self.solver!r}")

    @property
    def pairs(self) -> PairConfig:
        return PairConfig(n_pairs=self.n_pairs, flow=FlowConfig(solver=self.solver, steps=self.solver_steps),
                          seed=self.train_seed)


@dataclass
class Pairs:
    noise: Shards | None  # field "noise" (n, C) float32 per pair: X_1 = (eps_1 .. eps_n), on disk; None unless asked
    tokens: torch.Tensor  # (N, n) long: X_{n+1}, the teacher's tokens for that noise
    cond: torch.Tensor  # (N, P) long
    info: dict = field(default_factory=dict)  # seconds, n_pairs, cached


@torch.inference_mode()
def rollout(teacher, cond: torch.Tensor, sampling: SamplingConfig, n_tokens: int,
            pick: Callable[[int, torch.Tensor], torch.Tensor], prefix: torch.Tensor | None = None) -> torch.Tensor:
    """The teacher's next n_tokens (>= 1) for cond (B, P) after `prefix` (B, k) (none: from the start): one forward
    pass per token, KV-cached, the prefix read in the first -> (B, n_tokens).

    pick(i, probs (B, V)) -> (B,) chooses token i from its processed distribution (CFG, temperature, top-k). With
    `draw` it is the teacher's own sampler (`ar_token.sample_ar`), consuming the generator in the same order.
    """
    # a prefix is read in the condition's pass (`start`'s prefix: the teachers DD distils)
    state, logits = (teacher.start(cond, cfg=sampling.cfg) if prefix is None
                     else teacher.start(cond, cfg=sampling.cfg, prefix=prefix))
    tokens = torch.empty(cond.shape[0], n_tokens, dtype=torch.long, device=cond.device)
    for i in range(n_tokens):
        if i:
            logits = teacher.extend(state, tokens[:, i - 1 : i])[:, -1]
        tokens[:, i] = pick(i, process(logits, sampling))
    return tokens


def map_noise(teacher, noise: torch.Tensor, cond: torch.Tensor, sampling,
              flow: FlowConfig) -> torch.Tensor:
    """Eq. 5 to the end: noise (B, n, C) and cond (B, P) -> the teacher's tokens (B, n), deterministically.

    `flow_map` is row-wise; the teacher's forward pass could round differently in another batch composition (on CPU,
    the digits teacher gave identical tokens for batches of 1, 7, 64 and 256).
    """
    codebook = teacher.codebook
    if teacher.family is multiscale_vq.FAMILY:
        return _map_scales(teacher, noise, cond, sampling, flow)
    return rollout(teacher, cond, sampling, teacher.seq_len,
                   lambda i, probs: flow_map(noise[:, i], probs, codebook, flow))


@torch.inference_mode()
def _map_scales(teacher, noise: torch.Tensor, cond: torch.Tensor, s: multiscale_vq.SamplingConfig,
                flow: FlowConfig) -> torch.Tensor:
    """`map_noise` scale by scale: VAR's sampler (CFG ramp, top-k, top-p) with the flow map in place of the draw."""
    B, K = len(cond), len(teacher.patch_nums)
    state, logits = teacher.start(cond, cfg=s.cfg != 0)
    tokens, at = [], 0
    for si, pn in enumerate(teacher.patch_nums):
        probs = multiscale_vq.process(multiscale_vq.guide(logits, B, s.cfg, si, K), s)  # (B, pn^2, V)
        ids = flow_map(noise[:, at : at + pn * pn].flatten(0, 1), probs.flatten(0, 1), teacher.codebook, flow)
        tokens.append(ids.view(B, pn * pn))
        at += pn * pn
        if si + 1 < K:
            logits = teacher.next_scale(state, tokens[-1])
    return torch.cat(tokens, 1)


def pair_inputs(teacher, cfg: PairConfig) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """The pairs' conditions (b, P) and noise (b, n, C), drawn on the CPU from `cfg.seed`, one generation batch at a
    time (so that no more than a batch of noise is ever in memory: 1.2 M pairs of VAR-d16 are 104 GB of it).

    On the CPU whatever the device: the pair dataset is cached under a key without the device, so its inputs must be
    the same everywhere; and drawing them again takes a fraction of a second, so the cache entry keeps the tokens and
    the conditions, not the noise (20k x n x C floats: the entry ships in the model zoo without it)."""
    g, C = torch.Generator().manual_seed(cfg.seed), teacher.codebook.shape[1]
    for start in range(0, cfg.n_pairs, cfg.batch):
        b = min(cfg.batch, cfg.n_pairs - start)
        cond = teacher.conditions(b, g).cpu()
        yield cond, torch.randn(b, teacher.seq_len, C, generator=g)  # (b, P), (b, n, C)


def pair_noise(teacher, cfg: PairConfig, cond: torch.Tensor, *, cache: Cache, key: str | None) -> Shards:
    """The pairs' noise, drawn again from the seed into shards in the cache (`core.shards`, under the pairs' key;
    checked against the pairs' conditions `cond`, drawn with it), for DD's training to read a batch at a time."""
    shards = Shards.in_cache(cache.root, "dd-noise", key,
                             {"noise": Field((teacher.seq_len, teacher.codebook.shape[1]), torch.float32)},
                             cfg.n_pairs, cfg.batch * SHARD_BATCHES)
    if shards.missing():
        batches = pair_inputs(teacher, cfg)
        for j, (start, stop) in enumerate(shards.ranges()):
            drawn = [next(batches) for _ in range(0, stop - start, cfg.batch)]
            if not torch.equal(torch.cat([c for c, _ in drawn]), cond[start:stop]):
                raise RuntimeError(f"dd-pairs {key}: the conditions drawn again from seed {cfg.seed} differ from the "
                                   f"cached ones; delete the entry")
            if not shards.has(j):
                shards.write(j, {"noise": torch.cat([eps for _, eps in drawn])})
    return shards


def generate_pairs(teacher, s, cfg: PairConfig, *, cache: Cache, noise: bool = False,
                   world: distributed.World = distributed.World()) -> Pairs:
    """Algorithm 1: cfg.n_pairs (noise, tokens, condition) triples, cached by teacher, sampling settings and cfg
    (methods with different knobs of their own share the pairs); the noise only with `noise` (DD's training).

    Every rank of `world` (DD's `ddp`) calls this: the ranks map the generation batches between them (batch b on rank
    b mod N, into shards under the cache: a killed generation resumes), then rank 0 gathers them into the entry. A
    batch's tokens are the same whichever rank maps it, so the entry is the one one process makes."""
    key = keyed(teacher, dataclasses.asdict(s), dataclasses.asdict(cfg), VERSION)
    parts = None
    if world.size > 1 and key is not None and world.broadcast(cache.load("dd-pairs", key) is None
                                                              if world.main else None):
        parts = _map_parts(teacher, s, cfg, cache.root / "dd-pairs-parts" / key, world)
    blob, cached = cache.get_or_build("dd-pairs", key, lambda: _generate(teacher, s, cfg, parts))
    if parts is not None and world.main:
        shutil.rmtree(parts.folder, ignore_errors=True)
    eps = pair_noise(teacher, cfg, blob["cond"], cache=cache, key=key) if noise else None
    return Pairs(eps, blob["tokens"].long(), blob["cond"], {**blob["info"], "cached": cached})


def _map_parts(teacher, s, cfg: PairConfig, folder: Path, world: distributed.World) -> Shards:
    """This rank's generation batches (b mod N = rank) mapped into `folder`, one shard per batch; returns when every
    rank has mapped its own."""
    parts = Shards(folder, {"tokens": Field((teacher.seq_len,), torch.int64)}, cfg.n_pairs, cfg.batch)
    device = teacher.codebook.device
    for b, (cond, noise) in enumerate(pair_inputs(teacher, cfg)):  # every rank draws the whole stream (cheap)
        if b % world.size == world.rank and not parts.has(b):
            parts.write(b, {"tokens": map_noise(teacher, noise.to(device), cond.to(device), s, cfg.flow).cpu()})
    world.barrier()
    return parts


def _generate(teacher, s, cfg: PairConfig, parts: Shards | None = None) -> dict:
    """The pairs' entry: their tokens mapped here, or read from the ranks' `parts`."""
    t0, device = time.perf_counter(), teacher.codebook.device
    conds, tokens = [], []
    for b, (cond, noise) in enumerate(pair_inputs(teacher, cfg)):
        conds.append(cond)
        if parts is None:
            tokens.append(map_noise(teacher, noise.to(device), cond.to(device), s, cfg.flow).cpu())
        else:
            tokens.append(parts.read("tokens", torch.arange(b * cfg.batch, b * cfg.batch + len(cond))))
    dtype = torch.int16 if teacher.vocab_size <= torch.iinfo(torch.int16).max else torch.int32
    return {"tokens": torch.cat(tokens).to(dtype), "cond": torch.cat(conds),
            "info": {"seconds": time.perf_counter() - t0, "n_pairs": cfg.n_pairs}}
