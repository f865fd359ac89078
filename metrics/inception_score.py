"""Inception score (Salimans et al. 2016) of generated images, in the logits of the dataset's classifier (`is`) or of
Inception-v3 (`is@inception`, key "is.inception-v3-tf1": torch-fidelity's network and its unbiased logits, on the
8-bit images with the TF 1.x resize that fid@inception reads too: `metrics.inception`).

The score is torchmetrics' `InceptionScore` (exp of the mean KL divergence between p(y|x) and p(y), over splits), fed
the classifier's logits. It has no reference side: it reads the generated images only, and is high when the classifier
is confident on each image and the predicted classes are diverse. The split assignment is random (seed of `compute`).
"""
from __future__ import annotations

import warnings

from torchmetrics.image.inception import InceptionScore as TorchmetricsInceptionScore

from core.rng import seeded
from metrics.base import TORCHMETRICS_LOCAL, ImageFeatureMetric
from metrics.features import Features


class InceptionScore(ImageFeatureMetric):
    """Inception score (confident and diverse class predictions) in a classifier's logits (torchmetrics)."""

    name = "is"
    higher_is_better = True
    stochastic = True
    uses_logits = True
    compares_with = None
    splits = 10  # the standard number; `compute` uses fewer so that each split keeps at least `min_split` images
    min_split = 50  # smaller splits give a marginal p(y) from a handful of images and a meaningless score

    def compute(self, seed: int = 0) -> dict[str, float]:
        logits = self.generated()
        splits = max(1, min(self.splits, len(logits) // self.min_split))
        # torchmetrics fixes `splits` at construction, so the metric is built here, once the image count is known.
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*will save all extracted features in buffer")  # we know
            score = TorchmetricsInceptionScore(feature=Features(self.model.num_classes), splits=splits,
                                               **TORCHMETRICS_LOCAL)
        score.update(logits)
        with seeded(seed), warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="std\\(\\): degrees of freedom")  # one split has no spread
            mean, std = score.compute()
        # The spread over splits is keyed under "is." too: every key a metric returns starts with its name.
        return {self.key(): float(mean)} | ({f"{self.key()}.std": float(std)} if splits > 1 else {})
