"""The official DiT checkpoints (Peebles & Xie, arXiv:2212.09748; facebookresearch/DiT), ARD's teacher
(arXiv:2504.11295), loaded into our `teachers.networks.dit.DiT` from local files: the registered teachers
`dit-xl-2-256` and `dit-xl-2-512` of the ODE-diffusion family (DDIM, eta = 0, as ARD samples and distils DiT).

Files, in the folder named by `--checkpoints` or $ACCELBENCH_CHECKPOINTS (default ./checkpoints):
`DiT-XL-2-256x256.pt` or `DiT-XL-2-512x512.pt` as facebookresearch/DiT's download.py fetches them, and the Stable
Diffusion VAE `sd-vae-ft-ema/` (the Hugging Face folder stabilityai/sd-vae-ft-ema: config.json and its weights),
which DiT's FID script (sample_ddp.py) decodes with: `vae.decode(latents / 0.18215)`, through diffusers'
`AutoencoderKL`.

What a checkpoint holds and how it differs from our module is in docs/checkpoints.md: a raw state dict (training
checkpoints wrap it in "ema"/"model" beside an argparse "args"), timm's key names for the patch embedding and the MLP,
`adaLN_modulation` for our `ada`, a (1, L, d) `pos_embed` that is a frozen parameter inside the state dict (ours is a
buffer outside it, recomputed in the official column-first layout and checked against the file), and 8 output
channels (learned sigma). The keys are renamed one to one and loaded strictly, so a file of another architecture or
size fails on its first unknown, missing or mis-shaped key. `tests/test_real_dit.py` holds the parity fixture made
with the official code and the full-size key sets.
"""
from __future__ import annotations

import dataclasses
import re
from typing import ClassVar

import torch

from core.cache import Cache
from core.errors import UserError
from core.rng import seeded
from teachers.data.images import imagenet_class_names
from teachers.families import ode_diffusion
from teachers.networks.dit import DiT, DiTConfig, sincos_2d
from core.checkpoints import from_folder, mismatch, read_config, read_state_dict
from teachers.pretrained.local import LocalFilesTeacher

# DiT-XL/2 (models.py `DiT_XL_2`): depth 28, width 1152, 16 heads, patch 2, on the 4-channel latents of the
# Stable Diffusion VAE (image_size / 8 cells a side), 1000 ImageNet classes (id 1000 is the null class).
XL2 = {"depth": 28, "hidden": 1152, "heads": 16, "patch": 2}
CHECKPOINTS = {256: "DiT-XL-2-256x256.pt", 512: "DiT-XL-2-512x512.pt"}
LATENT_DOWNSAMPLE, LATENT_CHANNELS, N_CLASSES = 8, 4, 1000

# official name -> ours (regexes over whole keys, applied in order; the first that matches renames the key)
RENAMES = [
    (r"x_embedder\.proj\.(weight|bias)", r"x_embedder.\1"),
    (r"y_embedder\.embedding_table\.weight", r"y_embedder.weight"),
    (r"blocks\.(\d+)\.mlp\.fc1\.", r"blocks.\1.mlp.0."),
    (r"blocks\.(\d+)\.mlp\.fc2\.", r"blocks.\1.mlp.2."),
    (r"(blocks\.\d+|final_layer)\.adaLN_modulation\.1\.", r"\1.ada.1."),
]


def xl2_config(image_size: int) -> DiTConfig:
    """The DiT-XL/2 configuration for images of `image_size` pixels (256 or 512 for the released files)."""
    if image_size % (LATENT_DOWNSAMPLE * XL2["patch"]):
        raise UserError(f"DiT-XL/2 needs an image size divisible by {LATENT_DOWNSAMPLE * XL2['patch']}, "
                        f"got {image_size}")
    return DiTConfig(image_size=image_size // LATENT_DOWNSAMPLE, channels=LATENT_CHANNELS, n_classes=N_CLASSES,
                     learn_sigma=True, pos_layout="col-row", **XL2)


def official_name_to_ours(key: str) -> str:
    for pattern, repl in RENAMES:
        new, n = re.subn(f"^{pattern}", repl, key)
        if n:
            return new
    return key


def convert_state_dict(official: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """An official DiT state dict -> (our state dict, the file's position table (L, d))."""
    if "pos_embed" not in official:
        raise UserError("not a DiT state dict: it has no 'pos_embed'")
    ours = {official_name_to_ours(k): v for k, v in official.items() if k != "pos_embed"}
    return ours, official["pos_embed"].reshape(official["pos_embed"].shape[-2:])


def load_into(model: DiT, official: dict[str, torch.Tensor], *, pos_atol: float = 1e-6) -> DiT:
    """Load an official state dict into `model` strictly, taking its tensors as they are (so a model built on the
    meta device gets no random init it would throw away). The file's position table is checked against the one the
    configuration computes (a file whose layout or size differs is refused) and then used as it is."""
    ours, pos = convert_state_dict(official)
    try:
        model.load_state_dict(ours, strict=True, assign=True)
    except RuntimeError as exc:
        raise UserError(f"the DiT state dict does not fit {model.cfg}: {mismatch(exc)}") from None
    c = model.cfg
    expected = sincos_2d(c.hidden, c.image_size // c.patch, c.pos_layout)
    if pos.shape != expected.shape or not torch.allclose(pos.float(), expected, atol=pos_atol):
        raise UserError(f"the DiT state dict's pos_embed {tuple(pos.shape)} is not the {c.pos_layout} sin-cos table "
                        f"of {tuple(expected.shape)} this configuration computes")
    model.pos_embed = pos.float()
    return model


VAE_FOLDER = "sd-vae-ft-ema"  # sample_ddp.py's default (--vae ema), the FID setting; sample.py uses sd-vae-ft-mse
VAE_SCALE = 0.18215  # DiT hard-codes the SD latent scale
VERSION = 1  # bump when a change alters what the same files give


class OfficialDiT(LocalFilesTeacher):
    """DiT-XL/2 at 256 px, facebookresearch/DiT's DiT-XL-2-256x256.pt on SD-VAE latents; 1000 ImageNet classes.

    Classifier-free guidance as the official `forward_with_cfg` does it: on the first 3 of the 4 latent channels of
    eps only (the fourth keeps the conditional eps; docs/checkpoints.md, trap T6). The learned variance half of
    the output is not used: DDIM (eta = 0) needs eps alone."""

    family: ClassVar = ode_diffusion.FAMILY
    modality: ClassVar[str] = "image"
    image_size: ClassVar[int] = 256  # pixels; the network sees image_size / 8 latent cells a side
    checkpoint: ClassVar[str] = CHECKPOINTS[256]
    vae_folder: ClassVar[str] = VAE_FOLDER
    cfg_channels: ClassVar[int] = 3  # eps channels guided (the official code's "for exact reproducibility")
    # FID (fid@inception) against ADM's ImageNet 256 reference batch statistics, as DiT's paper reports it
    reference_statistics: ClassVar[tuple[str, str]] = ("VIRTUAL_imagenet256_labeled.npz", "adm-in256")

    def __init__(self, name: str, network: DiT, vae, info: dict):
        self.name, self.network, self.vae, self.info = name, network.eval().requires_grad_(False), vae, info
        c = network.cfg
        self.image_shape = (c.channels, c.image_size, c.image_size)  # (4, s/8, s/8) latents
        self.n_classes = c.n_classes

    @classmethod
    def config(cls) -> DiTConfig:
        return xl2_config(cls.image_size)

    @classmethod
    def local_files(cls) -> tuple[str, ...]:
        return cls.checkpoint, f"{cls.vae_folder}/config.json"

    @classmethod
    def hint(cls) -> str:
        return (f"{cls.checkpoint} (facebookresearch/DiT download.py) and the {cls.vae_folder} folder "
                f"(stabilityai/{VAE_FOLDER})")

    @classmethod
    def key_parts(cls) -> tuple:
        return "official-dit", dataclasses.asdict(cls.config()), cls.cfg_channels, VERSION

    @classmethod
    def load(cls, name: str, *, cache: Cache, device: torch.device) -> "OfficialDiT":
        from diffusers import AutoencoderKL

        cls.require_files()
        ckpt, vae_dir = cls.root() / cls.checkpoint, cls.root() / cls.vae_folder
        with torch.device("meta"):  # no random init of 675 M weights the file replaces
            network = DiT(cls.config())
        # raw as released, or the EMA weights of a training checkpoint
        network = load_into(network, read_state_dict(ckpt, ("ema", "model")))
        read_config(vae_dir, _class_name="AutoencoderKL")
        vae = from_folder(AutoencoderKL.from_pretrained, vae_dir, local_files_only=True).eval().requires_grad_(False)
        info = {"n_params": sum(p.numel() for p in network.parameters()) + network.pos_embed.numel()}
        return cls(name, network.to(device), vae.to(device), info)

    @classmethod
    def random(cls, name: str, device: torch.device) -> "OfficialDiT":
        """DiT-XL/2 at full size with seeded random weights, no file read and no VAE (the cost mode, `bench.cost`: a
        denoising pass costs what it costs whatever the weights, and ARD's Table 1 times denoising only)."""
        with seeded(0), torch.device(device):
            network = DiT(cls.config())
        return cls(name, network, None, {"n_params": sum(p.numel() for p in network.parameters())})

    # ---- the ODEDiffusionTeacher protocol -------------------------------------------------------------------
    def conditions(self, n: int, generator: torch.Generator) -> torch.Tensor:
        """n uniformly drawn class ids, (n, 1), on the generator's device."""
        return torch.randint(self.n_classes, (n, 1), generator=generator, device=generator.device)

    @torch.inference_mode()
    def eps(self, x, t, cond, *, cfg):  # (B, C, h, w), (B,), (B, 1) -> (B, C, h, w)
        C, y = self.image_shape[0], cond[:, 0]
        if cfg == 1.0:  # the official samplers skip the unconditional half when the scale is 1
            return self.network(x, t, y)[:, :C]
        e_c, e_u = self.network(torch.cat([x, x]), torch.cat([t, t]),
                                torch.cat([y, torch.full_like(y, self.n_classes)]))[:, :C].chunk(2)
        k = self.cfg_channels
        return torch.cat([e_u[:, :k] + cfg * (e_c[:, :k] - e_u[:, :k]), e_c[:, k:]], 1)

    @torch.inference_mode()
    def decode(self, x: torch.Tensor) -> torch.Tensor:  # latents (B, 4, h, w) -> images (B, 3, 8h, 8w) in [0, 1]
        return ((self.vae.decode(x / VAE_SCALE).sample + 1) / 2).clamp(0, 1)

    def captions(self, cond: torch.Tensor) -> list[str]:
        names = imagenet_class_names()
        return [names[c] for c in cond[:, 0].tolist()]


class OfficialDiT512(OfficialDiT):
    """DiT-XL/2 at 512 px, facebookresearch/DiT's DiT-XL-2-512x512.pt on SD-VAE latents; otherwise as dit-xl-2-256."""

    image_size: ClassVar[int] = 512
    checkpoint: ClassVar[str] = CHECKPOINTS[512]
    reference_statistics: ClassVar[tuple[str, str]] = ("VIRTUAL_imagenet512.npz", "adm-in512")
