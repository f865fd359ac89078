"""HPSv2: unavailable without a checkpoint, the hpsv2 package's score on a tiny local checkpoint, ViT-H-14's layout."""
from __future__ import annotations

import open_clip
import pytest
import torch

from core.cache import Cache
from core.errors import UserError
from metrics.clip_models import eval_transform
from metrics.hpsv2 import CHECKPOINT_ENV, HPSv2
from teachers.data.images import load_image_dataset
from tests.test_metrics_clip import TEACHER, TINY_ARCH, register_tiny_arch, tiny_state_dict
from tests.fakes import NO_CHECKPOINTS

CPU = torch.device("cpu")
PARITY_RTOL = 1e-5  # the same float32 features on both sides, averaged in another order


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory):
    """A random `TINY_ARCH` model saved as the HPS v2 files are ({"state_dict": ...}), under an awkward file name."""
    directory = tmp_path_factory.mktemp("hpsv2")
    register_tiny_arch(directory)
    weights = tiny_state_dict(seed=1)
    path = directory / "HPS v2.1 (tiny).pt"
    torch.save({"state_dict": weights}, path)
    return path, weights


@pytest.fixture(scope="module")
def digits():
    data = load_image_dataset("digits", "test", 16)
    return data.images[:120], data.labels[:120, None]  # (N, 1, 16, 16), (N, 1)


def _hps_reference(weights: dict, images: torch.Tensor, captions: list[str]) -> float:
    """hpsv2's `img_score.score`: the diagonal of image_features @ text_features.T from the model's normalised
    outputs, here averaged; the model loaded independently of `metrics.clip_models.load_open_clip`."""
    model = open_clip.create_model(TINY_ARCH)
    model.load_state_dict(weights)
    model.eval()
    tokens = open_clip.get_tokenizer(TINY_ARCH)(captions)
    with torch.no_grad():
        image_features, text_features, _ = model(eval_transform(model)(images), tokens)  # (B, D) each, unit norm
    return torch.diagonal(image_features @ text_features.T).mean().item()


def test_unavailable_without_a_checkpoint(tmp_path, monkeypatch):
    monkeypatch.delenv(CHECKPOINT_ENV, raising=False)
    assert HPSv2.check(None, NO_CHECKPOINTS) == ("hpsv2: no checkpoint; set ACCELBENCH_HPSV2_CHECKPOINT="
                                 "/path/to/HPS_v2.1_compressed.pt (ViT-H-14)")
    missing = tmp_path / "HPS_v2.1_compressed.pt"
    monkeypatch.setenv(CHECKPOINT_ENV, str(missing))
    reason = HPSv2.check(None, NO_CHECKPOINTS)
    assert str(missing) in reason and CHECKPOINT_ENV in reason and "\n" not in reason
    with pytest.raises(UserError, match="not found"):  # built anyway (the runner checks first): a clear error
        HPSv2(TEACHER, cache=Cache(tmp_path), device=CPU, checkpoints=NO_CHECKPOINTS)


def test_unknown_architecture_is_a_user_error(monkeypatch):
    monkeypatch.delenv(CHECKPOINT_ENV, raising=False)
    with pytest.raises(UserError, match="hpsv2@ViT-H-41: unknown open_clip architecture"):
        HPSv2.check("ViT-H-41", NO_CHECKPOINTS)


def test_tiny_checkpoint_score_is_the_feature_diagonal(tiny_checkpoint, digits, tmp_path, monkeypatch):
    from mlflow.utils.validation import _validate_metric_name

    from core.registry import METRICS

    path, weights = tiny_checkpoint
    monkeypatch.setenv(CHECKPOINT_ENV, str(path))
    assert HPSv2.check(TINY_ARCH, NO_CHECKPOINTS) is None
    metric = HPSv2(TEACHER, cache=Cache(tmp_path), device=CPU, checkpoints=NO_CHECKPOINTS, extractor=TINY_ARCH)
    loaded = metric.clip.model.state_dict()
    assert loaded.keys() == weights.keys() and all(torch.equal(loaded[k], weights[k]) for k in weights)

    images, cond = digits
    for start in range(0, len(images), 50):
        metric.update(images[start:start + 50], cond[start:start + 50])
    values = metric.compute()
    assert list(values) == ["hpsv2.HPS v2.1 _tiny_"]  # "(" and ")" are not allowed in MLflow metric names
    _validate_metric_name(*values)
    expected = _hps_reference(weights, images, TEACHER.captions(cond))
    assert values["hpsv2.HPS v2.1 _tiny_"] == pytest.approx(expected, rel=PARITY_RTOL)

    shifted = (cond + 1) % 10
    metric.reset()
    metric.update(images, shifted)
    (other,) = metric.compute().values()
    assert other == pytest.approx(_hps_reference(weights, images, TEACHER.captions(shifted)), rel=PARITY_RTOL)
    assert other != pytest.approx(expected, rel=1e-3)  # the prompts matter
    metric.reset()
    with pytest.raises(ValueError, match="before any update"):
        metric.compute()
    assert METRICS.get("hpsv2") is HPSv2 and HPSv2.higher_is_better is True and not HPSv2.stochastic


def test_stock_vit_h_14_has_the_hps_checkpoint_layout():
    """HPS v2 / v2.1 checkpoints are open_clip ViT-H-14 state dicts: 686 tensors (checked against the real
    file). Built on the meta device: no memory, no time."""
    with torch.device("meta"):
        model = open_clip.create_model("ViT-H-14", device="meta")
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    assert len(shapes) == 686
    assert shapes["visual.proj"] == (1280, 1024) and shapes["text_projection"] == (1024, 1024)
    assert shapes["token_embedding.weight"] == (49408, 1024) and shapes["positional_embedding"] == (77, 1024)
    assert shapes["visual.positional_embedding"] == (257, 1280)  # 224 / 14 = 16, 16 x 16 patches + class token
