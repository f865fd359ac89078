"""`fid@pytorch-fid` (FID as the SJD and DD releases computed it: the pytorch-fid package's network, torch's resize, its
statistics and distance), DD's reference-statistic file, and the inception score's ADM splits (`is@...:adm-splits`).

The weights are random, in the release's own layout: the state dict of pytorch-fid's own `fid_inception_v3()` network,
saved as torch.hub would hold the downloaded file. Nothing may download: torch.hub's downloader fails every test here.
The full network on 299 x 299 takes ~0.1 s an image on a CPU, and the square root of a 2048 x 2048 matrix that the
distance takes ~15 s: 4 + 4 images of 16 x 16 digits, two such distances in all (theirs, computed once, and ours); the
broken variant's is the same distance taken through 4 x 4 matrices (`frechet_of_few`).
"""
from __future__ import annotations

import zipfile
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import numpy as np
import pytest
import torch
from PIL import Image

from core import files
from core.cache import Cache
from core.errors import UserError
from metrics import features, inception, inception_pytorch_fid
from metrics.features import NAMED_REFERENCES
from metrics.fid import FID
from metrics.inception_pytorch_fid import WEIGHTS, PytorchFidExtractor
from metrics.inception_score import ADM_SPLIT_SIZE, InceptionScore

CPU = torch.device("cpu")
N = 4  # images a side
COCO = SimpleNamespace(reference_images=("val2017", "coco2017-val"))  # SJD's text-to-image teachers' reference


@pytest.fixture(scope="module", autouse=True)
def no_download():
    """For the whole module, so that the networks its module-scoped fixtures build cannot download either."""
    def refuse(url, *args, **kwargs):
        raise AssertionError(f"tried to download {url}")

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(torch.hub, "download_url_to_file", refuse)
        yield


@pytest.fixture(scope="module", autouse=True)
def one_blas_thread():
    """scipy's square root on one BLAS thread, as torch runs here (conftest's `one_thread`): beside another busy
    process on the 2 cores, OpenBLAS's two threads spun, and one square root took 61 s of CPU time against 17 s."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(1, user_api="blas"):
        yield


@pytest.fixture(scope="module")
def weights(tmp_path_factory) -> Path:
    """`pt_inception-2015-12-05-6726825d.pth` with random weights, written from pytorch-fid's own `fid_inception_v3()`
    (its download and its load of the downloaded state dict skipped, so the network keeps its initial weights; the
    convolutions re-drawn at He scale, so that pool3 is not vanishingly small dozens of layers down)."""
    import pytorch_fid.inception as pfi
    import torchvision

    with (mock.patch.object(pfi, "load_state_dict_from_url", lambda *args, **kwargs: None),
          mock.patch.object(torchvision.models.Inception3, "load_state_dict", lambda self, state: None),
          torch.random.fork_rng()):
        torch.manual_seed(0)
        net = pfi.fid_inception_v3()
        for module in net.modules():
            if isinstance(module, torch.nn.Conv2d):
                torch.nn.init.kaiming_normal_(module.weight, nonlinearity="relu")
    path = tmp_path_factory.mktemp("hub") / WEIGHTS
    torch.save(net.state_dict(), path)
    return path


@pytest.fixture(scope="module")
def pictures(tmp_path_factory) -> tuple[Path, torch.Tensor, Path]:
    """A checkpoints folder whose `val2017/` holds N real digits as RGB PNGs; N other digits as float images (the
    generated side) and the folder of their PNGs, as a sampler of the releases saves them."""
    from teachers.data.images import load_image_dataset

    digits = load_image_dataset("digits", "test", 16).images  # (n, 1, 16, 16) in [0, 1]
    g = torch.Generator().manual_seed(0)
    real, fake = digits[torch.randperm(len(digits), generator=g)[: 2 * N]].split(N)
    fake = fake * 0.9 + 0.03  # off the 8-bit grid: the rounding is part of the protocol
    root = tmp_path_factory.mktemp("pictures")
    for name, batch in (("checkpoints/val2017", real), ("fake", fake)):
        (root / name).mkdir(parents=True)
        for i, image in enumerate(inception.to_uint8(batch)):  # (3, 16, 16) uint8
            Image.fromarray(image.permute(1, 2, 0).numpy()).save(root / name / f"{i:012d}.png")
    return root / "checkpoints", fake, root / "fake"


def pytorch_fids_own(weights: Path, real: Path, fake: Path) -> list[tuple[np.ndarray, np.ndarray]]:
    """pytorch-fid's statistics of the two folders, by the steps of its `calculate_fid_given_paths` (fid_score.py:
    249-266, SJD's call, evaluation_metrics.py:185-191): its network loading the weights from torch.hub's folder, where
    its download would have put them, its statistics of each folder's PNGs (`their_fid` is its last step, the
    distance)."""
    from pytorch_fid.fid_score import compute_statistics_of_path
    from pytorch_fid.inception import InceptionV3

    previous = torch.hub.get_dir()
    hub = weights.parent / "torch-hub"
    (hub / "checkpoints").mkdir(parents=True, exist_ok=True)
    if not (hub / "checkpoints" / WEIGHTS).exists():
        (hub / "checkpoints" / WEIGHTS).symlink_to(weights)
    torch.hub.set_dir(str(hub))
    try:
        with torch.random.fork_rng():
            model = InceptionV3([InceptionV3.BLOCK_INDEX_BY_DIM[2048]])
    finally:
        torch.hub.set_dir(previous)
    return [compute_statistics_of_path(str(folder), model, N, 2048, "cpu", num_workers=0) for folder in (real, fake)]


def ours(pictures, cache: Path) -> FID:
    """fid@pytorch-fid against the real folder (SJD's protocol), updated with the generated side."""
    checkpoints, fake, _ = pictures
    assert FID.check("pytorch-fid", checkpoints) is None
    fid = FID(COCO, cache=Cache(cache), device=CPU, checkpoints=checkpoints, extractor="pytorch-fid")
    fid.update(fake, None)
    return fid


# Computed once for the tests below, each distance's square root of a 2048 x 2048 matrix (~15 s) in one test: the
# broken variant's test takes pytorch-fid's, the parity test ours.
@pytest.fixture(scope="module")
def their_statistics(weights, pictures) -> list[tuple[np.ndarray, np.ndarray]]:
    checkpoints, _, fake_folder = pictures
    return pytorch_fids_own(weights, checkpoints / "val2017", fake_folder)


@pytest.fixture(scope="module")
def their_fid(their_statistics) -> float:
    """pytorch-fid's own FID of the two folders: its distance of the two statistics, the real side first."""
    from pytorch_fid.fid_score import calculate_frechet_distance

    return float(calculate_frechet_distance(*their_statistics[0], *their_statistics[1]))


@pytest.fixture(scope="module")
def good(weights, pictures, tmp_path_factory) -> FID:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(inception_pytorch_fid.ENV, str(weights))
        return ours(pictures, tmp_path_factory.mktemp("good"))


def frechet_of_few(reference: dict, features: torch.Tensor) -> float:
    """The Frechet distance between `reference` statistics and those of n feature rows, without the 2048 x 2048 square
    root: with B the centred rows, the generated covariance is B'B / (n - 1), and the nonzero eigenvalues of
    sigma_ref B'B / (n - 1) are those of the n x n matrix B sigma_ref B' / (n - 1), so tr sqrtm(sigma_ref sigma_gen) is
    the sum of their square roots."""
    x = features.double().numpy()
    mu, b = x.mean(0), x - x.mean(0)
    cross = np.linalg.eigvalsh(b @ reference["sigma"] @ b.T / (len(x) - 1))
    return float(((reference["mu"] - mu) ** 2).sum() + np.trace(reference["sigma"]) + (b ** 2).sum() / (len(x) - 1)
                 - 2 * np.sqrt(cross.clip(0)).sum())


def tf1_resize_features(self, images: torch.Tensor) -> torch.Tensor:
    """The broken variant: ADM's TF 1.x resize (`inception.resize`) of the 8-bit images in place of torch's."""
    self.net.resize_input = False
    return self.net(inception.resize(inception.to_uint8(images)) / 255)[0][:, :, 0, 0]


def relative(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def test_each_sides_statistics_are_pytorch_fids_own(good, their_statistics):
    """fid@pytorch-fid against a folder of real images (SJD's protocol): each side's statistics are pytorch-fid's own
    of the two folders of PNGs, to 1e-5 relative (measured 2e-6)."""
    real_stats, fake_stats = their_statistics
    # float32 features: the real side runs one image a pass (`folder_statistics`), pytorch-fid's a batch of 4
    for stats, (mu, sigma) in ((good._stats, real_stats), (FID._statistics(good.generated()), fake_stats)):
        assert relative(stats["mu"], mu) < 1e-5 and relative(stats["sigma"], sigma) < 1e-5


def test_adms_resize_in_place_of_torchs_is_caught(weights, pictures, good, their_statistics, their_fid, tmp_path,
                                                  monkeypatch):
    """The broken variant: ADM's resize in place of torch's moves both sides' means by 1.4-1.5 %, a hundred times the
    statistics' tolerance above, and the FID beyond its tolerance below (measured: 7.848 against pytorch-fid's 8.221).
    The distances here are `frechet_of_few`'s, which gives pytorch-fid's own on the correct features to 1e-5 (measured
    5e-7: the square root of the singular 2048 x 2048 product is that inexact)."""
    real_stats, fake_stats = their_statistics
    assert frechet_of_few(good._stats, good.generated()) == pytest.approx(their_fid, rel=1e-5)
    monkeypatch.setenv(inception_pytorch_fid.ENV, str(weights))
    monkeypatch.setattr(PytorchFidExtractor, "features", tf1_resize_features)
    broken = ours(pictures, tmp_path)
    for stats, (mu, _) in ((broken._stats, real_stats), (FID._statistics(broken.generated()), fake_stats)):
        print(f"ADM's resize moves the mean by {relative(stats['mu'], mu):.2%}")
        assert relative(stats["mu"], mu) > 1e-3
    distance = frechet_of_few(broken._stats, broken.generated())
    print(f"FID under ADM's resize {distance}, pytorch-fid's own {their_fid}")
    assert distance != pytest.approx(their_fid, rel=1e-3)


def test_fid_equals_pytorch_fids_own_on_the_same_images_and_weights(good, their_fid):
    """fid@pytorch-fid against a folder of real images (SJD's protocol) is pytorch-fid's own FID of the two folders
    of PNGs, to 1e-6 relative (measured 1e-7)."""
    got = good.compute()
    print(f"FID of {N} + {N} digits: pytorch-fid's own {their_fid!r}, ours {got}")
    assert got == {"fid.pytorch-fid.coco2017-val": pytest.approx(their_fid, rel=1e-6)}


def test_the_network_is_pytorch_fids_own_and_nothing_downloads(weights):
    """The extractor's network is the package's `InceptionV3` holding the file's tensors; the global RNG and
    torch.hub's folder are left as they were."""
    from pytorch_fid.inception import FID_WEIGHTS_URL, InceptionV3

    assert FID_WEIGHTS_URL.rsplit("/", 1)[1] == WEIGHTS
    hub, state = torch.hub.get_dir(), torch.random.get_rng_state()
    extractor = PytorchFidExtractor(weights)
    assert torch.hub.get_dir() == hub and torch.equal(torch.random.get_rng_state(), state)
    assert isinstance(extractor.net, InceptionV3) and extractor.net.resize_input and extractor.net.normalize_input
    saved = torch.load(weights)
    loaded = extractor.net.blocks[0][0].conv.weight
    assert torch.equal(loaded, saved["Conv2d_1a_3x3.conv.weight"])
    assert extractor.name == "pytorch-fid" and extractor.num_classes is None and len(extractor.fingerprint) == 20


def test_a_missing_or_broken_weights_file_is_one_line_naming_it_and_the_option(tmp_path, monkeypatch):
    monkeypatch.delenv(inception_pytorch_fid.ENV, raising=False)
    with pytest.raises(UserError) as missing:
        FID.check("pytorch-fid", tmp_path)
    message = str(missing.value)
    assert "\n" not in message and message.startswith(f"missing {tmp_path / WEIGHTS}: ")
    assert "--checkpoints" in message and inception_pytorch_fid.ENV in message
    with files.audit() as needed:  # a dry run lists it instead
        FID.check("pytorch-fid", tmp_path)
    assert needed == [files.Needed(tmp_path / WEIGHTS, False)]
    monkeypatch.setenv(inception_pytorch_fid.ENV, str(tmp_path / "nope.pth"))
    with pytest.raises(UserError, match=f"^missing {tmp_path / 'nope.pth'}: .*{inception_pytorch_fid.ENV}"):
        FID.check("pytorch-fid", tmp_path)
    (tmp_path / "nope.pth").write_bytes(b"\x00" * 100)  # not a checkpoint
    with pytest.raises(UserError, match=f"^{tmp_path / 'nope.pth'}: not a PyTorch checkpoint"):
        FID.check("pytorch-fid", tmp_path)
    torch.save({"fc.weight": torch.zeros(2, 2)}, tmp_path / "nope.pth")  # the state dict of another network
    with pytest.raises(UserError) as other:
        PytorchFidExtractor(tmp_path / "nope.pth")
    assert "\n" not in str(other.value) and "not pytorch-fid's FID Inception weights (" in str(other.value)
    with pytest.raises(UserError, match="pytorch-fid's network ends at pool3: use is@inception"):
        InceptionScore.check("pytorch-fid", tmp_path)


def dd_statistic(path: Path, mu: np.ndarray, sigma: np.ndarray, *, numpy1: bool = False) -> None:
    """A statistic.pth as DD's fid_score.py:302 writes it, `torch.save({"m": m, "s": s})` of numpy arrays; `numpy1`:
    as numpy 1.x pickles the arrays (module `numpy.core.multiarray`, the authors' likely numpy)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"m": mu, "s": sigma}, path)
    if numpy1:
        with zipfile.ZipFile(path) as archive:
            entries = [(info, archive.read(info)) for info in archive.infolist()]
        with zipfile.ZipFile(path, "w") as archive:
            for info, data in entries:
                if info.filename.endswith("data.pkl"):
                    data = data.replace(b"numpy._core.multiarray\n", b"numpy.core.multiarray\n")
                archive.writestr(info, data)


@pytest.mark.parametrize("numpy1", [False, True])
def test_dds_reference_statistic_is_read_and_named_in_the_key(weights, tmp_path, monkeypatch, numpy1):
    rng = np.random.default_rng(0)
    acts = rng.normal(size=(10, 2048)).astype(np.float32)
    mu, sigma = np.mean(acts, axis=0), np.cov(acts, rowvar=False)  # fid_score.py:257-258: float32, float64
    path = tmp_path / NAMED_REFERENCES["dd-in256"].file
    dd_statistic(path, mu, sigma, numpy1=numpy1)
    monkeypatch.setenv(inception_pytorch_fid.ENV, str(weights))
    FID.check_teacher("var-d16", SimpleNamespace(reference_statistics=("VIRTUAL_imagenet256_labeled.npz", "adm-in256")),
                      "pytorch-fid:dd-in256", tmp_path)  # the named file is there; ADM's is not needed
    fid = FID(SimpleNamespace(), cache=Cache(tmp_path / "cache"), device=CPU, checkpoints=tmp_path,
              extractor="pytorch-fid:dd-in256")
    assert fid.key() == "fid.pytorch-fid.dd-in256"
    assert fid._stats["mu"].dtype == np.float64 and np.array_equal(fid._stats["mu"], mu.astype(np.float64))
    assert np.array_equal(fid._stats["sigma"], sigma)


def test_named_references_and_protocols_are_checked_in_one_line(tmp_path):
    adm = SimpleNamespace(reference_statistics=("VIRTUAL_imagenet256_labeled.npz", "adm-in256"))
    with pytest.raises(UserError, match=r"^metric 'fid@pytorch-fid:nope': unknown reference 'nope'; valid: dd-in256$"):
        FID.check("pytorch-fid:nope", tmp_path)
    with pytest.raises(UserError, match="computed by pytorch-fid, and compare only in its features: "
                                        "fid@pytorch-fid:dd-in256$"):
        FID.check("inception:dd-in256", tmp_path)
    with pytest.raises(UserError, match="write the extractor and the option around ':'"):
        FID.check("pytorch-fid:", tmp_path)
    with pytest.raises(UserError, match="VIRTUAL_imagenet256_labeled.npz are ADM's evaluator's .* "
                                        "fid@pytorch-fid:dd-in256$"):
        FID.check_teacher("var-d16", adm, "pytorch-fid", tmp_path)
    with pytest.raises(UserError, match=f"^missing {tmp_path / NAMED_REFERENCES['dd-in256'].file}: "
                                        f"fid@pytorch-fid:dd-in256 compares with DD's own"):
        FID.check_teacher("var-d16", adm, "pytorch-fid:dd-in256", tmp_path)
    path = tmp_path / NAMED_REFERENCES["dd-in256"].file
    path.parent.mkdir()
    torch.save({"mu": np.zeros(3)}, path)
    with pytest.raises(UserError, match=r"not a statistic file of DD's fid_score.py .*; it holds 'mu'$"):
        features.read_statistics(path)
    dd_statistic(path, np.zeros(3), np.eye(2))
    with pytest.raises(UserError, match=r"a mean \(3,\) and a covariance \(2, 2\) that do not go together$"):
        features.read_statistics(path)


# ---- the inception score's ADM splits -------------------------------------------------------------------------------

def adm_by_hand(logits: np.ndarray) -> float:
    """ADM's evaluator.py:186-192 on the softmax of the logits, written out."""
    preds = np.exp(logits - logits.max(1, keepdims=True))
    preds /= preds.sum(1, keepdims=True)
    scores = []
    for i in range(0, len(preds), 5000):
        part = preds[i : i + 5000]
        kl = part * (np.log(part) - np.log(np.expand_dims(np.mean(part, 0), 0)))
        scores.append(np.exp(np.mean(np.sum(kl, 1))))
    return float(np.mean(scores))


def test_adm_splits_are_contiguous_splits_of_5000(cache, classifier, images):
    """12,240 digits in class order: ADM's contiguous splits of 5,000 (two whole, one of 2,240) each see a few classes
    and score low; torchmetrics' random splits each see all ten."""
    digits = images["test"]  # (360, 1, 16, 16)
    order = classifier.logits(digits).argmax(1).argsort(stable=True)
    x = digits[order].repeat_interleave(34, dim=0)  # (12240, 1, 16, 16), class by class
    teacher = SimpleNamespace(dataset_name="digits", image_size=16)
    adm = InceptionScore(teacher, cache=cache, device=CPU, checkpoints=Path("/nonexistent"), extractor="cnn:adm-splits")
    random = InceptionScore(teacher, cache=cache, device=CPU, checkpoints=Path("/nonexistent"), extractor="cnn")
    for metric in (adm, random):
        for batch in x.split(1000):
            metric.update(batch, None)
    assert len(x) // ADM_SPLIT_SIZE == 2 and not adm.stochastic and random.stochastic
    ours = adm.compute(seed=3)
    expected = adm_by_hand(adm.generated().double().numpy())
    assert ours == {"is.digits-cnn.adm-splits": pytest.approx(expected, rel=1e-12)}
    assert adm.compute(seed=4) == ours  # no randomness
    theirs = random.compute()["is.digits-cnn"]
    print(f"IS of 12,240 digits in class order: ADM's splits {expected:.4f}, random splits {theirs:.4f}")
    assert theirs > 1.5 * expected
    with pytest.raises(UserError, match=r"unknown mode 'nope'; valid: adm-splits \(or none"):
        InceptionScore.check("inception:nope", Path("/nonexistent"))
