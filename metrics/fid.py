"""Frechet distance (FID, Heusel et al. 2017) between generated images and the real test split.

The distance is torchmetrics' `FrechetInceptionDistance`, fed features of a `metrics.features` extractor: the dataset's
classifier by default (`fid`, key "fid.<dataset>-cnn"), or the standard Inception-v3 under the papers' preprocessing
(`fid@inception`, key "fid.inception-v3-tf1": 8-bit images, TF 1.x bilinear resize, as ADM's evaluator and
torch-fidelity; `metrics.inception`); only the extractor differs from the standard FID, and the metric key names it.

A teacher of a real checkpoint (DiT, LlamaGen) has no real images here but names `reference_statistics`, a file of
Inception statistics (`mu`, `sigma`: ADM's `VIRTUAL_imagenet256_labeled.npz`, computed by ADM's evaluator under the same
preprocessing) in the checkpoints folder, and a tag: its FID is torch-fidelity's Frechet distance between those and the
generated images' statistics, under the key "fid.inception-v3-tf1.<tag>" (e.g. "fid.inception-v3-tf1.adm-in256"), the
number the papers' tables report.
"""
from __future__ import annotations

import numpy as np
import torch
from torchmetrics.image.fid import FrechetInceptionDistance

from bench.cache import Cache, checkpoint_dir
from metrics.base import TORCHMETRICS_LOCAL, ImageFeatureMetric
from metrics.features import Features


class FID(ImageFeatureMetric):
    """Frechet distance to the real test split in an extractor's features (torchmetrics; @cnn default, @inception)."""

    name = "fid"
    higher_is_better = False
    compares_with = "statistics"  # on a teacher of a real checkpoint; the real split's features otherwise

    def __init__(self, teacher, *, cache: Cache, device: torch.device, extractor: str | None = None):
        super().__init__(teacher, cache=cache, device=device, extractor=extractor)
        stats = getattr(teacher, "reference_statistics", None)  # (file, tag), checked by `check_teacher`
        if stats is not None:
            with np.load(checkpoint_dir() / stats[0]) as f:
                self._stats = {"mu": f["mu"].astype(np.float64), "sigma": f["sigma"].astype(np.float64)}
            return
        # reset_real_features=False: `reset` before each compute drops the generated side, keeps the reference.
        self._fid = FrechetInceptionDistance(feature=Features(self.model.num_features), reset_real_features=False,
                                             **TORCHMETRICS_LOCAL)
        self._fid.update(self.reference, real=True)

    def compute(self, seed: int = 0) -> dict[str, float]:
        if hasattr(self, "_stats"):
            from torch_fidelity.metric_fid import fid_features_to_statistics, fid_statistics_to_metric

            generated = fid_features_to_statistics(self.generated().double())
            return {self.key(): fid_statistics_to_metric(self._stats, generated, False)["frechet_inception_distance"]}
        self._fid.reset()
        self._fid.update(self.generated(), real=False)
        return {self.key(): float(self._fid.compute())}
