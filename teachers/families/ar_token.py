"""The AR-token family: discrete tokens decoded one position after another with a KV cache, for images and text.

LlamaGen / Lumina-mGPT-style image generators (SJD, arXiv:2410.01699; DD, arXiv:2412.17153) and causal language
models (SDTT's AR baseline, arXiv:2410.21035 §4.4) are one family: a prefix condition (a class token, caption tokens,
a text prompt, or nothing) followed by `seq_len` generated tokens; `grid` is the image raster (rows, cols), or
(seq_len,) for text. A method talks to such a teacher only through `ARTokenTeacher`: `start` (prefill the
condition, CFG branches included), `extend` (append tokens, get next-token logits), `rollback` (drop cached
positions), and `process` (logits -> the sampling distribution, the same for sampling and verification). A teacher
with `ragged_cache` also keeps a batch whose rows have their own lengths (`start(..., ragged=True)`, `rollback` to
per-row lengths, `select` to drop finished rows): what SJD and Jacobi decoding need at batch size > 1.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import ClassVar, Protocol

import torch

from core.errors import UserError
from core.samples import Samples
from teachers.families import Family

ANY_IMAGE_TOKEN = -1  # in a teacher's `structure`: any of its image tokens may come at this output position


@dataclass(frozen=True)
class SamplingConfig:
    """The teacher's sampling settings; a method's config embeds them and the reference arm samples with them."""

    top_k: int = 0  # 0 = the full vocabulary
    top_p: float = 1.0  # nucleus: the smallest set of tokens with probability >= top_p; 1 = off
    temperature: float = 1.0
    cfg: float = 1.0  # classifier-free guidance scale; 1 = conditional only (no unconditional branch)
    greedy: bool = False  # argmax instead of a draw (greedy decoding; classic Jacobi iteration)

    def __post_init__(self):
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 = full vocabulary), got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if not self.temperature > 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")
        if self.cfg < 0:
            raise ValueError(f"cfg must be >= 0, got {self.cfg}")


class DecodeState(Protocol):
    length: int | torch.Tensor  # generated tokens whose keys/values are cached; (B,) per row in a ragged state


class TokenNetwork(Protocol):
    """What a distillation student builds on (DD's student, `methods.dd_student`): a causal transformer over
    [condition prefix (P), tokens (N)]. A teacher loaded from a checkpoint can be distilled if its network has these.
    """

    cond_len: int  # P
    seq_len: int  # N
    width: int  # d

    def clone(self, dropout: float) -> "TokenNetwork": ...  # a trainable copy, same weights, this dropout rate
    def token_embedding(self) -> torch.nn.Parameter: ...  # (V, d) the input embedding table
    def embed_condition(self, cond: torch.Tensor) -> torch.Tensor: ...  # (B, P) ids -> (B, P, d)
    def trunk(self, h: torch.Tensor) -> torch.Tensor: ...  # (B, T, d) from position 0 -> (B, T, d), causal, normed
    def logits(self, h: torch.Tensor) -> torch.Tensor: ...  # (B, T, d) -> (B, T, V)


class ARTokenTeacher(Protocol):
    family: ClassVar[Family]
    modality: ClassVar[str]  # "image": decode -> (B, C, H, W) in [0, 1]; "text": decode -> B strings
    supports_cfg: ClassVar[bool]  # has an unconditional branch (trained with condition dropout)
    seq_len: int  # N generated tokens
    vocab_size: int
    grid: tuple[int, ...]  # (rows, cols) of an image raster, or (N,) for text
    network: TokenNetwork
    # Optional: the ids (K,) that random drafts (SJD's and Jacobi decoding's `init: random`) are drawn from, e.g. an
    # image model's image tokens, as SJD's release draws Chameleon's 8192; absent or None: the whole vocabulary
    # (`draft_vocabulary`).
    draft_tokens: torch.Tensor | None
    # Rows of one batch may hold different lengths (speculative and Jacobi decoding commit a different number of
    # tokens per row): `start` takes `ragged=True`, `rollback` per-row lengths (B,), and `select` drops rows. False (or
    # absent): every row has the state's one length, and SJD / Jacobi decode one sequence at a time.
    ragged_cache: ClassVar[bool]

    # (n, P) prefix conditions, drawn with `generator` on its device
    def conditions(self, n: int, generator: torch.Generator) -> torch.Tensor: ...
    def start(self, cond: torch.Tensor, *, cfg: float) -> tuple[DecodeState, torch.Tensor]: ...  # logits (B, V)
    # A teacher with a `network` (the distillable ones, `GuidedNetworkTeacher`) also takes `prefix` (B, k) in `start`:
    # those tokens read in the same pass after the condition, the logits then the next token's (DD's teacher segment,
    # as the released runner prefills the class token and DD's tokens together). A `ragged_cache` teacher takes
    # `ragged=True`: a state whose rows keep their own lengths.
    # Row t of the output predicts the token after input t. In a ragged state each row appends after its own length;
    # a caller may pad shorter rows' inputs to L and ignore their outputs (rolling the row back past them).
    def extend(self, state: DecodeState, tokens: torch.Tensor) -> torch.Tensor: ...  # (B, L) -> (B, L, V)
    # Keep the first `length` generated tokens: an int for every row, or (B,) per row in a ragged state.
    def rollback(self, state: DecodeState, length: int | torch.Tensor) -> None: ...
    # Keep these rows (B',), in this order: finished sequences leave a ragged state's batch, and a row may be kept
    # more than once (SJD-PAC verifies each path of its draft tree as a row of one pass, `methods.sjd_pac`).
    def select(self, state: DecodeState, rows: torch.Tensor) -> None: ...
    def decode(self, tokens: torch.Tensor) -> torch.Tensor | list[str]: ...
    # A structured image sequence (Lumina-mGPT's, Emu3's: image-start and size tokens, a newline closing each row of
    # `grid`, end tokens) has `structure` (seq_len + 1 ids, a list): the token forced at each output position,
    # `ANY_IMAGE_TOKEN` where an image token comes (ZipAR reads its raster from it, `methods.zipar`).
    # Image teachers also have `codebook` (V, D), the code vectors behind the ids (DD flows into them), and
    # `captions(cond)`, the prompt of each condition (text-image metrics). Text teachers have what the text metrics
    # read: `encode(texts)` -> token ids per text (entropy), `reference_texts()` (MAUVE's held-out side) and
    # `companion_lm`, a registered causal LM of the same corpus (`gen_ppl@tiny`).


class GuidedNetworkTeacher:
    """`start`, `extend`, `rollback` and `select` of a teacher whose network decodes with CFG branches
    (`teachers.networks.gpt.GuidedDecoding`): the guided logits are u + s (c - u), the unconditional branch's
    condition all `null_id` (LlamaGen's `generate`, docs/checkpoints.md). A ragged state is the network's
    `RaggedKVCache`, both branches of a row rolled back and selected together."""

    null_id: int
    ragged_cache: ClassVar[bool] = True

    @torch.inference_mode()
    def start(self, cond: torch.Tensor, *, cfg: float, prefix: torch.Tensor | None = None, ragged: bool = False):
        state, logits = self.network.start(cond, cfg=cfg, null_id=self.null_id, ragged=ragged, prefix=prefix)
        return state, guide(state, logits)

    @torch.inference_mode()
    def extend(self, state, tokens: torch.Tensor) -> torch.Tensor:
        return guide(state, self.network.extend_guided(state, tokens))

    def rollback(self, state, length: int | torch.Tensor) -> None:
        state.truncate(length)

    def select(self, state, rows: torch.Tensor) -> None:
        state.select(rows)

    def extend_at(self, state, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """`extend` of a ragged state with each input at its own token position (B, L) (0-based after the condition)
        instead of after the row's last: the inputs attend to every cached slot before their own, filled or not
        (`RaggedKVCache.place`; ZipAR's next-set decoding, `methods.zipar`). (B, L) -> (B, L, V)."""
        slots = state.cond_len + positions
        state.cache.place(torch.cat([slots, slots]) if state.cfg != 1.0 else slots)
        return self.extend(state, tokens)


def draft_vocabulary(teacher) -> torch.Tensor | None:
    """The ids (K,) a teacher's random drafts are drawn from (its `draft_tokens`), None for its whole vocabulary; a
    declared set that is empty or outside [0, vocab_size) is refused in one line."""
    ids = getattr(teacher, "draft_tokens", None)
    if ids is None:
        return None
    ids = torch.as_tensor(ids, dtype=torch.long)
    if ids.dim() != 1 or not len(ids) or int(ids.min()) < 0 or int(ids.max()) >= teacher.vocab_size:
        raise ValueError(f"draft_tokens of {type(teacher).__name__} must be a non-empty 1-D set of ids in "
                         f"[0, {teacher.vocab_size}), got shape {tuple(ids.shape)}")
    return ids


def token_vectors(teacher, space: str) -> torch.Tensor:
    """(V, D) one vector per token id, for methods that relate tokens by distance: `space` "codebook", the code
    vectors the ids decode through (LANTERN's latent neighbours), where the teacher's `codebook` has a row per id;
    "embedding", or a teacher without such a codebook (a text LM; Chameleon's and Emu3's ids map to their VQ codes
    through a table), the network's input embedding (GSD's). A teacher with neither is refused in one line."""
    codebook = getattr(teacher, "codebook", None)
    per_id = codebook is not None and len(codebook) == teacher.vocab_size
    if space == "codebook" and per_id:
        return codebook.detach().float()
    for owner in (getattr(teacher, "network", None), getattr(teacher, "model", None)):
        if hasattr(owner, "token_embedding"):
            return owner.token_embedding().detach()[: teacher.vocab_size].float()
        if hasattr(owner, "get_input_embeddings"):  # a Hugging Face model
            return owner.get_input_embeddings().weight.detach()[: teacher.vocab_size].float()
    if per_id:
        return codebook.detach().float()
    raise UserError(f"teacher {getattr(teacher, 'name', type(teacher).__name__)!r} has no token vectors: neither "
                    f"a codebook with a row per id nor a network with an input embedding")


def guide(state, logits: torch.Tensor) -> torch.Tensor:  # (2B or B, ..., V) -> (B, ..., V)
    """CFG on raw logits, u + cfg (c - u), for a state with `batch` conditional rows first and, when `cfg` != 1, as
    many unconditional rows after them."""
    if state.cfg == 1.0:
        return logits
    cond, uncond = logits[: state.batch], logits[state.batch :]
    return uncond + state.cfg * (cond - uncond)


def process(logits: torch.Tensor, s: SamplingConfig) -> torch.Tensor:
    """(..., V) guided logits -> (..., V) sampling distribution: temperature, top-k, softmax, then nucleus.

    The same distribution is used for sampling and for verification (SJD's p and q are both processed).
    """
    logits = logits.float()
    if s.temperature != 1.0:
        logits = logits / s.temperature
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


def draw(probs: torch.Tensor, generator: torch.Generator | None, greedy: bool = False) -> torch.Tensor:
    """One token per row of (..., V) probabilities -> (...) ids.

    Inverse-CDF sampling: one uniform per row against the row's cumulative sum. It is exact (up to float64
    rounding; a zero-probability token is never drawn, its cumulative step being empty) and, for a window of rows,
    5x cheaper on CPU than `torch.multinomial`, whose per-call overhead dominated the SJD verification step.
    """
    if greedy:
        return probs.argmax(dim=-1)
    cdf = probs.double().cumsum(-1)  # (..., V)
    u = torch.rand(probs.shape[:-1] + (1,), generator=generator, device=probs.device, dtype=torch.float64)
    idx = torch.searchsorted(cdf, u * cdf[..., -1:], right=True)
    return idx.clamp_(max=probs.shape[-1] - 1).squeeze(-1)


@torch.inference_mode()
def sample_ar(teacher: ARTokenTeacher, cond: torch.Tensor, s: SamplingConfig, *,
              generator: torch.Generator | None) -> Samples:
    """The teacher's own token-by-token sampler: one forward pass per token, KV-cached, batched over sequences."""
    B, N = cond.shape[0], teacher.seq_len
    state, logits = teacher.start(cond, cfg=s.cfg)
    tokens = torch.empty(B, N, dtype=torch.long, device=cond.device)
    tokens[:, 0] = draw(process(logits, s), generator, s.greedy)
    for i in range(1, N):
        logits = teacher.extend(state, tokens[:, i - 1 : i])[:, -1]
        tokens[:, i] = draw(process(logits, s), generator, s.greedy)
    return Samples(tokens, cond, Counter(nfe=B * N, tokens=B * N))


def check(teacher_cls: type, s: SamplingConfig) -> None:
    if s.cfg != 1.0 and not teacher_cls.supports_cfg:
        raise ValueError(f"cfg must be 1: this teacher has no unconditional branch to guide with, got {s.cfg}")


FAMILY = Family("ar-token", SamplingConfig, sample_ar, sampler="ar", check=check)
