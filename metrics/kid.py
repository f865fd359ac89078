"""Kernel Inception Distance (KID, Binkowski et al. 2018) between generated images and the real test split.

The distance is torchmetrics' `KernelInceptionDistance` (unbiased polynomial-kernel MMD^2 averaged over random subsets),
fed features of a `metrics.features` extractor, as for `metrics.fid` (`kid@inception`: key "kid.inception-v3-tf1", the
images preprocessed as ADM's evaluator does, `metrics.inception`). The subsets are random: the value depends on the
seed of `compute`, and the runner can repeat it over seeds.
"""
from __future__ import annotations

import warnings

from torchmetrics.image.kid import KernelInceptionDistance

from core.rng import seeded
from metrics.base import TORCHMETRICS_LOCAL, ImageFeatureMetric
from metrics.features import Features


class KID(ImageFeatureMetric):
    """Kernel (polynomial MMD) distance to the real test split in an extractor's features (torchmetrics)."""

    name = "kid"
    higher_is_better = False
    min_samples = 2  # the unbiased MMD^2 divides by m (m - 1)
    stochastic = True
    # The libraries' default subset size (1000) is larger than the digits test split (360 images) and than a typical
    # trial's sample count; `compute` lowers 50 further when either side has fewer images.
    subset_size = 50
    subsets = 100

    def compute(self, seed: int = 0) -> dict[str, float]:
        fake, real = self.generated(), self.reference
        # torchmetrics fixes subset_size at construction and raises if either side has fewer images, so the metric is
        # built here, once the number of generated images is known.
        size = min(self.subset_size, len(fake), len(real))
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*will save all extracted features in buffer")  # we know
            kid = KernelInceptionDistance(feature=Features(self.model.num_features), subsets=self.subsets,
                                          subset_size=size, **TORCHMETRICS_LOCAL)
        kid.update(real, real=True)
        kid.update(fake, real=False)
        with seeded(seed):
            mean, std = kid.compute()
        # The spread over subsets is keyed under "kid." too: every key a metric returns starts with its name (the
        # runner tags directions and the contract test checks keys by that prefix).
        return {self.key(): float(mean), f"{self.key()}.std": float(std)}
