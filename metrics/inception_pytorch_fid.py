"""pytorch-fid's Inception-v3 as an offline image feature extractor (`fid@pytorch-fid`, key "fid.pytorch-fid.<tag>"):
FID as the SJD and DD releases computed it, by the `pytorch-fid` package itself (0.3.0, pinned in pyproject.toml).

Both releases call pytorch-fid's network on PNG files the sampler wrote, against a reference of their own:
- SJD (tyshiwo1/Accelerating-T2I-AR-with-SJD b389cfb; pytorch-fid==0.3.0 in environment.yaml:66):
  evaluation_metrics.py:185-191 `calculate_fid_given_paths([real_image_path, fake_image_path], 1, device, dims=2048,
  num_workers=0)`, the real side the raw COCO `val2017/` folder (the teacher's `reference_images`).
- DD (microsoft/distilled_decoding 3b95d33): LlamaGen/evaluations/fid_score.py, a copy of pytorch-fid's script that
  imports the package's network (:53 `from pytorch_fid.inception import InceptionV3`, :323 `InceptionV3([block_idx])`,
  dims 2048) and reads the reference side from the authors' statistic file (:280-283; `metrics.features.
  NAMED_REFERENCES["dd-in256"]`), called by VAR/sample.py:115-125, VAR/combine_sample.py:155-165 (VAR's scripts import
  it as `evaluation.fid_score`), LlamaGen/autoregressive/sample/eval_fewstep.py:140-153 and eval_combine_sample.py:
  208-221.
The preprocessing, each step theirs:
- 8-bit images: the samplers save PNGs (DD: torchvision `save_image`, x * 255 + 0.5 clamped and cast, VAR/sample.py:
  110, combine_sample.py:150, eval_fewstep.py:136, eval_combine_sample.py:204; SJD: the pipelines' PIL images,
  dataset_tools/multi_gpu_infer_with_prompt.py:61-62), which pytorch-fid reads with PIL as RGB and `ToTensor`
  (fid_score.py:87, :121; DD's :85, :138): uint8 / 255. Ours: `inception.to_uint8` (round to nearest) / 255. For DD
  that is `save_image`'s rounding, the same levels but for exact ties (half to even, where it rounds half up). SJD's
  pipelines do not round: each truncates its own mapping to 8 bits (Lumina-mGPT's (x + 1) / 2 * 255, Anole's
  transformers postprocessing, LlamaGen-T2I's min/max stretch), and the teachers' `decode` gives those levels / 255
  (teachers/pretrained/chameleon.py, llamagen_t2i.py), which the rounding returns byte for byte
  (tests/test_release_pixels.py, tests/test_real_llamagen_t2i.py).
- torch's bilinear resize to 299x299 of those [0, 1] floats, `F.interpolate(x, size=(299, 299), mode="bilinear",
  align_corners=False)` (half-pixel centres), then 2x - 1: pytorch-fid inception.py:146-153 (`resize_input=True`,
  `normalize_input=True`, the defaults both releases keep). This is not ADM's protocol (`metrics.inception`: the TF
  1.x resize of the graph, no half-pixel centres, and (x - 128) / 128): same weights, other pixels, other features.
- pytorch-fid's FID Inception (`fid_inception_v3`, the TF 2015-12-05 graph ported, inception.py:197-221), pool3
  (2048), from its own class `InceptionV3([3])`; its output (B, 2048, 1, 1) squeezed as fid_score.py:143.
- Statistics `np.mean(act, axis=0)`, `np.cov(act, rowvar=False)` of the float64 activations (fid_score.py:128, :229-
  230; DD's :257-258 on float32 ones), and the distance the package's own `calculate_frechet_distance(mu1, sigma1,
  mu2, sigma2)` (fid_score.py:152-206; DD's copy :180-234), the reference first, as both releases order it.

The weights: pytorch-fid downloads `pt_inception-2015-12-05-6726825d.pth` (its release "fid_weights") through
torch.hub when its network is built. Here the file comes from the checkpoints folder or `ACCELBENCH_PYTORCH_FID_WEIGHTS`
and nothing downloads: the package's `InceptionV3` is built with torch.hub pointed at a private folder that holds that
file under its official name, the one place torch.hub looks before it would download (`_network`).
"""
from __future__ import annotations

import tempfile
import warnings
from pathlib import Path

import torch
import torch.nn as nn

from core.checkpoints import mismatch, read_state_dict
from core.errors import UserError
from metrics.inception import file_fingerprint, local_weights, to_uint8

ENV = "ACCELBENCH_PYTORCH_FID_WEIGHTS"
WEIGHTS = "pt_inception-2015-12-05-6726825d.pth"  # the basename of pytorch_fid.inception.FID_WEIGHTS_URL
NAME = "pytorch-fid"  # the network and the protocol (torch's resize of 8-bit images): part of every metric key
POOL3 = 2048
PREPROCESSING = ("uint8 (rounded) / 255, grey->RGB, torch bilinear resize to 299 (F.interpolate, align_corners=False, "
                 "pytorch-fid 0.3.0 InceptionV3 resize_input), 2x-1")


def weights_path(checkpoints: Path) -> Path:
    """pytorch-fid's FID Inception weights: `$ACCELBENCH_PYTORCH_FID_WEIGHTS`, else `WEIGHTS` in the checkpoints
    folder. Missing: one line naming the file and the options (in a dry run, listed)."""
    return local_weights(checkpoints, ENV, WEIGHTS, "fid@pytorch-fid reads pytorch-fid's FID Inception weights",
                         "pytorch-fid's release fid_weights")


def _network(path: Path) -> nn.Module:
    """pytorch-fid's own `InceptionV3([3])` (pool3), its weights loaded by its own `fid_inception_v3` from `path`."""
    from pytorch_fid.inception import FID_WEIGHTS_URL, InceptionV3

    assert FID_WEIGHTS_URL.endswith("/" + WEIGHTS), FID_WEIGHTS_URL  # another pytorch-fid: another file name
    # torch.hub unpickles the file without `weights_only`: it is read once with it first, so that a file of other
    # objects than tensors is refused (one line) before that.
    read_state_dict(path, ())
    previous = torch.hub.get_dir()
    # fork_rng: torchvision's Inception draws its (then overwritten) initial weights from the global generator.
    with tempfile.TemporaryDirectory() as hub, torch.random.fork_rng(devices=[]):
        cached = Path(hub) / "checkpoints" / WEIGHTS
        cached.parent.mkdir()
        cached.symlink_to(path.resolve())
        torch.hub.set_dir(hub)
        try:
            return InceptionV3([InceptionV3.BLOCK_INDEX_BY_DIM[POOL3]])
        except RuntimeError as exc:  # its strict load_state_dict: keys or shapes of another network
            raise UserError(f"{path}: not pytorch-fid's FID Inception weights ({mismatch(exc)}); fid@pytorch-fid "
                            f"reads {WEIGHTS} (checkpoints folder or {ENV})") from None
        finally:
            torch.hub.set_dir(previous)


class PytorchFidExtractor(nn.Module):
    """Pool3 features (B, 2048) of float images (B, C, H, W) in [0, 1], by pytorch-fid's network and preprocessing:
    `to_uint8` / 255 (the PNGs the releases read back), then the package's own forward (torch bilinear resize to 299,
    2x - 1, pool3)."""

    name = NAME
    num_features = POOL3
    num_classes = None  # pytorch-fid's network ends at pool3
    batch = 32  # images per forward pass: a 299x299 batch of 32 holds ~1 GB of activations
    max_reference = 2000  # real images of a tiny teacher's split (a real teacher names its reference)
    preprocessing = PREPROCESSING

    def __init__(self, path: Path):
        super().__init__()
        self.net = _network(path).eval()
        self.fingerprint = file_fingerprint(path)

    @torch.no_grad()
    def features(self, images: torch.Tensor) -> torch.Tensor:
        x = to_uint8(images).float() / 255  # what ToTensor makes of the 8-bit PNG
        return self.net(x)[0][:, :, 0, 0]  # (B, 2048, 1, 1) -> (B, 2048)


def load_pytorch_fid(device: torch.device, checkpoints: Path) -> PytorchFidExtractor:
    return PytorchFidExtractor(weights_path(checkpoints)).to(device)


def frechet_distance(reference: dict, generated: dict) -> float:
    """pytorch-fid's `calculate_frechet_distance` of two statistics {"mu", "sigma"}, the reference first (SJD's
    [real, fake]; DD's (statistic, samples))."""
    from pytorch_fid.fid_score import calculate_frechet_distance

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The `disp` argument is deprecated")  # its call, scipy >= 1.16
        return float(calculate_frechet_distance(reference["mu"], reference["sigma"], generated["mu"],
                                                generated["sigma"]))
