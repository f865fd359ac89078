"""Kernel Inception Distance between generated and real test-split images, in the features of the dataset's classifier.

The distance is torchmetrics' `KernelInceptionDistance` (unbiased polynomial-kernel MMD^2 averaged over random subsets)
with `metrics.extractors.TorchmetricsFeature` as its feature module, as for `metrics.fid`.
"""
from __future__ import annotations

import warnings

from torchmetrics.image.kid import KernelInceptionDistance

from bench.registry import METRICS
from metrics.base import BATCH, BufferedClassifierMetric, fixed_seed
from metrics.extractors import TorchmetricsFeature


@METRICS.register("kid")
class KID(BufferedClassifierMetric):
    """Kernel (polynomial MMD) distance to the real test split in the dataset classifier's features (torchmetrics)."""

    name = "kid"
    higher_is_better = False
    # The libraries' default subset size (1000) is larger than the digits test split (360 images) and than a typical
    # trial's sample count; `compute` lowers 50 further when either side has fewer images.
    subset_size = 50
    subsets = 100

    def compute(self) -> dict[str, float]:
        fake, real = self.generated(), self.real_images
        # torchmetrics fixes subset_size at construction and raises if either side has fewer images, so the metric is
        # built here, once the number of generated images is known, and fed everything kept so far.
        size = min(self.subset_size, len(fake), len(real))
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*will save all extracted features in buffer")  # we know
            kid = KernelInceptionDistance(feature=TorchmetricsFeature(self.classifier), subsets=self.subsets,
                                          subset_size=size).to(self.device)
        for batch in real.split(BATCH):
            kid.update(batch.to(self.device), real=True)
        for batch in fake.split(BATCH):
            kid.update(batch, real=False)
        with fixed_seed():
            mean, std = kid.compute()
        # The spread over subsets is keyed under "kid." too: every key a metric returns starts with its name (the
        # runner tags directions and the contract test checks keys by that prefix).
        return {self.key(): float(mean), f"{self.key()}.std": float(std)}
