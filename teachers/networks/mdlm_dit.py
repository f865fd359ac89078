"""MDLM's released backbone (Sahoo et al. 2024, arXiv:2406.07524; kuleshov-group/mdlm `models/dit.py` `DIT`), the
"DDiT" of the MDLM-OWT checkpoint SDTT distils (arXiv:2410.21035 §4), in the official parameter names
(docs/checkpoints.md, 'MDLM-OWT'), so that the released weights load strictly.

A DiT over token embeddings: adaLN blocks conditioned on c = SiLU(sigma_map(sigma)), rotary position embeddings
(GPT-NeoX half split, base 10000, q and k only), bidirectional attention, LayerNorms without bias computed in float32,
tanh-GELU MLPs, an adaLN output layer with an untied vocabulary projection. The checkpoint is trained without time
conditioning (`time_conditioning: False`): MDLM zeroes sigma before the network, so c is one constant vector and
`forward(z)` (sigma = 0) is the denoiser. flash-attn's packed varlen attention over equal-length sequences is
`scaled_dot_product_attention` here (equal up to kernel rounding, docs/checkpoints.md). The official code runs the
blocks under bfloat16 autocast on a GPU; this module computes in the parameters' dtype (float32), MDLM's
higher-precision setting (SDTT App., Fig. 9).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

FREQ_DIM = 256  # the sinusoidal embedding of sigma (TimestepEmbedder's frequency_embedding_size)


@dataclass(frozen=True)
class MDLMDiTConfig:
    vocab_size: int = 50258  # GPT-2's 50257 tokens and MASK (id 50257)
    hidden_size: int = 768
    cond_dim: int = 128
    length: int = 1024
    n_blocks: int = 12
    n_heads: int = 12
    dropout: float = 0.1

    def __post_init__(self):
        if self.hidden_size % self.n_heads or (self.hidden_size // self.n_heads) % 2:
            raise ValueError(f"hidden_size={self.hidden_size} / n_heads={self.n_heads} must be an even integer")


class LayerNorm(nn.Module):
    """LayerNorm without bias, normalised in float32, then scaled."""

    def __init__(self, dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x.float(), x.shape[-1:]).to(x.dtype) * self.weight


class TimestepEmbedder(nn.Module):
    """sigma (B,) -> (B, cond_dim): [cos, sin] features of sigma (max period 10000), then a 2-layer SiLU MLP."""

    def __init__(self, cond_dim: int):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(FREQ_DIM, cond_dim), nn.SiLU(), nn.Linear(cond_dim, cond_dim))

    def forward(self, sigma: torch.Tensor) -> torch.Tensor:
        half = FREQ_DIM // 2
        freqs = torch.exp(-math.log(10000) * torch.arange(half, dtype=torch.float32, device=sigma.device) / half)
        args = sigma[:, None].float() * freqs  # (B, half)
        return self.mlp(torch.cat([args.cos(), args.sin()], -1).to(self.mlp[0].weight.dtype))


class Rotary(nn.Module):
    def __init__(self, head_dim: int):
        super().__init__()
        self.register_buffer("inv_freq", 1.0 / 10000 ** (torch.arange(0, head_dim, 2).float() / head_dim))

    def forward(self, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        angle = torch.arange(length, device=self.inv_freq.device, dtype=self.inv_freq.dtype)[:, None] * self.inv_freq
        return angle.cos(), angle.sin()  # (L, hd/2) each


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (B, H, L, hd) rotated by position, halves (not pairs) rotated together."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


def modulate(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return x * (1 + scale[:, None]) + shift[:, None]


class DDiTBlock(nn.Module):
    def __init__(self, cfg: MDLMDiTConfig):
        super().__init__()
        d = cfg.hidden_size
        self.n_heads, self.dropout = cfg.n_heads, cfg.dropout
        self.norm1, self.norm2 = LayerNorm(d), LayerNorm(d)
        self.attn_qkv = nn.Linear(d, 3 * d, bias=False)
        self.attn_out = nn.Linear(d, d, bias=False)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(approximate="tanh"), nn.Linear(4 * d, d))
        self.adaLN_modulation = nn.Linear(cfg.cond_dim, 6 * d)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        B, L, d = x.shape
        shift1, scale1, gate1, shift2, scale2, gate2 = self.adaLN_modulation(c).chunk(6, dim=-1)  # (B, d) each
        qkv = self.attn_qkv(modulate(self.norm1(x), shift1, scale1))  # (B, L, 3d): [q; k; v], each head-major
        q, k, v = qkv.view(B, L, 3, self.n_heads, d // self.n_heads).permute(2, 0, 3, 1, 4)  # (B, H, L, hd) each
        y = F.scaled_dot_product_attention(rotate(q, cos, sin), rotate(k, cos, sin), v)  # bidirectional
        y = self.attn_out(y.transpose(1, 2).reshape(B, L, d))
        x = x + gate1[:, None] * F.dropout(y, self.dropout, self.training)
        y = self.mlp(modulate(self.norm2(x), shift2, scale2))
        return x + gate2[:, None] * F.dropout(y, self.dropout, self.training)


class DDitFinalLayer(nn.Module):
    def __init__(self, cfg: MDLMDiTConfig):
        super().__init__()
        self.norm_final = LayerNorm(cfg.hidden_size)
        self.linear = nn.Linear(cfg.hidden_size, cfg.vocab_size)
        self.adaLN_modulation = nn.Linear(cfg.cond_dim, 2 * cfg.hidden_size)

    def forward(self, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        shift, scale = self.adaLN_modulation(c).chunk(2, dim=-1)
        return self.linear(modulate(self.norm_final(x), shift, scale))


class EmbeddingLayer(nn.Module):
    def __init__(self, cfg: MDLMDiTConfig):
        super().__init__()
        self.embedding = nn.Parameter(torch.empty(cfg.vocab_size, cfg.hidden_size))
        nn.init.kaiming_uniform_(self.embedding, a=math.sqrt(5))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.embedding[ids]


class MDLMDiT(nn.Module):
    def __init__(self, cfg: MDLMDiTConfig):
        super().__init__()
        self.cfg = cfg
        self.vocab_embed = EmbeddingLayer(cfg)
        self.sigma_map = TimestepEmbedder(cfg.cond_dim)
        self.rotary_emb = Rotary(cfg.hidden_size // cfg.n_heads)
        self.blocks = nn.ModuleList(DDiTBlock(cfg) for _ in range(cfg.n_blocks))
        self.output_layer = DDitFinalLayer(cfg)

    def forward(self, z: torch.Tensor, sigma: torch.Tensor | None = None) -> torch.Tensor:
        """z (B, L) ids in [0, V) (MASK = V - 1), sigma (B,) or None (0: no time conditioning) -> logits (B, L, V)."""
        B, L = z.shape
        if sigma is None:
            sigma = torch.zeros(B, device=z.device)
        x = self.vocab_embed(z)  # (B, L, d)
        c = F.silu(self.sigma_map(sigma))  # (B, cond_dim)
        cos, sin = self.rotary_emb(L)
        cos, sin = cos.to(x.dtype), sin.to(x.dtype)
        for block in self.blocks:
            x = block(x, cos, sin, c)
        return self.output_layer(x, c)

    @classmethod
    def from_state_dict(cls, cfg: MDLMDiTConfig, state: dict[str, torch.Tensor]) -> "MDLMDiT":
        """Built on the meta device and loaded strictly with `assign` (no random init of what the file replaces). A
        file without `rotary_emb.inv_freq` (it is a buffer, derived from the head size) gets the computed table."""
        with torch.device("meta"):
            net = cls(cfg)
        state = dict(state)
        state.setdefault("rotary_emb.inv_freq", Rotary(cfg.hidden_size // cfg.n_heads).inv_freq)
        net.load_state_dict(state, strict=True, assign=True)
        return net
