"""Teacher families: the one place a method author reads.

A family module holds the contract between methods and teachers of one kind of generative model:
- the `Protocol` a teacher implements (what a method may call),
- the `SamplingConfig` of the teacher's own sampler (a method's config embeds it as its `sampling` field; the
  reference arm of every trial samples with exactly that config),
- the teacher's own sampler (the reference arm), and the network protocol a distillation student builds on,
- `FAMILY`, a `Family` record naming all of the above for the harness.

Families: `ar_token` (discrete-token AR: image tokens and text, with a KV cache), `continuous_ar` (MAR-style
continuous tokens with a diffusion head, target + draft), `ode_diffusion` (DiT with a PF-ODE sampler),
`masked_diffusion` (MDLM), `multiscale_vq` (VAR: next-scale prediction), `masked_ar` (MAR: continuous tokens in
a random order, bidirectional, target + draft).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable


@dataclass(frozen=True)
class Family:
    name: str  # e.g. "ar-token": logged with every run, listed by `accelbench list`
    SamplingConfig: type  # frozen dataclass of the teacher's own sampler settings
    # The teacher's own sampler: sample(teacher, cond (B, ...), sampling, *, generator) -> Samples. Every trial's
    # reference arm, and the method registered under `sampler`.
    sample: Callable[..., Any]
    sampler: str  # registry name of the method that runs `sample` alone ("ar", "ddim", "mdlm")
    # check(teacher_cls, sampling) -> None: raise ValueError for settings this teacher cannot sample with (e.g. CFG
    # on a teacher without an unconditional branch). Runs at plan time, before any work.
    check: Callable[[type, Any], None] | None = None
    # passes(sampling, length) -> {kind: count}: what the sampler runs per sample under `sampling` (an upper bound where
    # a cache may skip some) on a teacher of `length` positions (tokens; scales of a multi-scale teacher), by kind
    # (`methods.base.Passes`). A dry run plans a trial's cost with it, nothing loaded. By default a step per position.
    passes: Callable[[Any, int], dict[str, float]] = lambda sampling, length: {"step": length}

    def __str__(self) -> str:
        return self.name
