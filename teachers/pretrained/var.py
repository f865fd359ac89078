"""VAR's class-to-image models (Tian et al. 2024, arXiv:2404.02905; FoundationVision/VAR), DD's VAR teachers
(arXiv:2412.17153 §5), loaded from local files as registered multi-scale VQ teachers `var-d16` ... `var-d30`
(`ar`: the 10-scale sampler).

Files, in the checkpoints folder (`--checkpoints`, $ACCELBENCH_CHECKPOINTS; docs/checkpoints.md, 'VAR'), by the names of
VAR's README: the transformer `var_d16.pth` ... `var_d30.pth` and the VQ-VAE `vae_ch160v4096z32.pth`, raw state
dicts. Both load strictly (the transformer's buffers `lvl_1L`, `attn_bias_for_masking`, `zero_k_bias` included); of
the VQ-VAE only the encoder and `quant_conv`, which decoding never reads, are dropped, by name. 256 px: 10 scales
(1 ... 16), 680 tokens, 4096 codes; 1000 ImageNet classes, the null class 1000.
"""
from __future__ import annotations

import dataclasses
from typing import ClassVar

import torch

from core.cache import Cache
from core.errors import UserError
from core.rng import seeded
from teachers.data.images import imagenet_class_names
from teachers.families import multiscale_vq
from teachers.networks.msvq import MSVQConfig, MultiScaleVQ, load_decoder_state
from teachers.networks.var import VAR, VARConfig
from core.checkpoints import mismatch, read_state_dict
from teachers.pretrained.local import LocalFilesTeacher

VAE_FILE = "vae_ch160v4096z32.pth"
VERSION = 1  # bump when a change alters what the same files give


class VARC2I(LocalFilesTeacher, multiscale_vq.NetworkTeacher):
    """A VAR transformer at 256 px and the multi-scale VQ-VAE; 1000 ImageNet classes. A subclass names the depth."""

    family: ClassVar = multiscale_vq.FAMILY
    modality: ClassVar[str] = "image"
    supports_cfg: ClassVar[bool] = True  # trained with class dropout 0.1
    depth: ClassVar[int]  # 16, 20, 24 or 30: the transformer's file is var_d{depth}.pth
    vae_file: ClassVar[str] = VAE_FILE
    reference_statistics: ClassVar[tuple[str, str]] = ("VIRTUAL_imagenet256_labeled.npz", "adm-in256")

    def __init__(self, name: str, network: VAR, vq: MultiScaleVQ, info: dict):
        self.name, self.info = name, info
        self.network, self.vq = network.eval().requires_grad_(False), vq.eval().requires_grad_(False)
        c = network.cfg
        self.patch_nums, self.seq_len, self.vocab_size = c.patch_nums, c.L, c.vocab_size
        self.n_classes = c.num_classes

    @classmethod
    def config(cls) -> VARConfig:
        return VARConfig(depth=cls.depth)

    @classmethod
    def vq_config(cls) -> MSVQConfig:
        return MSVQConfig()

    @classmethod
    def local_files(cls) -> tuple[str, ...]:
        """The transformer, then the VQ-VAE."""
        return f"var_d{cls.depth}.pth", cls.vae_file

    @classmethod
    def hint(cls) -> str:
        return f"var_d{cls.depth}.pth and {cls.vae_file} (FoundationVision/VAR, README)"

    @classmethod
    def key_parts(cls) -> tuple:
        return "var-c2i", dataclasses.asdict(cls.config()), dataclasses.asdict(cls.vq_config()), VERSION

    @classmethod
    def load(cls, name: str, *, cache: Cache, device: torch.device) -> "VARC2I":
        cls.require_files()
        var_file, vae_file = cls.files()
        with torch.device("meta"):  # no random init of weights the files replace
            vq = MultiScaleVQ(cls.vq_config())
        try:
            network = VAR.from_state_dict(cls.config(), read_state_dict(var_file, ()))
            load_decoder_state(vq, read_state_dict(vae_file, ()))
        except RuntimeError as exc:
            raise UserError(f"{name}: {var_file.name} or {vae_file.name} does not fit VAR-d{cls.depth}: "
                            f"{mismatch(exc)}") from None
        info = {"n_params": sum(p.numel() for p in network.parameters())}
        return cls(name, network.to(device), vq.to(device), info)

    @classmethod
    def random(cls, name: str, device: torch.device) -> "VARC2I":
        """The transformer and the multi-scale VQ-VAE (its quantiser's residual convolutions run between scales) at
        full size with seeded random weights, no file read: the cost mode's (`bench.cost`)."""
        with seeded(0), torch.device(device):
            network, vq = VAR(cls.config()), MultiScaleVQ(cls.vq_config())
        return cls(name, network, vq, {"n_params": sum(p.numel() for p in network.parameters())})

    # ---- the MultiScaleTeacher protocol (start, next_scale, decode: `multiscale_vq.NetworkTeacher`) ------------
    def conditions(self, n: int, generator: torch.Generator) -> torch.Tensor:
        """n uniformly drawn class ids, (n, 1), on the generator's device."""
        return torch.randint(self.n_classes, (n, 1), generator=generator, device=generator.device)

    def captions(self, cond: torch.Tensor) -> list[str]:
        names = imagenet_class_names()
        return [names[c] for c in cond[:, 0].tolist()]


class VARd16(VARC2I):
    """VAR-d16 (310 M) at 256 px: 10 scales, 680 tokens of 4096 codes, the multi-scale VQ-VAE; 1000 ImageNet classes."""

    depth = 16


class VARd20(VARC2I):
    """VAR-d20 (601 M) at 256 px: 10 scales, 680 tokens of 4096 codes, the multi-scale VQ-VAE; 1000 ImageNet classes."""

    depth = 20


class VARd24(VARC2I):
    """VAR-d24 (1.03 B) at 256 px: 10 scales, 680 tokens of 4096 codes, the multi-scale VQ-VAE; 1000 ImageNet
    classes."""

    depth = 24


class VARd30(VARC2I):
    """VAR-d30 (2.01 B) at 256 px: 10 scales, 680 tokens of 4096 codes, the multi-scale VQ-VAE; 1000 ImageNet
    classes."""

    depth = 30
