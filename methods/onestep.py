"""`onestep*`: the optimal one-step sampler under a per-token loss (Distilled Decoding, arXiv:2412.17153, Prop. 3.1).

A network that emits every token at once, trained with per-token cross-entropy on teacher samples, is at best the
per-position marginal of those samples (Prop. 3.1). This baseline is that optimum, with no network: each position is
drawn independently from its empirical marginal, per condition (class, or caption row). The samples are the tokens
of the DD pair dataset (`methods.dd_pairs`, Algorithm 1), so the marginals are the teacher's under the same sampling
settings as the reference arm. A condition absent from the pairs falls back to the marginal over all conditions.

Steps: one parallel step per sample (nfe = 1, as the paper's "#Step 1"), though it runs no network at all; the
runner's step speed-up is then the teacher's N forward passes over 1. On a VAR teacher (the paper's VAR-onestep*)
the positions are those of all scales; the marginals are dense, (conditions + 1) x L x V, so VAR-d16's 1000 classes
(22 GB in float64) are refused before any work beyond `MAX_MARGINALS` values.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import torch

from bench.cache import Cache
from bench.errors import UserError
from bench.samples import Samples
from methods.base import Method, Passes
from methods.dd import refuse_greedy
from methods.dd_pairs import PairKnobs, generate_pairs
from teachers.families import ar_token, multiscale_vq
from teachers.families.ar_token import draw


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


MAX_MARGINALS = 2**28  # float64 values (2 GiB) of a dense marginal table


@dataclass
class Marginals:
    """Per-condition, per-position token frequencies of teacher samples."""

    conds: torch.Tensor  # (U, P) the distinct condition rows
    probs: torch.Tensor  # (U + 1, n, V); row U pools every condition

    @classmethod
    def count(cls, tokens: torch.Tensor, cond: torch.Tensor, vocab: int) -> "Marginals":
        """tokens (M, n), cond (M, P) -> frequencies."""
        conds, group = torch.unique(cond, dim=0, return_inverse=True)  # (U, P), (M,)
        M, n = tokens.shape
        counts = torch.zeros(len(conds) + 1, n, vocab, dtype=torch.float64)
        counts.index_put_((group[:, None].expand(M, n), torch.arange(n).expand(M, n), tokens),
                          torch.ones(M, n, dtype=torch.float64), accumulate=True)
        counts[-1] = counts[:-1].sum(0)
        return cls(conds, counts / counts.sum(-1, keepdim=True))

    def of(self, cond: torch.Tensor) -> torch.Tensor:
        """The marginals (B, n, V) for cond (B, P)."""
        match = (cond[:, None].cpu() == self.conds[None]).all(-1)  # (B, U)
        row = torch.where(match.any(-1), match.int().argmax(-1), len(self.conds))
        return self.probs[row].to(cond.device)


class FromPairs(Method):
    """A method whose `fit` reads the teacher-sample marginals off the DD pair dataset."""

    needs = ("codebook",)  # the pairs flow into the tokenizer's code vectors
    marginals: Marginals | None = None

    def fit(self, *, cache: Cache) -> dict[str, float]:
        t = self.teacher
        rows = min(self.config.n_pairs, getattr(t, "n_classes", self.config.n_pairs)) + 1
        if rows * t.seq_len * t.vocab_size > MAX_MARGINALS:
            raise UserError(f"{type(self).__name__}: the marginals of {rows - 1} conditions x {t.seq_len} positions x "
                            f"{t.vocab_size} tokens exceed {MAX_MARGINALS} values; use fewer n_pairs")
        pairs = generate_pairs(t, self.config.sampling, self.config.pairs, cache=cache)
        self.marginals = Marginals.count(pairs.tokens, pairs.cond, t.vocab_size)
        return {f"pairs_{k}": float(v) for k, v in pairs.info.items()}

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
        tokens = draw(self.fitted().of(cond), generator)  # (B, n)
        B, n = tokens.shape
        return Samples(tokens, cond, Counter(nfe=B, tokens=B * n))
