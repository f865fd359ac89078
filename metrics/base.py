"""The Metric contract every file in `metrics/` implements (see DESIGN.md, "Core contracts").

torchmetrics-style: a metric is built once per trial (its reference side, e.g. real-image statistics, is computed in
`__init__`), fed generated images with `update`, and read with `compute`. `reset` forgets the generated images only,
so one metric object can score several arms against the same reference.

`ClassifierMetric` and `BufferedClassifierMetric` are the shared plumbing of the image metrics (FID, KID, IS,
precision, recall): the dataset classifier as extractor, the real test split as reference, a buffer of generated images.
"""
from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any, ClassVar

import torch

from bench.cache import Cache
from metrics.extractors import DatasetClassifier, load_classifier
from teachers.datasets import load_image_dataset

BATCH = 256  # images per classifier forward pass (bounds the activations held at once)


class Metric:
    name: ClassVar[str]  # registry name, e.g. "fid"
    higher_is_better: ClassVar[bool]
    extractor: str  # the feature extractor's name; part of every key `compute` returns

    def __init__(self, teacher: Any, *, cache: Cache, device: torch.device):
        """`teacher` gives `dataset_name` and `image_size`; trained extractors are cached in `cache`."""
        self.teacher, self.cache, self.device = teacher, cache, device

    def update(self, images: torch.Tensor, cond: torch.Tensor) -> None:
        """Add generated images (B, C, H, W), float in [0, 1], with the conditions they were sampled for."""
        raise NotImplementedError

    def compute(self) -> dict[str, float]:
        """Metric key -> value. Keys are valid MLflow metric names naming the extractor, e.g. "fid.digits-cnn"."""
        raise NotImplementedError

    def reset(self) -> None:
        """Forget the generated images; keep the reference side."""
        raise NotImplementedError


class ClassifierMetric(Metric):
    """An image metric in the features of the classifier trained on the teacher's dataset (`metrics.extractors`)."""

    classifier: DatasetClassifier

    def __init__(self, teacher: Any, *, cache: Cache, device: torch.device):
        super().__init__(teacher, cache=cache, device=device)
        self.classifier = load_classifier(teacher.dataset_name, teacher.image_size, cache=cache, device=device)
        self.extractor = self.classifier.name

    @functools.cached_property
    def real_images(self) -> torch.Tensor:
        """The whole test split (N, C, H, W), float in [0, 1], on the CPU: the reference side."""
        # Lazy: the inception score has no reference side and should not pay for loading one.
        return load_image_dataset(self.teacher.dataset_name, "test", self.teacher.image_size).images

    def key(self, name: str | None = None) -> str:
        """The metric key "<name>.<extractor>", e.g. "fid.digits-cnn"."""
        return f"{name or self.name}.{self.extractor}"


class BufferedClassifierMetric(ClassifierMetric):
    """A `ClassifierMetric` that keeps the generated images (or what `_keep` makes of them) until `reset`."""

    def __init__(self, teacher: Any, *, cache: Cache, device: torch.device):
        super().__init__(teacher, cache=cache, device=device)
        self._generated: list[torch.Tensor] = []

    def _keep(self, images: torch.Tensor) -> torch.Tensor:
        return images

    def update(self, images: torch.Tensor, cond: torch.Tensor) -> None:
        self._generated.append(self._keep(images.detach().to(self.device)))

    def generated(self) -> torch.Tensor:
        """Everything kept since the last `reset`, concatenated."""
        if not self._generated:
            raise ValueError(f"{self.name}: compute() before any update()")
        return torch.cat(self._generated)

    def reset(self) -> None:
        self._generated.clear()


@contextlib.contextmanager
def fixed_seed(seed: int = 0) -> Iterator[None]:
    """Seed torch's global CPU RNG inside the block and restore the caller's RNG state after it.

    torchmetrics' KID and IS draw their random subsets / splits from the global RNG; seeding makes a score a function of
    the images alone, and restoring keeps the caller's random stream the same whether or not a metric ran.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield
