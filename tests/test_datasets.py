"""Image datasets: the Fashion-MNIST IDX reader (on a synthetic directory and, when installed, the real one), captions,
the Fashion-MNIST teachers and classifier."""
from __future__ import annotations

import gzip
import re
import struct
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from core.cache import PROJECT_ZOO, Cache, ModelZoo
from core.errors import UserError
from core.registry import TEACHERS
from metrics.extractors import ClassifierRecipe, classifier_recipe, load_classifier
from teachers.data import images as datasets
from teachers.tiny.registered import FashionARText
from teachers.data.images import FASHION_DIR, FASHION_ENV, FASHION_FILES, caption_table, load_image_dataset
from teachers.families.ar_token import SamplingConfig, sample_ar
from teachers.tiny.image_ar import CaptionVocab

CPU = torch.device("cpu")
SIZES = {"train": 40, "test": 20}
REAL = Path(FASHION_DIR)
needs_real = pytest.mark.skipif(not all((REAL / f).is_file() for files in FASHION_FILES.values() for f in files),
                                reason=f"Fashion-MNIST is not installed in {REAL} "
                                       "(apt-get install dataset-fashion-mnist)")


def _write_idx(path: Path, array: torch.Tensor) -> None:
    header = bytes((0, 0, 8, array.dim())) + struct.pack(f">{array.dim()}I", *array.shape)
    path.write_bytes(gzip.compress(header + array.numpy().tobytes()))


@pytest.fixture(scope="module")
def fake_dir(tmp_path_factory) -> tuple[Path, dict[str, tuple[torch.Tensor, torch.Tensor]]]:
    """A Fashion-MNIST directory of random 28x28 images, every class in both splits, and what it holds."""
    root = tmp_path_factory.mktemp("fashion")
    g = torch.Generator().manual_seed(0)
    content = {}
    for split, n in SIZES.items():
        images = torch.randint(256, (n, 28, 28), generator=g, dtype=torch.uint8)
        labels = (torch.arange(n) % 10).to(torch.uint8)
        for name, array in zip(FASHION_FILES[split], (images, labels)):
            _write_idx(root / name, array)
        content[split] = images, labels
    return root, content


@pytest.fixture()
def fake_fashion(fake_dir, monkeypatch):
    monkeypatch.setenv(FASHION_ENV, str(fake_dir[0]))
    return fake_dir[1]


@pytest.mark.parametrize("split", ["train", "test"])
def test_reads_the_idx_files_the_variable_points_at(fake_fashion, split):
    images, labels = fake_fashion[split]
    data = load_image_dataset("fashion-mnist", split, 28)
    assert data.images.dtype == torch.float32 and data.images.shape == (SIZES[split], 1, 28, 28)
    assert torch.equal(data.images, images.unsqueeze(1).float() / 255)
    assert data.labels.dtype == torch.long and torch.equal(data.labels, labels.long())
    assert len(data.class_names) == 10 and data.name == "fashion-mnist"


def test_resizes_bilinearly_like_digits(fake_fashion):
    full = load_image_dataset("fashion-mnist", "train", 28).images
    small = load_image_dataset("fashion-mnist", "train", 16).images
    expected = F.interpolate(full, size=(16, 16), mode="bilinear", align_corners=False).clamp(0, 1)
    assert torch.equal(small, expected)


def test_decodes_each_split_once(fake_fashion, monkeypatch):
    first = load_image_dataset("fashion-mnist", "test", 28)
    monkeypatch.setattr(datasets, "_read_idx", lambda *a, **k: pytest.fail("decoded the files again"))
    again = load_image_dataset("fashion-mnist", "test", 28)
    assert torch.equal(again.images, first.images)
    again.images.zero_()  # a caller may write into its copy without corrupting the next load
    assert torch.equal(load_image_dataset("fashion-mnist", "test", 28).images, first.images)


def test_missing_directory_says_how_to_get_the_data(tmp_path, monkeypatch):
    monkeypatch.setenv(FASHION_ENV, str(tmp_path / "nowhere"))
    with pytest.raises(UserError) as e:
        load_image_dataset("fashion-mnist", "train", 28)
    message = str(e.value)
    assert "\n" not in message
    for part in (str(tmp_path / "nowhere"), "apt-get install dataset-fashion-mnist", FASHION_ENV,
                 *FASHION_FILES["train"], *FASHION_FILES["test"]):
        assert part in message


def test_a_file_that_is_not_idx_is_a_user_error(fake_dir, tmp_path, monkeypatch):
    for name in FASHION_FILES["test"]:
        (tmp_path / name).write_bytes((fake_dir[0] / name).read_bytes())
    (tmp_path / FASHION_FILES["test"][1]).write_bytes(gzip.compress(b"\0\0\x08\x03" + bytes(8)))  # 3-d labels
    monkeypatch.setenv(FASHION_ENV, str(tmp_path))
    with pytest.raises(UserError, match="not an IDX file of 1-dimensional unsigned bytes"):
        load_image_dataset("fashion-mnist", "test", 28)


def test_captions_use_the_right_article():
    table = caption_table("fashion-mnist")
    assert len(table) == 10 and {len(row) for row in table} == {4}
    assert table[9][0] == "a photo of an ankle boot" and table[0][0] == "a photo of a t-shirt/top"
    for caption in (c for row in table for c in row):
        assert not re.search(r"\ba [aeiou]|\ban [^aeiou]", caption), caption
    assert caption_table("digits")[7] == ["a handwritten seven", "the digit seven", "a drawing of the number seven",
                                          "a seven written by hand"]


def test_dataset_captions_match_the_table(fake_fashion):
    data = load_image_dataset("fashion-mnist", "test", 28)
    assert [[data.caption(c, t) for t in range(4)] for c in range(10)] == caption_table("fashion-mnist")


def test_text_teacher_captions_fit_its_prefix():
    captions = [c for row in caption_table("fashion-mnist") for c in row]
    assert max(map(len, CaptionVocab.bpe(captions))) <= FashionARText.recipe.caption_len


@pytest.mark.parametrize("name", ["fashion-ar-c2i", "fashion-ar-t2i"])
def test_fashion_teacher_trains_and_samples(name, fake_fashion, tiny_recipe, tmp_path):
    teacher = TEACHERS.get(name).load(name, cache=Cache(tmp_path), device=CPU)
    assert teacher.seq_len == 49 and teacher.grid == (7, 7)
    conditions = teacher.cond_table.flatten(0, 1)
    assert len(conditions.unique(dim=0)) == len(conditions)  # every caption (or class) is its own condition
    g = torch.Generator().manual_seed(0)
    cond = teacher.conditions(3, g)
    samples = sample_ar(teacher, cond, SamplingConfig(cfg=2.0), generator=g)
    assert samples.data.shape == (3, 49) and int(samples.data.max()) < teacher.vocab_size
    images = teacher.decode(samples.data)
    assert images.shape == (3, 1, 28, 28) and 0 <= images.min() and images.max() <= 1
    assert set(teacher.captions(cond)) <= {c for row in caption_table("fashion-mnist") for c in row}


def test_digits_classifier_recipe_is_unchanged():
    assert classifier_recipe("digits", 16) == ClassifierRecipe(dataset="digits", image_size=16)


@needs_real
def test_real_fashion_mnist(monkeypatch):
    monkeypatch.delenv(FASHION_ENV, raising=False)
    for split, n in (("train", 60000), ("test", 10000)):
        data = load_image_dataset("fashion-mnist", split, 28)
        assert data.images.shape == (n, 1, 28, 28) and data.labels.shape == (n,)
        assert data.images.min() == 0 and data.images.max() == 1
        assert data.labels.bincount().tolist() == [n // 10] * 10


@needs_real
def test_real_fashion_mnist_classifier(monkeypatch, tmp_path):
    """The classifier of the current recipe, from the model zoo (it trains for a minute: `bench.zoo_build`
    ZOO_EXTRACTORS), classifies the real test split as its training measured: 0.899 (3 epochs)."""
    monkeypatch.delenv(FASHION_ENV, raising=False)
    zoo = Cache(tmp_path, zoo=ModelZoo(PROJECT_ZOO))  # the tests' caches have none (conftest)
    classifier = load_classifier("fashion-mnist", 28, cache=zoo, device=CPU)
    assert classifier.name == "fashion-mnist-cnn" and classifier.info["cached"]  # the zoo's, not trained here
    assert classifier.test_accuracy >= 0.88
    test = load_image_dataset("fashion-mnist", "test", 28)
    with torch.inference_mode():
        accuracy = torch.cat([classifier.logits(test.images[i : i + 2000]).argmax(-1)
                              for i in range(0, len(test.images), 2000)]).eq(test.labels).float().mean().item()
    assert accuracy == pytest.approx(classifier.test_accuracy, abs=1e-4)
