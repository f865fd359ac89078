"""`skip-scales`: VAR's skip-n baseline of Distilled Decoding (arXiv:2412.17153, Table 1: VAR-skip-1, VAR-skip-2):
the teacher's own next-scale sampler stops n scales early and the image is decoded from the partial residual sum of
the scales it drew. The paper "directly skips the last several steps" without saying what the decoder sees; for VAR
the partial multi-scale sum is the natural reading (docs/methods/dd.md), exact up to the skipped detail. The first
K - n scales are the teacher's sampler draw for draw (skip = 0 is exactly `ar`); nfe = K - n per image.
"""
from __future__ import annotations

from dataclasses import dataclass

from core.errors import UserError
from methods.base import Method, Passes
from teachers.families import multiscale_vq


@dataclass(frozen=True)
class SkipScalesConfig:
    sampling: multiscale_vq.SamplingConfig = multiscale_vq.SamplingConfig()  # the teacher's (VAR's README defaults)
    skip: int = 1  # n: the last scales not drawn, in [0, K - 1]

    def __post_init__(self):
        if self.skip < 0:
            raise ValueError(f"skip must be >= 0 (and < the teacher's number of scales), got {self.skip}")


class SkipScales(Method):
    """The teacher's first K - n scales, decoded from their partial residual sum (VAR-skip-n)."""

    families = (multiscale_vq.FAMILY,)
    modalities = ("image",)
    Config = SkipScalesConfig
    key_knobs = ("skip",)

    @classmethod
    def passes(cls, config: SkipScalesConfig, family, length: int) -> dict[str, Passes]:
        return {"method": Passes({"step": length - config.skip})}

    def __init__(self, teacher, config: SkipScalesConfig):
        super().__init__(teacher, config)
        K = len(teacher.patch_nums)
        if not config.skip < K:
            raise UserError(f"skip-scales: skip must be < the teacher's {K} scales, got {config.skip}")

    def sample(self, cond, *, generator):
        K = len(self.teacher.patch_nums)
        return multiscale_vq.sample_scales(self.teacher, cond, self.config.sampling, generator=generator,
                                           scales=K - self.config.skip)
