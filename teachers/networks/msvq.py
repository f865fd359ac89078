"""The decoding half of VAR's multi-scale VQ-VAE (Tian et al. 2024, arXiv:2404.02905; FoundationVision/VAR
`models/vqvae.py`, `quant.py`, `basic_vae.py`) in the official parameter names (docs/checkpoints.md, 'VAR'), so that
`vae_ch160v4096z32.pth` loads strictly once its encoder and `quant_conv` (never read to decode) are dropped.

Scale k's codes h_k (pn_k x pn_k, `embedding`) add to an accumulated map f_hat at the last scale's size: upsampled
bicubically (all but the last scale), then through Phi_k(x) = (1 - 0.5) x + 0.5 conv3x3(x), one of 4 convolutions
shared across the scales by the nearest of 4 ticks to k / (K - 1) (`PhiPartiallyShared`; the exact ties of scales 2
and 7 broken by float64 `argmin`, as numpy breaks them in the official code). The next scale's transformer input is
f_hat area-downsampled to that scale. The image is `decoder(post_quant_conv(f_hat))`, clamped to [-1, 1]: an LDM
decoder (GroupNorm 32, swish, nearest upsampling, single-head attention with a fused qkv at the deepest level and in
the middle).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from teachers.networks.vq16 import LDMDecoder, _norm
from teachers.networks.var import PATCH_NUMS

UNUSED_PREFIXES = ("encoder.", "quant_conv.")  # in the file, not needed to decode


@dataclass(frozen=True)
class MSVQConfig:
    vocab_size: int = 4096
    Cvae: int = 32
    ch: int = 160  # 0: no convolutional decoder, the map holds pixel patches (`decode` un-shuffles them)
    ch_mult: tuple[int, ...] = (1, 1, 2, 2, 4)  # x16
    num_res_blocks: int = 2  # the decoder runs num_res_blocks + 1 per level
    share_quant_resi: int = 4
    quant_resi: float = 0.5
    patch_nums: tuple[int, ...] = PATCH_NUMS

    @property
    def downsample(self) -> int:
        return 2 ** (len(self.ch_mult) - 1)


class AttnBlock(nn.Module):
    def __init__(self, c: int):
        super().__init__()
        self.norm, self.qkv, self.proj_out = _norm(c), nn.Conv2d(c, 3 * c, 1), nn.Conv2d(c, c, 1)

    def forward(self, x):  # (B, C, H, W): single-head attention over the H*W cells
        B, C, H, W = x.shape
        q, k, v = self.qkv(self.norm(x)).reshape(B, 3, C, H * W).unbind(1)  # (B, C, HW)
        weights = torch.softmax(torch.bmm(q.transpose(1, 2), k) * C ** -0.5, dim=2)  # (B, HW queries, HW keys)
        return x + self.proj_out(torch.bmm(v, weights.transpose(1, 2)).reshape(B, C, H, W))


class Phi(nn.Conv2d):
    def __init__(self, c: int, ratio: float):
        super().__init__(c, c, 3, padding=1)
        self.ratio = ratio

    def forward(self, h):
        return h * (1 - self.ratio) + super().forward(h) * self.ratio


class QuantResi(nn.Module):
    def __init__(self, cfg: MSVQConfig):
        super().__init__()
        K = cfg.share_quant_resi
        self.qresi_ls = nn.ModuleList(Phi(cfg.Cvae, cfg.quant_resi) for _ in range(K))
        # VAR's np.linspace(lo, 1 - lo, K) and np.argmin, in plain floats to the last bit: a GPU box's
        # `make gpu-bench` builds VAR without numpy
        lo = 1 / 3 / K if K == 4 else 1 / 2 / K
        step = (1 - lo - lo) / max(K - 1, 1)
        ticks = [i * step + lo for i in range(K - 1)] + [1 - lo]
        last = len(cfg.patch_nums) - 1
        self.index = [min(range(K), key=lambda k: abs(ticks[k] - si / last)) for si in range(last + 1)]  # scale -> Phi

    def forward(self, si: int, h: torch.Tensor) -> torch.Tensor:
        return self.qresi_ls[self.index[si]](h)


class Quantize(nn.Module):
    def __init__(self, cfg: MSVQConfig):
        super().__init__()
        self.embedding = nn.Embedding(cfg.vocab_size, cfg.Cvae)
        self.quant_resi = QuantResi(cfg)
        self.register_buffer("ema_vocab_hit_SV", torch.zeros(len(cfg.patch_nums), cfg.vocab_size))  # training stat


class MultiScaleVQ(nn.Module):
    def __init__(self, cfg: MSVQConfig):
        super().__init__()
        self.cfg = cfg
        self.quantize = Quantize(cfg)
        if cfg.ch:
            self.post_quant_conv = nn.Conv2d(cfg.Cvae, cfg.Cvae, 3, padding=1)
            self.decoder = LDMDecoder(cfg.Cvae, cfg.ch, cfg.ch_mult, cfg.num_res_blocks, AttnBlock, level_attn=True)

    @torch.no_grad()
    def encode_map(self, f: torch.Tensor) -> list[torch.Tensor]:
        """A feature map (B, Cvae, P, P) -> the codes of every scale, (B, pn^2) each: the residual left by the
        earlier scales, area-downsampled to the scale, takes its nearest code (VAR's `f_to_idxBl_or_fhat`)."""
        rest, codes, table = f.clone(), [], self.quantize.embedding.weight  # (V, Cvae)
        for si, pn in enumerate(self.cfg.patch_nums):
            z = self.downsample(si, rest).flatten(2).transpose(1, 2)  # (B, pn^2, Cvae)
            idx = torch.cdist(z, table.expand(len(z), -1, -1)).argmin(-1)  # (B, pn^2)
            codes.append(idx)
            rest = rest - self.accumulate(si, torch.zeros_like(rest), idx)
        return codes

    def accumulate(self, si: int, f_hat: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        """f_hat (B, Cvae, P, P) plus scale si's codes idx (B, pn^2): the updated map (out of place)."""
        B, pn, P = idx.shape[0], self.cfg.patch_nums[si], self.cfg.patch_nums[-1]
        h = self.quantize.embedding(idx).transpose(1, 2).reshape(B, self.cfg.Cvae, pn, pn)
        if si != len(self.cfg.patch_nums) - 1:
            h = F.interpolate(h, size=(P, P), mode="bicubic")
        return f_hat + self.quantize.quant_resi(si, h)

    def downsample(self, si: int, f_hat: torch.Tensor) -> torch.Tensor:
        """f_hat area-downsampled to scale si: the transformer's input there, (B, Cvae, pn, pn)."""
        pn = self.cfg.patch_nums[si]
        return F.interpolate(f_hat, size=(pn, pn), mode="area")

    def var_input(self, idx: list[torch.Tensor]) -> torch.Tensor:
        """Teacher forcing: the codes of every scale -> the inputs of scales 1..K-1, (B, L - pn0^2, Cvae)."""
        B, P = idx[0].shape[0], self.cfg.patch_nums[-1]
        f_hat, out = torch.zeros(B, self.cfg.Cvae, P, P, device=idx[0].device), []
        for si in range(len(self.cfg.patch_nums) - 1):
            f_hat = self.accumulate(si, f_hat, idx[si])
            out.append(self.downsample(si + 1, f_hat).flatten(2).transpose(1, 2))
        return torch.cat(out, 1)

    def decode(self, f_hat: torch.Tensor) -> torch.Tensor:  # (B, Cvae, P, P) -> (B, 3, P*16, P*16) in [-1, 1]
        if not self.cfg.ch:  # pixel patches of a one-channel image: (B, r^2, P, P) -> (B, 1, rP, rP)
            return F.pixel_shuffle(f_hat, round(self.cfg.Cvae ** 0.5)).clamp(-1, 1)
        return self.decoder(self.post_quant_conv(f_hat)).clamp(-1, 1)

    def decode_codes(self, idx: list[torch.Tensor]) -> torch.Tensor:
        """The codes of every scale -> the image, (B, 3, H, W) in [-1, 1]. The map is rebuilt from the codes rather
        than kept from sampling: 6-12 ms against 6-7 s for the decoder on one CPU thread (VAR-d16's VAE, measured)."""
        B, P = idx[0].shape[0], self.cfg.patch_nums[-1]
        f_hat = torch.zeros(B, self.cfg.Cvae, P, P, device=idx[0].device)
        for si, codes in enumerate(idx):
            f_hat = self.accumulate(si, f_hat, codes)
        return self.decode(f_hat)


def load_decoder_state(model: MultiScaleVQ, official: dict[str, torch.Tensor]) -> MultiScaleVQ:
    """Load the decoding half of an official VQ-VAE state dict strictly, dropping only `UNUSED_PREFIXES` (tensors
    assigned, not copied)."""
    model.load_state_dict({k: v for k, v in official.items() if not k.startswith(UNUSED_PREFIXES)}, strict=True,
                          assign=True)
    return model
