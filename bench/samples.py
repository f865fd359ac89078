"""What a sampler returns: the samples plus the counters the method kept (the harness does the timing)."""
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
