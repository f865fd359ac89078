"""KID, inception score, precision and recall with the digits classifier: parity with torch-fidelity, sanity, reset."""
from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from torch_fidelity.metric_isc import isc_features_to_metric
from torch_fidelity.metric_kid import kid_features_to_metric
from torch_fidelity.metric_prc import prc_features_to_metric

from core.registry import METRICS
from metrics.inception_score import InceptionScore
from metrics.kid import KID
from metrics.precision_recall import Precision, Recall
from tests.fakes import NO_CHECKPOINTS

CPU = torch.device("cpu")
TEACHER = SimpleNamespace(dataset_name="digits", image_size=16)
# Both sides get identical float64 features and, with subsets covering every image, identical subsets; the results
# differ only by summation order (torch vs numpy), measured ~1e-15 relative.
PARITY_RTOL, PARITY_ATOL = 1e-9, 1e-12
NO_COND = torch.zeros(360, dtype=torch.long)


@pytest.fixture(scope="module")
def metrics(cache, classifier) -> dict:
    return {cls.name: cls(TEACHER, cache=cache, device=CPU, checkpoints=NO_CHECKPOINTS)
            for cls in (KID, InceptionScore, Precision, Recall)}


def _score(metric, fake: torch.Tensor) -> dict[str, float]:
    metric.reset()
    for batch in fake.split(100):
        metric.update(batch, NO_COND[:len(batch)])
    return metric.compute()


@pytest.mark.parametrize("fake", ["train", "noise"])
def test_kid_matches_torch_fidelity_on_same_features(metrics, classifier, images, fake, monkeypatch):
    kid = metrics["kid"]
    monkeypatch.setattr(kid, "subset_size", 10_000)  # every subset is then all 360 images: no sampling difference
    ours = _score(kid, images[fake])
    ref = kid_features_to_metric(classifier.features(images[fake]).double(),
                                 classifier.features(images["test"]).double(),
                                 kid_subsets=2, kid_subset_size=360, verbose=False)
    assert ours["kid.digits-cnn"] == pytest.approx(ref["kernel_inception_distance_mean"], rel=PARITY_RTOL,
                                                   abs=PARITY_ATOL)
    assert ours["kid.digits-cnn.std"] == pytest.approx(0.0, abs=PARITY_ATOL)


@pytest.mark.parametrize("fake", ["train", "noise"])
def test_kid_default_subsets_agree_with_torch_fidelity_within_sampling_error(metrics, classifier, images, fake):
    ours = _score(metrics["kid"], images[fake])
    ref = kid_features_to_metric(classifier.features(images[fake]).double(),
                                 classifier.features(images["test"]).double(),
                                 kid_subsets=100, kid_subset_size=50, verbose=False)
    # Different random subsets (torch vs numpy RNG): each mean of 100 subsets has standard error std / 10.
    error = math.hypot(ours["kid.digits-cnn.std"], ref["kernel_inception_distance_std"]) / 10
    assert abs(ours["kid.digits-cnn"] - ref["kernel_inception_distance_mean"]) < 4 * error


def test_kid_real_vs_real_is_near_zero_and_far_below_noise(metrics, images):
    real = _score(metrics["kid"], images["train"])
    noise = _score(metrics["kid"], images["noise"])
    assert abs(real["kid.digits-cnn"]) < 3 * real["kid.digits-cnn.std"] + 1e-3
    assert noise["kid.digits-cnn"] > 50 * max(real["kid.digits-cnn"], real["kid.digits-cnn.std"])
    assert _score(metrics["kid"], images["train"]) == real  # reset kept the real side; fixed subsets


@pytest.mark.parametrize("fake", ["train", "noise"])
def test_precision_recall_match_torch_fidelity_on_same_features(metrics, classifier, images, fake):
    ref = prc_features_to_metric(classifier.features(images[fake]), classifier.features(images["test"]),
                                 prc_neighborhood=3, verbose=False)
    assert _score(metrics["precision"], images[fake]) == {"precision.digits-cnn": ref["precision"]}
    assert _score(metrics["recall"], images[fake]) == {"recall.digits-cnn": ref["recall"]}


def test_precision_recall_real_vs_real_high_noise_precision_low(metrics, images):
    assert _score(metrics["precision"], images["train"])["precision.digits-cnn"] > 0.6
    assert _score(metrics["recall"], images["train"])["recall.digits-cnn"] > 0.6
    assert _score(metrics["precision"], images["noise"])["precision.digits-cnn"] < 0.2


def test_precision_recall_cap_the_neighborhood_for_few_images(metrics, classifier, images):
    few = images["train"][:3]  # k = 3 needs 4 images; capped at 2
    ref = prc_features_to_metric(classifier.features(few), classifier.features(images["test"]),
                                 prc_neighborhood=2, verbose=False)
    assert _score(metrics["precision"], few) == {"precision.digits-cnn": ref["precision"]}
    assert _score(metrics["recall"], few) == {"recall.digits-cnn": ref["recall"]}


def test_inception_score_real_above_noise(metrics, images):
    real = _score(metrics["is"], images["test"])
    noise = _score(metrics["is"], images["noise"])
    assert real["is.digits-cnn"] > 2 * noise["is.digits-cnn"]
    assert 1.0 <= noise["is.digits-cnn"] and real["is.digits-cnn"] <= 10.0  # IS lies in [1, number of classes]


@pytest.mark.filterwarnings("ignore:std\\(\\)")  # torchmetrics takes the std over the one split
def test_inception_score_matches_torch_fidelity_in_one_split(metrics, classifier, images, monkeypatch):
    monkeypatch.setattr(metrics["is"], "splits", 1)  # one split: no dependence on the shuffle
    ours = _score(metrics["is"], images["test"])
    ref = isc_features_to_metric(classifier.logits(images["test"]).double(), splits=1)
    assert ours["is.digits-cnn"] == pytest.approx(ref["inception_score_mean"], rel=PARITY_RTOL)


def test_compute_is_reproducible_and_leaves_the_global_rng_alone(metrics, images):
    rng = torch.get_rng_state()
    first = [_score(metrics[n], images["noise"][:40]) for n in ("kid", "is")]
    assert torch.equal(torch.get_rng_state(), rng)
    assert [_score(metrics[n], images["noise"][:40]) for n in ("kid", "is")] == first


@pytest.mark.parametrize("name", ["kid", "is"])
def test_stochastic_metrics_depend_on_the_seed_only(metrics, images, name):
    metric = metrics[name]
    assert metric.stochastic and not metrics["precision"].stochastic
    _score(metric, images["train"])
    by_seed = [metric.compute(seed=s) for s in (0, 1, 0)]
    assert by_seed[0] == by_seed[2] and by_seed[0] != by_seed[1]


def test_small_batches_use_smaller_subsets_and_splits(metrics, images):
    few = images["train"][:8]  # fewer than the default KID subset size and IS splits
    for name in ("kid", "is"):
        values = _score(metrics[name], few)
        assert all(math.isfinite(v) for v in values.values()), values


@pytest.mark.parametrize("name, cls, higher", [("kid", KID, False), ("is", InceptionScore, True),
                                                ("precision", Precision, True), ("recall", Recall, True)])
def test_registered_with_mlflow_metric_keys(metrics, images, name, cls, higher):
    from mlflow.utils.validation import _validate_metric_name

    assert METRICS.get(name) is cls and cls.higher_is_better is higher
    assert len(cls.__doc__.splitlines()[0]) <= 120  # `accelbench list` shows it
    keys = _score(metrics[name], images["train"][:50])
    assert keys and all(k.startswith(f"{name}.digits-cnn") for k in keys)
    for key in keys:
        _validate_metric_name(key)
    metrics[name].reset()
    with pytest.raises(ValueError, match="before any update"):
        metrics[name].compute()
