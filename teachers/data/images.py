"""Image datasets read from local files (no download), with class captions for text conditioning.

`digits` ships with scikit-learn; `fashion-mnist` is read from the IDX files of the Debian package
`dataset-fashion-mnist` (or any directory holding the same four files, named by `ACCELBENCH_FASHION_MNIST`).
"""
from __future__ import annotations

import functools
import gzip
import math
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from core.errors import UserError

NUMBER_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
DIGIT_TEMPLATES = ("a handwritten {}", "the digit {}", "a drawing of the number {}", "a {} written by hand")
# The standard Fashion-MNIST class names (torchvision's `FashionMNIST.classes`), lower-cased for captions.
FASHION_CLASSES = ("t-shirt/top", "trouser", "pullover", "dress", "coat", "sandal", "shirt", "sneaker", "bag",
                   "ankle boot")
# "{a}" is the class name's indefinite article ("an ankle boot").
FASHION_TEMPLATES = ("a photo of {a} {}", "a grayscale photo of {a} {}", "{a} {} on a black background",
                     "a product photo of {a} {}")

FASHION_ENV = "ACCELBENCH_FASHION_MNIST"
FASHION_DIR = "/usr/share/datasets/fashion-mnist"  # where `apt-get install dataset-fashion-mnist` puts it
FASHION_FILES = {"train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
                 "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz")}


@dataclass(frozen=True)
class ImageDataset:
    name: str
    split: str
    images: torch.Tensor  # (N, 1, H, W) float in [0, 1]
    labels: torch.Tensor  # (N,) long
    class_names: tuple[str, ...]
    templates: tuple[str, ...]  # caption templates, "{}" is replaced by the class name and "{a}" by its article

    def caption(self, label: int, template: int) -> str:
        return _caption(self.templates[template], self.class_names[label])


def caption_table(name: str) -> list[list[str]]:
    """Every caption of a dataset, [class][template], without loading its images."""
    class_names, templates = _CAPTIONS[_known(name)]
    return [[_caption(t, c) for t in templates] for c in class_names]


def _caption(template: str, name: str) -> str:
    return template.format(name, a="an" if name[0] in "aeiou" else "a")


def _resize(images: torch.Tensor, size: int) -> torch.Tensor:
    """(N, C, h, w) images in [0, 1] at size x size, bilinearly resampled unless they already are."""
    if images.shape[-1] == size:
        return images
    return F.interpolate(images, size=(size, size), mode="bilinear", align_corners=False).clamp(0, 1)


def to_patches(images: torch.Tensor, patch: int) -> torch.Tensor:
    """(B, 1, H, W) in [0, 1] -> (B, N, p*p) pixel-patch tokens in [-1, 1], raster order (the MAR teachers' tokens)."""
    return F.unfold(images * 2 - 1, kernel_size=patch, stride=patch).transpose(1, 2)


def from_patches(tokens: torch.Tensor, patch: int, size: int) -> torch.Tensor:
    """(B, N, p*p) -> (B, 1, size, size) images in [0, 1], the inverse of `to_patches` (clamped)."""
    return ((F.fold(tokens.transpose(1, 2), (size, size), kernel_size=patch, stride=patch) + 1) / 2).clamp(0, 1)


def _digits(split: str, size: int) -> ImageDataset:
    from sklearn.datasets import load_digits

    d = load_digits()
    images = _resize(torch.tensor(d.images, dtype=torch.float32).unsqueeze(1) / 16.0, size)  # (1797, 1, 8, 8)
    labels = torch.tensor(d.target, dtype=torch.long)
    # A fixed permutation, so the split never depends on the trial seed: 80 % train, 20 % test.
    perm = torch.randperm(len(labels), generator=torch.Generator().manual_seed(0))
    cut = int(0.8 * len(labels))
    idx = perm[:cut] if split == "train" else perm[cut:]
    return ImageDataset("digits", split, images[idx], labels[idx], *_CAPTIONS["digits"])


def _fashion_mnist(split: str, size: int) -> ImageDataset:
    images, labels = _fashion_split(os.environ.get(FASHION_ENV) or FASHION_DIR, split)
    images = _resize(images.unsqueeze(1).float() / 255.0, size)  # a fresh tensor: the cached bytes stay intact
    return ImageDataset("fashion-mnist", split, images, labels.long(), *_CAPTIONS["fashion-mnist"])


@functools.lru_cache(maxsize=4)
def _fashion_split(directory: str, split: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, 28, 28) uint8 images and (N,) uint8 labels, decoded once per process (teachers, classifiers and metrics
    all read the same splits)."""
    paths = [Path(directory) / f for f in FASHION_FILES[split]]
    if not all(p.is_file() for p in paths):
        expected = ", ".join(f for files in FASHION_FILES.values() for f in files)
        raise UserError(f"Fashion-MNIST not found: {directory} must hold {expected}; install the Debian package "
                        f"(apt-get install dataset-fashion-mnist) or set {FASHION_ENV} to such a directory")
    images, labels = _read_idx(paths[0], ndim=3), _read_idx(paths[1], ndim=1)
    if len(images) != len(labels):
        raise UserError(f"Fashion-MNIST in {directory}: {len(images)} {split} images but {len(labels)} labels")
    return images, labels


def _read_idx(path: Path, ndim: int) -> torch.Tensor:
    """A gzipped IDX file of unsigned bytes as a uint8 tensor.

    torchvision's IDX reader (`datasets.mnist.read_sn3_pascalvincent_tensor`) opens only uncompressed files, and
    the Debian package ships them gzipped: decompressing in memory avoids writing 55 MB of copies to disk.
    """
    try:
        data = gzip.decompress(path.read_bytes())
    except (OSError, EOFError) as e:
        raise UserError(f"cannot read {path}: {e}") from None
    header = 4 + 4 * ndim
    # Magic number: two zero bytes, the element type (0x08 = unsigned byte), the number of dimensions.
    if len(data) < header or data[:4] != bytes((0, 0, 8, ndim)):
        raise UserError(f"{path} is not an IDX file of {ndim}-dimensional unsigned bytes")
    shape = struct.unpack(f">{ndim}I", data[4:header])
    if len(data) - header != math.prod(shape):
        raise UserError(f"{path} holds {len(data) - header} bytes of data, its header says {shape}")
    return torch.frombuffer(bytearray(data), dtype=torch.uint8, offset=header).view(shape)


_LOADERS = {"digits": _digits, "fashion-mnist": _fashion_mnist}
_CAPTIONS = {"digits": (NUMBER_WORDS, DIGIT_TEMPLATES),  # (class names, caption templates)
             "fashion-mnist": (FASHION_CLASSES, FASHION_TEMPLATES)}
SPLITS = ("train", "test")


def _known(name: str) -> str:
    if name not in _LOADERS:
        raise UserError(f"unknown dataset {name!r}; valid: {', '.join(sorted(_LOADERS))}")
    return name


def load_image_dataset(name: str, split: str, size: int) -> ImageDataset:
    if split not in SPLITS:
        raise UserError(f"unknown split {split!r}; valid: {', '.join(SPLITS)}")
    return _LOADERS[_known(name)](split, size)


def imagenet_class_names() -> list[str]:
    """The 1000 ImageNet-1k class names in label order (the class conditions of DiT and LlamaGen), from torchvision's
    code: nothing is downloaded."""
    from torchvision.models import ResNet50_Weights

    return ResNet50_Weights.IMAGENET1K_V1.meta["categories"]
