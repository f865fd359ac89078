"""Every file a trial reads either loads or is refused in one line naming it (exit 2, no traceback): checkpoints
(.pt / .pth / .ckpt), safetensors shards and Hugging Face folders, reference .npz files, prompt files, WebText jsonl,
suite / trial / study YAML; damaged (random bytes), cut short (the first half of a valid file) and foreign (the wrong
kind of content) versions of each, written into a temporary checkpoints folder. And the other bad inputs that ended in
a traceback: a cache folder that cannot be made, a sample count beyond torch's integers; and MLflow's INFO lines on a
new store (`test_a_damaged_checkpoint_stops_the_cli_before_any_run`)."""
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from core.errors import UserError
from core.registry import TEACHERS
from tests.fakes import NO_CHECKPOINTS, refused_by_the_cli


def damage(path: Path, how: str) -> Path:
    """`path` made random bytes, or cut to its first half."""
    if how == "random":
        path.write_bytes(np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8).tobytes())
    else:
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    return path


def one_line(exc: pytest.ExceptionInfo, path: Path) -> str:
    message = str(exc.value)
    assert "\n" not in message and str(path) in message and "Traceback" not in message, message
    return message


class _Object:
    """A class a weights-only unpickler refuses."""


# ---- .pt / .pth / .ckpt ------------------------------------------------------------------------------------------

@pytest.fixture()
def llamagen_copy(tmp_path):
    """A copy of the tiny LlamaGen files, and the tiny teacher reading that copy."""
    from tests.fakes import TinyLlamaGen

    for path in TinyLlamaGen.files():
        shutil.copy(path, tmp_path / path.name)

    class Copy(TinyLlamaGen):
        @classmethod
        def root(cls):
            return tmp_path

    return Copy


@pytest.mark.parametrize("how, message", [
    ("random", "not a PyTorch checkpoint, or a damaged one"),
    ("half", "not a PyTorch checkpoint, or a truncated one"),
    ("tensor", "holds a Tensor, not a state dict"),
    ("objects", "holds objects other than tensors (tests.test_bad_files._Object), which we do not unpickle"),
])
def test_a_bad_checkpoint_is_one_line_naming_it(llamagen_copy, how, message):
    gpt = llamagen_copy.files()[0]
    if how in ("random", "half"):
        damage(gpt, how)
    else:
        torch.save(torch.zeros(3) if how == "tensor" else {"model": {"w": _Object()}}, gpt)
    with pytest.raises(UserError) as exc:
        llamagen_copy.load("copy", cache=None, device=torch.device("cpu"))
    assert message in one_line(exc, gpt)


@pytest.mark.usefixtures("fresh_store")  # a copy of the migrated store at tmp_path/mlflow.db
def test_a_damaged_checkpoint_stops_the_cli_before_any_run(llamagen_copy, tmp_path, capfd, monkeypatch):
    """On a new store, so the one line is also all of stderr: MLflow's INFO lines while it makes the store's tables
    are silenced (its handler holds the process's stderr from import time: only `capfd` sees what it writes)."""
    monkeypatch.setitem(TEACHERS._entries, "tiny-llamagen-copy", llamagen_copy)
    damage(llamagen_copy.files()[1], "half")
    err = refused_by_the_cli(capfd, "run", "--teacher", "tiny-llamagen-copy", "--method", "ar", "--n-samples", "2",
                             "--tracking-uri", f"sqlite:///{tmp_path}/mlflow.db", "--cache-dir", str(tmp_path / "c"),
                             "--no-progress")
    assert f"{llamagen_copy.files()[1]}: not a PyTorch checkpoint, or a truncated one" in err
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    assert not client.search_runs([e.experiment_id for e in client.search_experiments()])


# ---- safetensors and Hugging Face folders ------------------------------------------------------------------------

@pytest.fixture()
def emu3_copy(tmp_path):
    from tests.fakes import TinyEmu3

    shutil.copytree(TinyEmu3.path(), tmp_path / TinyEmu3.folder)

    class Copy(TinyEmu3):
        @classmethod
        def root(cls):
            return tmp_path

    return Copy


def _retype(config: Path) -> None:
    config.write_text(json.dumps({**json.loads(config.read_text()), "model_type": "llama"}))


@pytest.mark.parametrize("file, change, message", [
    ("config.json", "random", "config.json: not UTF-8 text"),
    ("config.json", "half", "config.json: not valid JSON"),
    ("config.json", _retype, "config.json: model_type is 'llama', expected 'emu3'"),
    ("model.safetensors", "random", "Emu3-tiny: Emu3ForConditionalGeneration cannot load it (SafetensorError"),
    ("model.safetensors", "half", "Emu3-tiny: Emu3ForConditionalGeneration cannot load it (SafetensorError"),
    ("tokenizer.json", "half", "Emu3-tiny: Emu3Processor cannot load it"),
])
def test_a_bad_hugging_face_folder_is_one_line_naming_it(emu3_copy, file, change, message):
    path = emu3_copy.path() / file
    change(path) if callable(change) else damage(path, change)
    with pytest.raises(UserError) as exc:
        emu3_copy.load("copy", cache=None, device=torch.device("cpu"))
    assert message in one_line(exc, emu3_copy.path())


@pytest.mark.parametrize("how", ["random", "half"])
def test_a_bad_safetensors_shard_is_one_line_naming_it(tmp_path, how):
    """`read_chameleon` reads the shards itself (transformers' loader is not used for Chameleon's weights)."""
    from teachers.pretrained.chameleon import read_chameleon
    from tests.fakes_chameleon import TinyLumina

    folder = Path(shutil.copytree(TinyLumina.path(), tmp_path / "Lumina"))
    shard = damage(sorted(folder.glob("*.safetensors"))[0], how)
    with pytest.raises(UserError) as exc:
        read_chameleon(folder, torch.device("cpu"), torch.float32)
    assert "not a safetensors file, or a truncated one" in one_line(exc, shard)
    (folder / "config.json").write_text("[1, 2]")
    with pytest.raises(UserError, match="holds a JSON list, not a model configuration"):
        read_chameleon(folder, torch.device("cpu"), torch.float32)


def test_a_folder_of_another_library_class_is_refused(tmp_path):
    from tests.fakes import TinyOfficialDiT

    root = TinyOfficialDiT.root()
    shutil.copy(root / TinyOfficialDiT.checkpoint, tmp_path)
    folder = Path(shutil.copytree(root / TinyOfficialDiT.vae_folder, tmp_path / TinyOfficialDiT.vae_folder))
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "_class_name": "UNet2DModel"}))

    class Copy(TinyOfficialDiT):
        @classmethod
        def root(cls):
            return tmp_path

    with pytest.raises(UserError) as exc:
        Copy.load("copy", cache=None, device=torch.device("cpu"))
    assert "_class_name is 'UNet2DModel', expected 'AutoencoderKL'" in one_line(exc, folder / "config.json")


# ---- reference .npz ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("how, message", [
    ("random", "not an .npz archive, or a damaged or truncated one"),
    ("half", "not an .npz archive, or a damaged or truncated one"),
    ("npy", "holds a single array (.npy), not an .npz archive"),
    ("objects", "cannot read its arrays"),
    ("other", "no array 'sigma'; it holds mu"),
])
def test_a_bad_reference_file_is_one_line_naming_it(tmp_path, how, message):
    from metrics.features import npz_members, read_npz

    path = tmp_path / "VIRTUAL_imagenet256_labeled.npz"
    np.savez(path, mu=np.zeros(4), sigma=np.eye(4))
    if how in ("random", "half"):
        damage(path, how)
    elif how == "npy":
        with path.open("wb") as fh:
            np.save(fh, np.zeros(4))
    elif how == "objects":
        np.savez(path, mu=np.array([object()]), sigma=np.eye(4))
    else:
        np.savez(path, mu=np.zeros(4))
    with pytest.raises(UserError) as exc:
        npz_members(path)
        read_npz(path, "mu", "sigma")
    assert message in one_line(exc, path)


# ---- prompts and WebText ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name, content, message", [
    ("p.txt", None, "not UTF-8 text"),
    ("p.json", b'{"annotations": [{"image_id": 1, "caption": "a c', "not valid JSON"),
    ("p.json", b'{"images": []}', "not COCO caption annotations"),
    ("p.json", b'[1, 2]', "not COCO caption annotations"),
    ("p.tsv", b"Text\tCategory\na cat\tAnimals\n", "no 'Prompt' column"),
    ("p.tsv", None, "not UTF-8 text"),
])
def test_a_bad_prompt_file_is_one_line_naming_it(tmp_path, name, content, message):
    from teachers.data.prompts import read_prompts

    path = tmp_path / name
    path.write_bytes(b"x" * 4096)
    damage(path, "random") if content is None else path.write_bytes(content)
    with pytest.raises(UserError) as exc:
        read_prompts(path)
    assert message in one_line(exc, path)


@pytest.mark.parametrize("content, message", [
    (None, "not UTF-8 text"),
    (b'{"text": "one"}\n{"text": "tw', "line 2 is not JSON"),
    (b'{"text": "one"}\n[1, 2]\n', "line 2 is not a WebText document"),
    (b'{"text": 3}\n', "line 1 is not a WebText document"),
])
def test_a_bad_webtext_file_is_one_line_naming_it(tmp_path, content, message):
    from teachers.data import webtext

    path = webtext.path("test", tmp_path)
    path.write_bytes(b"x" * 4096)
    damage(path, "random") if content is None else path.write_bytes(content)
    with pytest.raises(UserError) as exc:
        webtext.documents("test", "the test", tmp_path)
    assert message in one_line(exc, path)


# ---- YAML ---------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("content, message", [
    (b"teacher: [digits-ar-c2i\nmethod: ar\n", "is not valid YAML"),
    (b"- teacher: digits-ar-c2i\n", "expected a mapping, got list"),
    (None, "not UTF-8 text"),
    (b"teacher: digits-ar-c2i\nmethod: sjd\nparams: {window: 16, window: 4}\n", "key 'window' is given twice (line 3)"),
])
@pytest.mark.parametrize("command", ["trial", "suite", "sweep"])
def test_a_bad_yaml_file_is_one_line_naming_it(tmp_path, capsys, command, content, message):
    path = tmp_path / "bad.yaml"
    path.write_bytes(b"x" * 4096)
    damage(path, "random") if content is None else path.write_bytes(content)
    store = ["--tracking-uri", f"sqlite:///{tmp_path}/mlflow.db", "--cache-dir", str(tmp_path / "c")]
    args = {"trial": ["run", str(path)], "suite": ["suite", str(path)], "sweep": ["sweep", str(path)]}[command]
    err = refused_by_the_cli(capsys, *args, *store)
    assert message in err and str(path) in err
    assert not (tmp_path / "c").exists()


# ---- folders and counts ----------------------------------------------------------------------------------------

@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs /proc")
def test_a_cache_folder_that_cannot_be_made_is_one_line(tmp_path, capsys):
    err = refused_by_the_cli(capsys, "run", "--teacher", "digits-ar-c2i", "--method", "ar", "--cache-dir", "/proc/x",
                             "--tracking-uri", f"sqlite:///{tmp_path}/mlflow.db")
    assert "cache directory (--cache-dir) /proc/x: cannot create a folder in /proc" in err


def test_a_sample_count_beyond_torch_is_one_line_stating_the_limit(tmp_path, capsys):
    err = refused_by_the_cli(capsys, "run", "--teacher", "digits-ar-c2i", "--method", "ar", "--n-samples",
                             "99999999999999999999999", "--tracking-uri", f"sqlite:///{tmp_path}/mlflow.db",
                             "--cache-dir", str(tmp_path / "c"))
    assert "n_samples must be at most 2**31 - 1 = 2147483647, got 99999999999999999999999" in err


def test_a_seed_beyond_torch_is_one_line_stating_the_limit(tmp_path, capsys):
    err = refused_by_the_cli(capsys, "run", "--teacher", "digits-ar-c2i", "--method", "ar", "--seed",
                             str(2**64), "--tracking-uri", f"sqlite:///{tmp_path}/mlflow.db",
                             "--cache-dir", str(tmp_path / "c"))
    assert f"seed must be at most 2**63 - 1 = {2**63 - 1}, got {2**64}" in err


# ---- the metrics' model files: open_clip checkpoints (clip@<arch>, hpsv2), Inception's TorchScript ----------------

def _bad_checkpoint(path: Path, good: Path, how: str) -> Path:
    """`good` copied to `path` and damaged `how`, or `path` written with the wrong content."""
    if how in ("random", "half"):
        shutil.copy(good, path)
        return damage(path, how)
    content = {"tensor": torch.zeros(3), "objects": {"state_dict": {"w": _Object()}},
               "keys": {"state_dict": {"w": torch.zeros(2)}}}[how]
    torch.save(content, path)
    return path


@pytest.mark.parametrize("how, message", [
    ("random", "not a PyTorch checkpoint"),
    ("half", "a truncated one"),
    ("tensor", "holds no state dict"),
    ("objects", "holds objects other than tensors (tests.test_bad_files._Object)"),
    ("keys", "not a checkpoint of open_clip's AccelBench-Tiny-CLIP (Missing key(s)"),
])
def test_a_bad_open_clip_checkpoint_is_one_line_naming_it(tmp_path, how, message):
    from metrics.clip_models import load_open_clip
    from tests.test_metrics_clip import TINY_ARCH, register_tiny_arch, tiny_state_dict

    register_tiny_arch(tmp_path)
    good = tmp_path / "good.pt"
    torch.save({"state_dict": tiny_state_dict(seed=1)}, good)
    path = _bad_checkpoint(tmp_path / f"{how}.pt", good, how)
    with pytest.raises(UserError) as exc:
        load_open_clip(TINY_ARCH, path, device=torch.device("cpu"))
    assert message in one_line(exc, path)


@pytest.mark.parametrize("how", ["random", "half"])
def test_a_damaged_metric_file_is_refused_when_planned_not_skipped(tmp_path, monkeypatch, how):
    """A missing HPS v2 file makes the metric unavailable (the trial runs); one that is there but damaged is refused
    at planning, as are a damaged clip@<arch> checkpoint and a damaged Inception TorchScript."""
    from metrics import inception
    from metrics.clip_score import CHECKPOINT_ENV as CLIP_ENV
    from metrics.clip_score import CLIPScore
    from metrics.hpsv2 import CHECKPOINT_ENV as HPS_ENV
    from metrics.hpsv2 import HPSv2

    good = tmp_path / "good.pt"
    torch.save({"state_dict": {"w": torch.zeros(64, 64)}}, good)
    path = _bad_checkpoint(tmp_path / f"{how}.pt", good, how)
    monkeypatch.setenv(HPS_ENV, str(tmp_path / "absent.pt"))
    assert "not found" in HPSv2.check(None, NO_CHECKPOINTS)
    for env, check in ((HPS_ENV, lambda: HPSv2.check(None, NO_CHECKPOINTS)),
                       (CLIP_ENV, lambda: CLIPScore.check("ViT-B-16", NO_CHECKPOINTS)),
                       (inception.ENV, inception.weights_path)):
        monkeypatch.setenv(env, str(path))
        with pytest.raises(UserError) as exc:
            check()
        assert "PyTorch checkpoint" in one_line(exc, path)


def test_a_checkpoint_that_is_not_torchscript_is_one_line_for_the_inception_network(tmp_path):
    from metrics.inception import InceptionExtractor

    path = tmp_path / "state_dict.pt"
    torch.save({"w": torch.zeros(2)}, path)
    with pytest.raises(UserError) as exc:
        InceptionExtractor(path)
    assert "not the TorchScript network" in one_line(exc, path)
