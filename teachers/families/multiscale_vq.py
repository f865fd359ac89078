"""The multi-scale VQ family (VAR, Tian et al. 2024, arXiv:2404.02905): next-scale prediction over a pyramid of token
maps, the teacher of Distilled Decoding's VAR experiments (arXiv:2412.17153 §5).

A sample is K token maps of growing size (`patch_nums`, 1 x 1 to 16 x 16 at 256 px: L = 680 tokens), concatenated in
scale order, (B, L). Scale k's tokens are drawn all at once, independently given the earlier scales: one forward
pass per scale. A method talks to a teacher only through `MultiScaleTeacher`: `start` (the class condition, with the
unconditional rows for CFG, and optionally the tokens of the first whole scales, all read in one pass; logits of the
next scale), `next_scale` (this scale's tokens in, the next scale's logits out, through the KV cache) and `decode`
(all tokens -> images).

A prefix read by `start` is one pass under VAR's training mask (a token sees the scales up to its own): the same
computation as reading it scale by scale through the cache, in one forward pass instead of one per scale. DD's
pre-trained-ts-t2 sampler (arXiv:2412.17153 Alg. 4, Table 2: 2 + t2 - ts steps) reads the DD prefix this way, as the
released `VAR.intermediate_sample` does (microsoft/distilled_decoding VAR/models/var.py); the released pass has no
mask at all (`attn_bias=None`), so there the earlier scales also attend to the later ones and the last scale's logits
are not the teacher's conditional (`tests/test_dd_var.py` shows that they differ).

The family's own sampler is VAR's `autoregressive_infer_cfg` (docs/checkpoints.md, 'VAR'): at scale k the logits are
(1 + t) c - t u with t = cfg k / (K - 1) (no guidance at the first scale; at the last the usual scale is 1 + cfg),
then VAR's top-k (ties kept) and top-p (tokens whose ascending cumulative probability is <= 1 - p removed, the most
likely kept), no temperature, and one draw per token; the same tokens feed both CFG branches.
"""
from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import dataclass
from typing import ClassVar, Protocol

import torch

from core.samples import Samples
from teachers.families import Family
from teachers.families.ar_token import draw


@dataclass(frozen=True)
class SamplingConfig:
    """VAR's sampling settings; the defaults are its README's FID settings (cfg 1.5, top-k 900, top-p 0.96)."""

    cfg: float = 1.5  # the CFG ramp's final t: scale k guides with t = cfg k / (K - 1); 0 = conditional only
    top_k: int = 900  # 0 = the full vocabulary
    top_p: float = 0.96  # 0 = off (VAR's convention)

    def __post_init__(self):
        if self.cfg < 0:
            raise ValueError(f"cfg must be >= 0 (0 = no guidance), got {self.cfg}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 = full vocabulary), got {self.top_k}")
        if not 0 <= self.top_p <= 1:
            raise ValueError(f"top_p must be in [0, 1] (0 = off), got {self.top_p}")


class MultiScaleTeacher(Protocol):
    family: ClassVar[Family]
    modality: ClassVar[str]  # "image"
    supports_cfg: ClassVar[bool]
    patch_nums: tuple[int, ...]  # the side of each scale's token map
    seq_len: int  # L = sum of pn^2
    vocab_size: int

    def conditions(self, n: int, generator: torch.Generator) -> torch.Tensor: ...  # (n, 1) class ids
    # cond (B, 1); prefix (B, pn_0^2 + ... + pn_{j-1}^2): the first j >= 0 scales, read in the same pass
    # -> (state, logits of scale j (R, pn_j^2, V)), R = 2B with cfg
    def start(self, cond: torch.Tensor, *, cfg: bool, prefix: torch.Tensor | None = None): ...
    def next_scale(self, state, tokens: torch.Tensor) -> torch.Tensor: ...  # (B, pn_k^2) -> (R, pn_{k+1}^2, V)
    # (B, L) -> (B, 3, H, W) in [0, 1]; trailing scales of SKIPPED tokens add nothing to the decoded feature map
    def decode(self, tokens: torch.Tensor) -> torch.Tensor: ...


SKIPPED = -1  # the token of a scale that was not generated


@dataclass
class ScaleState:
    caches: list[dict]  # per block: the keys and values of the scales so far
    cond: torch.Tensor  # (R, C) class embeddings: the batch's, then (with CFG) as many null-class rows
    f_hat: torch.Tensor  # (B, Cvae, P, P) the accumulated feature map
    si: int  # the scale whose logits were returned last


class NetworkTeacher:
    """`start`, `next_scale` and `decode` of a teacher made of a VAR transformer (`network`: `class_emb`,
    `first_input`, `scale_input`, `step`, the block-causal `attn_bias_for_masking`; `teachers.networks.var`) and a
    multi-scale VQ (`vq`: `accumulate`, `downsample`, `decode_codes`; `teachers.networks.msvq`); `n_classes` is the
    null class."""

    n_classes: int
    patch_nums: tuple[int, ...]

    @torch.inference_mode()
    def start(self, cond: torch.Tensor, *, cfg: bool,
              prefix: torch.Tensor | None = None) -> tuple[ScaleState, torch.Tensor]:
        labels = cond[:, 0]
        if cfg:
            labels = torch.cat([labels, torch.full_like(labels, self.n_classes)])
        emb = self.network.class_emb(labels)  # (R, C)
        P = self.patch_nums[-1]
        f_hat = torch.zeros(len(cond), self.vq.cfg.Cvae, P, P, device=cond.device)
        state = ScaleState([{} for _ in self.network.blocks], emb, f_hat, 0)
        x = [self.network.first_input(emb)]  # (R, pn0^2, C), then each known scale's successor's input
        for tokens in prefix_scales(self.patch_nums, prefix):
            x.append(self._input_after(state, tokens))
        if len(x) == 1:
            return state, self.network.step(x[0], emb, state.caches)
        x = torch.cat(x, 1)  # (R, n, C)
        n = x.shape[1]
        logits = self.network.step(x, emb, state.caches, self.network.attn_bias_for_masking[:, :, :n, :n])
        return state, logits[:, -self.patch_nums[state.si] ** 2 :]

    def _input_after(self, state: ScaleState, tokens: torch.Tensor) -> torch.Tensor:
        """Scale state.si's tokens (B, pn^2) into the map; the next scale's input (R, pn'^2, C); state.si advances."""
        state.f_hat = self.vq.accumulate(state.si, state.f_hat, tokens)
        state.si += 1
        x = self.network.scale_input(state.si, self.vq.downsample(state.si, state.f_hat))  # (B, pn^2, C)
        return torch.cat([x, x]) if len(state.cond) != len(tokens) else x  # the same tokens feed the null rows

    @property
    def codebook(self) -> torch.Tensor:
        """(V, Cvae) the code vectors behind the ids, shared by the scales (DD flows into them)."""
        return self.vq.quantize.embedding.weight

    @torch.inference_mode()
    def next_scale(self, state: ScaleState, tokens: torch.Tensor) -> torch.Tensor:
        return self.network.step(self._input_after(state, tokens), state.cond, state.caches)

    @torch.inference_mode()
    def decode(self, tokens: torch.Tensor) -> torch.Tensor:  # (B, L) -> (B, C, H, W) in [0, 1]
        """The image of the scales' codes; skipped trailing scales (`SKIPPED`) leave the partial residual sum."""
        codes = [c for c in tokens.split([pn * pn for pn in self.patch_nums], dim=1) if c[0, 0] != SKIPPED]
        return (self.vq.decode_codes(codes) + 1) / 2


def prefix_scales(patch_nums: tuple[int, ...], prefix: torch.Tensor | None) -> list[torch.Tensor]:
    """A prefix (B, k) of whole scales -> its scales' tokens, [(B, pn_0^2), ...]; none for None or k = 0."""
    if prefix is None or not prefix.shape[1]:
        return []
    ends = list(itertools.accumulate(pn * pn for pn in patch_nums))
    if prefix.shape[1] not in ends[:-1]:
        raise ValueError(f"a prefix holds whole scales short of the last, {ends[:-1]} tokens; got {prefix.shape[1]}")
    j = ends.index(prefix.shape[1]) + 1
    return list(prefix.split([pn * pn for pn in patch_nums[:j]], dim=1))


def process(logits: torch.Tensor, s: SamplingConfig) -> torch.Tensor:
    """(..., V) guided logits -> (..., V) probabilities, with VAR's top-k and top-p (`sample_with_top_k_top_p_`)."""
    logits = logits.float()
    if 0 < s.top_k < logits.shape[-1]:
        kth = logits.topk(s.top_k, dim=-1).values.amin(dim=-1, keepdim=True)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if s.top_p > 0:
        ascending, order = logits.sort(dim=-1)
        drop = ascending.softmax(-1).cumsum(-1) <= 1 - s.top_p
        drop[..., -1] = False
        logits = logits.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
    return logits.softmax(-1)


def guide(logits: torch.Tensor, batch: int, cfg: float, si: int, n_scales: int) -> torch.Tensor:
    """VAR's ramp: rows [:batch] conditional, [batch:] unconditional -> (1 + t) c - t u, t = cfg si / (K - 1)."""
    if cfg == 0:
        return logits
    t = cfg * si / (n_scales - 1)
    return (1 + t) * logits[:batch] - t * logits[batch:]


@torch.inference_mode()
def sample_scales(teacher: MultiScaleTeacher, cond: torch.Tensor, s: SamplingConfig, *,
                  generator: torch.Generator | None, scales: int | None = None) -> Samples:
    """The teacher's own next-scale sampler: one forward pass per scale, batched over images. With `scales` < K only
    the first `scales` are drawn; the tokens of the others are `SKIPPED` (DD's skip-n baseline)."""
    B, K = len(cond), len(teacher.patch_nums)
    scales = K if scales is None else scales
    state, logits = teacher.start(cond, cfg=s.cfg != 0)
    tokens = []
    for si in range(scales):
        tokens.append(draw(process(guide(logits, B, s.cfg, si, K), s), generator))  # (B, pn^2)
        if si < scales - 1:
            logits = teacher.next_scale(state, tokens[-1])
    rest = teacher.seq_len - sum(pn * pn for pn in teacher.patch_nums[:scales])
    tokens.append(torch.full((B, rest), SKIPPED, dtype=torch.long, device=cond.device))
    return Samples(torch.cat(tokens, 1), cond, Counter(nfe=B * scales, tokens=B * teacher.seq_len))


def check(teacher_cls: type, s: SamplingConfig) -> None:
    if s.cfg != 0 and not teacher_cls.supports_cfg:
        raise ValueError(f"cfg must be 0: this teacher has no unconditional branch to guide with, got {s.cfg}")


FAMILY = Family("multiscale-vq", SamplingConfig, sample_scales, sampler="ar", check=check)
