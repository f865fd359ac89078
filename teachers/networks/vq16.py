"""The decoding half of LlamaGen's VQ-16 image tokenizer (Sun et al., arXiv:2406.06525; FoundationVision/LlamaGen
`tokenizer/tokenizer_image/vq_model.py`), in the official parameter names: codes -> L2-normalised code vectors ->
`post_quant_conv` -> a convolutional decoder (GroupNorm 32, swish, nearest-neighbour upsampling, self-attention at the
deepest level) -> an image in [-1, 1]. docs/checkpoints.md, 'LlamaGen class-to-image'. Swish is torch's fused
`F.silu` in place, as VAR's decoder writes it; LlamaGen's, MAR's and taming's write x * sigmoid(x), which rounds
differently (1e-5 here) and ran slower (benchmarks/decoder_speed.py).

The released `vq_ds16_c2i.pt` also holds the encoder, `quant_conv` and the codebook-usage counter, which decoding never
reads: `load_decoder_state` drops exactly those (an allow-list; trap T2) and loads the rest strictly.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

UNUSED_PREFIXES = ("encoder.", "quant_conv.", "quantize.codebook_used")  # in the file, not needed to decode


@dataclass(frozen=True)
class VQDecoderConfig:
    codebook_size: int = 16384
    embed_dim: int = 8
    z_channels: int = 256
    ch: int = 128
    ch_mult: tuple[int, ...] = (1, 1, 2, 2, 4)  # VQ-16: four upsamplings
    num_res_blocks: int = 2  # the decoder runs num_res_blocks + 1 per level

    @property
    def downsample(self) -> int:
        return 2 ** (len(self.ch_mult) - 1)


def _norm(channels: int) -> nn.GroupNorm:
    return nn.GroupNorm(32, channels, eps=1e-6)


class ResnetBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int):
        super().__init__()
        self.norm1, self.conv1 = _norm(c_in), nn.Conv2d(c_in, c_out, 3, padding=1)
        self.norm2, self.conv2 = _norm(c_out), nn.Conv2d(c_out, c_out, 3, padding=1)
        if c_in != c_out:
            self.nin_shortcut = nn.Conv2d(c_in, c_out, 1)

    def forward(self, x):
        h = self.conv1(F.silu(self.norm1(x), inplace=True))
        h = self.conv2(F.silu(self.norm2(h), inplace=True))
        return (self.nin_shortcut(x) if hasattr(self, "nin_shortcut") else x) + h


class AttnBlock(nn.Module):
    def __init__(self, c: int):
        super().__init__()
        self.norm = _norm(c)
        self.q, self.k, self.v, self.proj_out = (nn.Conv2d(c, c, 1) for _ in range(4))

    def forward(self, x):  # (B, C, H, W): single-head attention over the H*W cells
        B, C, H, W = x.shape
        h = self.norm(x)
        q, k, v = (m(h).reshape(B, C, H * W) for m in (self.q, self.k, self.v))  # (B, C, HW)
        # explicit products in the official order: a fused kernel rounds differently (1e-5 on unit-scale images)
        weights = torch.softmax(torch.bmm(q.transpose(1, 2), k) * C ** -0.5, dim=2)  # (B, HW queries, HW keys)
        return x + self.proj_out(torch.bmm(v, weights.transpose(1, 2)).reshape(B, C, H, W))


class Upsample(nn.Module):
    def __init__(self, c: int):
        super().__init__()
        self.conv = nn.Conv2d(c, c, 3, padding=1)

    def forward(self, x):
        return self.conv(F.interpolate(x, scale_factor=2.0, mode="nearest"))


def decode_level(h: torch.Tensor, res: nn.ModuleList, attn: nn.ModuleList, upsample: nn.Module | None) -> torch.Tensor:
    """One level of an LDM-style decoder: each residual block, followed by its attention block where the level has
    them (the deepest), then the upsampling (all but the finest level)."""
    for i, block in enumerate(res):
        h = block(h)
        if len(attn):
            h = attn[i](h)
    return upsample(h) if upsample is not None else h


class LDMDecoder(nn.Module):
    """LDM's decoder in its own names (`conv_in`, `mid.block_1/attn_1/block_2`, `up[level].block/attn/upsample` with
    up[0] the finest level, `norm_out`, `conv_out`): VAR's multi-scale VQ-VAE (`attn` its fused-qkv block) and MAR's
    KL-16 VAE (no attention in the levels)."""

    def __init__(self, z_channels: int, ch: int, ch_mult: tuple[int, ...], num_res_blocks: int, attn: type = AttnBlock,
                 level_attn: bool = True):
        super().__init__()
        c = ch * ch_mult[-1]
        self.conv_in = nn.Conv2d(z_channels, c, 3, padding=1)
        self.mid = nn.Module()
        self.mid.block_1, self.mid.attn_1, self.mid.block_2 = ResnetBlock(c, c), attn(c), ResnetBlock(c, c)
        ups = []
        for level in reversed(range(len(ch_mult))):
            up, c_out = nn.Module(), ch * ch_mult[level]
            up.block = nn.ModuleList(ResnetBlock(c if i == 0 else c_out, c_out) for i in range(num_res_blocks + 1))
            deepest = level == len(ch_mult) - 1
            up.attn = nn.ModuleList(attn(c_out) for _ in range(num_res_blocks + 1) if deepest and level_attn)
            if level != 0:
                up.upsample = Upsample(c_out)
            ups.insert(0, up)  # up[0] is the finest level, as the official list is ordered
            c = c_out
        self.up = nn.ModuleList(ups)
        self.norm_out, self.conv_out = _norm(c), nn.Conv2d(c, 3, 3, padding=1)

    def forward(self, z):  # (B, z_channels, h, w) -> (B, 3, h * 2^levels, w * 2^levels)
        h = self.mid.block_2(self.mid.attn_1(self.mid.block_1(self.conv_in(z))))
        for up in reversed(self.up):
            h = decode_level(h, up.block, up.attn, getattr(up, "upsample", None))
        return self.conv_out(F.silu(self.norm_out(h), inplace=True))


class Decoder(nn.Module):
    def __init__(self, cfg: VQDecoderConfig):
        super().__init__()
        c = cfg.ch * cfg.ch_mult[-1]
        self.conv_in = nn.Conv2d(cfg.z_channels, c, 3, padding=1)
        self.mid = nn.ModuleList([ResnetBlock(c, c), AttnBlock(c), ResnetBlock(c, c)])
        self.conv_blocks = nn.ModuleList()
        for level in reversed(range(len(cfg.ch_mult))):  # conv_blocks[0] is the deepest level
            block, c_out = nn.Module(), cfg.ch * cfg.ch_mult[level]
            block.res = nn.ModuleList(ResnetBlock(c if i == 0 else c_out, c_out) for i in range(cfg.num_res_blocks + 1))
            deepest = level == len(cfg.ch_mult) - 1
            block.attn = nn.ModuleList(AttnBlock(c_out) for _ in range(cfg.num_res_blocks + 1) if deepest)
            if level != 0:
                block.upsample = Upsample(c_out)
            self.conv_blocks.append(block)
            c = c_out
        self.norm_out, self.conv_out = _norm(c), nn.Conv2d(c, 3, 3, padding=1)

    def forward(self, z):  # (B, z_channels, h, w) -> (B, 3, h * 2^levels, w * 2^levels)
        h = self.conv_in(z)
        for block in self.mid:
            h = block(h)
        for block in self.conv_blocks:
            h = decode_level(h, block.res, block.attn, getattr(block, "upsample", None))
        return self.conv_out(F.silu(self.norm_out(h), inplace=True))


class Quantize(nn.Module):
    def __init__(self, cfg: VQDecoderConfig):
        super().__init__()
        self.embedding = nn.Embedding(cfg.codebook_size, cfg.embed_dim)


class VQ16Decoder(nn.Module):
    """codes (B, h*w) in raster order -> images (B, 3, 16h, 16w) in [-1, 1] (for VQ-16)."""

    def __init__(self, cfg: VQDecoderConfig):
        super().__init__()
        self.cfg = cfg
        self.quantize = Quantize(cfg)
        self.post_quant_conv = nn.Conv2d(cfg.embed_dim, cfg.z_channels, 1)
        self.decoder = Decoder(cfg)

    @property
    def codebook(self) -> torch.Tensor:
        """(K, embed_dim) the code vectors as decoding uses them: the stored rows, L2-normalised."""
        return F.normalize(self.quantize.embedding.weight, dim=-1)

    def forward(self, codes: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
        B, (h, w) = codes.shape[0], grid
        z = self.codebook[codes].reshape(B, h, w, -1).permute(0, 3, 1, 2).contiguous()  # (B, D, h, w), as officially
        return self.decoder(self.post_quant_conv(z))


def load_decoder_state(model: VQ16Decoder, official: dict[str, torch.Tensor]) -> VQ16Decoder:
    """Load the decoding half of an official VQ state dict strictly, dropping only `UNUSED_PREFIXES`; its tensors are
    taken as they are, so `model` may be built on the meta device."""
    kept = {k: v for k, v in official.items() if not k.startswith(UNUSED_PREFIXES)}
    model.load_state_dict(kept, strict=True, assign=True)
    return model
