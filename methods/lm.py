"""`lm`: a causal LM's own token-by-token sampler with its KV cache, the AR baseline of SDTT (arXiv:2410.21035 §4.4)."""
from __future__ import annotations

from bench.registry import METHODS
from methods.base import Method
from teachers import causal_lm


@METHODS.register("lm")
class LM(Method):
    """One single-token forward pass per position, keys and values cached; temperature, top-k and nucleus."""

    families = (causal_lm.FAMILY,)
    Config = causal_lm.SamplingConfig
    key_knobs = ("top_p",)

    def sample(self, cond, *, generator):
        return self.teacher.sample(cond, generator=generator, sampling=self.config)
