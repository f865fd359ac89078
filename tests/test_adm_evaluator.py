"""The numpy half of ADM's evaluator (openai/guided-diffusion 22e0df8 `evaluations/evaluator.py`, the one ARD reports
with and DD's release carries a copy of), rewritten here by hand and compared with our metrics on fixed features:
the Frechet distance against reference statistics (`fid@inception` on a teacher with `reference_statistics`) and the
improved precision and recall (`precision@inception`, `recall@inception`). Its TensorFlow half (the Inception graph,
the float16 pairwise distances of `DistanceBlock`) is not run here: docs/guide/papers.md, "Evaluator parity", says
what differs."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import linalg

from metrics.fid import FID
from metrics.precision_recall import Precision, Recall

RNG = np.random.default_rng(0)
REAL = RNG.normal(size=(60, 8)).astype(np.float32)  # reference activations (ADM's batch of real images)
FAKE = (RNG.normal(size=(50, 8)) * 1.3 + 0.4).astype(np.float32)  # the samples'


def adm_statistics(acts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`compute_statistics` (evaluator.py:174-177): the mean and the sample covariance of the activations."""
    return np.mean(acts, axis=0), np.cov(acts, rowvar=False)


def adm_frechet_distance(sample: tuple, ref: tuple, eps: float = 1e-6) -> float:
    """`FIDStatistics.frechet_distance` (evaluator.py:72-116), the sample's statistics first as `main` calls it
    (:56): |mu1 - mu2|^2 + tr(S1) + tr(S2) - 2 tr(sqrtm(S1 S2)), eps on the diagonals if the root is not finite,
    the root's imaginary dust dropped."""
    (mu1, s1), (mu2, s2) = sample, ref
    root, _ = linalg.sqrtm(s1.dot(s2), disp=False)
    if not np.isfinite(root).all():
        offset = np.eye(len(s1)) * eps
        root = linalg.sqrtm((s1 + offset).dot(s2 + offset))
    root = root.real if np.iscomplexobj(root) else root
    return float((mu1 - mu2).dot(mu1 - mu2) + np.trace(s1) + np.trace(s2) - 2 * np.trace(root))


def adm_precision_recall(ref: np.ndarray, sample: np.ndarray, k: int = 3) -> tuple[float, float]:
    """`compute_prec_recall` (evaluator.py:194-203) through `ManifoldEstimator` (nhood_sizes (3,), :217): each set's
    radius per point is its squared distance to its k-th neighbour (:248-276, the point itself at index 0); a sample
    counts for precision inside some reference ball, a reference point for recall inside some sample ball
    (`evaluate_pr`, :325-360; `DistanceBlock.less_thans`, :386-388, `<=`). Squared distances as
    `_batch_pairwise_distances` (:414-431) writes them, here in float32 where the evaluator tries float16 first."""
    def squared(u, v):
        return np.maximum((u * u).sum(1)[:, None] - 2 * u @ v.T + (v * v).sum(1)[None, :], 0.0)

    def radii(x):
        return np.partition(squared(x, x), k, axis=1)[:, k]

    d = squared(ref, sample)  # (N_ref, N_sample)
    precision = (d <= radii(ref)[:, None]).any(axis=0).mean()
    recall = (d <= radii(sample)[None, :]).any(axis=1).mean()
    return float(precision), float(recall)


def metric_on_features(cls, generated: np.ndarray, **state):
    """Our metric with its extractor's work done: the generated features and the reference side given."""
    metric = object.__new__(cls)
    metric.extractor = "inception-v3-tf1.adm-in256"
    metric._generated = [torch.from_numpy(generated)]
    metric.__dict__.update(state)
    return metric


def test_fid_against_reference_statistics_is_adms_frechet_distance():
    ref = adm_statistics(REAL)  # what the reference batch's `mu` and `sigma` hold, read as float64 (metrics.features)
    stats = {"mu": ref[0].astype(np.float64), "sigma": ref[1]}
    ours = metric_on_features(FID, FAKE, _pytorch_fid=False, _stats=stats).compute()
    theirs = adm_frechet_distance(adm_statistics(FAKE), ref)
    assert ours == {"fid.inception-v3-tf1.adm-in256": pytest.approx(theirs, rel=1e-6)}
    assert theirs != pytest.approx(adm_frechet_distance(adm_statistics(FAKE[:-5]), ref), rel=1e-3)  # it can tell


def test_precision_and_recall_are_adms_manifold_estimator():
    real = torch.from_numpy(REAL)
    precision, recall = adm_precision_recall(REAL, FAKE)
    assert metric_on_features(Precision, FAKE, reference=real).compute() == {
        "precision.inception-v3-tf1.adm-in256": pytest.approx(precision, abs=1e-6)}
    assert metric_on_features(Recall, FAKE, reference=real).compute() == {
        "recall.inception-v3-tf1.adm-in256": pytest.approx(recall, abs=1e-6)}
    assert 0 < precision < 1 and 0 < recall < 1 and (precision, recall) != adm_precision_recall(REAL, FAKE, k=5)
