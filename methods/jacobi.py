"""`jacobi`: Jacobi decoding, the baseline of Speculative Jacobi Decoding (arXiv:2410.01699, Sec. 3.2).

Same window loop as SJD, but a draft is accepted only if it equals this pass's token at its position. Greedy
(argmax) is the classic Jacobi iteration and reproduces greedy AR token for token; the sampling variant is the one the
paper's tables evaluate (released code, `prefix_token_sampler_scheme='jacobi'`): exact in distribution, ~1x faster.
Batches run as SJD's: the exact-match test is per row, each row with its own window and rollback.
"""
from __future__ import annotations

from dataclasses import dataclass

from methods.sjd import SJD, SJDConfig, exact_match_rule


@dataclass(frozen=True)
class JacobiConfig(SJDConfig):
    # `greedy` (a sampling setting): argmax everywhere, the classic Jacobi iteration, against greedy AR as the
    # reference; false samples as the paper's JD baseline does.
    greedy_allowed = True
    verify_modes = ("exact",)  # its rule is the exact match


class Jacobi(SJD):
    """Jacobi decoding: accept drafts that equal the refreshed tokens (greedy or sampling)."""

    headline = False  # the SJD paper's baseline
    Config = JacobiConfig
    key_knobs = ("window", "greedy")
    rule = staticmethod(exact_match_rule)

    @classmethod
    def lossless(cls, knobs):
        return "certified: tests/test_sjd.py (sampling; greedy: token for token)"
