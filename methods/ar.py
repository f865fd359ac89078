"""`ar`: the teacher's own token-by-token sampler, the reference arm of SJD (arXiv:2410.01699), DD (arXiv:2412.17153)
and, with the target model alone, of CSpD (arXiv:2411.11925)."""
from __future__ import annotations

from dataclasses import dataclass

from bench.registry import METHODS
from methods.base import Method
from teachers import continuous_ar, discrete_ar


@dataclass(frozen=True)
class ARConfig(discrete_ar.SamplingConfig):
    greedy: bool = False  # argmax instead of sampling (top-1)


@METHODS.register("ar")
class AR(Method):
    """Plain autoregressive decoding, one forward pass per token (the teacher's own sampler)."""

    families = (discrete_ar.FAMILY, continuous_ar.FAMILY)
    Config = ARConfig
    key_knobs = ("greedy",)

    @classmethod
    def config_class(cls, family: str) -> type:
        return continuous_ar.SamplingConfig if family == continuous_ar.FAMILY else ARConfig

    def sample(self, cond, *, generator):
        if isinstance(self.config, ARConfig):
            return self.teacher.sample(cond, generator=generator, sampling=self.config, greedy=self.config.greedy)
        return self.teacher.sample(cond, generator=generator, sampling=self.config)
