"""Frechet distance between generated and real test-split images, in the features of the dataset's classifier.

The distance itself is torchmetrics' `FrechetInceptionDistance` with `metrics.extractors.TorchmetricsFeature` as its
feature module; only the extractor differs from the standard FID, and the metric key names it.
"""
from __future__ import annotations

import torch
from torchmetrics.image.fid import FrechetInceptionDistance

from bench.cache import Cache
from bench.registry import METRICS
from metrics.base import BATCH, ClassifierMetric
from metrics.extractors import TorchmetricsFeature


@METRICS.register("fid")
class FID(ClassifierMetric):
    """Frechet distance to the real test split in the features of a classifier trained on the dataset (torchmetrics)."""

    name = "fid"
    higher_is_better = False

    def __init__(self, teacher, *, cache: Cache, device: torch.device):
        super().__init__(teacher, cache=cache, device=device)
        # reset_real_features=False: `reset` drops the generated images but keeps the test-split statistics.
        self._fid = FrechetInceptionDistance(feature=TorchmetricsFeature(self.classifier),
                                             reset_real_features=False).to(device)
        for batch in self.real_images.split(BATCH):
            self._fid.update(batch.to(device), real=True)

    def update(self, images: torch.Tensor, cond: torch.Tensor) -> None:
        self._fid.update(images.to(self.device), real=False)

    def compute(self) -> dict[str, float]:
        return {self.key(): float(self._fid.compute())}

    def reset(self) -> None:
        self._fid.reset()
