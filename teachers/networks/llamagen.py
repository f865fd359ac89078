"""LlamaGen's class- and text-conditional GPT (Sun et al., arXiv:2406.06525; FoundationVision/LlamaGen
`autoregressive/models/gpt.py`), the teacher network of SJD (arXiv:2410.01699) and Distilled Decoding
(arXiv:2412.17153), in the official parameter names, so a released `c2i_*.pt` or `t2i_*.pt` loads strictly as it is.

Llama blocks without biases: RMSNorm (computed in float32, eps 1e-5), fused `wqkv` attention, SwiGLU feed-forward
(`w2(silu(w1 x) * w3 x)`), an untied output head; one class token (`cls_embedding.embedding_table`, the null class
`num_classes` for classifier-free guidance) before `seq_len` = grid² image tokens. Positions are 2-D RoPE on
interleaved pairs (2k, 2k+1): the first half of a head's pairs rotate by the token's row, the second half by its
column; the class token's rotation is all zeros, so its query and key are exactly 0 (docs/checkpoints.md, trap T5).
Decoding reuses `teachers.networks.gpt`'s truncatable KV caches and CFG branches, so the AR-token family's methods
(SJD's windows and rollback, DD's student) run on it unchanged.

Text-to-image (`caption_dim` > 0, gpt.py `CaptionEmbedder`, model_type "t2i"): the condition is `cond_len` = 120
caption embeddings (FLAN-T5-XL's last hidden states, 2048 wide) mapped by a bias-free tanh-GELU MLP
(`cls_embedding.cap_proj.fc1/fc2`); the unconditional branch reads the learned `cls_embedding.uncond_embedding` (a
buffer of the state dict, 120 x caption_dim) through the same MLP. Its caption positions rotate by zero as the class
token does. A caption shorter than 120 tokens is left-padded, and LlamaGen's `generate` (autoregressive/models/
generate.py) multiplies the causal mask by the embedding mask, for both CFG branches, then sets the diagonal: no
position reads a padded key, a padded position reads only itself. `start(..., padding=...)` does the same through the
KV cache (`KVCache.hide`).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from teachers.networks.gpt import GuidedDecoding, KVCache

# The released class-to-image models (gpt.py `GPT_B` .. `GPT_3B`; FFN hidden = find_multiple(int(8 d / 3), 256)).
SIZES = {"GPT-B": (768, 12, 12, 2048), "GPT-L": (1024, 24, 16, 2816), "GPT-XL": (1280, 36, 20, 3584),
         "GPT-XXL": (1536, 48, 24, 4096), "GPT-3B": (3200, 24, 32, 8704)}  # dim, layers, heads, FFN hidden


@dataclass(frozen=True)
class LlamaGenConfig:
    vocab_size: int = 16384  # VQ-16 codes
    num_classes: int = 1000  # the embedding table has one more row: the null class
    seq_len: int = 256  # image tokens (block_size): 256 at 256 px, 576 at 384 px
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    ffn_hidden: int = 2048
    norm_eps: float = 1e-5
    rope_base: float = 10000.0
    dropout: float = 0.0  # token, residual and FFN dropout (the released models trained with 0.1 each)
    cond_len: int = 1  # cls_token_num: the class token, or 120 caption tokens
    caption_dim: int = 0  # > 0: text-to-image, caption embeddings of this width (FLAN-T5-XL: 2048) instead of classes

    def __post_init__(self):
        grid = round(self.seq_len ** 0.5)
        if grid * grid != self.seq_len or self.n_embd % self.n_head or (self.n_embd // self.n_head) % 4:
            raise ValueError(f"seq_len must be a square (got {self.seq_len}) and the head width a multiple of 4 "
                             f"(got {self.n_embd} / {self.n_head})")

    @property
    def grid(self) -> int:
        return round(self.seq_len ** 0.5)


def size_config(name: str, image_tokens: int, **overrides) -> LlamaGenConfig:
    """A released size ("GPT-B" .. "GPT-3B") over `image_tokens` tokens (256 or 576)."""
    dim, layers, heads, hidden = SIZES[name]
    return LlamaGenConfig(seq_len=image_tokens, n_layer=layers, n_head=heads, n_embd=dim, ffn_hidden=hidden,
                          **overrides)


def t2i_config(name: str, image_tokens: int, **overrides) -> LlamaGenConfig:
    """A released text-to-image size (sample_t2i.py: GPT-XL, cls_token_num 120, FLAN-T5-XL's 2048-wide states)."""
    return size_config(name, image_tokens, cond_len=120, caption_dim=2048, **overrides)


def rope_2d(cfg: LlamaGenConfig) -> torch.Tensor:
    """(cond_len + seq_len, hd/2, 2) cos/sin of each position's rotation angles, the class token's all zero."""
    half = (cfg.n_embd // cfg.n_head) // 2
    freqs = 1.0 / (cfg.rope_base ** (torch.arange(0, half, 2)[: half // 2].float() / half))  # (hd/4,)
    angles = torch.outer(torch.arange(cfg.grid).float(), freqs)  # (grid, hd/4)
    rows = angles[:, None, :].expand(-1, cfg.grid, -1)
    cols = angles[None, :, :].expand(cfg.grid, -1, -1)
    grid = torch.cat([rows, cols], -1).flatten(0, 1)  # (seq_len, hd/2), row-major cells
    table = torch.stack([grid.cos(), grid.sin()], -1)
    return torch.cat([torch.zeros(cfg.cond_len, half, 2), table])


def rotate(x: torch.Tensor, rot: torch.Tensor) -> torch.Tensor:
    """x (B, L, H, hd) by rot (L or B x L, hd/2, 2) on interleaved pairs, in float32."""
    xs = x.float().reshape(*x.shape[:-1], -1, 2)  # (B, L, H, hd/2, 2)
    r = rot[:, :, None] if rot.dim() == 4 else rot[None, :, None]  # (B or 1, L, 1, hd/2, 2)
    out = torch.stack([xs[..., 0] * r[..., 0] - xs[..., 1] * r[..., 1],
                       xs[..., 1] * r[..., 0] + xs[..., 0] * r[..., 1]], -1)
    return out.flatten(3).type_as(x)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps, self.weight = eps, nn.Parameter(torch.ones(dim))

    def forward(self, x):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


class Attention(nn.Module):
    def __init__(self, cfg: LlamaGenConfig):
        super().__init__()
        self.n_head, self.dim = cfg.n_head, cfg.n_embd
        self.wqkv = nn.Linear(cfg.n_embd, 3 * cfg.n_embd, bias=False)
        self.wo = nn.Linear(cfg.n_embd, cfg.n_embd, bias=False)
        self.resid_dropout = nn.Dropout(cfg.dropout)

    def forward(self, x, rot, layer=None, cache: KVCache | None = None, mask=None):
        B, L, _ = x.shape
        q, k, v = (t.view(B, L, self.n_head, -1) for t in self.wqkv(x).split(self.dim, -1))  # (B, L, H, hd)
        q, k = rotate(q, rot).transpose(1, 2), rotate(k, rot).transpose(1, 2)
        v = v.transpose(1, 2)  # (B, H, L, hd)
        if cache is not None:
            k, v = cache.update(layer, k, v)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=cache is None and L > 1)
        return self.resid_dropout(self.wo(y.transpose(1, 2).reshape(B, L, self.dim)))


class FeedForward(nn.Module):
    def __init__(self, cfg: LlamaGenConfig):
        super().__init__()
        self.w1 = nn.Linear(cfg.n_embd, cfg.ffn_hidden, bias=False)
        self.w3 = nn.Linear(cfg.n_embd, cfg.ffn_hidden, bias=False)
        self.w2 = nn.Linear(cfg.ffn_hidden, cfg.n_embd, bias=False)
        self.ffn_dropout = nn.Dropout(cfg.dropout)

    def forward(self, x):
        return self.ffn_dropout(self.w2(F.silu(self.w1(x)) * self.w3(x)))


class TransformerBlock(nn.Module):
    def __init__(self, cfg: LlamaGenConfig):
        super().__init__()
        self.attention, self.feed_forward = Attention(cfg), FeedForward(cfg)
        self.attention_norm = RMSNorm(cfg.n_embd, cfg.norm_eps)
        self.ffn_norm = RMSNorm(cfg.n_embd, cfg.norm_eps)

    def forward(self, x, rot, layer=None, cache=None, mask=None):
        h = x + self.attention(self.attention_norm(x), rot, layer, cache, mask)
        return h + self.feed_forward(self.ffn_norm(h))


class LabelEmbedder(nn.Module):
    def __init__(self, cfg: LlamaGenConfig):
        super().__init__()
        self.embedding_table = nn.Embedding(cfg.num_classes + 1, cfg.n_embd)


class CaptionEmbedder(nn.Module):
    """gpt.py `CaptionEmbedder` and its `MLP`: caption embeddings (B, P, caption_dim) -> (B, P, d), bias-free
    fc1, tanh-GELU, fc2; `uncond_embedding` the unconditional branch's caption (a persistent buffer) of cond_len rows
    (the official `token_num`, 120, which the released models' cls_token_num equals)."""

    def __init__(self, cfg: LlamaGenConfig):
        super().__init__()
        self.cap_proj = nn.Sequential()
        self.cap_proj.add_module("fc1", nn.Linear(cfg.caption_dim, cfg.n_embd, bias=False))
        self.cap_proj.add_module("act", nn.GELU(approximate="tanh"))
        self.cap_proj.add_module("fc2", nn.Linear(cfg.n_embd, cfg.n_embd, bias=False))
        self.register_buffer("uncond_embedding", torch.randn(cfg.cond_len, cfg.caption_dim) / cfg.caption_dim ** 0.5)


class LlamaGenGPT(GuidedDecoding, nn.Module):
    """logits of token i+1 from [condition, tokens 1..i]: cond (B, 1) class ids or (B, cond_len, caption_dim) caption
    embeddings, tokens (B, N) VQ codes."""

    def __init__(self, cfg: LlamaGenConfig):
        super().__init__()
        self.cfg = cfg
        self.cls_embedding = CaptionEmbedder(cfg) if cfg.caption_dim else LabelEmbedder(cfg)
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.tok_dropout = nn.Dropout(cfg.dropout)
        self.layers = nn.ModuleList(TransformerBlock(cfg) for _ in range(cfg.n_layer))
        self.norm = RMSNorm(cfg.n_embd, cfg.norm_eps)
        self.output = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self._register_tables()

    def _register_tables(self) -> None:
        """The fixed tables, computed (the official state dict holds neither)."""
        n_pos = self.cfg.cond_len + self.cfg.seq_len
        self.register_buffer("rope", rope_2d(self.cfg), persistent=False)
        self.register_buffer("causal", torch.ones(n_pos, n_pos, dtype=torch.bool).tril(), persistent=False)

    @classmethod
    def from_state_dict(cls, cfg: LlamaGenConfig, state: dict[str, torch.Tensor]) -> "LlamaGenGPT":
        """A network with a checkpoint's weights, loaded strictly as they are: built on the meta device, so no
        random init (3 B weights for GPT-3B) is drawn and thrown away."""
        with torch.device("meta"):
            net = cls(cfg)
        net.load_state_dict(state, strict=True, assign=True)
        net._register_tables()
        return net

    # ---- the rest of the TokenNetwork contract (`teachers.families.ar_token`) ---------------------------------
    def token_embedding(self) -> nn.Parameter:
        return self.tok_embeddings.weight

    def embed_condition(self, cond: torch.Tensor) -> torch.Tensor:  # (B, 1) ids or (B, P, caption_dim) -> (B, P, d)
        if self.cfg.caption_dim:
            return self.cls_embedding.cap_proj(cond.to(self.tok_embeddings.weight.dtype))
        return self.cls_embedding.embedding_table(cond)

    def null_condition(self, cond: torch.Tensor, null_id: int) -> torch.Tensor:
        """The unconditional branch's condition: the null class, or the learned unconditional caption (generate.py
        `generate`: `zeros_like(cond) + uncond_embedding`)."""
        if self.cfg.caption_dim:
            return self.cls_embedding.uncond_embedding.to(cond.dtype).expand_as(cond)
        return super().null_condition(cond, null_id)

    def embed_tokens(self, tokens: torch.Tensor) -> torch.Tensor:  # (B, L) -> (B, L, d)
        return self.tok_embeddings(tokens)

    def trunk(self, x: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        """Input embeddings (B, L, d) from position 0 (or after the cache's) -> final-normed states (B, L, d)."""
        L = x.shape[1]
        positions = torch.arange(L, device=x.device) if cache is None else cache.positions(L)
        rot = self.rope[positions]  # (L or B x L, hd/2, 2)
        mask = None if cache is None else cache.mask(L, self.causal)
        x = self.tok_dropout(x)
        for i, layer in enumerate(self.layers):
            x = layer(x, rot, i, cache, mask)
        if cache is not None:
            cache.advance(L)
        return self.norm(x)

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        return self.output(h).float()

    def forward(self, cond, tokens):
        """Teacher-forced logits for every token: cond (B, 1) or (B, P, caption_dim) unpadded, tokens (B, N) ->
        (B, N, V)."""
        x = torch.cat([self.embed_condition(cond), self.embed_tokens(tokens[:, :-1])], 1)
        return self.logits(self.trunk(x))[:, self.cfg.cond_len - 1 :]
