"""Image feature extractors for FID / KID / IS / precision / recall, and cached real-data reference features.

Three extractors, chosen per metric with "name@extractor" (e.g. `fid@inception`):
- `cnn` (default): the small classifier trained on the teacher's dataset (`metrics.extractors`), seconds on CPU;
- `inception`: the standard FID Inception-v3 from a local TorchScript file (`metrics.inception`), slow on CPU; for
  class logits (`is@inception`), the same network with its classifier, through torch-fidelity. Both read the images
  as ADM's evaluator and torch-fidelity do (8 bits, TF 1.x bilinear resize to 299), and are named for it in the keys
  (`inception-v3-tf1`);
- `pytorch-fid`: the same Inception weights as pytorch-fid ships and runs them, torch's bilinear resize included
  (`metrics.inception_pytorch_fid`): FID as the SJD and DD releases computed it (keys `pytorch-fid`).

The reference side (features of the real test split) is cached on disk, clean-fid style, keyed by dataset, split,
image size, extractor (and its weights), preprocessing and the number of images, so a sweep computes it once. A
teacher of a real checkpoint names its reference instead: a file of statistics (`reference_statistics`, ADM's), or a
folder of real images (`reference_images`, COCO's `val2017/`) whose statistics are computed once and cached
(`folder_statistics`). A FID spec may name another file of statistics after its extractor, a paper's own
(`NAMED_REFERENCES`: "fid@pytorch-fid:dd-in256").
Metrics hand features, never images, to torchmetrics through `Features`, so each image passes the extractor once.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
import torch.nn as nn

from core.cache import Cache, config_key, file_key
from core.checkpoints import torch_load_errors
from core.errors import UserError
from teachers.data.images import load_image_dataset

CHOICES = ("cnn", "inception", "pytorch-fid")
INCEPTIONS = ("inception", "pytorch-fid")  # the standard network: what a teacher without a dataset is scored with
REFERENCE_SPLIT = "test"
REFERENCE_BATCH = "arr_0"  # the images of an ADM reference batch
REFERENCE_VERSION = 1  # bump when the way reference features are computed changes
# Image files of a reference folder, by suffix (any case): pytorch-fid 0.3.0's IMAGE_EXTENSIONS (fid_score.py:73)
IMAGE_SUFFIXES = (".bmp", ".jpeg", ".jpg", ".pgm", ".png", ".ppm", ".tif", ".tiff", ".webp")


@dataclass(frozen=True)
class NamedReference:
    """A file of reference statistics a paper's release compares with, named in a FID spec (`fid@<extractor>:<tag>`)
    in place of the teacher's own reference; the key ends in the tag."""

    file: str  # under the checkpoints folder
    extractor: str  # the protocol that computed the statistics: the only extractor they may be compared in
    source: str


NAMED_REFERENCES = {
    # DD's ImageNet-256 statistic (`--fid_statistic DIR` holding statistic.pth; VAR/README.md:22, LlamaGen/README.md:21,
    # placed under the checkpoints folder by its path in the Hugging Face repository microsoft/distilled_decoding).
    "dd-in256": NamedReference("ImageNet-256_FID_Statistic/statistic.pth", "pytorch-fid",
                               "DD's own ImageNet-256 FID statistic (microsoft/distilled_decoding)"),
}


class ImageExtractor(Protocol):
    name: str  # appears in every metric key, e.g. "fid.digits-cnn"
    num_features: int
    num_classes: int | None  # None: no `logits` method (no inception score)
    batch: int  # images per forward pass
    max_reference: int | None  # cap on reference images (None: the whole split)
    preprocessing: str  # how [0, 1] images are turned into the network's input; part of the reference key
    fingerprint: str  # identity of the weights; part of the reference key

    def features(self, images: torch.Tensor) -> torch.Tensor: ...


def split_option(metric: str, extractor: str | None) -> tuple[str | None, str | None]:
    """The extractor choice and the option written after it: "inception:adm-splits" -> ("inception", "adm-splits"),
    "inception" -> ("inception", None); a ':' with nothing on one side is one `UserError`."""
    if extractor is None:
        return None, None
    choice, colon, option = extractor.partition(":")
    if colon and not (choice and option):
        raise UserError(f"metric '{metric}@{extractor}': write the extractor and the option around ':', e.g. "
                        f"{metric}@inception:<option>")
    return choice, option or None


def check_choice(metric: str, choice: str | None, *, logits: bool, checkpoints: Path) -> None:
    """Validate "metric@choice" before any work; the Inception weights must then be on disk."""
    from metrics import inception_pytorch_fid
    from metrics.inception import logits_weights_path, weights_path

    if choice is None or choice == "cnn":
        return
    if choice not in CHOICES:
        raise UserError(f"metric {metric!r}: unknown extractor {choice!r}; valid: {', '.join(CHOICES)}")
    if choice == "pytorch-fid":
        if logits:
            raise UserError(f"metric {metric!r} reads class logits; pytorch-fid's network ends at pool3: use "
                            f"{metric}@inception")
        inception_pytorch_fid.weights_path(checkpoints)
    elif logits:
        logits_weights_path(checkpoints)
    else:
        weights_path()


def load_extractor(choice: str | None, teacher: Any, *, cache: Cache, device: torch.device, checkpoints: Path,
                   logits: bool = False) -> ImageExtractor:
    """The extractor `choice`; with `logits`, one that also gives class logits (torch-fidelity's Inception)."""
    from metrics.extractors import load_classifier
    from metrics.inception import load_inception, load_inception_logits
    from metrics.inception_pytorch_fid import load_pytorch_fid

    if choice == "inception":
        return load_inception_logits(device, checkpoints) if logits else load_inception(device)
    if choice == "pytorch-fid":
        return load_pytorch_fid(device, checkpoints)
    return load_classifier(teacher.dataset_name, teacher.image_size, cache=cache, device=device)


@torch.no_grad()
def embed(extractor: ImageExtractor, images: torch.Tensor, *, device: torch.device,
          logits: bool = False) -> torch.Tensor:
    """Features (N, D), or logits (N, K), of images (N, C, H, W) in [0, 1], a batch at a time, on the CPU."""
    fn = extractor.logits if logits else extractor.features
    return torch.cat([fn(b.to(device)).float().cpu() for b in images.split(extractor.batch)])


def reference_features(extractor: ImageExtractor, teacher: Any, *, cache: Cache, device: torch.device,
                       checkpoints: Path) -> torch.Tensor:
    """Features (n, D) of the real reference split: from the cache, or computed and cached on first use.

    The key holds the cap on the image count, not the count itself, so a cache hit never loads the split. A teacher
    of a real checkpoint has no split here: its reference is the batch of images in its reference-statistics file
    (`reference_batch_features`).
    """
    stats = getattr(teacher, "reference_statistics", None)
    if stats is not None:
        return reference_batch_features(extractor, checkpoints / stats[0], cache=cache, device=device)
    recipe = {"dataset": teacher.dataset_name, "split": REFERENCE_SPLIT, "image_size": teacher.image_size,
              "extractor": extractor.name, "weights": extractor.fingerprint,
              "preprocessing": extractor.preprocessing, "max_images": extractor.max_reference}

    def build() -> torch.Tensor:
        images = load_image_dataset(teacher.dataset_name, REFERENCE_SPLIT, teacher.image_size).images
        # The first n of a fixed permutation: a capped reference is still a class-balanced sample of the split.
        idx = torch.randperm(len(images), generator=torch.Generator().manual_seed(0))[:extractor.max_reference]
        return embed(extractor, images[idx], device=device)

    feats, _ = cache.get_or_build("reference", config_key(recipe, REFERENCE_VERSION), build)
    return feats


def reference_batch_features(extractor: ImageExtractor, path: Path, *, cache: Cache,
                             device: torch.device) -> torch.Tensor:
    """Features (n, D) of the images `arr_0` (n, H, W, 3) uint8 of a reference batch: ADM's evaluation files
    (`VIRTUAL_imagenet256_labeled.npz`: 10,000 ImageNet images beside `mu` and `sigma`), all of them, as ADM's
    evaluator scores precision and recall against the whole batch. Cached under the file's identity."""
    recipe = {"file": file_key(path), "extractor": extractor.name, "weights": extractor.fingerprint,
              "preprocessing": extractor.preprocessing}

    def build() -> torch.Tensor:
        images = read_npz(path, REFERENCE_BATCH)[REFERENCE_BATCH]
        return torch.cat([embed(extractor, torch.from_numpy(images[i : i + 1000]).permute(0, 3, 1, 2).float() / 255,
                                device=device) for i in range(0, len(images), 1000)])

    feats, _ = cache.get_or_build("reference", config_key(recipe, REFERENCE_VERSION), build)
    return feats


def reference_statistics(extractor: ImageExtractor, teacher: Any, *, cache: Cache, device: torch.device,
                         checkpoints: Path, named: str | None = None) -> dict[str, np.ndarray] | None:
    """The statistics {"mu": (D,), "sigma": (D, D)} float64 of the reference: the file of `NAMED_REFERENCES[named]`,
    else the ones a teacher of a real checkpoint names: the file of `reference_statistics`, or those of the images of
    the folder `reference_images` (`folder_statistics`); None for a teacher without either (its reference is the real
    split's features)."""
    if named is not None:
        return read_statistics(checkpoints / NAMED_REFERENCES[named].file)
    stats = getattr(teacher, "reference_statistics", None)
    if stats is not None:
        return read_statistics(checkpoints / stats[0])
    folder = getattr(teacher, "reference_images", None)
    if folder is not None:
        return folder_statistics(extractor, checkpoints / folder[0], cache=cache, device=device)
    return None


def image_files(folder: Path) -> list[Path]:
    """The image files (`IMAGE_SUFFIXES`) of a folder, sorted by name; none when it is not a folder."""
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file())


def read_image(path: Path) -> torch.Tensor:
    """(1, 3, H, W) float in [0, 1] of an image file, decoded by PIL and converted to RGB (COCO holds grey images), as
    pytorch-fid reads it (fid_score.py:87); on the 8-bit grid, so the extractor's `to_uint8` keeps it as it is."""
    from PIL import Image

    with Image.open(path) as im:
        pixels = torch.from_numpy(np.array(im.convert("RGB")))  # (H, W, 3) uint8
    return pixels.permute(2, 0, 1)[None].float() / 255


def folder_statistics(extractor: ImageExtractor, folder: Path, *, cache: Cache,
                      device: torch.device) -> dict[str, np.ndarray]:
    """torch-fidelity's statistics (`fid_features_to_statistics`: `np.mean`, `np.cov` of the float64 features, which are
    pytorch-fid's too, fid_score.py:229-230) of the features of every image of `folder` (`image_files`), one image a
    pass (they differ in size; each is resized to the extractor's input as it
    is). Cached under the files' identities (`file_key`: path, size, modification time) and the extractor, so a
    second trial reads them back and a changed folder is computed again."""
    from torch_fidelity.metric_fid import fid_features_to_statistics

    paths = image_files(folder)
    recipe = {"files": [file_key(p) for p in paths], "extractor": extractor.name, "weights": extractor.fingerprint,
              "preprocessing": extractor.preprocessing}

    def build() -> dict[str, np.ndarray]:
        feats = torch.cat([embed(extractor, read_image(p), device=device) for p in paths])
        return fid_features_to_statistics(feats.double())

    stats, _ = cache.get_or_build("reference", config_key(recipe, REFERENCE_VERSION), build)
    return stats


def _open_npz(path: Path):
    """The archive of an .npz file the user provides; damaged, cut short or a single .npy is one `UserError`."""
    import zipfile

    try:
        f = np.load(path)
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        why = (str(exc).split(". ")[0].strip() or "the file ends early")[:200]
        raise UserError(f"{path}: not an .npz archive, or a damaged or truncated one ({why})") from None
    if not isinstance(f, np.lib.npyio.NpzFile):
        raise UserError(f"{path}: holds a single array (.npy), not an .npz archive of named arrays")
    return f


def npz_members(path: Path) -> list[str]:
    """The array names of an .npz file (reads the archive's index only): a reference file checked at plan time."""
    with _open_npz(path) as f:
        return list(f.files)


def read_npz(path: Path, *names: str) -> dict[str, np.ndarray]:
    """The arrays `names` of an .npz file the user provides (ADM's reference batches and statistics); a damaged file,
    or one without them, is one `UserError` naming it."""
    import zipfile
    import zlib

    with _open_npz(path) as f:
        missing = [n for n in names if n not in f.files]
        if missing:
            raise UserError(f"{path}: no array {missing[0]!r}; it holds {', '.join(f.files) or 'none'}")
        try:
            return {n: f[n] for n in names}
        except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error) as exc:
            raise UserError(f"{path}: cannot read its arrays, damaged, truncated or of objects ({str(exc)[:200]})") \
                from None


def _numpy_globals() -> list:
    """What unpickling numpy arrays takes besides containers, allowed to `torch.load(weights_only=True)`: the array
    rebuilder under numpy 2's module path and numpy 1.x's (`numpy.core`, which DD's file may name), arrays, dtypes."""
    rebuild = np._core.multiarray._reconstruct
    return [rebuild, (rebuild, "numpy.core.multiarray._reconstruct"), np.ndarray, np.dtype,
            *(type(np.dtype(t)) for t in ("float16", "float32", "float64"))]


def read_statistics(path: Path) -> dict[str, np.ndarray]:
    """{"mu": (D,), "sigma": (D, D)} float64 of a file of reference statistics the user provides: an .npz with `mu`
    and `sigma` (ADM's reference batches; clean-fid's), or a .pth as DD's fid_score.py writes it (:302
    `torch.save({"m": m, "s": s})` of numpy arrays) and reads it back (:280-283 `act["m"]`, `act["s"]`). A damaged
    file, or one of another layout: one `UserError` naming it."""
    if path.suffix != ".pth":
        stats = read_npz(path, "mu", "sigma")
    else:
        with torch_load_errors(path), torch.serialization.safe_globals(_numpy_globals()):
            blob = torch.load(path, map_location="cpu", weights_only=True)
        if not isinstance(blob, dict) or not {"m", "s"} <= blob.keys():
            held = ", ".join(map(repr, blob)) if isinstance(blob, dict) else type(blob).__name__
            raise UserError(f"{path}: not a statistic file of DD's fid_score.py (a dict of the mean 'm' and the "
                            f"covariance 's'); it holds {held or 'nothing'}")
        stats = {"mu": np.asarray(blob["m"]), "sigma": np.asarray(blob["s"])}  # numpy arrays, or CPU tensors
    mu, sigma = stats["mu"].astype(np.float64), stats["sigma"].astype(np.float64)
    if mu.ndim != 1 or sigma.shape != (len(mu), len(mu)):
        raise UserError(f"{path}: a mean {mu.shape} and a covariance {sigma.shape} that do not go together")
    return {"mu": mu, "sigma": sigma}


class Features(nn.Module):
    """The `feature=` module of torchmetrics' FID / KID / IS when it is given features rather than images.

    torchmetrics 1.9.0 calls the module on whatever `update` receives and reads the dimension from `num_features`.
    Float64, because torchmetrics casts the final value back to the features' dtype.
    """

    def __init__(self, num_features: int):
        super().__init__()
        self.num_features = num_features

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return features.double()
