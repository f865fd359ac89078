"""`ddim`: the DiT teacher's own deterministic sampler (DDIM, eta = 0), the reference arm of ARD (arXiv:2504.11295);
at K steps it is the quality target, at S steps the "same steps, no distillation" baseline."""
from __future__ import annotations

from bench.registry import METHODS
from methods.base import Method
from teachers import ode_diffusion


@METHODS.register("ddim")
class DDIM(Method):
    """The teacher's DDIM sampler with `steps` steps and CFG `cfg` (one batched forward pass per step)."""

    families = (ode_diffusion.FAMILY,)
    Config = ode_diffusion.SamplingConfig
    key_knobs = ("steps",)

    def sample(self, cond, *, generator):
        return self.teacher.sample(cond, generator=generator, sampling=self.config)
