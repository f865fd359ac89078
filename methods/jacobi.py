"""`jacobi`: Jacobi decoding, the baseline of Speculative Jacobi Decoding (arXiv:2410.01699, Sec. 3.2).

Same window loop as SJD, but a draft is accepted only if it equals this pass's token at its position. Greedy
(argmax) is the classic Jacobi iteration and reproduces greedy AR token for token; the sampling variant is the one the
paper's tables evaluate (released code, `prefix_token_sampler_scheme='jacobi'`): exact in distribution, ~1x faster.
"""
from __future__ import annotations

from dataclasses import dataclass

from bench.registry import METHODS
from bench.samples import Samples
from methods.base import Method
from methods.sjd import SJDConfig, exact_match_rule, jacobi_decode
from teachers import discrete_ar


@dataclass(frozen=True)
class JacobiConfig(SJDConfig):
    greedy: bool = False  # argmax everywhere (classic Jacobi); False samples as the paper's JD baseline does


@METHODS.register("jacobi")
class Jacobi(Method):
    """Jacobi decoding: accept drafts that equal the refreshed tokens (greedy or sampling)."""

    families = (discrete_ar.FAMILY,)
    Config = JacobiConfig
    batch_size_one = True
    key_knobs = ("window", "greedy")

    def sample(self, cond, *, generator):
        c = self.config
        tokens, counts = jacobi_decode(self.teacher, cond, c, generator, exact_match_rule, greedy=c.greedy)
        return Samples(tokens.view(1, -1), cond, counts)
