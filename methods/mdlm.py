"""`mdlm`: the MDLM teacher's own ancestral sampler (Sahoo et al. 2024, arXiv:2406.07524), the reference arm of SDTT
(arXiv:2410.21035) — at many steps the quality target, at the student's step count the "no distillation" baseline."""
from __future__ import annotations

from bench.registry import METHODS
from methods.base import Method
from teachers import masked_diffusion


@METHODS.register("mdlm")
class MDLM(Method):
    """T ancestral steps from all-MASK (one forward pass each), then the noise-removal pass if a token is left."""

    families = (masked_diffusion.FAMILY,)
    Config = masked_diffusion.SamplingConfig
    key_knobs = ("steps", "cache")

    def sample(self, cond, *, generator):
        return self.teacher.sample(cond, generator=generator, sampling=self.config)
