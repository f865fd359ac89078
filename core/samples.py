"""What a sampler returns: the samples plus the counters the method kept (the harness does the timing); the texts a
text teacher decodes them into."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import torch


@dataclass
class Samples:
    data: torch.Tensor  # family-specific: (B, N) token ids for discrete AR teachers
    cond: torch.Tensor  # the conditions the samples were drawn for, (B, ...)
    # Sums over the sequences of the batch, e.g. "nfe" (forward passes each sequence went through),
    # "tokens", "drafts_verified", "drafts_accepted". The runner divides by the number of samples.
    counters: Counter = field(default_factory=Counter)


class Texts(list):
    """A text teacher's decoded samples (a list of B strings, what text metrics read) that keep the token ids they
    were decoded from, `tokens` (B, N) on the CPU: gen-PPL scores those ids themselves when its evaluator reads the
    teacher's tokenizer, as SDTT's evaluation does (jdeschena/sdtt run_eval.py:227-238), since decoded text
    re-tokenises into other ids and a decoder drops the end-of-text token."""

    def __init__(self, texts, tokens: torch.Tensor):
        super().__init__(texts)
        self.tokens = tokens
