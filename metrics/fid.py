"""Frechet distance (FID, Heusel et al. 2017) between generated images and the real test split.

The distance is torchmetrics' `FrechetInceptionDistance`, fed features of a `metrics.features` extractor: the dataset's
classifier by default (`fid`, key "fid.<dataset>-cnn"), or the standard Inception-v3 (`fid@inception`, key
"fid.inception-v3"); only the extractor differs from the standard FID, and the metric key names it.
"""
from __future__ import annotations

import torch
from torchmetrics.image.fid import FrechetInceptionDistance

from bench.cache import Cache
from metrics.base import ImageFeatureMetric
from metrics.features import Features


class FID(ImageFeatureMetric):
    """Frechet distance to the real test split in an extractor's features (torchmetrics; @cnn default, @inception)."""

    name = "fid"
    higher_is_better = False

    def __init__(self, teacher, *, cache: Cache, device: torch.device, extractor: str | None = None):
        super().__init__(teacher, cache=cache, device=device, extractor=extractor)
        # reset_real_features=False: `reset` before each compute drops the generated side, keeps the reference.
        self._fid = FrechetInceptionDistance(feature=Features(self.model.num_features), reset_real_features=False)
        self._fid.update(self.reference, real=True)

    def compute(self, seed: int = 0) -> dict[str, float]:
        self._fid.reset()
        self._fid.update(self.generated(), real=False)
        return {self.key(): float(self._fid.compute())}
