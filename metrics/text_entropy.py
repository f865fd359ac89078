"""Unigram entropy of generated texts, the diversity check MDLM / SDTT (arXiv:2410.21035, Zheng et al. 2024) report next
to generative perplexity: a sampler that repeats a few tokens scores a deceptively low perplexity and a low entropy.

Per sample: the entropy (nats) of the empirical distribution of its token ids under the teacher's tokenizer (the text
teachers' `encode`; `torch.distributions.Categorical`); the metric is the mean over samples. On a teacher of a
prompted protocol (`mdlm-owt-prompted`) it is the entropy of each continuation, its prompt left out as self-BLEU leaves
it out (a real text the 5 continuations of a prompt share, half of each sample, would pull every arm toward WebText's
entropy), key "entropy.tokens.<protocol>".
"""
from __future__ import annotations

from collections import Counter

import torch

from metrics.base import Metric, prompt_length


class TokenEntropy(Metric):
    """Mean per-sample unigram entropy (nats) of the token ids of generated texts."""

    name = "entropy"
    higher_is_better = True
    modality = "text"

    def __init__(self, teacher, *, cache, device, checkpoints, extractor=None):
        super().__init__(teacher, cache=cache, device=device, checkpoints=checkpoints)
        protocol = getattr(teacher, "protocol", None)
        self.extractor = "tokens" + (f".{protocol}" if protocol else "")
        self._values: list[float] = []

    def update(self, texts: list[str], cond) -> None:
        prompt = prompt_length(self.name, self.teacher, texts, cond)
        if prompt:  # the continuations, decoded as the teacher decodes its samples
            texts = self.teacher.decode(texts.tokens[:, prompt:])
        for ids in self.teacher.encode(list(texts)):
            counts = torch.tensor(list(Counter(ids).values()), dtype=torch.float64) if ids else torch.ones(1)
            self._values.append(float(torch.distributions.Categorical(probs=counts / counts.sum()).entropy()))

    def compute(self, seed: int = 0) -> dict[str, float]:
        if not self._values:
            raise ValueError(f"{self.name}: compute() before any update()")
        return {f"{self.name}.{self.extractor}": sum(self._values) / len(self._values)}

    def reset(self) -> None:
        self._values.clear()
