"""The Method contract every file in `methods/` implements (see DESIGN.md, "Core contracts")."""
from __future__ import annotations

from typing import Any, ClassVar

import torch

from bench.cache import Cache
from bench.samples import Samples


class Method:
    """A sampler built on a teacher. Methods count (NFE, accepted tokens); the harness times."""

    families: ClassVar[tuple[str, ...]]
    Config: ClassVar[type]
    key_knobs: ClassVar[tuple[str, ...]] = ()  # the knobs a results table shows for this method
    # Decodes one sequence at a time (speculative / Jacobi decoding commit a different number of tokens per
    # sequence); the runner refuses a larger batch rather than compare a sequential loop with a batched baseline.
    batch_size_one: ClassVar[bool] = False

    @classmethod
    def config_class(cls, family: str) -> type:
        """The config dataclass for a teacher of `family`: `Config`, unless a method spans families."""
        return cls.Config

    def __init__(self, teacher: Any, config: Any):
        self.teacher, self.config = teacher, config

    def fit(self, *, cache: Cache) -> dict[str, float]:
        """Train what the method needs (cached by key); returns figures to log. Training-free methods: no-op."""
        return {}

    def extra_arms(self, *, cache: Cache, device: torch.device) -> dict[str, "Method"]:
        """Baselines this method is compared with in the same run besides the teacher's reference arm, by arm name
        (the runner samples them interleaved with the others and logs them under "<name>/")."""
        return {}

    def sample(self, cond: torch.Tensor, *, generator: torch.Generator) -> Samples:
        raise NotImplementedError
