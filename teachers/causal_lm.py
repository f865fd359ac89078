"""The causal-LM family: the protocol, next-token processing (temperature, top-k, nucleus) and the KV-cached sampler.

The AR latency and quality baseline of SDTT (arXiv:2410.21035, §4.4: GPT-2 with KV caching, nucleus sampling
p = 0.95 in its figures) and the evaluator behind generative perplexity.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import torch

from bench.samples import Samples
from teachers.discrete_ar import draw

FAMILY = "causal-lm"


@dataclass(frozen=True)
class SamplingConfig:
    top_k: int = 0  # 0 = the full vocabulary
    top_p: float = 1.0  # nucleus: the smallest set of tokens with probability >= top_p; 1 = off
    temperature: float = 1.0

    def __post_init__(self):
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 = full vocabulary), got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if not self.temperature > 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")


class CausalLM(Protocol):
    family: ClassVar[str]
    seq_len: int  # tokens per sample
    vocab_size: int

    def start(self, batch: int) -> tuple[Any, torch.Tensor]: ...  # a fresh KV cache, (B, V) logits of token 0
    def extend(self, state: Any, tokens: torch.Tensor) -> torch.Tensor: ...  # (B, k) -> (B, k, V) next-token logits
    def token_nll(self, ids: torch.Tensor) -> torch.Tensor: ...  # (B, L) -> (B, L): -log p(x_i | x_<i)
    def conditions(self, n: int, generator: torch.Generator) -> torch.Tensor: ...
    def decode(self, tokens: torch.Tensor) -> list[str]: ...


def process(logits: torch.Tensor, s: SamplingConfig) -> torch.Tensor:
    """(..., V) logits -> (..., V) sampling distribution: temperature, top-k, then nucleus."""
    logits = logits.float() / s.temperature
    if 0 < s.top_k < logits.shape[-1]:
        kth = torch.topk(logits, s.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if s.top_p < 1:
        sorted_p, order = probs.sort(dim=-1, descending=True)
        # keep a token if the mass strictly before it is < top_p (the top token always survives)
        keep_sorted = (sorted_p.cumsum(-1) - sorted_p) < s.top_p
        keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
        probs = probs * keep
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


@torch.inference_mode()
def sample_lm(teacher: CausalLM, batch: int, s: SamplingConfig, *, generator: torch.Generator,
              device=None) -> Samples:
    """Token by token with the KV cache: one forward pass of one token per position."""
    L = teacher.seq_len
    state, logits = teacher.start(batch)
    tokens = torch.empty(batch, L, dtype=torch.long, device=device)
    tokens[:, 0] = draw(process(logits, s), generator)
    for i in range(1, L):
        logits = teacher.extend(state, tokens[:, i - 1 : i])[:, -1]
        tokens[:, i] = draw(process(logits, s), generator)
    cond = torch.zeros(batch, 0, dtype=torch.long, device=device)
    return Samples(tokens, cond, Counter(nfe=batch * L, tokens=batch * L))
