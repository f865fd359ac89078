"""`ar`: the teacher's own token-by-token sampler, the reference arm of SJD (arXiv:2410.01699) and DD."""
from __future__ import annotations

from dataclasses import dataclass

from bench.registry import METHODS
from methods.base import Method
from teachers import discrete_ar


@dataclass(frozen=True)
class ARConfig(discrete_ar.SamplingConfig):
    greedy: bool = False  # argmax instead of sampling (top-1)


@METHODS.register("ar")
class AR(Method):
    """Plain autoregressive decoding, one forward pass per token (the teacher's own sampler)."""

    families = (discrete_ar.FAMILY,)
    Config = ARConfig
    key_knobs = ("greedy",)

    def sample(self, cond, *, generator):
        return self.teacher.sample(cond, generator=generator, sampling=self.config, greedy=self.config.greedy)
