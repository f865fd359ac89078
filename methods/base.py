"""The Method contract every file in `methods/` implements (see ARCHITECTURE.md, "Methods").

A method's config is a frozen dataclass whose `sampling` field is its family's `SamplingConfig`
(`teachers.families.<family>`): the trial's reference arm, the teacher's own sampler, samples with exactly that
config. Its knobs are addressed flat (`--param cfg=2.0` sets `sampling.cfg`); a method knob may not share a name with
a sampling setting (`bench.config.build_config` refuses the config class).
"""
from __future__ import annotations

from typing import Any, ClassVar

import torch

from bench.cache import Cache
from bench.errors import UserError
from bench.samples import Samples
from teachers.families import Family


class Method:
    """A sampler built on a teacher. Methods count (NFE, accepted tokens); the harness times."""

    families: ClassVar[tuple[Family, ...]]
    modalities: ClassVar[tuple[str, ...]] = ("image", "text")  # what its teachers may generate
    Config: ClassVar[type]
    key_knobs: ClassVar[tuple[str, ...]] = ()  # the knobs a results table shows for this method
    # Decodes one sequence at a time (speculative / Jacobi decoding commit a different number of tokens per
    # sequence); the runner refuses a larger batch rather than compare a sequential loop with a batched baseline.
    batch_size_one: ClassVar[bool] = False
    # One of the five papers' methods: its runs at its default key knobs make the report's headline row.
    headline: ClassVar[bool] = False
    # What the method reads of its teacher beyond the family protocol (e.g. an image AR teacher's `codebook`); a
    # teacher without one is refused at construction, in one line.
    needs: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def config_class(cls, family: Family) -> type:
        """The config dataclass for a teacher of `family`: `Config`, unless a method spans families."""
        return cls.Config

    @classmethod
    def sampling_of(cls, config: Any) -> Any:
        """The family's sampling settings inside a config of this method: what the reference arm samples with."""
        return config.sampling

    def __init__(self, teacher: Any, config: Any):
        missing = [a for a in self.needs if not hasattr(teacher, a)]
        if missing:
            name = getattr(teacher, "name", type(teacher).__name__)
            raise UserError(f"{type(self).__name__} reads the teacher's {' and '.join(missing)}, which teacher "
                            f"{name!r} does not have")
        self.teacher, self.config = teacher, config

    def fit(self, *, cache: Cache) -> dict[str, float]:
        """Train what the method needs (cached by key); returns figures to log. Training-free methods: no-op."""
        return {}

    def caveats(self) -> dict[str, str]:
        """Where this configuration departs from the paper or its released code, by name -> one line: logged with the
        run as tags `caveat.<name>` (and listed by the report)."""
        return {}

    def extra_arms(self, *, cache: Cache, device: torch.device) -> dict[str, "Method"]:
        """Baselines this method is compared with in the same run besides the teacher's reference arm, by arm name
        (the runner samples them interleaved with the others and logs them under "<name>/")."""
        return {}

    def sample(self, cond: torch.Tensor, *, generator: torch.Generator) -> Samples:
        raise NotImplementedError


class OwnSampler(Method):
    """The teacher's own sampler (its family's), under a config that is the family's `SamplingConfig` itself: every
    trial's reference arm, and a method of its own under the family's sampler name (`methods.own`)."""

    @classmethod
    def config_class(cls, family: Family) -> type:
        return family.SamplingConfig

    @classmethod
    def sampling_of(cls, config: Any) -> Any:
        return config

    def sample(self, cond: torch.Tensor, *, generator: torch.Generator) -> Samples:
        return self.teacher.family.sample(self.teacher, cond, self.config, generator=generator)
