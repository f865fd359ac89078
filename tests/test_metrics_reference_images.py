"""fid@inception of a text-to-image teacher against a folder of real images (`reference_images`: COCO's `val2017/`, the
SJD paper's protocol): the folder's statistics equal torchmetrics' on the same files under the same extractor, are
cached under the files' identities, the key names the reference, and a missing or empty folder is refused in one line.

The extractor is `InceptionExtractor` (the TF 1.x resize of 8-bit images) on a small random TorchScript network in
place of default_1.pt, so the test needs no weights and takes seconds."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from core import files
from core.cache import Cache
from core.errors import UserError
from metrics import features, inception
from metrics.fid import FID
from teachers.families import ar_token
from tests.fakes import NO_CHECKPOINTS, TinyEmu3, tiny_emu3_teacher

CPU = torch.device("cpu")
KEY = "fid.inception-v3-tf1.coco2017-val"
DIM = 64
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated")


class RandomFeatures(torch.nn.Module):
    """Stands in for the TorchScript Inception: random features of the (B, 3, 299, 299) input, 64 of them (the
    square root of a 2048 x 2048 covariance takes seconds)."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 9, stride=8)
        self.head = torch.nn.Linear(8 * 16, DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.nn.functional.adaptive_avg_pool2d(torch.tanh(self.conv(x)), 4)  # (B, 8, 4, 4)
        return self.head(h.flatten(1))


@pytest.fixture()
def checkpoints(tmp_path, monkeypatch):
    """A checkpoints folder with `val2017/`: RGB and grey images of several sizes (PNG and JPEG) and a non-image
    file; the random extractor named by ACCELBENCH_INCEPTION_WEIGHTS."""
    with torch.random.fork_rng():
        torch.manual_seed(0)
        torch.jit.script(RandomFeatures()).save(str(tmp_path / "random.pt"))
    monkeypatch.setenv(inception.ENV, str(tmp_path / "random.pt"))
    folder = tmp_path / "val2017"
    folder.mkdir()
    rng = np.random.default_rng(0)
    for i, (h, w) in enumerate([(8, 12), (12, 8), (10, 14), (8, 12), (16, 16)]):
        pixels = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        if i % 2:
            Image.fromarray(pixels[..., 0]).save(folder / f"{i:012d}.jpg", quality=90)  # grey, as some of COCO's
        else:
            Image.fromarray(pixels).save(folder / f"{i:012d}.png")
    (folder / "LICENSE.txt").write_text("not an image")
    return tmp_path


@pytest.fixture(scope="module")
def generated():
    """Four 8 x 12 images of the tiny Emu3 teacher (its own sampler), and the teacher."""
    teacher = tiny_emu3_teacher()
    cond = teacher.conditions(4, torch.Generator().manual_seed(0))
    samples = ar_token.sample_ar(teacher, cond, ar_token.SamplingConfig(), generator=torch.Generator().manual_seed(1))
    return teacher, teacher.decode(samples.data)


class TorchmetricsInput(torch.nn.Module):
    """torchmetrics' `feature=` module: the extractor on the uint8 images torchmetrics is given."""

    def __init__(self, extractor):
        super().__init__()
        self.extractor = extractor
        self.num_features = DIM

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.extractor.features(images.float() / 255).double()


def test_statistics_and_fid_equal_torchmetrics_on_the_same_files(checkpoints, generated, tmp_path):
    """torch-fidelity's loader reads the folder's files (PIL, RGB, uint8); torchmetrics' FID accumulates their
    features under the same extractor: its mean and covariance are our cached statistics, its FID ours."""
    from torch_fidelity.datasets import ImagesPathDataset
    from torchmetrics.image.fid import FrechetInceptionDistance

    teacher, images = generated
    fid = FID(teacher, cache=Cache(tmp_path / "cache"), device=CPU, checkpoints=checkpoints, extractor="inception")
    fid.update(images, None)
    ours = fid.compute()

    paths = sorted((checkpoints / "val2017").glob("*.*g"))
    assert [p.name for p in features.image_files(checkpoints / "val2017")] == [p.name for p in paths]
    theirs = FrechetInceptionDistance(feature=TorchmetricsInput(fid.model))
    for image in ImagesPathDataset([str(p) for p in paths]):  # (3, H, W) uint8, one size each
        theirs.update(image[None], real=True)
    theirs.update(inception.to_uint8(images), real=False)
    n = int(theirs.real_features_num_samples)
    mean = theirs.real_features_sum / n
    cov = (theirs.real_features_cov_sum - n * torch.outer(mean, mean)) / (n - 1)
    assert n == 5
    np.testing.assert_allclose(fid._stats["mu"], mean.numpy(), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(fid._stats["sigma"], cov.numpy(), rtol=1e-9, atol=1e-12)
    # 5 + 4 images in 64 dimensions: singular covariances, whose square root torch-fidelity takes by scipy's sqrtm
    # and torchmetrics by eigenvalues (measured 1.4e-9 relative apart).
    assert ours == {KEY: pytest.approx(float(theirs.compute()), rel=1e-6)}


def test_statistics_are_cached_by_the_files_and_the_extractor(checkpoints, generated, tmp_path, monkeypatch):
    teacher, images = generated
    cache = Cache(tmp_path / "cache")
    opened, open_image = [], Image.open

    def counting_open(*args, **kwargs):
        opened.append(args[0])
        return open_image(*args, **kwargs)

    monkeypatch.setattr(Image, "open", counting_open)
    first = FID(teacher, cache=cache, device=CPU, checkpoints=checkpoints, extractor="inception")
    assert len(opened) == 5 and len(list((tmp_path / "cache" / "reference").glob("*.pt"))) == 1
    # a second trial: read back, no image opened
    again = FID(teacher, cache=cache, device=CPU, checkpoints=checkpoints, extractor="inception")
    assert len(opened) == 5
    for stat in ("mu", "sigma"):
        np.testing.assert_array_equal(again._stats[stat], first._stats[stat])
    for metric in (first, again):
        metric.update(images, None)
    assert again.compute() == first.compute() and list(first.compute()) == [KEY]
    # A changed folder (one image more) is another entry, computed from every image again.
    Image.fromarray(np.zeros((8, 12, 3), np.uint8)).save(checkpoints / "val2017" / "000000000099.png")
    FID(teacher, cache=cache, device=CPU, checkpoints=checkpoints, extractor="inception")
    assert len(opened) == 5 + 6 and len(list((tmp_path / "cache" / "reference").glob("*.pt"))) == 2


def test_a_missing_or_empty_folder_is_refused_in_one_line_before_any_work(checkpoints):
    folder = checkpoints / "val2017"
    FID.check_teacher("tiny-emu3", TinyEmu3, "inception", checkpoints)  # present: accepted
    for p in folder.iterdir():
        if p.suffix != ".txt":
            p.unlink()
    with pytest.raises(UserError) as empty:
        FID.check_teacher("tiny-emu3", TinyEmu3, "inception", checkpoints)
    for p in folder.iterdir():
        p.unlink()
    folder.rmdir()
    with pytest.raises(UserError) as missing:
        FID.check_teacher("tiny-emu3", TinyEmu3, "inception", checkpoints)
    for refusal, start in ((empty, f"{folder} holds no images: "), (missing, f"missing {folder}: ")):
        message = str(refusal.value)
        assert "\n" not in message and message.startswith(start) and "--checkpoints" in message
        assert "fid@inception on teacher 'tiny-emu3' compares with the real images of val2017/" in message
    with files.audit() as needed:  # a dry run lists the folder as missing instead
        FID.check_teacher("tiny-emu3", TinyEmu3, "inception", checkpoints)
    assert needed == [files.Needed(folder, False)]


def test_other_image_metrics_on_the_folder_are_refused():
    from metrics.kid import KID

    with pytest.raises(UserError, match=r"kid@inception compares with real images; .* \(fid@inception against its "
                                        r"real images val2017/, text-image metrics"):
        KID.check_teacher("tiny-emu3", TinyEmu3, "inception", NO_CHECKPOINTS)
    with pytest.raises(UserError, match="on it, image metrics are @inception against val2017, e.g. fid@inception"):
        FID.check_teacher("tiny-emu3", TinyEmu3, None, NO_CHECKPOINTS)
