"""VAR's next-scale transformer (Tian et al. 2024, arXiv:2404.02905; FoundationVision/VAR `models/var.py`,
`basic_var.py`), DD's second teacher (arXiv:2412.17153 §5), in the official parameter names so that the released
`var_d{16,20,24,30}.pth` load strictly (docs/checkpoints.md, 'VAR').

A class-conditional transformer over the tokens of all scales at once (L = sum of pn^2 = 680): the first scale's
input is the class embedding plus `pos_start`; the input of scale k + 1 is `word_embed` of the accumulated feature map
area-downsampled to that scale (`teachers.networks.msvq`); every input gets its level and position embeddings. Blocks
are adaLN (SiLU then Linear, unbound as gamma1, gamma2, scale1, scale2, shift1, shift2: not DiT's order) around
attention with l2-normalised queries and keys (query scale exp(min(s, ln 100)), softmax scale 1; the qkv bias is
[q_bias; 0; v_bias]) and a tanh-GELU MLP; LayerNorms are not affine (eps 1e-6); the head has its own adaLN (scale,
shift), computed in float32. At inference a scale attends to every earlier scale and to itself through the KV cache,
with no mask: the block-causal mask of training, in one pass (`forward`).
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

PATCH_NUMS = (1, 2, 3, 4, 5, 6, 8, 10, 13, 16)  # 256 px: 16 x 16 tokens at the last scale


@dataclass(frozen=True)
class VARConfig:
    depth: int = 16  # heads = depth, width = 64 depth (models/__init__.py `build_vae_var`)
    num_classes: int = 1000
    vocab_size: int = 4096
    Cvae: int = 32
    patch_nums: tuple[int, ...] = PATCH_NUMS
    embed_dim: int = 0  # 0: 64 depth
    num_heads: int = 0  # 0: depth
    norm_eps: float = 1e-6

    @property
    def width(self) -> int:
        return self.embed_dim or 64 * self.depth

    @property
    def heads(self) -> int:
        return self.num_heads or self.depth

    @property
    def L(self) -> int:
        return sum(pn * pn for pn in self.patch_nums)


class SelfAttention(nn.Module):
    def __init__(self, cfg: VARConfig):
        super().__init__()
        C, H = cfg.width, cfg.heads
        self.num_heads, self.head_dim = H, C // H
        self.scale_mul_1H11 = nn.Parameter(torch.full((1, H, 1, 1), 4.0).log())
        self.max_scale_mul = math.log(100)
        self.mat_qkv = nn.Linear(C, 3 * C, bias=False)
        self.q_bias, self.v_bias = nn.Parameter(torch.zeros(C)), nn.Parameter(torch.zeros(C))
        self.register_buffer("zero_k_bias", torch.zeros(C))
        self.proj = nn.Linear(C, C)

    def forward(self, x: torch.Tensor, cache: dict | None, attn_bias: torch.Tensor | None) -> torch.Tensor:
        B, L, C = x.shape
        bias = torch.cat((self.q_bias, self.zero_k_bias, self.v_bias))
        qkv = F.linear(x, self.mat_qkv.weight, bias).view(B, L, 3, self.num_heads, self.head_dim)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # (B, H, L, hd) each
        q = F.normalize(q, dim=-1) * self.scale_mul_1H11.clamp_max(self.max_scale_mul).exp()
        k = F.normalize(k, dim=-1)
        if cache is not None:  # this scale's keys and values join the earlier scales'
            if "k" in cache:
                k, v = torch.cat((cache["k"], k), 2), torch.cat((cache["v"], v), 2)
            cache["k"], cache["v"] = k, v
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_bias, scale=1.0)
        return self.proj(y.transpose(1, 2).reshape(B, L, C))


class FFN(nn.Module):
    def __init__(self, C: int):
        super().__init__()
        self.fc1, self.act, self.fc2 = nn.Linear(C, 4 * C), nn.GELU(approximate="tanh"), nn.Linear(4 * C, C)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class AdaLNSelfAttn(nn.Module):
    def __init__(self, cfg: VARConfig):
        super().__init__()
        C = cfg.width
        self.attn, self.ffn = SelfAttention(cfg), FFN(C)
        self.ln_wo_grad = nn.LayerNorm(C, eps=cfg.norm_eps, elementwise_affine=False)
        self.ada_lin = nn.Sequential(nn.SiLU(), nn.Linear(C, 6 * C))

    def forward(self, x: torch.Tensor, cond: torch.Tensor, cache: dict | None, attn_bias=None) -> torch.Tensor:
        g1, g2, s1, s2, b1, b2 = self.ada_lin(cond).view(-1, 1, 6, x.shape[-1]).unbind(2)  # (B, 1, C) each
        x = x + self.attn(self.ln_wo_grad(x) * (1 + s1) + b1, cache, attn_bias) * g1
        return x + self.ffn(self.ln_wo_grad(x) * (1 + s2) + b2) * g2


class AdaLNBeforeHead(nn.Module):
    def __init__(self, cfg: VARConfig):
        super().__init__()
        C = cfg.width
        self.ln_wo_grad = nn.LayerNorm(C, eps=cfg.norm_eps, elementwise_affine=False)
        self.ada_lin = nn.Sequential(nn.SiLU(), nn.Linear(C, 2 * C))

    def forward(self, x: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        scale, shift = self.ada_lin(cond).view(-1, 1, 2, x.shape[-1]).unbind(2)
        return self.ln_wo_grad(x) * (1 + scale) + shift


class VAR(nn.Module):
    def __init__(self, cfg: VARConfig):
        super().__init__()
        self.cfg = cfg
        C, L, first = cfg.width, cfg.L, cfg.patch_nums[0] ** 2
        self.word_embed = nn.Linear(cfg.Cvae, C)
        self.class_emb = nn.Embedding(cfg.num_classes + 1, C)  # the last row is the null class (CFG)
        self.pos_start = nn.Parameter(torch.zeros(1, first, C))
        self.pos_1LC = nn.Parameter(torch.zeros(1, L, C))
        self.lvl_embed = nn.Embedding(len(cfg.patch_nums), C)
        self.blocks = nn.ModuleList(AdaLNSelfAttn(cfg) for _ in range(cfg.depth))
        self.head_nm = AdaLNBeforeHead(cfg)
        self.head = nn.Linear(C, cfg.vocab_size)
        level = torch.cat([torch.full((pn * pn,), i) for i, pn in enumerate(cfg.patch_nums)]).view(1, L, 1)
        self.register_buffer("lvl_1L", level[:, :, 0].contiguous())  # (1, L) the scale of each position
        block_causal = torch.where(level >= level.transpose(1, 2), 0.0, -torch.inf).reshape(1, 1, L, L)
        self.register_buffer("attn_bias_for_masking", block_causal.contiguous())
        self.ends = list(itertools.accumulate(pn * pn for pn in cfg.patch_nums))  # where each scale ends

    def lvl_pos(self) -> torch.Tensor:  # (1, L, C)
        return self.lvl_embed(self.lvl_1L) + self.pos_1LC

    def logits(self, h: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:  # (B, l, C) -> (B, l, V) float32
        return self.head(self.head_nm(h.float(), cond.float())).float()

    def first_input(self, cond: torch.Tensor) -> torch.Tensor:
        """(B, C) class embeddings -> (B, pn0^2, C) the first scale's input."""
        first = self.cfg.patch_nums[0] ** 2
        return cond[:, None] + self.pos_start + self.lvl_pos()[:, :first]

    def scale_input(self, si: int, f_down: torch.Tensor) -> torch.Tensor:
        """Scale si's input from the accumulated map area-downsampled to it, (B, Cvae, pn, pn) -> (B, pn^2, C)."""
        start = self.ends[si - 1]
        return self.word_embed(f_down.flatten(2).transpose(1, 2)) + self.lvl_pos()[:, start : self.ends[si]]

    def step(self, x: torch.Tensor, cond: torch.Tensor, caches: list[dict],
             attn_bias: torch.Tensor | None = None) -> torch.Tensor:
        """One scale through the blocks with the KV caches: (B, pn^2, C) -> logits (B, pn^2, V); several scales at
        once, (B, l, C), with `attn_bias` the block-causal mask of their l positions (after nothing cached)."""
        for block, cache in zip(self.blocks, caches):
            x = block(x, cond, cache, attn_bias)
        return self.logits(x, cond)

    def forward(self, labels: torch.Tensor, x_next: torch.Tensor) -> torch.Tensor:
        """Teacher forcing, every scale at once under the block-causal mask: labels (B,), x_next (B, L - pn0^2, Cvae)
        the next-scale inputs (`msvq.MultiScaleVQ.var_input`) -> logits (B, L, V)."""
        cond = self.class_emb(labels)
        first = self.first_input(cond)
        rest = self.word_embed(x_next) + self.lvl_pos()[:, first.shape[1] :]
        x = torch.cat([first, rest], 1)
        for block in self.blocks:
            x = block(x, cond, None, self.attn_bias_for_masking)
        return self.logits(x, cond)

    @classmethod
    def from_state_dict(cls, cfg: VARConfig, state: dict[str, torch.Tensor]) -> "VAR":
        """Built on the meta device and loaded strictly with `assign` (the file's buffers included)."""
        with torch.device("meta"):
            net = cls(cfg)
        net.load_state_dict(state, strict=True, assign=True)
        return net
