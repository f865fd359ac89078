"""FID with the digits classifier extractor: parity with clean-fid, sanity, accuracy, caching and determinism."""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from core.cache import Cache
from metrics import extractors
from metrics.extractors import load_classifier
from metrics.fid import FID
from tests.fakes import NO_CHECKPOINTS

CPU = torch.device("cpu")
TEACHER = SimpleNamespace(dataset_name="digits", image_size=16)  # all FID reads from a teacher
PARITY_RTOL = 1e-6  # both sides get identical float64 features; measured difference ~1e-12 relative


@pytest.fixture(scope="module")
def fid(cache, classifier):
    return FID(TEACHER, cache=cache, device=CPU, checkpoints=NO_CHECKPOINTS)


def _fid_of(fid: FID, fake: torch.Tensor) -> float:
    fid.reset()
    for batch in fake.split(100):
        fid.update(batch, torch.zeros(len(batch), dtype=torch.long))
    (value,) = fid.compute().values()
    return value


def test_classifier_accuracy_and_shapes(classifier, images):
    assert classifier.name == "digits-cnn"
    assert classifier.test_accuracy >= 0.97
    x = images["test"][:5]
    assert classifier.features(x).shape == (5, classifier.num_features)
    assert classifier.logits(x).shape == (5, 10)


def test_second_load_reads_the_cache(cache, classifier, images, monkeypatch):
    monkeypatch.setattr(extractors, "_train", lambda recipe: pytest.fail("retrained although cached"))
    again = load_classifier("digits", 16, cache=cache, device=CPU)
    assert again.info["cached"]  # the fixture's build may come from an earlier test sharing the session cache
    assert torch.equal(again.features(images["test"]), classifier.features(images["test"]))


def test_training_is_deterministic_and_leaves_global_rng_alone(tmp_path, classifier):
    rng = torch.get_rng_state()
    rebuilt = load_classifier("digits", 16, cache=Cache(tmp_path), device=CPU)
    assert torch.equal(torch.get_rng_state(), rng) and not rebuilt.info["cached"]
    a, b = classifier.state_dict(), rebuilt.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_classifier_checks_its_input_and_stays_in_eval_mode(classifier):
    classifier.train()
    assert not classifier.training  # batch statistics would make features depend on the batch
    with pytest.raises(ValueError, match="digits-cnn expects"):
        classifier.features(torch.rand(2, 1, 8, 8))


def test_reference_features_are_cached_by_extractor_and_split(tmp_path, classifier, images, monkeypatch):
    from metrics import features

    cache = Cache(tmp_path)
    first = features.reference_features(classifier, TEACHER, cache=cache, device=CPU, checkpoints=NO_CHECKPOINTS)
    assert first.shape == (len(images["test"]), classifier.num_features)
    # The reference is the whole split in a fixed order: the same multiset of features as the split itself.
    direct = classifier.features(images["test"])
    assert torch.allclose(first.sum(0), direct.sum(0), rtol=1e-4) and len(list(tmp_path.glob("reference/*.pt"))) == 1
    monkeypatch.setattr(features, "embed", lambda *a, **k: pytest.fail("recomputed although cached"))
    monkeypatch.setattr(features, "load_image_dataset", lambda *a: pytest.fail("split loaded although cached"))
    assert torch.equal(features.reference_features(classifier, TEACHER, cache=cache, device=CPU,
                                                   checkpoints=NO_CHECKPOINTS), first)
    monkeypatch.setattr(classifier, "max_reference", 100)  # another cap is another entry
    with pytest.raises(pytest.fail.Exception, match="split loaded"):
        features.reference_features(classifier, TEACHER, cache=cache, device=CPU, checkpoints=NO_CHECKPOINTS)


def test_extractor_choices_are_validated():
    from core.errors import UserError

    assert FID.check(None, NO_CHECKPOINTS) is None and FID.check("cnn", NO_CHECKPOINTS) is None
    with pytest.raises(UserError, match="unknown extractor 'vgg'; valid: cnn, inception"):
        FID.check("vgg", NO_CHECKPOINTS)
    from metrics.inception_score import InceptionScore

    with pytest.MonkeyPatch.context() as mp:  # is@inception reads torch-fidelity's weights file, named in one line
        mp.delenv("ACCELBENCH_INCEPTION_LOGITS_WEIGHTS", raising=False)
        with pytest.raises(UserError, match="missing /nonexistent/weights-inception-2015-12-05-6726825d.pth: the "
                                            "inception score reads Inception-v3's class logits"):
            InceptionScore.check("inception", Path("/nonexistent"))


@pytest.mark.parametrize("fake", ["train", "noise"])
@pytest.mark.filterwarnings("ignore:The `disp` argument is deprecated:DeprecationWarning")  # inside clean-fid
def test_fid_matches_cleanfid_on_same_features(fid, classifier, images, fake):
    from cleanfid.fid import fid_from_feats

    ours = _fid_of(fid, images[fake])
    reference = fid_from_feats(classifier.features(images["test"]).double().numpy(),
                               classifier.features(images[fake]).double().numpy())
    assert ours == pytest.approx(float(reference), rel=PARITY_RTOL)


def test_fid_real_vs_real_is_far_below_real_vs_noise(fid, images):
    real = _fid_of(fid, images["train"])
    noise = _fid_of(fid, images["noise"])
    assert 0 <= real < 2.0
    assert noise > 20 * real
    assert _fid_of(fid, images["train"]) == pytest.approx(real, rel=1e-9)  # reset kept the real statistics


def test_registered_and_keys_are_mlflow_metric_names(fid, images):
    from mlflow.utils.validation import _validate_metric_name

    from core.registry import METRICS

    assert METRICS.get("fid") is FID and FID.higher_is_better is False
    _fid_of(fid, images["train"][:50])
    (key,) = fid.compute()
    assert key == f"fid.{fid.extractor}" == "fid.digits-cnn"
    _validate_metric_name(key)
    assert np.isfinite(fid.compute()[key])
