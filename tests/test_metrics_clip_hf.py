"""CLIP score from a local transformers CLIP folder (`clip@hf:<folder>`, SJD's evaluation): parity with torchmetrics'
CLIPScore and with CLIPModel's own embeddings on a tiny random-weight CLIP, the refusal of a missing folder, the key."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from core.cache import Cache
from core.errors import UserError
from metrics import clip_hf
from metrics.clip_score import CLIPScore
from tests.fakes import NO_CHECKPOINTS, write_tiny_clip

CPU = torch.device("cpu")
PARITY_RTOL = 1e-6
MODEL_SEED = 4  # a random model whose mean cosine is positive (measured 7.58): the clamp leaves it


class CaptionTeacher:
    dataset_name, image_size = "digits", 16
    words = ["a photo of a cat", "two dogs on a red sofa", "a white box on a black background", "an empty street"]

    def captions(self, cond: torch.Tensor) -> list[str]:
        return [self.words[c] for c in cond[:, 0].tolist()]


TEACHER = CaptionTeacher()


@pytest.fixture(scope="module")
def clip_folder(tmp_path_factory) -> Path:
    return write_tiny_clip(tmp_path_factory.mktemp("ckpts") / "tiny-clip", MODEL_SEED)


@pytest.fixture(scope="module")
def samples():
    g = torch.Generator().manual_seed(0)
    return torch.rand(20, 3, 24, 24, generator=g), torch.randint(4, (20, 1), generator=g)


def _score(metric: CLIPScore, images, cond) -> float:
    metric.reset()
    for start in range(0, len(images), 7):
        metric.update(images[start:start + 7], cond[start:start + 7])
    (value,) = metric.compute().values()
    return value


def test_parity_with_torchmetrics_and_clipmodel(clip_folder, samples):
    from torchmetrics.multimodal.clip_score import CLIPScore as TorchmetricsCLIPScore
    from transformers import AutoImageProcessor, AutoTokenizer, CLIPModel, CLIPProcessor

    name = f"hf:{clip_folder}"
    assert CLIPScore.check(name, NO_CHECKPOINTS) is None
    metric = CLIPScore(TEACHER, cache=Cache(clip_folder.parent / "cache"), device=CPU, checkpoints=NO_CHECKPOINTS,
                       extractor=name)
    images, cond = samples
    ours = _score(metric, images, cond)
    unclamped = (metric._score.score / metric._score.n_samples).item()

    # Loaded independently; SJD's images: 8-bit, bilinear to 299x299; one torchmetrics update of all of them.
    model = CLIPModel.from_pretrained(clip_folder, local_files_only=True).eval()
    processor = CLIPProcessor(image_processor=AutoImageProcessor.from_pretrained(clip_folder, backend="pil"),
                              tokenizer=AutoTokenizer.from_pretrained(clip_folder))
    x = (images * 255).round().to(torch.uint8)
    x = torch.nn.functional.interpolate(x, size=(299, 299), mode="bilinear", align_corners=False)
    captions = TEACHER.captions(cond)
    reference = TorchmetricsCLIPScore(model_name_or_path=lambda: (clip_hf.FeaturesOf(model), processor))
    reference.update(x, captions)
    assert ours == pytest.approx(float(reference.compute()), rel=PARITY_RTOL, abs=1e-9)
    assert unclamped == pytest.approx((reference.score / reference.n_samples).item(), rel=PARITY_RTOL)

    # CLIPModel's own forward: its normalised embeddings, without torchmetrics or the adapter.
    inputs = processor(text=captions, images=list(x), return_tensors="pt", padding=True)
    with torch.no_grad():
        out = model(**inputs)
    direct = 100 * (out.image_embeds * out.text_embeds).sum(-1).mean().item()
    assert unclamped == pytest.approx(direct, rel=1e-5)  # float32 features summed in another order
    assert direct > 0 and ours == pytest.approx(direct, rel=1e-5)


def test_key_names_the_folder(clip_folder, samples):
    from mlflow.utils.validation import _validate_metric_name

    metric = CLIPScore(TEACHER, cache=Cache(clip_folder.parent / "cache"), device=CPU, checkpoints=NO_CHECKPOINTS,
                       extractor=f"hf:{clip_folder}")
    _score(metric, *samples)
    (key,) = metric.compute()
    assert key == "clip.hf-tiny-clip"
    _validate_metric_name(key)


def test_name_under_checkpoints_folder(clip_folder, monkeypatch):
    checkpoints = clip_folder.parent
    monkeypatch.chdir(clip_folder.parent.parent)  # "tiny-clip" is not a path from here
    assert CLIPScore.check("hf:tiny-clip", checkpoints) is None
    assert clip_hf.key_name("hf:tiny-clip") == "hf-tiny-clip"


def test_missing_folder_is_one_line_naming_file_and_option(tmp_path):
    missing = tmp_path / "clip-vit-base-patch16"
    for call in (lambda: CLIPScore.check(f"hf:{missing}", NO_CHECKPOINTS),
                 lambda: CLIPScore(TEACHER, cache=Cache(tmp_path), device=CPU, checkpoints=NO_CHECKPOINTS,
                                   extractor=f"hf:{missing}")):
        with pytest.raises(UserError) as info:
            call()
        message = str(info.value)
        assert "\n" not in message and str(missing / "config.json") in message and "--checkpoints" in message


def test_not_a_clip_folder_and_unknown_choice(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "gpt2"}')
    (tmp_path / "tokenizer_config.json").write_text("{}")
    with pytest.raises(UserError, match="model_type is 'gpt2', expected 'clip'"):
        CLIPScore.check(f"hf:{tmp_path}", NO_CHECKPOINTS)
    with pytest.raises(UserError, match=r"unknown open_clip architecture .*ViT-B-16.*clip@hf:<folder>"):
        CLIPScore.check("ViT-B-61", NO_CHECKPOINTS)
    with pytest.raises(UserError, match="name the folder"):
        CLIPScore.check("hf:", NO_CHECKPOINTS)
