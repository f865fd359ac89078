"""MAR's class-to-image models (Li et al., arXiv:2406.11838; LTH14/mar), CSpD's teachers (arXiv:2411.11925, §4.1):
registered masked-family teachers `mar-h` (MAR-H verifying MAR-B, the paper's main pair) and `mar-l` (MAR-L verifying
MAR-B), loaded from local files (`mar`: MAR's own sampler with the target).

Files, in the checkpoints folder (`--checkpoints`, $ACCELBENCH_CHECKPOINTS) laid out as MAR's `pretrained_models/`
(docs/checkpoints.md, 'MAR'): `mar/mar_huge/checkpoint-last.pth`, `mar/mar_large/...`, `mar/mar_base/...` and
`vae/kl16.ckpt`. A MAR checkpoint is a training checkpoint; its EMA weights (`model_ema`, what MAR evaluates and its
demo loads) load strictly, the DiffLoss's depth and width read from them (not implied by the model's name). Of the
VAE only the encoder and `quant_conv` are dropped, by name. 256 px: 256 tokens of 16 dims, 1000 ImageNet classes.

MAR evaluates with 100 head steps, no noise on the last one, cfg 2.9 / 3.0 / 3.2 (B / L / H) on a linear schedule:
`--param steps=100 final_noise=false cfg=3.2`; the family's defaults (20 steps, a sampled last step) are what CSpD's
`exact` mode needs.
"""
from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import ClassVar

import torch

from core.cache import Cache
from core.errors import UserError
from core.rng import seeded
from teachers.data.images import imagenet_class_names
from teachers.families import masked_ar
from teachers.networks.kl16 import KL16Config, KL16Decoder, load_decoder_state
from teachers.networks.mar import MAR, MARConfig, official_to_ours
from core.checkpoints import mismatch, read_state_dict
from teachers.pretrained.local import LocalFilesTeacher

VERSION = 1  # bump when a change alters what the same files give
SIZES = {"mar_base": dict(encoder_width=768, encoder_depth=12, encoder_heads=12),
         "mar_large": dict(encoder_width=1024, encoder_depth=16, encoder_heads=16),
         "mar_huge": dict(encoder_width=1280, encoder_depth=20, encoder_heads=16)}  # models/mar.py
# The released DiffLoss heads, (width, depth): LTH14/mar README's evaluation commands (`--diffloss_w`, `--diffloss_d`;
# tests/fixtures/mar/mar_keys.json holds the models built with them). The loader reads them from the files instead.
HEADS = {"mar_base": (1024, 6), "mar_large": (1280, 8), "mar_huge": (1536, 12)}


class MARH(LocalFilesTeacher):
    """MAR-H (942 M) verifying MAR-B (208 M) at 256 px: 256 KL-16 tokens of 16 dims; 1000 ImageNet classes."""

    family: ClassVar = masked_ar.FAMILY
    modality: ClassVar[str] = "image"
    target_model: ClassVar[str] = "mar_huge"
    draft_model: ClassVar[str] = "mar_base"
    reference_statistics: ClassVar[tuple[str, str]] = ("VIRTUAL_imagenet256_labeled.npz", "adm-in256")

    def __init__(self, name: str, target: MAR, draft: MAR, vae: KL16Decoder, info: dict):
        self.name, self.info = name, info
        self.target, self.draft = masked_ar.NetworkModel(target), masked_ar.NetworkModel(draft)
        self.vae = vae.eval().requires_grad_(False)
        side = math.isqrt(target.cfg.seq_len)
        self.seq_len, self.token_dim, self.grid = target.cfg.seq_len, target.cfg.token_dim, (side, side)
        self.n_classes = 1000

    @classmethod
    def config(cls, model: str, head_width: int, head_depth: int) -> MARConfig:
        """The released `mar_base/large/huge` (decoder as wide and deep as the encoder) with a given DiffLoss."""
        size = SIZES[model]
        return MARConfig(**size, decoder_width=size["encoder_width"], decoder_depth=size["encoder_depth"],
                         decoder_heads=size["encoder_heads"], head_width=head_width, head_depth=head_depth)

    @classmethod
    def vae_config(cls) -> KL16Config:
        return KL16Config()

    @classmethod
    def load_network(cls, model: str, path: Path) -> MAR:
        """A MAR from its checkpoint's EMA weights, strictly; the head's size read from the file."""
        state = official_to_ours(read_state_dict(path, ("model_ema",)))
        depth = len({k.split(".")[2] for k in state if k.startswith("head.blocks.")})
        width = state["head.inp.weight"].shape[0] if "head.inp.weight" in state else 0
        with torch.device("meta"):  # no random init of weights the file replaces
            network = MAR(cls.config(model, width, depth))
        network.load_state_dict(state, strict=True, assign=True)
        return network

    @classmethod
    def local_files(cls) -> tuple[str, ...]:
        """The target's checkpoint, the draft's, then the KL-16 VAE: MAR's `pretrained_models/` layout."""
        return (f"mar/{cls.target_model}/checkpoint-last.pth", f"mar/{cls.draft_model}/checkpoint-last.pth",
                "vae/kl16.ckpt")

    @classmethod
    def hint(cls) -> str:
        return (f"the contents of MAR's pretrained_models folder (LTH14/mar, README: mar/{cls.target_model}, "
                f"mar/{cls.draft_model}, vae/kl16.ckpt)")

    @classmethod
    def key_parts(cls) -> tuple:
        return "mar-c2i", cls.target_model, cls.draft_model, dataclasses.asdict(cls.vae_config()), VERSION

    @classmethod
    def load(cls, name: str, *, cache: Cache, device: torch.device) -> "MARH":
        cls.require_files()
        target_file, draft_file, vae_file = cls.files()
        with torch.device("meta"):
            vae = KL16Decoder(cls.vae_config())
        try:
            target = cls.load_network(cls.target_model, target_file)
            draft = cls.load_network(cls.draft_model, draft_file)
            load_decoder_state(vae, read_state_dict(vae_file, ("model",)))
        except (RuntimeError, KeyError) as exc:
            raise UserError(f"{name}: {target_file.name}, {draft_file.name} or {vae_file.name} does not fit "
                            f"{cls.target_model} / {cls.draft_model} / KL-16: "
                            f"{mismatch(exc) if isinstance(exc, RuntimeError) else exc}") from None
        info = {"target_n_params": sum(p.numel() for p in target.parameters()),
                "draft_n_params": sum(p.numel() for p in draft.parameters())}
        return cls(name, target.to(device), draft.to(device), vae.to(device), info)

    @classmethod
    def random(cls, name: str, device: torch.device) -> "MARH":
        """The target, the draft (MAR-B) and the KL-16 decoder at full size with the released heads (`HEADS`) and
        seeded random weights, no file read: the cost mode's (`bench.cost`)."""
        with seeded(0), torch.device(device):
            target, draft = [MAR(cls.config(model, *HEADS[model])) for model in (cls.target_model, cls.draft_model)]
            vae = KL16Decoder(cls.vae_config())
        info = {"target_n_params": sum(p.numel() for p in target.parameters()),
                "draft_n_params": sum(p.numel() for p in draft.parameters())}
        return cls(name, target, draft, vae, info)

    # ---- the MaskedARTeacher protocol -----------------------------------------------------------------------
    def conditions(self, n: int, generator: torch.Generator) -> torch.Tensor:
        """n uniformly drawn class ids, (n, 1), on the generator's device."""
        return torch.randint(self.n_classes, (n, 1), generator=generator, device=generator.device)

    def captions(self, cond: torch.Tensor) -> list[str]:
        names = imagenet_class_names()
        return [names[c] for c in cond[:, 0].tolist()]

    @torch.inference_mode()
    def decode(self, tokens: torch.Tensor) -> torch.Tensor:  # (B, 256, 16) -> (B, 3, 256, 256) in [0, 1]
        return (self.vae(tokens, self.grid) + 1) / 2


class MARL(MARH):
    """MAR-L (478 M) verifying MAR-B (208 M) at 256 px: 256 KL-16 tokens of 16 dims; 1000 ImageNet classes."""

    target_model = "mar_large"
