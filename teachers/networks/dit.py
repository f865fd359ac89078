"""A class-conditional Diffusion Transformer (Peebles & Xie, DiT, arXiv:2212.09748), the teacher of ARD
(arXiv:2504.11295).

Patchify, fixed 2-D sin-cos positions, adaLN-Zero blocks conditioned on c = t_emb(t) + y_emb(y), a final adaLN layer
and unpatchify. ARD reuses the parts: every block takes a token-wise condition c (B, L, d) as well as DiT's (B, d),
an attention mask, and extra keys/values of earlier inputs (`history`); it returns its own keys/values so a sampler
can cache them.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from teachers.networks.diffusion_head import TimestepEmbedder


POS_LAYOUTS = ("row-col", "col-row")


@dataclass(frozen=True)
class DiTConfig:
    image_size: int = 16  # pixels, or latent cells for a latent DiT
    channels: int = 1
    patch: int = 4
    n_classes: int = 10  # id n_classes is the null class (label dropout, CFG)
    hidden: int = 128
    depth: int = 4
    heads: int = 4
    # The official DiT predicts a variance too (learned sigma): 2 * channels outputs, eps first.
    learn_sigma: bool = False
    # Which coordinate the first half of the position channels encodes: the official DiT's is the column
    # (`get_2d_sincos_pos_embed`, docs/checkpoints.md); our tiny teachers were trained with the row first.
    pos_layout: str = "row-col"

    def __post_init__(self):
        if self.image_size % self.patch or self.hidden % self.heads:
            raise ValueError(f"image_size {self.image_size} must be divisible by patch {self.patch} and hidden "
                             f"{self.hidden} by heads {self.heads}")
        if self.pos_layout not in POS_LAYOUTS:
            raise ValueError(f"pos_layout must be one of {', '.join(POS_LAYOUTS)}, got {self.pos_layout!r}")

    @property
    def tokens(self) -> int:
        return (self.image_size // self.patch) ** 2

    @property
    def out_channels(self) -> int:
        return 2 * self.channels if self.learn_sigma else self.channels


def sincos_2d(d: int, grid: int, layout: str) -> torch.Tensor:
    """(grid*grid, d) fixed positions, row-major tokens, half the channels for one coordinate and half for the other
    (DiT / MAE), each half [sin, cos], computed in float64 as the official code does."""
    def one(pos, dim):
        omega = 1.0 / 10000 ** (torch.arange(dim // 2, dtype=torch.float64) / (dim / 2))
        a = pos.flatten().double()[:, None] * omega
        return torch.cat([a.sin(), a.cos()], 1)

    r, c = torch.meshgrid(torch.arange(grid), torch.arange(grid), indexing="ij")
    first, second = (r, c) if layout == "row-col" else (c, r)
    return torch.cat([one(first, d // 2), one(second, d // 2)], 1).float()


def _modulate(x, shift, scale):
    return x * (1 + scale) + shift


class Attention(nn.Module):
    def __init__(self, cfg: DiTConfig):
        super().__init__()
        self.heads = cfg.heads
        self.qkv, self.proj = nn.Linear(cfg.hidden, 3 * cfg.hidden), nn.Linear(cfg.hidden, cfg.hidden)

    def forward(self, x, mask=None, history=None):
        """x (B, L, d); mask (L, L_history + L) bool, True = may attend; history: keys/values (B, H, L_h, hd) of
        earlier inputs, read before x's own. Returns the output and x's keys/values."""
        B, L, d = x.shape
        q, k, v = (t.view(B, L, self.heads, -1).transpose(1, 2) for t in self.qkv(x).split(d, dim=2))
        keys, values = (torch.cat([history[0], k], 2), torch.cat([history[1], v], 2)) if history else (k, v)
        y = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
        return self.proj(y.transpose(1, 2).reshape(B, L, d)), (k, v)


class DiTBlock(nn.Module):
    def __init__(self, cfg: DiTConfig):
        super().__init__()
        d = cfg.hidden
        self.norm1 = nn.LayerNorm(d, elementwise_affine=False, eps=1e-6)
        self.attn = Attention(cfg)
        self.norm2 = nn.LayerNorm(d, elementwise_affine=False, eps=1e-6)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(approximate="tanh"), nn.Linear(4 * d, d))
        self.ada = nn.Sequential(nn.SiLU(), nn.Linear(d, 6 * d))

    def forward(self, x, c, mask=None, history=None):
        """c (B, d) for the whole input, or (B, L, d) per token (ARD's token-wise time)."""
        mods = self.ada(c if c.dim() == 3 else c[:, None]).chunk(6, -1)
        shift1, scale1, gate1, shift2, scale2, gate2 = mods
        h, kv = self.attn(_modulate(self.norm1(x), shift1, scale1), mask, history)
        x = x + gate1 * h
        return x + gate2 * self.mlp(_modulate(self.norm2(x), shift2, scale2)), kv


class FinalLayer(nn.Module):
    def __init__(self, cfg: DiTConfig):
        super().__init__()
        self.norm = nn.LayerNorm(cfg.hidden, elementwise_affine=False, eps=1e-6)
        self.linear = nn.Linear(cfg.hidden, cfg.patch * cfg.patch * cfg.out_channels)
        self.ada = nn.Sequential(nn.SiLU(), nn.Linear(cfg.hidden, 2 * cfg.hidden))

    def forward(self, x, c):
        shift, scale = self.ada(c if c.dim() == 3 else c[:, None]).chunk(2, -1)
        return self.linear(_modulate(self.norm(x), shift, scale))


class DiT(nn.Module):
    """eps(x_t, t, y): x (B, C, H, W), t (B,) training steps, y (B,) class ids -> (B, C_out, H, W) (eps, then the
    variance interpolation v when `learn_sigma`)."""

    def __init__(self, cfg: DiTConfig):
        super().__init__()
        self.cfg = cfg
        self.x_embedder = nn.Conv2d(cfg.channels, cfg.hidden, cfg.patch, stride=cfg.patch)
        self.register_buffer("pos_embed", sincos_2d(cfg.hidden, cfg.image_size // cfg.patch, cfg.pos_layout),
                             persistent=False)
        self.t_embedder = TimestepEmbedder(cfg.hidden)
        self.y_embedder = nn.Embedding(cfg.n_classes + 1, cfg.hidden)
        self.blocks = nn.ModuleList(DiTBlock(cfg) for _ in range(cfg.depth))
        self.final_layer = FinalLayer(cfg)
        self._init()

    def _init(self):
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.xavier_uniform_(m.weight)
                nn.init.zeros_(m.bias)
        nn.init.normal_(self.y_embedder.weight, std=0.02)
        for m in [b.ada[-1] for b in self.blocks] + [self.final_layer.ada[-1], self.final_layer.linear]:
            nn.init.zeros_(m.weight)  # adaLN-Zero: every block starts as the identity
            nn.init.zeros_(m.bias)

    def embed(self, x):  # (B, C, H, W) -> (B, L, d)
        return self.x_embedder(x).flatten(2).transpose(1, 2) + self.pos_embed

    def cond(self, t, y):  # (B,), (B,) -> (B, d)
        return self.t_embedder(t) + self.y_embedder(y)

    def unpatchify(self, out):  # (B, L, p*p*C_out) -> (B, C_out, H, W)
        cfg, B, C = self.cfg, out.shape[0], self.cfg.out_channels
        g = cfg.image_size // cfg.patch
        out = out.view(B, g, g, cfg.patch, cfg.patch, C)
        return torch.einsum("bhwpqc->bchpwq", out).reshape(B, C, cfg.image_size, cfg.image_size)

    def forward(self, x, t, y):
        h, c = self.embed(x), self.cond(t, y)
        for block in self.blocks:
            h, _ = block(h, c)
        return self.unpatchify(self.final_layer(h, c))
