"""LlamaGen's class-to-image models (Sun et al., arXiv:2406.06525; FoundationVision/LlamaGen), the teachers of SJD
(arXiv:2410.01699) and Distilled Decoding (arXiv:2412.17153), loaded from local files as registered AR-token
teachers: `llamagen-b-256` ... `llamagen-3b-384` (`ar`, `jacobi`, `sjd`, `dd`, `onestep*`, `skip-n`).

Files, in the folder named by `--checkpoints` or $ACCELBENCH_CHECKPOINTS (default ./checkpoints), by the names of
LlamaGen's README: the GPT (`c2i_B_256.pt`, ..., `c2i_3B_384.pt`; weights under "model", or a raw state dict for the
FSDP-trained XXL and 3B) and the VQ-16 tokenizer `vq_ds16_c2i.pt` (weights under "model"). The resolution is not in
the file (the 256 and 384 px files have the same shapes): it comes from the registered name (docs/checkpoints.md).
Both load strictly; only a `freqs_cis` entry (a RoPE table some checkpoints carry) and the tokenizer's encoder are
dropped, by name.

Sampling as LlamaGen's `generate`: CFG on raw logits, u + s (c - u), the null class `num_classes`; then temperature,
top-k, top-p and a draw (`ar_token.process`). Its FID script's defaults are cfg 1.5 and top-k 0 (sample_c2i_ddp.py);
the paper's tables use cfg 2.0 (B, L), 1.75 (XL, XXL), 1.65 (3B): set them with `--param cfg=...`.
"""
from __future__ import annotations

import dataclasses
from typing import ClassVar

import torch

from core.cache import Cache
from core.errors import UserError
from core.rng import seeded
from teachers.data.images import imagenet_class_names
from teachers.families import ar_token
from teachers.networks.llamagen import LlamaGenConfig, LlamaGenGPT, size_config
from teachers.networks.vq16 import VQ16Decoder, VQDecoderConfig, load_decoder_state
from core.checkpoints import mismatch, read_state_dict
from teachers.pretrained.local import LocalFilesTeacher

VQ_FILE = "vq_ds16_c2i.pt"
GPT_WRAPPERS = ("model", "module", "state_dict")  # the official sampler's fallback order
DROPPED = ("freqs_cis",)
VERSION = 1  # bump when a change alters what the same files give


class LlamaGenC2I(LocalFilesTeacher, ar_token.GuidedNetworkTeacher):
    """A LlamaGen class-to-image GPT and the VQ-16 decoder; 1000 ImageNet classes. A subclass names the size."""

    family: ClassVar = ar_token.FAMILY
    modality: ClassVar[str] = "image"
    supports_cfg: ClassVar[bool] = True  # trained with class dropout 0.1
    size: ClassVar[str]  # "GPT-B" ... "GPT-3B"
    image_size: ClassVar[int]  # pixels: 16 px a token
    checkpoint: ClassVar[str]  # the GPT's file, by LlamaGen's README
    vq_file: ClassVar[str] = VQ_FILE
    # FID (fid@inception) against ADM's ImageNet 256 statistics. LlamaGen scores its 384 px models after resizing the
    # images to 256; our Inception resizes every image straight to 299 (a protocol difference, named here).
    reference_statistics: ClassVar[tuple[str, str]] = ("VIRTUAL_imagenet256_labeled.npz", "adm-in256")

    def __init__(self, name: str, network: LlamaGenGPT, vq: VQ16Decoder, info: dict):
        self.name, self.info = name, info
        self.network, self.vq = network.eval().requires_grad_(False), vq.eval().requires_grad_(False)
        c = network.cfg
        self.seq_len, self.vocab_size, self.grid = c.seq_len, c.vocab_size, (c.grid, c.grid)
        self.n_classes = self.null_id = c.num_classes  # the null class is the last row of the class table

    @classmethod
    def config(cls) -> LlamaGenConfig:
        return size_config(cls.size, (cls.image_size // VQDecoderConfig().downsample) ** 2)

    @classmethod
    def vq_config(cls) -> VQDecoderConfig:
        return VQDecoderConfig()

    @classmethod
    def local_files(cls) -> tuple[str, ...]:
        """The GPT checkpoint, then the VQ tokenizer."""
        return cls.checkpoint, cls.vq_file

    @classmethod
    def hint(cls) -> str:
        return f"{cls.checkpoint} and {cls.vq_file} (FoundationVision/LlamaGen, README)"

    @classmethod
    def key_parts(cls) -> tuple:
        return "llamagen-c2i", dataclasses.asdict(cls.config()), dataclasses.asdict(cls.vq_config()), VERSION

    @classmethod
    def load(cls, name: str, *, cache: Cache, device: torch.device) -> "LlamaGenC2I":
        cls.require_files()
        network, vq = cls.read_networks(name)
        info = {"n_params": sum(p.numel() for p in network.parameters())}
        return cls(name, network.to(device), vq.to(device), info)

    @classmethod
    def random(cls, name: str, device: torch.device) -> "LlamaGenC2I":
        """The GPT and the VQ-16 decoder (its codebook is DD's) at full size with seeded random weights, no file
        read: the cost mode's (`bench.cost`)."""
        with seeded(0), torch.device(device):
            network, vq = LlamaGenGPT(cls.config()), VQ16Decoder(cls.vq_config())
        return cls(name, network, vq, {"n_params": sum(p.numel() for p in network.parameters())})

    @classmethod
    def read_networks(cls, name: str) -> tuple[LlamaGenGPT, VQ16Decoder]:
        """The GPT and the VQ-16 decoder from the first two of `files()`, strictly, on the CPU: a file that does not
        fit this teacher's configuration is one `UserError`."""
        gpt_file, vq_file = cls.files()[:2]
        state = {k: v for k, v in read_state_dict(gpt_file, GPT_WRAPPERS).items() if k not in DROPPED}
        with torch.device("meta"):  # no random init of weights the files replace
            vq = VQ16Decoder(cls.vq_config())
        try:
            network = LlamaGenGPT.from_state_dict(cls.config(), state)
            load_decoder_state(vq, read_state_dict(vq_file, ("model",)))
        except RuntimeError as exc:
            raise UserError(f"{name}: {gpt_file.name} or {vq_file.name} does not fit {cls.size} at "
                            f"{cls.image_size} px: {mismatch(exc)}") from None
        return network, vq

    # ---- the ARTokenTeacher protocol (start, extend, rollback: `GuidedNetworkTeacher`) ------------------------
    def conditions(self, n: int, generator: torch.Generator) -> torch.Tensor:
        """n uniformly drawn class ids, (n, 1), on the generator's device."""
        return torch.randint(self.n_classes, (n, 1), generator=generator, device=generator.device)

    @property
    def codebook(self) -> torch.Tensor:
        """(K, 8) the code vectors the decoder reads (L2-normalised): DD flows into this space."""
        return self.vq.codebook

    @torch.inference_mode()
    def decode(self, tokens: torch.Tensor) -> torch.Tensor:  # (B, N) codes -> (B, 3, H, W) in [0, 1]
        return ((self.vq(tokens, self.grid) + 1) / 2).clamp(0, 1)

    def captions(self, cond: torch.Tensor) -> list[str]:
        names = imagenet_class_names()
        return [names[c] for c in cond[:, 0].tolist()]


class LlamaGenGPTB256(LlamaGenC2I):
    """LlamaGen GPT-B at 256 px (c2i_B_256.pt, 16 x 16 tokens), VQ-16 decoder; 1000 ImageNet classes."""

    size, image_size, checkpoint = "GPT-B", 256, "c2i_B_256.pt"


class LlamaGenB384(LlamaGenC2I):
    """LlamaGen GPT-B at 384 px (c2i_B_384.pt, 24 x 24 tokens), VQ-16 decoder; 1000 ImageNet classes."""

    size, image_size, checkpoint = "GPT-B", 384, "c2i_B_384.pt"


class LlamaGenL256(LlamaGenC2I):
    """LlamaGen GPT-L at 256 px (c2i_L_256.pt, 16 x 16 tokens), VQ-16 decoder; 1000 ImageNet classes."""

    size, image_size, checkpoint = "GPT-L", 256, "c2i_L_256.pt"


class LlamaGenL384(LlamaGenC2I):
    """LlamaGen GPT-L at 384 px (c2i_L_384.pt, 24 x 24 tokens), VQ-16 decoder; 1000 ImageNet classes."""

    size, image_size, checkpoint = "GPT-L", 384, "c2i_L_384.pt"


class LlamaGenXL384(LlamaGenC2I):
    """LlamaGen GPT-XL at 384 px (c2i_XL_384.pt, 24 x 24 tokens), VQ-16 decoder; 1000 ImageNet classes."""

    size, image_size, checkpoint = "GPT-XL", 384, "c2i_XL_384.pt"


class LlamaGenXXL384(LlamaGenC2I):
    """LlamaGen GPT-XXL at 384 px (c2i_XXL_384.pt, a raw FSDP state dict), VQ-16 decoder; 1000 ImageNet classes."""

    size, image_size, checkpoint = "GPT-XXL", 384, "c2i_XXL_384.pt"


class LlamaGen3B384(LlamaGenC2I):
    """LlamaGen GPT-3B at 384 px (c2i_3B_384.pt, a raw FSDP state dict), VQ-16 decoder; 1000 ImageNet classes."""

    size, image_size, checkpoint = "GPT-3B", 384, "c2i_3B_384.pt"
