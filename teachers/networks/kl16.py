"""The decoding half of MAR's KL-16 VAE (LDM's KL autoencoder as LTH14/mar `models/vae.py` configures it;
docs/checkpoints.md, 'MAR'), in the official names: latents (B, 16, h, w) -> `post_quant_conv` -> LDM's decoder
(GroupNorm 32, swish, nearest upsampling, separate q/k/v single-head attention in the middle block only) -> an image
in [-1, 1] at 16 h x 16 w. MAR's tokens are the latents scaled by 0.2325 (`SCALE`), a token per latent cell in raster
order.

`kl16.ckpt` holds `{"model": state dict}` with the encoder and `quant_conv` too, which decoding never reads:
`load_decoder_state` drops exactly those (an allow-list: the official loader is `strict=False`, trap T2) and loads the
rest strictly.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn

from teachers.networks.vq16 import AttnBlock, LDMDecoder

UNUSED_PREFIXES = ("encoder.", "quant_conv.")  # in the file, not needed to decode
SCALE = 0.2325  # MAR's latent scale (engine_mar.py: posterior.sample() * 0.2325)


@dataclass(frozen=True)
class KL16Config:
    embed_dim: int = 16
    ch: int = 128
    ch_mult: tuple[int, ...] = (1, 1, 2, 2, 4)
    num_res_blocks: int = 2


class KL16Decoder(nn.Module):
    """tokens (B, h*w, embed_dim) in raster order, MAR's scaled latents -> images (B, 3, 16h, 16w) in [-1, 1]."""

    def __init__(self, cfg: KL16Config):
        super().__init__()
        self.cfg = cfg
        self.post_quant_conv = nn.Conv2d(cfg.embed_dim, cfg.embed_dim, 1)
        self.decoder = LDMDecoder(cfg.embed_dim, cfg.ch, cfg.ch_mult, cfg.num_res_blocks, AttnBlock, level_attn=False)

    def decode(self, z: torch.Tensor) -> torch.Tensor:  # (B, embed_dim, h, w) latents -> (B, 3, 16h, 16w)
        return self.decoder(self.post_quant_conv(z))

    def forward(self, tokens: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
        B, (h, w) = tokens.shape[0], grid
        z = tokens.transpose(1, 2).reshape(B, -1, h, w)  # MAR's unpatchify at patch size 1
        return self.decode(z / SCALE).clamp(-1, 1)


def load_decoder_state(model: KL16Decoder, official: dict[str, torch.Tensor]) -> KL16Decoder:
    """Load the decoding half of the official VAE state dict strictly, dropping only `UNUSED_PREFIXES`."""
    model.load_state_dict({k: v for k, v in official.items() if not k.startswith(UNUSED_PREFIXES)}, strict=True,
                          assign=True)
    return model
