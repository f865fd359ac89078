"""The Method contract every file in `methods/` implements (see ARCHITECTURE.md, "Methods").

A method's config is a frozen dataclass whose `sampling` field is its family's `SamplingConfig`
(`teachers.families.<family>`): the trial's reference arm, the teacher's own sampler, samples with exactly that
config. Its knobs are addressed flat (`--param cfg=2.0` sets `sampling.cfg`); a method knob may not share a name with
a sampling setting (`core.config.build_config` refuses the config class).
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch

from core.cache import Cache
from core.errors import UserError
from core.samples import Samples
from teachers.families import Family


@dataclass(frozen=True)
class Passes:
    """What one arm runs per sample, as a dry run plans it before anything is loaded: forward passes by kind, each kind
    priced by a measured cost (`bench/costs.yaml`): "step" (one step of the teacher's sampler), "window" (a speculative
    window), "full" (one pass over every position: a one-step student), "head_chain" (a diffusion head's chain for
    one token), "draft_step" / "draft_head_chain" (a draft model's), "student_step" (a distilled student's step),
    "refiner_step" (CoDe's refiner's step: a smaller model), "ar_token" (a companion causal LM's token), "lookup" (a
    table read, free). `at_most`: a bound (speculative decoding's data-dependent count)."""

    counts: dict[str, float] = field(default_factory=dict)
    at_most: bool = False


@dataclass(frozen=True)
class Training:
    """What `fit`'s training costs, as a dry run prices it (`Method.training`): `iterations` optimiser steps of
    `batch` samples (the global batch), each sample's share of a step priced by the measured cost of `kind` (seconds
    per sample per iteration, timed by the cost mode: `Method.train_step`). A kind names what a step's cost depends on
    ("train ard S=4 N=6"), so one measured step prices exactly the trainings that run it."""

    iterations: int
    batch: int
    kind: str


class Method:
    """A sampler built on a teacher. Methods count (NFE, accepted tokens); the harness times."""

    families: ClassVar[tuple[Family, ...]]
    modalities: ClassVar[tuple[str, ...]] = ("image", "text")  # what its teachers may generate
    Config: ClassVar[type]
    key_knobs: ClassVar[tuple[str, ...]] = ()  # the knobs a results table shows for this method
    window_knob: ClassVar[str | None] = None  # the knob that sets its tokens per pass (the report's acceptance plot)
    # One of the five papers' methods: its runs at its default key knobs make the report's headline row.
    headline: ClassVar[bool] = False
    # What the method reads of its teacher beyond the family protocol (e.g. an image AR teacher's `codebook`); a
    # teacher without one is refused at construction, in one line.
    needs: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def lossless(cls, knobs: Mapping[str, str]) -> str | None:
        """The verdict on this setting's sample law against its teacher's, as a leaderboard prints it (knobs as a
        run logs them, strings): "certified: <the exactness test>", "not lossless: <the measured distance>" (a
        method claiming to be lossless and refuted), "lossy: <the measured distance>" (lossy by design), or None
        where no test measured it."""
        return None

    @classmethod
    def config_class(cls, family: Family) -> type:
        """The config dataclass for a teacher of `family`: `Config`, unless a method spans families."""
        return cls.Config

    @classmethod
    def sampling_of(cls, config: Any) -> Any:
        """The family's sampling settings inside a config of this method: what the reference arm samples with."""
        return config.sampling

    @classmethod
    def passes(cls, config: Any, family: Family, length: int) -> dict[str, Passes]:
        """Per arm ("method", and each of `extra_arms`), what it runs per sample under `config` on a teacher of
        `family` with `length` positions (tokens; a multi-scale teacher's scales): a dry run's cost plan. Every
        registered method declares it (the contract test checks)."""
        raise NotImplementedError(f"{cls.__name__} does not declare its passes")

    @classmethod
    def generates(cls, config: Any, family: Family, length: int) -> tuple[str, int, Passes] | None:
        """The teacher samples `fit` draws as training data before it trains (ARD's trajectories, DD's pairs), for a
        dry run to price: (what they are, how many, the passes of each), or None when it draws none."""
        return None

    @classmethod
    def training(cls, config: Any, family: Family, length: int) -> Training | None:
        """What `fit` trains under `config`, for a dry run to price: its iterations, global batch and the kind of step
        (`Training`); None when it trains nothing (a released student, a training-free method, a table counted from
        teacher samples). A method that declares it implements `train_step` (the contract test checks)."""
        return None

    def train_step(self, batch: int, generator: torch.Generator) -> Callable[[], None]:
        """One training iteration of `training(...)`'s kind on `batch` samples, as `fit` runs it (the same loss,
        optimiser and EMA update, on a fresh student built as `fit` builds it), on random inputs of the data's shapes
        drawn by `generator` (on the CPU): the cost mode times it (`bench.cost.time_training`), for an iteration costs
        the same whatever the data and weights. Returns the call; building it is not part of what is timed."""
        raise NotImplementedError(f"{type(self).__name__} trains nothing")

    @classmethod
    def batch_refusal(cls, teacher_cls: type, batch_size: int) -> str | None:
        """Why this method cannot sample batches of `batch_size` on a teacher of this class, in one line naming the
        batch size to use, or None (SJD and Jacobi need a teacher with a ragged cache above batch size 1)."""
        return None

    @classmethod
    def trains_on_every_rank(cls, config: Any) -> bool:
        """Whether `fit` trains with every rank of a torchrun trial at once (DDP, `core.distributed`); by default
        rank 0 fits alone while the others wait, then they read its result from the cache."""
        return False

    @classmethod
    def trains(cls, config: Any) -> bool:
        """Whether `fit` trains (or generates its training data) under `config`: a dry run says so."""
        return cls.fit is not Method.fit

    @classmethod
    def required_files(cls, config: Any, checkpoints: Path) -> dict[Path, str]:
        """Files this configuration reads from the user (a released student) in the checkpoints folder: path -> the
        one line that refuses the trial when it is missing (`plan` checks them; a dry run lists them)."""
        return {}

    @classmethod
    def with_files(cls, config: Any, checkpoints: Path) -> Any:
        """The config completed by what the user's files say (a released student's settings), once they are located
        in `checkpoints`; `plan` calls it after building the config. The config itself by default."""
        return config

    def __init__(self, teacher: Any, config: Any):
        missing = [a for a in self.needs if not hasattr(teacher, a)]
        if missing:
            name = getattr(teacher, "name", type(teacher).__name__)
            raise UserError(f"{type(self).__name__} reads the teacher's {' and '.join(missing)}, which teacher "
                            f"{name!r} does not have")
        self.teacher, self.config = teacher, config

    def fit(self, *, cache: Cache, checkpoints: Path) -> dict[str, float]:
        """Train what the method needs (cached by key), or read it from the user's files in `checkpoints` (a released
        student); returns figures to log. Training-free methods: no-op."""
        return {}

    def stand_in(self) -> None:
        """Put seeded random weights where `fit` would train or read them (a student, a table), nothing trained and
        no file read: the cost mode's (`bench.cost`), for a pass costs the same whatever the weights. A method whose
        `fit` trains or reads must override it (the contract test checks); one without `fit` has nothing to do."""

    def caveats(self) -> dict[str, str]:
        """Where this configuration departs from the paper or its released code, by name -> one line: logged with the
        run as tags `caveat.<name>` (and listed by the report)."""
        return {}

    def extra_arms(self, *, cache: Cache, device: torch.device, checkpoints: Path,
                   random: bool = False) -> dict[str, "Method"]:
        """Baselines this method is compared with in the same run besides the teacher's reference arm, by arm name
        (the runner samples them interleaved with the others and logs them under "<name>/"). `random`: a model an arm
        loads is its full-size random build instead (the cost mode's, `bench.cost.build`)."""
        return {}

    def sample(self, cond: torch.Tensor, *, generator: torch.Generator) -> Samples:
        raise NotImplementedError


class TeacherSampler(Method):
    """The teacher's own sampler (its family's), under a config that is the family's `SamplingConfig` itself: every
    trial's reference arm, and a method of its own under the family's sampler name (`methods.teacher_samplers`)."""

    @classmethod
    def config_class(cls, family: Family) -> type:
        return family.SamplingConfig

    @classmethod
    def sampling_of(cls, config: Any) -> Any:
        return config

    @classmethod
    def passes(cls, config: Any, family: Family, length: int) -> dict[str, Passes]:
        return {"method": Passes(family.passes(config, length))}

    def sample(self, cond: torch.Tensor, *, generator: torch.Generator) -> Samples:
        return self.teacher.family.sample(self.teacher, cond, self.config, generator=generator)
