"""Improved precision and recall (Kynkaanniemi et al. 2019) of generated images against the real test split.

Both are measured in the features of a `metrics.features` extractor (`@inception`: keys "precision.inception-v3-tf1",
"recall.inception-v3-tf1", the images preprocessed as ADM's evaluator does, `metrics.inception`) by torch-fidelity's
`prc_features_to_metric`: a generated image counts towards precision if it lies inside the k-nearest-neighbour ball of
some real image, and a real image counts towards recall if it lies inside the ball of some generated image. The two
registered metrics share one class that keeps the features.
"""
from __future__ import annotations

from torch_fidelity.metric_prc import KEY_METRIC_PRECISION, KEY_METRIC_RECALL, prc_features_to_metric

from metrics.base import ImageFeatureMetric


class _PrecisionRecall(ImageFeatureMetric):
    """k-NN manifolds of the generated and the real features; `_result` picks the output."""

    higher_is_better = True
    neighborhood = 3  # k of the k-NN balls; torch-fidelity's and the paper's default
    _result: str  # key of `prc_features_to_metric`'s dict

    def compute(self, seed: int = 0) -> dict[str, float]:
        fake, real = self.generated(), self.reference
        # A k-NN radius needs k other points in the set (torch-fidelity takes the (k+1)-th smallest distance, the
        # point itself being the first) and fails otherwise, so with few generated images k is capped at n - 1.
        k = min(self.neighborhood, len(fake) - 1, len(real) - 1)
        prc = prc_features_to_metric(fake, real, prc_neighborhood=k, verbose=False)
        return {self.key(): float(prc[self._result])}


class Precision(_PrecisionRecall):
    """Share of generated images inside the k-NN manifold of the real test split (fidelity; torch-fidelity)."""

    name = "precision"
    _result = KEY_METRIC_PRECISION


class Recall(_PrecisionRecall):
    """Share of real test images inside the k-NN manifold of the generated images (coverage; torch-fidelity)."""

    name = "recall"
    _result = KEY_METRIC_RECALL
