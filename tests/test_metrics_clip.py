"""CLIP score: the small dataset CLIP (accuracy, caching, determinism), parity with a direct computation, sanity,
and any open_clip architecture from a local checkpoint."""
from __future__ import annotations

import json

import open_clip
import pytest
import torch

from core.cache import Cache
from core.errors import UserError
from metrics import clip_models
from metrics.clip_models import CLIPRecipe, eval_transform, load_small_clip
from metrics.clip_score import CHECKPOINT_ENV, CLIPScore
from teachers.data.images import caption_table, load_image_dataset
from tests.test_datasets import needs_real
from tests.fakes import NO_CHECKPOINTS

CPU = torch.device("cpu")
# A registered open_clip architecture small enough to build in milliseconds; 32x32 input, so the 16x16 digits are
# resized on the way in. Shared with tests/test_metrics_hpsv2.py.
TINY_ARCH = "AccelBench-Tiny-CLIP"
TINY_CONFIG = {"embed_dim": 32,
               "vision_cfg": {"image_size": 32, "patch_size": 8, "width": 32, "layers": 1, "head_width": 16},
               "text_cfg": {"context_length": 16, "width": 32, "heads": 2, "layers": 1}}
PARITY_RTOL = 1e-5  # the same float32 features on both sides, summed in another order; measured 7e-8 relative


class CaptionTeacher:
    """What the CLIP score reads from a teacher: a class-conditional digits teacher whose condition row is the class."""

    dataset_name, image_size = "digits", 16

    def captions(self, cond: torch.Tensor) -> list[str]:
        table = caption_table(self.dataset_name)
        return [table[c][0] for c in cond[:, 0].tolist()]


TEACHER = CaptionTeacher()


def register_tiny_arch(directory) -> None:
    path = directory / f"{TINY_ARCH}.json"
    path.write_text(json.dumps(TINY_CONFIG))
    open_clip.add_model_config(path)


def tiny_state_dict(seed: int = 0) -> dict[str, torch.Tensor]:
    """A randomly initialised `TINY_ARCH` model's weights (the architecture must be registered)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return open_clip.create_model(TINY_ARCH).state_dict()


@pytest.fixture(scope="module")
def digits_test():
    data = load_image_dataset("digits", "test", 16)
    return data.images, data.labels[:, None]  # (N, 1, 16, 16), (N, 1): the class as the condition row


@pytest.fixture(scope="module")
def metric(cache):
    return CLIPScore(TEACHER, cache=cache, device=CPU, checkpoints=NO_CHECKPOINTS)


@pytest.fixture(scope="module")
def tiny_arch(tmp_path_factory):
    register_tiny_arch(tmp_path_factory.mktemp("open_clip_configs"))
    return TINY_ARCH


def _score(metric: CLIPScore, images: torch.Tensor, cond: torch.Tensor, chunk: int = 100) -> float:
    metric.reset()
    for start in range(0, len(images), chunk):
        metric.update(images[start:start + chunk], cond[start:start + chunk])
    (value,) = metric.compute().values()
    return value


def _direct_mean_score(model: torch.nn.Module, tokenizer, images: torch.Tensor, captions: list[str]) -> float:
    """100 * mean cos(image, caption) straight from open_clip's encoders; torchmetrics' CLIPScore is max(this, 0)."""
    with torch.no_grad():
        image = model.encode_image(eval_transform(model)(images), normalize=True)  # (B, D)
        text = model.encode_text(tokenizer(captions), normalize=True)  # (B, D)
    return 100 * (image * text).sum(-1).mean().item()


def _unclamped(metric: CLIPScore) -> float:
    """The mean before torchmetrics' clamp at 0, from its documented states."""
    return (metric._score.score / metric._score.n_samples).item()


def test_preprocessing_matches_open_clips_own_pil_transform(digits_test):
    """Our tensor path against the eval transform open_clip gives a real CLIP (ViT-B-16, built on the meta device)."""
    from torchvision.transforms.functional import to_pil_image

    with torch.device("meta"):
        model, _, preprocess = open_clip.create_model_and_transforms("ViT-B-16", device="meta")
    x = (digits_test[0][:32] * 255).round() / 255  # exactly 8-bit, so only the resizing can differ
    ours, reference = eval_transform(model)(x), torch.stack([preprocess(to_pil_image(i)) for i in x])
    assert ours.shape == reference.shape == (32, 3, 224, 224)
    diff = (ours - reference).abs()
    # Measured 0.0055 mean and 0.19 max (normalised units): PIL rounds the bicubic upscale to 8 bits and clips it.
    assert diff.mean() < 0.01 and diff.max() < 0.25


def test_small_clip_retrieves_digits(metric, digits_test):
    clip = metric.clip
    assert clip.name == "digits-clip"
    # Measured at training time: zero-shot 0.967, caption -> image 1.0 (a 16x16 ViT + text transformer, 400 steps).
    assert clip.info["zero_shot_top1"] >= 0.93 and clip.info["text_to_image_top1"] >= 0.95
    # Recomputed on the loaded model with each class's first caption only: loading and preprocessing are intact.
    images, cond = digits_test
    texts = [row[0] for row in caption_table("digits")]
    predicted = (clip.image_features(images) @ clip.text_features(texts).T).argmax(-1)  # (N,)
    assert predicted.eq(cond[:, 0]).float().mean() >= 0.9


@needs_real
def test_small_clip_on_fashion_mnist_captions_with_articles(tmp_path):
    """Fashion-MNIST's templates carry an article ("an ankle boot"); the zero-shot evaluation uses those captions."""
    clip = load_small_clip("fashion-mnist", 28, cache=Cache(tmp_path), device=CPU)
    assert clip.name == "fashion-mnist-clip"
    # Measured (1 training thread, deterministic): zero-shot 0.738, caption -> image 0.70; chance is 0.1. The shirt,
    # T-shirt, pullover and coat captions retrieve each other's images.
    assert clip.info["zero_shot_top1"] >= 0.6 and clip.info["text_to_image_top1"] >= 0.6, clip.info


def test_second_load_reads_the_cache(cache, metric, digits_test, monkeypatch):
    monkeypatch.setattr(clip_models, "_train", lambda recipe: pytest.fail("retrained although cached"))
    again = load_small_clip("digits", 16, cache=cache, device=CPU)
    assert again.info["cached"] and again.info["key"] == metric.clip.info["key"]
    images = digits_test[0][:50]
    assert torch.equal(again.image_features(images), metric.clip.image_features(images))


def test_training_is_deterministic_and_leaves_global_rng_alone():
    recipe = CLIPRecipe(dataset="digits", image_size=16, steps=20)  # the same code as the full recipe, 20x shorter
    rng = torch.get_rng_state()
    a, b = clip_models._train(recipe), clip_models._train(recipe)
    assert torch.equal(torch.get_rng_state(), rng)
    assert a["state_dict"].keys() == b["state_dict"].keys()
    assert all(torch.equal(a["state_dict"][k], b["state_dict"][k]) for k in a["state_dict"])
    assert a["info"]["zero_shot_top1"] == b["info"]["zero_shot_top1"]


def test_matched_captions_score_far_above_mismatched(metric, digits_test):
    images, cond = digits_test
    shifted = (cond + torch.randint(1, 10, cond.shape, generator=torch.Generator().manual_seed(0))) % 10
    matched, mismatched = _score(metric, images, cond), _score(metric, images, shifted)
    # Measured: 73.1 matched; mismatched pairs have a negative mean cosine, which torchmetrics clamps to 0.
    assert matched >= 60 and mismatched <= matched - 40


def test_parity_with_direct_computation_from_open_clip(metric, digits_test, monkeypatch):
    images, cond = digits_test
    monkeypatch.setattr(metric.clip, "batch", 64)  # several torchmetrics updates per `update` call, too
    ours = _score(metric, images, cond, chunk=150)
    direct = _direct_mean_score(metric.clip.model, metric.clip.tokenizer, images, TEACHER.captions(cond))
    assert direct > 0 and ours == pytest.approx(direct, rel=PARITY_RTOL)


def test_registered_keys_and_reset(metric, digits_test):
    from mlflow.utils.validation import _validate_metric_name

    from core.registry import METRICS

    assert METRICS.get("clip") is CLIPScore and CLIPScore.higher_is_better is True and not CLIPScore.stochastic
    assert CLIPScore.check(None, NO_CHECKPOINTS) is None
    images, cond = digits_test
    first = _score(metric, images[:40], cond[:40])
    (key,) = metric.compute()
    assert key == "clip.digits-clip"
    _validate_metric_name(key)
    _score(metric, images[40:], cond[40:])
    assert _score(metric, images[:40], cond[:40]) == pytest.approx(first, rel=1e-6)  # reset forgot the other images
    metric.reset()
    with pytest.raises(ValueError, match="before any update"):
        metric.compute()


def test_unknown_architecture_is_a_user_error():
    with pytest.raises(UserError, match=r"clip@ViT-B-61: unknown open_clip architecture .*ViT-B-16"):
        CLIPScore.check("ViT-B-61", NO_CHECKPOINTS)
    with pytest.raises(UserError, match="unknown open_clip architecture"):
        CLIPScore.check("ViT-B-16-SigLIP", NO_CHECKPOINTS)  # its text tower is a Hugging Face download


def test_missing_checkpoint_is_a_user_error_naming_file_and_variable(tmp_path, monkeypatch):
    monkeypatch.delenv(CHECKPOINT_ENV, raising=False)
    with pytest.raises(UserError, match=f"clip@ViT-B-16: no checkpoint; set {CHECKPOINT_ENV}="):
        CLIPScore.check("ViT-B-16", NO_CHECKPOINTS)
    missing = tmp_path / "vit_b_16.pt"
    monkeypatch.setenv(CHECKPOINT_ENV, str(missing))
    with pytest.raises(UserError, match=f"{missing} \\(from {CHECKPOINT_ENV}\\) not found"):
        CLIPScore.check("ViT-B-16", NO_CHECKPOINTS)
    with pytest.raises(UserError, match="not found"):
        CLIPScore(TEACHER, cache=Cache(tmp_path), device=CPU, checkpoints=NO_CHECKPOINTS, extractor="ViT-B-16")


@pytest.mark.parametrize("layout", ["raw", "wrapped", "ddp"])
def test_local_checkpoint_loads_and_scores(tiny_arch, tmp_path, monkeypatch, digits_test, layout):
    weights = tiny_state_dict()
    saved = {"raw": weights,  # a bare state dict
             "wrapped": {"state_dict": weights, "epoch": 3},  # a training checkpoint, as the HPS v2 files
             "ddp": {"state_dict": {f"module.{k}": v for k, v in weights.items()}}}[layout]
    path = tmp_path / "tiny.pt"
    torch.save(saved, path)
    monkeypatch.setenv(CHECKPOINT_ENV, str(path))
    assert CLIPScore.check(tiny_arch, NO_CHECKPOINTS) is None

    metric = CLIPScore(TEACHER, cache=Cache(tmp_path), device=CPU, checkpoints=NO_CHECKPOINTS, extractor=tiny_arch)
    loaded = metric.clip.model.state_dict()
    assert loaded.keys() == weights.keys() and all(torch.equal(loaded[k], weights[k]) for k in weights)
    images, cond = digits_test
    ours = _score(metric, images, cond)
    assert list(metric.compute()) == [f"clip.{TINY_ARCH}"]
    reference = open_clip.create_model(TINY_ARCH)  # loaded independently of `load_open_clip`
    reference.load_state_dict(weights)
    direct = _direct_mean_score(reference.eval(), open_clip.get_tokenizer(TINY_ARCH), images, TEACHER.captions(cond))
    # This random model's mean cosine is negative, so the reported score is torchmetrics' clamp; the states before it
    # carry the comparison.
    assert ours == max(direct, 0.0)
    assert _unclamped(metric) == pytest.approx(direct, rel=PARITY_RTOL)
