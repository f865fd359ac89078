"""The official DiT checkpoints load into our DiT (teachers/pretrained/dit.py), proved without the weights: a golden
parity fixture made with the official code (tests/fixtures/dit/MAKING.md) and the full-size key sets."""
import json
from pathlib import Path

import pytest
import torch

from core.errors import UserError
from teachers.networks.dit import DiT, DiTConfig
from teachers.pretrained import dit as real_dit

FIXTURES = Path(__file__).parent / "fixtures" / "dit"


def tiny_config(fixture: dict, **overrides) -> DiTConfig:
    c = fixture["config"]
    assert c["class_dropout_prob"] > 0 and c["mlp_ratio"] == 4.0  # the null class exists; our MLP is 4x wide
    return DiTConfig(**{"image_size": c["input_size"], "channels": c["in_channels"], "patch": c["patch_size"],
                        "n_classes": c["num_classes"], "hidden": c["hidden_size"], "depth": c["depth"],
                        "heads": c["num_heads"], "learn_sigma": c["learn_sigma"], "pos_layout": "col-row",
                        **overrides})


@pytest.fixture(scope="module")
def fixture():
    return torch.load(FIXTURES / "dit_tiny_parity.pt", weights_only=True)


def test_official_dit_outputs_are_reproduced(fixture):
    model = real_dit.load_into(DiT(tiny_config(fixture)), fixture["state_dict"]).eval()
    with torch.no_grad():
        out = model(fixture["x"], fixture["t"], fixture["y"])  # (B, 2C, H, W): eps, then v
    assert out.shape == fixture["out"].shape == (3, 8, 8, 8)
    # 1e-4, not 1e-5: float32 sin/cos of t * f (up to 999 rad) round differently with the CPU's vector math library;
    # measured max |diff| on an AMD EPYC: 5.5e-6 at t = 0, 4.2e-5 at t = 417 and 999 (outputs up to 8.7). The broken
    # variants below are off by O(1).
    assert (out - fixture["out"]).abs().max() <= 1e-4


def test_our_tiny_teachers_position_layout_is_refused_and_would_not_match(fixture):
    """The broken variant: our tiny teachers' row-first positions. The loader refuses the file's table, and a model
    run with its own row-first table gives other outputs."""
    model = DiT(tiny_config(fixture, pos_layout="row-col")).eval()
    with pytest.raises(UserError, match="not the row-col sin-cos table"):
        real_dit.load_into(model, fixture["state_dict"])
    ours, _ = real_dit.convert_state_dict(fixture["state_dict"])
    model.load_state_dict(ours, strict=True)
    with torch.no_grad():
        out = model(fixture["x"], fixture["t"], fixture["y"])
    assert (out - fixture["out"]).abs().max() > 1e-2


@pytest.mark.parametrize("image_size", sorted(real_dit.CHECKPOINTS))
def test_full_size_key_sets_equal_the_official_checkpoints(image_size):
    """DiT-XL/2 at full size on the meta device: every official key, renamed, is one of ours with the official
    shape, and none is left over on either side, so a strict load of the real file cannot fail on names or shapes."""
    official = json.loads((FIXTURES / real_dit.CHECKPOINTS[image_size].replace(".pt", ".keys.json")).read_text())
    with torch.device("meta"):
        model = DiT(real_dit.xl2_config(image_size))
    ours = {k: list(v.shape) for k, v in model.state_dict().items()}
    renamed = {real_dit.official_name_to_ours(k): shape for k, shape in official["keys"].items() if k != "pos_embed"}
    assert renamed == ours
    assert official["keys"]["pos_embed"] == [1, *model.pos_embed.shape]
    n_params = sum(v.numel() for v in model.state_dict().values()) + model.pos_embed.numel()
    assert n_params == official["n_params"]


def test_a_file_of_another_size_or_kind_is_one_clear_error(fixture, tmp_path):
    with pytest.raises(UserError, match="does not fit"):
        real_dit.load_into(DiT(tiny_config(fixture, depth=3)), fixture["state_dict"])
    with pytest.raises(UserError, match="no 'pos_embed'"):
        real_dit.convert_state_dict({"x_embedder.proj.weight": torch.zeros(1)})


def test_checkpoint_files_raw_and_wrapped(fixture, tmp_path):
    """As released (a raw state dict) or as train.py saves it (the EMA weights beside "model", "opt" and an argparse
    "args" that plain `weights_only` loading refuses)."""
    import argparse

    from core.checkpoints import read_state_dict

    sd = fixture["state_dict"]
    torch.save(sd, tmp_path / "raw.pt")
    torch.save({"model": {}, "ema": sd, "opt": {}, "args": argparse.Namespace(model="DiT-XL/2")}, tmp_path / "train.pt")
    for name in ("raw.pt", "train.pt"):
        blob = read_state_dict(tmp_path / name, ("ema", "model"))
        assert blob.keys() == sd.keys() and all(torch.equal(blob[k], sd[k]) for k in sd)


FAST = {"ddim": ["steps=8"],
        **{m: ["steps=8", "n_traj=8", "train_steps=2", "batch=4"] for m in ("kd", "step-distill", "ard")}}


@pytest.mark.usefixtures("fresh_store")  # a copy of the migrated store at tmp_path/mlflow.db
def test_the_official_dit_loader_runs_every_method_of_its_family_from_the_cli(plugin, tmp_path):
    """`tiny-official-dit` (tests/plugins.py): the official-layout loader on tiny random-weight files, through every
    method of the ODE-diffusion family by the CLI into MLflow (samples decoded by the VAE), then into a report."""
    from mlflow.tracking import MlflowClient

    import cli
    from core.registry import METHODS
    from teachers.families import ode_diffusion

    assert sorted(FAST) == sorted(n for n, c in METHODS.items() if ode_diffusion.FAMILY in c.families)
    store = f"sqlite:///{tmp_path}/mlflow.db"
    for method, params in FAST.items():
        args = ["run", "--teacher", "tiny-official-dit", "--method", method, "--n-samples", "4", "--batch-size", "2",
                "--tracking-uri", store, "--cache-dir", str(tmp_path / "cache"), "--experiment", "real-dit",
                "--warmup", "0", "--no-progress", *(a for p in params for a in ("--param", p))]
        assert cli.main(args) == 0, method
    client = MlflowClient(store)
    runs = client.search_runs([client.get_experiment_by_name("real-dit").experiment_id])
    assert sorted(r.data.params["method"] for r in runs) == sorted(FAST)
    assert all(r.info.status == "FINISHED" and r.data.metrics["ref/nfe_per_sample"] == 8 for r in runs)
    assert {a.path for a in client.list_artifacts(runs[0].info.run_id)} >= {"samples.png", "ref_samples.png"}
    assert cli.main(["report", "--tracking-uri", store, "--experiment", "real-dit", "--out", str(tmp_path / "r")]) == 0
    report = (tmp_path / "r" / "REPORT.md").read_text()
    assert "## tiny-official-dit" in report and "| ard |" in report


def test_ard_refuses_its_gan_fine_tune_without_real_images():
    from methods.ard import ARD, ARDConfig
    from tests.fakes import make_config, tiny_official_dit_teacher

    with pytest.raises(UserError, match="needs the teacher's real images"):
        ARD(tiny_official_dit_teacher(), make_config(ARDConfig, gan_steps=2))


def test_missing_files_are_one_line_naming_them_the_option_and_the_source(tmp_path, capsys):
    import cli

    folder = tmp_path / "ckpts"
    assert cli.main(["list", "--checkpoints", str(folder)]) == 0
    from tests.fakes import listed_entries

    assert f"missing {folder}/DiT-XL-2-256x256.pt" in listed_entries(capsys.readouterr().out)["dit-xl-2-256"]
    args = ["run", "--teacher", "dit-xl-2-512", "--method", "ard", "--checkpoints", str(folder),
            "--tracking-uri", f"sqlite:///{tmp_path}/mlflow.db", "--cache-dir", str(tmp_path / "cache")]
    assert cli.main(args) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and f"missing {folder}/DiT-XL-2-512x512.pt and {folder}/sd-vae-ft-ema/config.json" in err
    assert "facebookresearch/DiT" in err and "--checkpoints or ACCELBENCH_CHECKPOINTS" in err
    assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / "cache").exists()  # refused before any work


def test_fid_against_reference_statistics_equals_fid_against_the_features_they_summarise(tmp_path, monkeypatch):
    """fid@inception on a teacher of a real checkpoint: torch-fidelity's distance between the statistics file and the
    generated images' statistics equals torchmetrics' FID between the features the file summarises and the same
    generated features. A 16-feature extractor stands in for Inception: the statistics path is what is tested."""
    from types import SimpleNamespace

    import numpy as np
    import torch.nn.functional as F
    from torchmetrics.image.fid import FrechetInceptionDistance

    import metrics.base
    from core.cache import Cache
    from metrics.features import Features
    from metrics.fid import FID

    class Pixels:
        name, num_features, num_classes, batch = "inception-v3", 16, None, 64

        def features(self, images):  # (B, 3, H, W) -> (B, 16)
            return F.adaptive_avg_pool2d(images, 4).mean(1).flatten(1)

    monkeypatch.setattr(metrics.base, "load_extractor", lambda *args, **kwargs: Pixels())
    checkpoints = tmp_path
    g = torch.Generator().manual_seed(0)
    real = torch.randn(300, 16, generator=g, dtype=torch.float64) @ torch.rand(16, 16, generator=g, dtype=torch.float64)
    np.savez(tmp_path / "stats.npz", mu=real.mean(0).numpy(), sigma=np.cov(real.numpy(), rowvar=False))
    teacher = SimpleNamespace(reference_statistics=("stats.npz", "test-ref"))
    fid = FID(teacher, cache=Cache(tmp_path / "cache"), device=torch.device("cpu"), checkpoints=checkpoints,
              extractor="inception")
    images = torch.rand(100, 3, 8, 8, generator=g)
    fid.update(images, None)
    ((key, value),) = fid.compute().items()
    expected = FrechetInceptionDistance(feature=Features(16))
    expected.update(real, real=True)
    expected.update(Pixels().features(images), real=False)
    assert key == "fid.inception-v3.test-ref" and value == pytest.approx(float(expected.compute()), rel=1e-6)


def test_image_metrics_on_a_real_checkpoint_teacher_are_checked_before_any_work(tmp_path, capsys):
    import cli

    def run(metric):
        assert cli.main(["run", "--teacher", "dit-xl-2-256", "--method", "ddim", "--metric", metric, "--checkpoints",
                         str(tmp_path), "--tracking-uri", f"sqlite:///{tmp_path}/mlflow.db"]) == 2
        return capsys.readouterr().err.strip()

    assert "fid@cnn needs real images" in run("fid")
    assert "image metrics are @inception against VIRTUAL_imagenet256_labeled.npz" in run("kid")
    err = run("fid@inception")
    assert f"missing {tmp_path}/VIRTUAL_imagenet256_labeled.npz" in err and "openai/guided-diffusion" in err
    assert not (tmp_path / "mlflow.db").exists()


class Pixels:
    """A 16-feature stand-in for Inception: what is tested is the reference path, not the network."""
    name, num_features, num_classes, batch, fingerprint, preprocessing = "inception-v3", 16, None, 64, "px", "pool"

    def features(self, images):  # (B, 3, H, W) -> (B, 16)
        return torch.nn.functional.adaptive_avg_pool2d(images, 4).mean(1).flatten(1)


def test_kid_precision_and_recall_against_an_adm_reference_batch(tmp_path, monkeypatch):
    """On a teacher of a real checkpoint, KID, precision and recall compare with the images `arr_0` of the
    reference file (all of them, as ADM's evaluator does), under keys naming the reference; a file of statistics
    only is refused for them (not for FID) before any work."""
    from types import SimpleNamespace

    import numpy as np
    from torch_fidelity.metric_prc import prc_features_to_metric

    import metrics.base
    from core.cache import Cache
    from core.errors import UserError
    from metrics.fid import FID
    from metrics.precision_recall import Precision, Recall

    monkeypatch.setattr(metrics.base, "load_extractor", lambda *args, **kwargs: Pixels())
    checkpoints = tmp_path
    g = torch.Generator().manual_seed(0)
    batch = torch.randint(0, 256, (40, 8, 8, 3), generator=g, dtype=torch.uint8)
    np.savez(tmp_path / "ref.npz", arr_0=batch.numpy(), mu=np.zeros(16), sigma=np.eye(16))
    teacher = SimpleNamespace(reference_statistics=("ref.npz", "test-ref"))
    images = torch.rand(30, 3, 8, 8, generator=g)
    real = Pixels().features(batch.permute(0, 3, 1, 2).float() / 255)
    expected = prc_features_to_metric(Pixels().features(images), real, prc_neighborhood=3, verbose=False)
    for cls, result in ((Precision, "precision"), (Recall, "recall")):
        cls.check_teacher("t", teacher, "inception", checkpoints)
        m = cls(teacher, cache=Cache(tmp_path / "cache"), device=torch.device("cpu"), checkpoints=checkpoints,
                extractor="inception")
        m.update(images, None)
        assert m.compute() == {f"{result}.inception-v3.test-ref": pytest.approx(float(expected[result]))}
    np.savez(tmp_path / "ref.npz", mu=np.zeros(16), sigma=np.eye(16))
    FID.check_teacher("t", teacher, "inception", checkpoints)
    with pytest.raises(UserError, match="ref.npz holds statistics only"):
        Precision.check_teacher("t", teacher, "inception", checkpoints)


def test_inception_score_at_paper_scale_equals_torch_fidelity(tmp_path, monkeypatch):
    """is@inception: torch-fidelity's Inception-v3 with its classifier, from a weights file in its own format
    (random weights here, written by its own class), gives the score torch-fidelity computes from its logits."""
    from types import SimpleNamespace
    from unittest import mock

    from torch_fidelity.feature_extractor_inceptionv3 import FeatureExtractorInceptionV3
    from torch_fidelity.metric_isc import isc_features_to_metric

    from core.cache import Cache
    from metrics.inception_score import InceptionScore

    torch.save({}, tmp_path / "empty.pth")
    with mock.patch.object(FeatureExtractorInceptionV3, "load_state_dict", lambda self, state: None):
        torch.manual_seed(0)
        net = FeatureExtractorInceptionV3("x", ["logits_unbiased"],
                                          feature_extractor_weights_path=tmp_path / "empty.pth")
    torch.save(net.state_dict(), tmp_path / "weights-inception-2015-12-05-6726825d.pth")
    checkpoints = tmp_path
    teacher = SimpleNamespace(reference_statistics=("absent.npz", "test-ref"))  # IS reads no reference
    InceptionScore.check("inception", checkpoints)
    InceptionScore.check_teacher("t", teacher, "inception", checkpoints)
    score = InceptionScore(teacher, cache=Cache(tmp_path / "cache"), device=torch.device("cpu"),
                           checkpoints=checkpoints, extractor="inception")
    images = torch.rand(12, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    score.update(images, None)
    ((key, value),) = score.compute().items()  # 12 images: one split
    (logits,) = net.eval()((images * 255).round().to(torch.uint8))
    expected = isc_features_to_metric(logits, splits=1, shuffle=False)["inception_score_mean"]
    assert key == "is.inception-v3-tf1" and value == pytest.approx(expected, rel=1e-5)
