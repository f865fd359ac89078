"""The decoding half of Chameleon's VQGAN image tokenizer (Chameleon Team, arXiv:2405.09818), which Lumina-mGPT and
Anole decode their image tokens with, in the official parameter names: codes -> code vectors (a plain lookup, no L2
norm) -> `post_quant_conv` -> taming-transformers' convolutional decoder -> an image clamped to [-1, 1].

The reference is tyshiwo1/Accelerating-T2I-AR-with-SJD (the same folder as Alpha-VLLM/Lumina-mGPT)
`lumina_mgpt/model/chameleon_vae_ori/`: `vqgan.py` (`VQModel`, `Decoder`, `VectorQuantizer2`) and
`image_tokenizer.py` (`ImageTokenizer.pil_from_img_toks`, `_pil_from_chw_tensor`). The released files are
`vqgan.yaml` (taming's model config) and `vqgan.ckpt` (the weights under "state_dict"). The official loader
(`VQModel.init_from_ckpt`) loads with strict=False, which would hide a missing key; `load_vqgan_state` drops only the
named prefixes decoding never reads and loads the rest strictly.

Full-size values (`ChameleonVQConfig()`): n_embed 8192, embed_dim 256, z_channels 256, ch 128, ch_mult (1, 1, 2, 2, 4),
num_res_blocks 2, resolution 512 and no attention in the levels are transformers' `ChameleonVQVAEConfig` defaults
(attn_resolutions None there); that the released vqgan.yaml holds the same is presumed, not read from the file
(transformers' `convert_chameleon_weights_to_hf.py` builds its config from that file); the teacher reads the file's
own values with `ChameleonVQConfig.from_yaml`.
tests/test_chameleon_vqgan.py proves the decoding on a tiny config against the official code.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn as nn

from core.config import read_yaml_mapping
from teachers.networks.vq16 import AttnBlock, LDMDecoder

# In the released file, not needed to decode: the encoder half (`encoder.*`, `quant_conv.*`) and, presumed from the
# taming training code the checkpoint comes from, its training loss (`loss.*`: LPIPS and the discriminator), which the
# official inference-only `VQModel` has no module for (its strict=False load skips them). Anything else is refused.
UNUSED_PREFIXES = ("encoder.", "quant_conv.", "loss.")

# ddconfig / model.params entries the official code accepts that would change decoding: only their defaults are
# supported (taming's `Decoder` and `VQModel` arguments; `remap` would re-index the codes through a `used` table)
FIXED_OPTIONS = {"resamp_with_conv": True, "give_pre_end": False, "tanh_out": False, "use_linear_attn": False,
                 "attn_type": "vanilla", "remap": None}


@dataclass(frozen=True)
class ChameleonVQConfig:
    n_embed: int = 8192  # codebook size
    embed_dim: int = 256  # code vector width
    z_channels: int = 256  # `post_quant_conv`'s output, the decoder's input
    ch: int = 128
    ch_mult: tuple[int, ...] = (1, 1, 2, 2, 4)  # four upsamplings: 16x
    num_res_blocks: int = 2  # the decoder runs num_res_blocks + 1 per level
    resolution: int = 512  # the training size: only names the levels for attn_resolutions
    attn_resolutions: tuple[int, ...] = ()  # levels (by their size at `resolution`) with attention after each block

    def __post_init__(self):
        for name in ("n_embed", "embed_dim", "z_channels", "ch", "resolution"):
            if not (isinstance(getattr(self, name), int) and getattr(self, name) > 0):
                raise ValueError(f"{name}={getattr(self, name)!r}: must be a positive integer")
        if not (self.ch_mult and all(isinstance(m, int) and m > 0 for m in self.ch_mult)):
            raise ValueError(f"ch_mult={list(self.ch_mult)!r}: must be a non-empty list of positive integers")
        if self.ch % 32:  # GroupNorm(32) on every level's width (taming's `Normalize`)
            raise ValueError(f"ch={self.ch}: must be a multiple of 32")
        if not (isinstance(self.num_res_blocks, int) and self.num_res_blocks >= 0):
            raise ValueError(f"num_res_blocks={self.num_res_blocks!r}: must be an integer >= 0")
        if any(r not in self.level_sizes for r in self.attn_resolutions):
            raise ValueError(f"attn_resolutions={list(self.attn_resolutions)}: each must be one of the level sizes "
                             f"{sorted(set(self.level_sizes))}")

    @property
    def downsample(self) -> int:
        return 2 ** (len(self.ch_mult) - 1)

    @property
    def level_sizes(self) -> list[int]:
        """Each level's nominal size, level 0 the finest, as `Decoder.__init__` counts them (`curr_res`): the deepest
        is resolution // downsample, doubled by each upsampling."""
        return [(self.resolution // self.downsample) << (len(self.ch_mult) - 1 - i) for i in range(len(self.ch_mult))]

    @classmethod
    def from_yaml(cls, path: Path | str) -> ChameleonVQConfig:
        """The decoder's config from the official vqgan.yaml (`model.params`: embed_dim, n_embed, ddconfig), read as
        `ImageTokenizer.__init__` reads it; the encoder-only entries (double_z, in_channels, dropout) are not needed."""
        try:
            params = read_yaml_mapping(str(path), "VQGAN config")["model"]["params"]
            dd, given = params["ddconfig"], {**params, **params["ddconfig"]}
            for name, default in FIXED_OPTIONS.items():
                if given.get(name, default) != default:
                    raise ValueError(f"{name}={given[name]!r}: only {default!r} is supported")
            if dd.get("out_ch", 3) != 3:
                raise ValueError(f"out_ch={dd['out_ch']!r}: only 3 (RGB) is supported")
            return cls(n_embed=params["n_embed"], embed_dim=params["embed_dim"], z_channels=dd["z_channels"],
                       ch=dd["ch"], ch_mult=tuple(dd["ch_mult"]), num_res_blocks=dd["num_res_blocks"],
                       resolution=dd["resolution"], attn_resolutions=tuple(dd.get("attn_resolutions") or ()))
        except (KeyError, TypeError) as e:  # not the layout the official `ImageTokenizer` reads
            raise ValueError(f"{path}: not a taming VQGAN config (model.params with its ddconfig): {e!r}") from None
        except ValueError as e:
            raise ValueError(f"{path}: {e}") from None


class ChameleonDecoder(LDMDecoder):
    """taming's `Decoder` (vqgan.py): LDM's decoder (teachers/networks/vq16.py, the same names and blocks) whose
    levels get attention by their nominal size (`ChameleonVQConfig.level_sizes`), not by depth: where a level's size
    is in attn_resolutions, an `AttnBlock` runs after each of its residual blocks. The middle always has one."""

    def __init__(self, cfg: ChameleonVQConfig):
        super().__init__(cfg.z_channels, cfg.ch, cfg.ch_mult, cfg.num_res_blocks, level_attn=False)
        for level, up in enumerate(self.up):
            if cfg.level_sizes[level] in cfg.attn_resolutions:
                up.attn = nn.ModuleList(AttnBlock(cfg.ch * cfg.ch_mult[level]) for _ in range(cfg.num_res_blocks + 1))


class ChameleonVQGAN(nn.Module):
    """codes (B, h*w) in raster order -> images (B, 3, 16h, 16w) in [-1, 1] (at the full size; 2^(levels-1) in
    general): `pil_from_img_toks` without the conversion to 8-bit pixels."""

    def __init__(self, cfg: ChameleonVQConfig):
        super().__init__()
        self.cfg = cfg
        self.quantize = nn.Module()  # `VectorQuantizer2`: decoding reads its embedding alone
        self.quantize.embedding = nn.Embedding(cfg.n_embed, cfg.embed_dim)
        self.post_quant_conv = nn.Conv2d(cfg.embed_dim, cfg.z_channels, 1)
        self.decoder = ChameleonDecoder(cfg)

    @property
    def codebook(self) -> torch.Tensor:
        """(n_embed, embed_dim) the code vectors as decoding uses them: the stored rows as they are (LlamaGen's VQ-16
        normalises its rows; `VectorQuantizer2.get_codebook_entry` does not)."""
        return self.quantize.embedding.weight

    def forward(self, codes: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
        B, (h, w) = codes.shape[0], grid
        z = self.codebook[codes].reshape(B, h, w, -1).permute(0, 3, 1, 2).contiguous()  # (B, D, h, w), row-major codes
        image = self.decoder(self.post_quant_conv(z))  # (B, 3, h * downsample, w * downsample)
        return image.clamp(-1.0, 1.0)  # as `_pil_from_chw_tensor` clamps before the 8-bit conversion


def load_vqgan_state(model: ChameleonVQGAN, official: dict[str, torch.Tensor]) -> ChameleonVQGAN:
    """Load the decoding half of the official state dict strictly, dropping only `UNUSED_PREFIXES`: a missing or other
    unexpected key raises `load_state_dict`'s RuntimeError. Its tensors are taken as they are (`assign`), so `model`
    may be built on the meta device."""
    kept = {k: v for k, v in official.items() if not k.startswith(UNUSED_PREFIXES)}
    model.load_state_dict(kept, strict=True, assign=True)
    return model
