"""Image datasets that ship with installed packages (no download), with class captions for text conditioning."""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from bench.errors import UserError

NUMBER_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
DIGIT_TEMPLATES = ("a handwritten {}", "the digit {}", "a drawing of the number {}", "a {} written by hand")


@dataclass(frozen=True)
class ImageDataset:
    name: str
    split: str
    images: torch.Tensor  # (N, 1, H, W) float in [0, 1]
    labels: torch.Tensor  # (N,) long
    class_names: tuple[str, ...]
    templates: tuple[str, ...]  # caption templates, "{}" is replaced by the class name

    def caption(self, label: int, template: int) -> str:
        return self.templates[template].format(self.class_names[label])


def _digits(split: str, size: int) -> ImageDataset:
    from sklearn.datasets import load_digits

    d = load_digits()
    images = torch.tensor(d.images, dtype=torch.float32).unsqueeze(1) / 16.0  # (1797, 1, 8, 8)
    if size != 8:
        images = F.interpolate(images, size=(size, size), mode="bilinear", align_corners=False).clamp(0, 1)
    labels = torch.tensor(d.target, dtype=torch.long)
    # A fixed permutation, so the split never depends on the trial seed: 80 % train, 20 % test.
    perm = torch.randperm(len(labels), generator=torch.Generator().manual_seed(0))
    cut = int(0.8 * len(labels))
    idx = perm[:cut] if split == "train" else perm[cut:]
    return ImageDataset("digits", split, images[idx], labels[idx], NUMBER_WORDS, DIGIT_TEMPLATES)


_LOADERS = {"digits": _digits}
SPLITS = ("train", "test")


def load_image_dataset(name: str, split: str, size: int) -> ImageDataset:
    if name not in _LOADERS:
        raise UserError(f"unknown dataset {name!r}; valid: {', '.join(sorted(_LOADERS))}")
    if split not in SPLITS:
        raise UserError(f"unknown split {split!r}; valid: {', '.join(SPLITS)}")
    return _LOADERS[name](split, size)
