"""`onestep*`: the optimal one-step sampler under a per-token loss (Distilled Decoding, arXiv:2412.17153, Prop. 3.1).

A network that emits every token at once, trained with per-token cross-entropy on teacher samples, is at best the
per-position marginal of those samples (Prop. 3.1). This baseline is that optimum, with no network: each position is
drawn independently from its empirical marginal, per condition (class, or caption row). The samples are the tokens
of the DD pair dataset (`methods.dd_pairs`, Algorithm 1), so the marginals are the teacher's under the same sampling
settings as the reference arm. A condition absent from the pairs falls back to the marginal over all conditions.

Steps: one parallel step per sample (nfe = 1, as the paper's "#Step 1"), though it runs no network at all; the
runner's step speed-up is then the teacher's N forward passes over 1. On a VAR teacher (the paper's VAR-onestep*)
the positions are those of all scales.

No table of marginals is built: a dense one, (conditions + 1) x n x V, would be 22 GB for VAR-d16's 1000 classes and
33 GB for LlamaGen's. The pairs' tokens are kept grouped by condition instead, and a position's draw takes that
position's token from a pair of the condition picked uniformly, independently per position: exactly a draw from the
empirical marginal. Memory is the pairs' tokens themselves (1.2 M pairs x 680 tokens: 1.6 GB as int16).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import torch

from core.cache import Cache
from core.samples import Samples
from methods.base import Method, Passes
from methods.dd import refuse_greedy
from methods.dd_pairs import PairKnobs, generate_pairs
from teachers.families import ar_token, multiscale_vq


@dataclass(frozen=True)
class OneStepConfig(PairKnobs):
    """The teacher's sampling settings (shared with the reference arm) and the pair dataset the marginals come from."""

    sampling: ar_token.SamplingConfig = ar_token.SamplingConfig()

    def __post_init__(self):
        super().__post_init__()
        refuse_greedy(self.sampling, "onestep*")


@dataclass(frozen=True)
class VAROneStepConfig(OneStepConfig):
    sampling: multiscale_vq.SamplingConfig = multiscale_vq.SamplingConfig()


@dataclass
class Marginals:
    """Per-condition, per-position empirical token distributions of teacher samples, kept as the samples themselves:
    the pairs' tokens sorted by condition, so a condition's samples are one contiguous block."""

    conds: torch.Tensor  # (U, P) the distinct condition rows
    tokens: torch.Tensor  # (M, n) the samples' tokens, grouped by condition in the order of `conds`
    starts: torch.Tensor  # (U + 1,) where each condition's block starts; the last entry is M
    vocab: int

    @classmethod
    def count(cls, tokens: torch.Tensor, cond: torch.Tensor, vocab: int) -> "Marginals":
        """tokens (M, n), cond (M, P) -> the marginals of each condition (and of all of them pooled)."""
        conds, group = torch.unique(cond, dim=0, return_inverse=True)  # (U, P), (M,)
        order = torch.argsort(group, stable=True)
        sizes = torch.bincount(group, minlength=len(conds))
        starts = torch.cat([torch.zeros(1, dtype=torch.long), sizes.cumsum(0)])
        dtype = torch.int16 if vocab <= 2**15 else torch.int32
        return cls(conds, tokens[order].to(dtype), starts, vocab)

    def _blocks(self, cond: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(first sample, sample count) (B,) of each condition's block; an unseen condition pools every sample."""
        match = (cond[:, None].cpu() == self.conds[None]).all(-1)  # (B, U)
        row = match.int().argmax(-1)
        seen = match.any(-1)
        first = torch.where(seen, self.starts[row], 0)
        size = torch.where(seen, self.starts[row + 1] - self.starts[row], self.starts[-1])
        return first, size

    def draw(self, cond: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """A draw from the marginals of cond (B, P) -> tokens (B, n): at every position, that position's token of a
        sample of the condition picked uniformly (the picks independent across positions)."""
        first, size = self._blocks(cond)
        B, n = len(cond), self.tokens.shape[1]
        u = torch.rand(B, n, generator=generator, device=generator.device, dtype=torch.float64).cpu()
        pick = first[:, None] + (u * size[:, None]).long().clamp(max=size[:, None] - 1)  # (B, n)
        return self.tokens[pick, torch.arange(n)].long().to(cond.device)

    def probs(self, cond: torch.Tensor) -> torch.Tensor:
        """The marginals (B, n, V) of cond (B, P), counted from the condition's samples."""
        first, size = self._blocks(cond)
        out = torch.zeros(len(cond), self.tokens.shape[1], self.vocab, dtype=torch.float64)
        for b, (f, s) in enumerate(zip(first.tolist(), size.tolist())):
            block = self.tokens[f : f + s].long()  # (s, n)
            out[b].scatter_add_(1, block.T, torch.ones(block.T.shape, dtype=torch.float64))
            out[b] /= s
        return out.to(cond.device)

    def modes(self, cond: torch.Tensor) -> torch.Tensor:
        """The most frequent token (B, n) at each position for cond (B, P); ties go to the lowest token id. Counted
        once per distinct condition of the batch, one at a time (a (n, V) table each: LlamaGen's is 33 MB)."""
        distinct, inverse = torch.unique(cond, dim=0, return_inverse=True)
        per = torch.cat([self.probs(distinct[u : u + 1]).argmax(-1) for u in range(len(distinct))])  # (U, n)
        return per[inverse.to(per.device)]


class FromPairs(Method):
    """A method whose `fit` reads the teacher-sample marginals off the DD pair dataset."""

    needs = ("codebook",)  # the pairs flow into the tokenizer's code vectors
    marginals: Marginals | None = None

    def fit(self, *, cache: Cache, checkpoints: Path) -> dict[str, float]:
        t = self.teacher
        pairs = generate_pairs(t, self.config.sampling, self.config.pairs, cache=cache)
        self.marginals = Marginals.count(pairs.tokens, pairs.cond, t.vocab_size)
        return {f"pairs_{k}": float(v) for k, v in pairs.info.items()}

    @classmethod
    def generates(cls, config, family, length: int) -> tuple[str, int, Passes]:
        """DD's pair dataset, each pair a run of the teacher's sampler (shared with DD at the same settings)."""
        return "pairs", config.n_pairs, Passes(family.passes(config.sampling, length))

    def stand_in(self) -> None:
        """One random sample as the table (a lookup costs nothing, whatever the table holds)."""
        t, g = self.teacher, torch.Generator().manual_seed(0)
        tokens = torch.randint(t.vocab_size, (1, t.seq_len), generator=g)
        self.marginals = Marginals.count(tokens, torch.zeros(1, 1, dtype=torch.long), t.vocab_size)

    def fitted(self) -> Marginals:
        if self.marginals is None:
            raise RuntimeError(f"{type(self).__name__}: call fit() before sample()")
        return self.marginals


class OneStep(FromPairs):
    """Every token at once, independently, from its per-condition teacher-sample marginal (Prop. 3.1's optimum)."""

    families = (ar_token.FAMILY, multiscale_vq.FAMILY)
    modalities = ("image",)  # the pairs flow into the tokenizer's code vectors
    Config = OneStepConfig
    key_knobs = ("n_pairs",)

    @classmethod
    def config_class(cls, family) -> type:
        return VAROneStepConfig if family is multiscale_vq.FAMILY else OneStepConfig

    @classmethod
    def passes(cls, config: OneStepConfig, family, length: int) -> dict[str, Passes]:
        return {"method": Passes({"lookup": 1})}  # counted as one pass; a table lookup costs nothing to price

    def sample(self, cond, *, generator):
        tokens = self.fitted().draw(cond, generator)  # (B, n)
        B, n = tokens.shape
        return Samples(tokens, cond, Counter(nfe=B, tokens=B * n))
