"""The MDLM denoiser (Sahoo et al. 2024, arXiv:2406.07524) at CPU scale: a bidirectional transformer with rotary
position embeddings and no time input.

MDLM's DiT keeps its adaLN layers but is fed a zero noise level (`time_conditioning: False`), which makes it a plain
pre-norm transformer over the whole sequence with RoPE; that is what this file is. It reads ids in [0, V] (V = MASK) and
returns logits over [0, V]; the SUBS parameterisation (`teachers.families.masked_diffusion.subs`) turns them into the
model's log-probabilities.

Why RoPE rather than learnt absolute positions: with learnt positions (init std 0.02 or 1, `nn.TransformerEncoder`
or our GPT blocks made bidirectional) the tiny MDLM sat on the unigram plateau (masked CE 6.4 nats = the unigram
entropy of the corpus, at any masking rate) for all of its 2000 training steps, while the AR model of the same size
left it within 400; docs/methods/sdtt.md
says the same. A masked position's input says nothing about where it is except through its position encoding, and
relative positions inside attention are what the model needs to read its neighbours.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass(frozen=True)
class MDLMNetConfig:
    vocab_size: int  # V real tokens; id V is MASK
    seq_len: int  # L
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    dropout: float = 0.1

    def __post_init__(self):
        if self.vocab_size < 2 or self.seq_len < 1:
            raise ValueError(f"need vocab_size >= 2 and seq_len >= 1, got {self.vocab_size}, {self.seq_len}")
        if self.n_embd % self.n_head or (self.n_embd // self.n_head) % 2:
            raise ValueError(f"n_embd={self.n_embd} / n_head={self.n_head} must be an even integer (RoPE pairs)")


def rope_tables(seq_len: int, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin (L, head_dim / 2) of RoPE (Su et al. 2021), base 10000."""
    freq = 10000 ** (-torch.arange(0, head_dim, 2).float() / head_dim)  # (hd/2,)
    angle = torch.arange(seq_len).float()[:, None] * freq  # (L, hd/2)
    return angle.cos(), angle.sin()


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (B, H, L, hd) rotated pairwise by position."""
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).flatten(-2)


class Block(nn.Module):
    def __init__(self, cfg: MDLMNetConfig):
        super().__init__()
        self.n_head, self.dropout = cfg.n_head, cfg.dropout
        self.ln1, self.ln2 = nn.LayerNorm(cfg.n_embd), nn.LayerNorm(cfg.n_embd)
        self.qkv = nn.Linear(cfg.n_embd, 3 * cfg.n_embd)
        self.proj = nn.Linear(cfg.n_embd, cfg.n_embd)
        self.mlp = nn.Sequential(nn.Linear(cfg.n_embd, 4 * cfg.n_embd), nn.GELU(),
                                 nn.Linear(4 * cfg.n_embd, cfg.n_embd), nn.Dropout(cfg.dropout))

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        B, L, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        q, k, v = (t.view(B, L, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))  # (B, H, L, hd)
        y = F.scaled_dot_product_attention(rotate(q, cos, sin), rotate(k, cos, sin), v,
                                           dropout_p=self.dropout if self.training else 0.0)  # every position sees all
        x = x + self.proj(y.transpose(1, 2).reshape(B, L, C))
        return x + self.mlp(self.ln2(x))


class MDLMNet(nn.Module):
    def __init__(self, cfg: MDLMNetConfig):
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size + 1, cfg.n_embd)  # + MASK
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd)
        self.head = nn.Linear(cfg.n_embd, cfg.vocab_size + 1)
        cos, sin = rope_tables(cfg.seq_len, cfg.n_embd // cfg.n_head)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        for name, p in self.named_parameters():  # GPT-2's init: residual projections scaled by depth
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * cfg.n_layer) if name.endswith(("proj.weight", "mlp.2.weight")) else 0.02
                nn.init.normal_(p, std=std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        """z (B, L) ids in [0, V] -> logits (B, L, V + 1)."""
        L = z.shape[1]
        h = self.drop(self.tok_emb(z))  # (B, L, C): positions enter through RoPE only
        for block in self.blocks:
            h = block(h, self.cos[:L], self.sin[:L])
        return self.head(self.ln_f(h))
