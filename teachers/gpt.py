"""A LlamaGen-style raster-order causal transformer over discrete image tokens, with a truncatable KV cache.

Used by the discrete-token AR teacher family (SJD, arXiv:2410.01699, and Distilled Decoding, arXiv:2412.17153).
The sequence is `[c_1 .. c_P, x_1 .. x_N]`: P condition tokens (class id or caption tokens, all NULL for the
unconditional branch of CFG) followed by N image tokens in raster order. The output at position P-1+i predicts x_{i+1}.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass(frozen=True)
class GPTConfig:
    vocab_size: int  # image codes
    cond_vocab: int  # condition token ids, NULL included
    cond_len: int  # P
    seq_len: int  # N
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    dropout: float = 0.0

    def __post_init__(self):
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd={self.n_embd} is not divisible by n_head={self.n_head}")


class KVCache:
    """Keys/values of every layer for a batch, preallocated to the full context; `truncate` rolls back."""

    def __init__(self, cfg: GPTConfig, batch: int, device, dtype):
        hd = cfg.n_embd // cfg.n_head
        shape = (cfg.n_layer, batch, cfg.n_head, cfg.cond_len + cfg.seq_len, hd)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.length = 0  # positions (condition + image) currently valid

    def truncate(self, length: int) -> None:
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot truncate a cache of length {self.length} to {length}")
        self.length = length


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.n_head = cfg.n_head
        self.qkv = nn.Linear(cfg.n_embd, 3 * cfg.n_embd)
        self.proj = nn.Linear(cfg.n_embd, cfg.n_embd)
        self.dropout = cfg.dropout

    def forward(self, x, layer: int | None = None, cache: KVCache | None = None, mask=None):
        B, L, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        q, k, v = (t.view(B, L, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))  # (B, H, L, hd)
        if cache is None:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0)
        else:
            start = cache.length
            cache.k[layer, :, :, start : start + L] = k
            cache.v[layer, :, :, start : start + L] = v
            k_all = cache.k[layer, :, :, : start + L]  # (B, H, start+L, hd)
            v_all = cache.v[layer, :, :, : start + L]
            y = F.scaled_dot_product_attention(q, k_all, v_all, attn_mask=mask)
        y = y.transpose(1, 2).contiguous().view(B, L, C)
        return self.proj(y)


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.n_embd)
        self.attn = CausalSelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.n_embd)
        self.mlp = nn.Sequential(
            nn.Linear(cfg.n_embd, 4 * cfg.n_embd), nn.GELU(), nn.Linear(4 * cfg.n_embd, cfg.n_embd), nn.Dropout(cfg.dropout)
        )

    def forward(self, x, layer=None, cache=None, mask=None):
        x = x + self.attn(self.ln1(x), layer, cache, mask)
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.cond_emb = nn.Embedding(cfg.cond_vocab, cfg.n_embd)
        self.pos_emb = nn.Embedding(cfg.cond_len + cfg.seq_len, cfg.n_embd)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd)
        self.head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        n_pos = cfg.cond_len + cfg.seq_len
        self.register_buffer("causal", torch.ones(n_pos, n_pos, dtype=torch.bool).tril(), persistent=False)
        self.apply(self._init_weights)
        for name, p in self.named_parameters():
            if name.endswith("proj.weight") or name.endswith("mlp.2.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init_weights(m):
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def _embed(self, x, start: int):
        return self.drop(x + self.pos_emb.weight[start : start + x.shape[1]])

    def _run(self, x, cache=None):
        mask = None
        if cache is not None and x.shape[1] > 1:
            # New token t sits at absolute position start+t and may see positions <= start+t.
            L, start = x.shape[1], cache.length
            mask = self.causal[start : start + L, : start + L]
        for i, block in enumerate(self.blocks):
            x = block(x, i, cache, mask)
        if cache is not None:
            cache.length += x.shape[1]
        return self.head(self.ln_f(x))

    def forward(self, cond, tokens):
        """Teacher-forced logits for every image token: cond (B, P), tokens (B, N) -> (B, N, V)."""
        x = self._embed(torch.cat([self.cond_emb(cond), self.tok_emb(tokens[:, :-1])], dim=1), 0)  # (B, P+N-1, C)
        return self._run(x)[:, self.cfg.cond_len - 1 :]

    def new_cache(self, batch: int) -> KVCache:
        p = next(self.parameters())
        return KVCache(self.cfg, batch, p.device, p.dtype)

    def prefill(self, cond, cache: KVCache):
        """Consume the condition; return the logits of the first image token, (B, V)."""
        return self._run(self._embed(self.cond_emb(cond), 0), cache)[:, -1]

    def extend(self, tokens, cache: KVCache):
        """Append image tokens (B, L) after the cached ones; logits (B, L, V), row t predicts the token after t."""
        return self._run(self._embed(self.tok_emb(tokens), cache.length), cache)
