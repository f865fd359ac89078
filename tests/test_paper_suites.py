"""Paper suites (suites/papers/): the papers' numbers as data, validated; a dry run plans each offline."""
import re
from pathlib import Path

import pytest
import torch
import yaml

from cli import main
from bench.dryrun import costs
from tests.fakes import NO_CHECKPOINTS

ROOT = Path(__file__).resolve().parent.parent
PAPER_SUITES = sorted((ROOT / "suites" / "papers").glob("*.yaml"))


def test_there_is_a_paper_suite_for_every_paper():
    names = {p.name.split("-")[0] for p in PAPER_SUITES}
    assert len(PAPER_SUITES) >= 5 and names >= {"ard", "cspd", "dd", "sdtt", "sjd"}, names


@pytest.mark.parametrize("path", PAPER_SUITES, ids=lambda p: p.stem)
def test_a_paper_suite_dry_runs_offline_against_an_empty_checkpoints_folder(path, tmp_path, capsys, monkeypatch):
    """Exit 0 with nothing at hand: the files each trial needs, marked missing, its samples and passes per arm, and
    device-hours priced from the measured per-pass costs; nothing is written."""
    monkeypatch.chdir(tmp_path)
    empty = tmp_path / "checkpoints"
    empty.mkdir()
    assert main(["suite", str(path), "--dry-run", "--checkpoints", str(empty), "--cache-dir",
                 str(tmp_path / "cache")]) == 0
    out = capsys.readouterr().out
    assert "MISSING" in out and f"{empty}/" in out
    assert ("samples per arm" in out or "lm-eval tasks" in out) and "device-hours estimated for sampling" in out
    data = yaml.safe_load(path.read_text())
    assert "paper" not in data.get("defaults", {})
    assert any("paper" in t for t in data["trials"]), "a paper suite carries the paper's numbers"
    assert all(t["paper"]["source"] for t in data["trials"] if "paper" in t)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoints"]  # no store, no cache, no report


def test_the_dry_run_prices_passes_with_the_measured_costs(tmp_path, capsys):
    """VAR-d16's own sampler: 10 scale passes per sample at the measured cost per pass, in its one arm (a
    teacher-only trial: its draws are the reference arm's)."""
    assert main(["run", "--teacher", "var-d16", "--method", "ar", "--n-samples", "100", "--batch-size", "10",
                 "--warmup", "1", "--dry-run", "--checkpoints", str(tmp_path), "--device-kind",
                 "cpu-amd-epyc"]) == 0
    out = capsys.readouterr().out
    measured = costs()["cpu-amd-epyc-fp32"]["var-d16"].batches[1]  # batch 10 at batch 1's cost per sample: a bound
    per_arm = 110 * 10 * measured.seconds["step"] / 3600  # 100 samples + a warm-up batch of 10
    assert (f"method     10 step per sample: {per_arm:.3g} device-hours (batch 10 at batch 1's per-sample cost, "
            f"the largest measured below: an upper bound)") in out
    assert f"estimated: {per_arm:.3g} device-hours on cpu" in out and "ref   " not in out
    assert f"MISSING  {tmp_path}/var_d16.pth" in out and f"{measured.device} ({measured.command})" in out


def test_a_speculative_arm_is_priced_at_the_acceptance_its_paper_row_states(capsys):
    """SJD on Emu3-Gen (sjd-fig10-tables1-5.yaml): the row states NFE 3523, so the method arm is 3523 windows per
    sample at the measured window cost, below the AR arm's 8193 steps by that ratio; a row with the step compression
    only (sjdpac-table1.yaml's SJD on Emu3, 2.32x) is priced at the AR arm's passes over it; a row with neither at the
    bound, one window per token."""
    from bench.dryrun import stated_passes
    from methods.base import Passes

    assert main(["suite", str(ROOT / "suites" / "papers" / "sjd-fig10-tables1-5.yaml"), "--dry-run",
                 "--device-kind", "cpu-amd-epyc", "--dtype", "fp32"]) == 0  # the machine's costs are float32's
    trial = capsys.readouterr().out.split("trial 1/")[1].split("trial 2/")[0]
    ref, method = (float(re.search(rf"  {arm} +\d+ \w+ per sample.*: ([\d.e+]+) device-hours", trial).group(1))
                   for arm in ("ref", "method"))
    cost = costs()["cpu-amd-epyc-fp32"]["emu3-gen"].batches[1].seconds
    assert "3523 window per sample (at the NFE 3523 of SJD App. B Fig. 10" in trial
    assert method / ref == pytest.approx(3523 * cost["window"] / (8193 * cost["step"]), rel=0.01) and method < ref
    bound, ar = Passes({"window": 8193}, at_most=True), Passes({"step": 8193})
    assert stated_passes(bound, {"speedup_steps": 2.32, "source": "S"}, ar) == (
        Passes({"window": 8193 / 2.32}), "at the step compression 2.32x of S")
    assert stated_passes(bound, {}, ar) == (bound, "at the bound (the row states no step compression or NFE)")


def test_a_dry_run_of_a_teacher_without_measured_costs_lists_it_unpriced(capsys):
    assert main(["run", "--teacher", "digits-ar-c2i", "--method", "sjd", "--dry-run", "--device-kind",
                 "cpu-amd-epyc"]) == 0
    out = capsys.readouterr().out
    assert ("not planned (teacher digits-ar-c2i's length is in no cost table and it has no random build to read it "
            "from)") in out and "1 runs not priced" in out


def test_a_dry_run_for_a_device_kind_without_costs_says_so_in_one_line(capsys):
    assert main(["suite", str(ROOT / "suites" / "papers" / "dd-table1.yaml"), "--dry-run", "--device-kind",
                 "nvidia-a100-sxm4-80gb"]) == 0
    out = capsys.readouterr().out
    said = [line for line in out.splitlines() if "nvidia-a100-sxm4-80gb" in line and "no measured costs" in line]
    assert len(said) == 1 and "kinds with costs: cpu-amd-epyc-fp32" in said[0] and "--record" in said[0]
    assert "'nvidia-a100-sxm4-80gb-bf16' or 'nvidia-a100-sxm4-80gb-fp32'" in said[0]  # the rows' two precisions
    assert "device-hours estimated" in out and "0 device-hours" in out and "21 runs not priced" in out
    # the passes plan stays: the positions are the cost tables' (or the random build's), whatever the device
    trial = out.split("trial 1/")[1].split("trial 2/")[0]
    assert "  method     10 step per sample: not priced (no measured cost of var-d16 on nvidia-a100-sxm4-80gb-fp32)" \
        in trial


def test_the_dry_run_of_dd_table1_draws_each_reference_once(capsys):
    """21 trials, 5 teachers: each teacher's reference draws (its own sampler, the same settings, seed and sample
    count) drawn by its first trial and read by the others, which are priced for their method arm and the latency
    protocol's calls alone."""
    assert main(["suite", str(ROOT / "suites" / "papers" / "dd-table1.yaml"), "--dry-run", "--device-kind",
                 "cpu-amd-epyc"]) == 0
    out = capsys.readouterr().out
    assert "reference draws: 5 drawn for 21 trials" in out
    assert out.count("read from the cache (timed here, not drawn)") == 16
    step = costs()["cpu-amd-epyc-fp32"]["var-d16"].batches[1].seconds["step"]
    timed = (10 + 10) * 10 * step / 3600  # the protocol's floors, 10 scale passes each
    assert f"  ref        10 step per sample: {timed:.3g} device-hours" in out  # a reading trial's reference arm


def write(tmp_path, trials, **extra):
    path = tmp_path / "suite.yaml"
    path.write_text(yaml.safe_dump({"experiment": "p", "defaults": {"teacher": "digits-ar-c2i", "n_samples": 4},
                                    "trials": trials, **extra}))
    return str(path)


@pytest.mark.parametrize("paper, message", [
    ({"fid": 2.0}, "'paper' needs a 'source' naming the paper's table and row"),
    ({"fid": 2.0, "bleu": 1.0, "source": "T1"}, "unknown paper key 'bleu'; valid: source, acceptance_rate"),
    ({"fid": "low", "source": "T1"}, "paper fid must be a finite number, got 'low'"),
    ({"fid": 2.0, "source": "T1", "note": "two\nlines"}, "paper note must be one line of text, got 'two\\nlines'"),
    ([1, 2], "'paper' must be a mapping"),
])
def test_paper_numbers_are_checked_before_any_work(tmp_path, capsys, paper, message):
    path = write(tmp_path, [{"method": "ar", "paper": paper}])
    assert main(["suite", path, "--tracking-uri", f"sqlite:///{tmp_path}/m.db", "--cache-dir",
                 str(tmp_path / "cache")]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "trial 0" in err and "\n" not in err
    assert not (tmp_path / "m.db").exists()


def test_suite_overrides_set_a_knob_in_every_trial_that_has_it(tmp_path, capsys):
    from bench.suite import load_suite

    path = write(tmp_path, [{"method": "dd", "params": {"steps": 2}}, {"method": "sjd", "params": {"window": 4}}])
    suite = load_suite(path, checkpoints=NO_CHECKPOINTS, n_samples=2, overrides={"train_steps": "3"})
    dd, sjd = (p.trial for p in suite.plans)
    assert dd.params["train_steps"] == 3 and dd.params["steps"] == 2 and "train_steps" not in sjd.params
    assert dd.n_samples == sjd.n_samples == 2
    assert main(["suite", path, "--dry-run", "--param", "no_such_knob=1"]) == 2
    assert "--param no_such_knob is a knob of none of its trials' methods" in capsys.readouterr().err


# --- each paper suite end to end on tiny random-weight files in the official formats ------------------------------

# The paper suites' teachers, each replaced by its loader on tiny random-weight files in the official format (the
# same classes with tiny configurations, tests/fakes.py); MDLM-OWT and the GPT-2 evaluators read the tiny files
# `write_sdtt_checkpoints` puts in the checkpoints folder under their official names.
TINY = {**dict.fromkeys(("var-d16", "var-d20", "var-d24", "var-d30"), "TinyVAR"),
        **dict.fromkeys(("llamagen-b-256", "llamagen-l-256", "llamagen-b-384"), "TinyLlamaGen"),
        **dict.fromkeys(("mar-h", "mar-l"), "TinyOfficialMAR"),
        "dit-xl-2-256": "TinyOfficialDiT", "emu3-gen": "TinyEmu3", "lumina-mgpt-7b-768": "TinyLumina",
        "anole-7b": "TinyAnole", **dict.fromkeys(("llamagen-t2i-xl-256", "llamagen-t2i-xl-512"), "TinyLlamaGenT2I")}
# Training at the papers' scale (ARD's 2.56 M trajectories and 300k steps; DD's baselines' 1.2 M pairs) cut to seconds,
# and MAR's 100-step diffusion head to 2 steps: a noised one and the last, whose Gaussians CSpD's ratio reads (at 10
# steps the head's chains took three quarters of cspd-table1-table3's sampling).
QUICK = {"ard": ["n_traj=16", "train_steps=2", "batch=4"], "dd": ["n_pairs=64"], "cspd": ["steps=2"]}
# the latency protocol's least (tests/test_latency.py checks the protocol): sdtt-fig22's five rows timed their four
# arms, the 1024-step teacher among them, for 331 s at the defaults on this project's Intel machine
PROTOCOL_FLOORS = ["--latency-warmup", "1", "--latency-min-count", "2", "--latency-min-seconds", "0"]
TINY_DIT_DEPTH = 2  # ARD's N = 6 and 28 history layers read this many blocks of the tiny DiT
# scales / tokens: DD's t2, ts, split, skip-n's skip and MAR's num_iter fit in them
TINY_LENGTH = {"TinyVAR": 4, "TinyLlamaGen": 16, "TinyOfficialMAR": 16}
# step counts at most: the tiny MDLM's 32 tokens (write_sdtt_checkpoints), as the papers' 1024 steps are MDLM-OWT's
# 1024 tokens (the 1024-step arms, drawn, timed and counted, were most of sdtt-fig22's minute); DiT's DDIM, the 25 of
# ARD's trajectories (the 250-step row was most of ard-table1's sampling)
TINY_STEPS = {"mdlm-owt": 32, "mdlm-owt-prompted": 32, "dit-xl-2-256": 25}


def tiny_trials(suite: dict) -> list[dict]:
    """The suite's trials on the tiny teachers: one per distinct (method, tiny teacher, mode, metrics, CSpD's align and
    prefill), the knobs that address the full-size models' positions, blocks and steps brought within the tiny ones'.
    (Every trial of every suite is planned, at full size, by the dry-run test above.)"""
    kept, seen = [], set()
    for trial in suite["trials"]:
        merged = {**suite.get("defaults", {}), **trial}
        teacher, p = merged["teacher"], dict(trial.get("params", {}))
        key = (merged["method"], TINY.get(teacher, teacher), p.get("mode"), str(merged.get("metrics")),
               p.get("align"), p.get("prefill"))  # CSpD's ablations (cspd-tables4-5): each arm of them runs
        if key in seen:
            continue
        seen.add(key)
        if "history_layers" in p:
            p["history_layers"] = min(p["history_layers"], TINY_DIT_DEPTH)
        if n := TINY_LENGTH.get(TINY.get(teacher)):
            p.update({k: min(p[k], n) for k in ("t2", "split", "num_iter") if k in p})
            p.update({k: min(p[k], p.get("t2", n) - 1, n - 1) for k in ("ts", "skip", "draft_steps") if k in p})
        if n := TINY_STEPS.get(teacher):
            p.update({k: min(p[k], n) for k in ("steps", "student_steps") if k in p})
        kept.append({**trial, "params": p})
    return kept


FEATURES = 16  # the stand-in Inception's features, and the reference statistics' size: FID's sqrtm stays cheap


class TinyInception(torch.nn.Module):
    """A stand-in for the TorchScript Inception (`ACCELBENCH_INCEPTION_WEIGHTS`): features of a 299 px image."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(3 * 4 * 4, FEATURES)

    def forward(self, x):
        return self.proj(torch.nn.functional.adaptive_avg_pool2d(x, 4).flatten(1))


def tiny_class(name: str) -> type:
    """A tiny teacher class of `TINY` by name, from the module of fakes that holds it."""
    from tests import fakes, fakes_chameleon, fakes_llamagen_t2i

    return next(getattr(m, name) for m in (fakes, fakes_chameleon, fakes_llamagen_t2i) if hasattr(m, name))


def write_paper_files(folder: Path, suite: dict) -> None:
    """What the suite's trials read from the checkpoints folder, tiny and random: ADM's reference batch, DD's
    reference statistic, the inception score's and pytorch-fid's networks, MDLM-OWT, GPT-2 (the AR arm and, as
    gpt2-large, the evaluator), WebText, every released student the suite names, the transformers CLIP folders of
    `clip@hf:<folder>` and the real images of the prompted teachers' `reference_images` (COCO's val2017/)."""
    import shutil

    import numpy as np
    from PIL import Image

    from metrics import inception, inception_pytorch_fid
    from metrics.features import NAMED_REFERENCES
    from tests.fakes import write_sdtt_checkpoints, write_sdtt_student, write_tiny_clip

    rng = np.random.default_rng(0)
    np.savez(folder / "VIRTUAL_imagenet256_labeled.npz", mu=rng.normal(size=FEATURES), sigma=np.eye(FEATURES),
             arr_0=rng.integers(0, 256, (8, 8, 8, 3), dtype=np.uint8))
    torch.jit.script(TinyInception()).save(str(folder / "inception.pt"))
    torch.save({}, folder / inception.LOGITS_WEIGHTS)  # read by TinyInceptionLogits' stand-in: present, not loaded
    torch.save({}, folder / inception_pytorch_fid.WEIGHTS)  # likewise TinyPytorchFid's
    statistic = folder / NAMED_REFERENCES["dd-in256"].file  # DD's reference, as its fid_score.py:302 writes it
    statistic.parent.mkdir()
    torch.save({"m": rng.normal(size=FEATURES).astype(np.float32), "s": np.eye(FEATURES)}, statistic)
    write_sdtt_checkpoints(folder)
    shutil.copytree(folder / "gpt2", folder / "gpt2-large")
    defaults = suite.get("defaults", {})
    if "tasks" in defaults or any("tasks" in t for t in suite["trials"]):  # lm-eval rows: their tasks' data
        shutil.copytree(Path(__file__).parent / "fixtures" / "lm-eval", folder / "lm-eval")
    for trial in suite["trials"]:
        for metric in trial.get("metrics", defaults.get("metrics", [])):
            if metric.startswith("clip@hf:") and not (folder / metric[len("clip@hf:") :]).exists():
                write_tiny_clip(folder / metric[len("clip@hf:") :])
        teacher = trial.get("teacher", defaults.get("teacher"))
        reference = getattr(tiny_class(TINY[teacher]), "reference_images", None) if teacher in TINY else None
        if reference and not (folder / reference[0]).exists():
            (folder / reference[0]).mkdir()
            for i in range(4):  # photos of their own sizes, as COCO's
                Image.fromarray(rng.integers(0, 256, (12 + i, 16, 3), dtype=np.uint8)).save(
                    folder / reference[0] / f"{i:012d}.jpg")
        if trial.get("params", {}).get("released") and trial.get("method") == "code":  # CoDe's pair: VAR files
            for role in ("drafter", "refiner"):
                shutil.copyfile(tiny_class(TINY[teacher]).files()[0],
                                folder / f"{role}_{trial['params']['draft_steps']}.pth")
        student = trial.get("params", {}).get("student")
        if student and not (folder / student).exists():
            if trial.get("method") == "sdtt":
                write_sdtt_student(folder, student)
            else:
                from tests.fakes import write_dd_student

                write_dd_student(folder / student, TINY[trial.get("teacher", suite.get("defaults", {}).get("teacher"))])


class TinyInceptionLogits(torch.nn.Module):
    """A stand-in for torch-fidelity's Inception with its classifier (`is@inception`): its weights file is only
    checked for, as the real one's is; the network itself is proved against torch-fidelity in
    tests/test_metrics_inception.py, and its 299 px forward would be most of this test's time."""

    num_classes, batch, max_reference = 1008, 32, None

    def __init__(self, path: Path):
        from metrics import inception

        super().__init__()
        self.name, self.preprocessing, self.fingerprint = inception.NAME, inception.PREPROCESSING, "tiny"
        self.num_features = FEATURES
        self.proj = torch.nn.Linear(3 * 4 * 4, self.num_classes)

    def logits(self, images: torch.Tensor) -> torch.Tensor:
        from metrics.inception import to_uint8

        return self.proj(torch.nn.functional.adaptive_avg_pool2d(to_uint8(images).float(), 4).flatten(1))


@pytest.mark.parametrize("path", PAPER_SUITES, ids=lambda p: p.stem)
@pytest.mark.usefixtures("fresh_store")  # a copy of the migrated store at tmp_path/mlflow.db
def test_a_paper_suite_runs_end_to_end_on_tiny_files_into_a_report_with_the_paper_column(path, tmp_path, plugin,
                                                                                           monkeypatch):
    """The suite file through `accelbench suite` on tiny random-weight files in the official formats (teachers,
    released students, ADM's reference batch, the evaluators), 4 samples per arm, into MLflow and a report whose
    teacher tables carry the paper column."""
    from mlflow.tracking import MlflowClient

    from core.registry import TEACHERS

    for name, cls in TINY.items():
        monkeypatch.setitem(TEACHERS._entries, name, tiny_class(cls))
    monkeypatch.setattr("metrics.inception.InceptionLogits", TinyInceptionLogits)
    monkeypatch.setattr("metrics.inception_pytorch_fid.PytorchFidExtractor", TinyPytorchFid)
    suite = yaml.safe_load(path.read_text())
    suite["trials"] = tiny_trials(suite)
    tiny_suite = tmp_path / path.name
    tiny_suite.write_text(yaml.safe_dump(suite))
    ckpt = tmp_path / "checkpoints"
    ckpt.mkdir()
    write_paper_files(ckpt, suite)
    monkeypatch.setenv("ACCELBENCH_INCEPTION_WEIGHTS", str(ckpt / "inception.pt"))
    store, out = f"sqlite:///{tmp_path}/mlflow.db", tmp_path / "report"
    quick = [a for q in QUICK.get(path.stem.split("-")[0], []) for a in ("--param", q)]
    assert main(["suite", str(tiny_suite), "--n-samples", "4", *quick, "--checkpoints", str(ckpt),
                 "--tracking-uri", store, "--cache-dir", str(tmp_path / "cache"), "--out", str(out), "--warmup", "0",
                 "--no-progress", *PROTOCOL_FLOORS]) == 0
    client = MlflowClient(store)
    runs = client.search_runs([client.get_experiment_by_name(suite["experiment"]).experiment_id])
    assert len(runs) == len(suite["trials"]) * len(suite.get("seeds", [0]))
    assert all(r.info.status == "FINISHED" for r in runs)
    text = (out / "REPORT.md").read_text()
    headers = [line for line in text.splitlines()
               if line.startswith(("| method | knobs | sampling |", "| teacher | method | knobs |"))]  # lm-eval rows
    assert headers and all("| paper | Δ |" in h for h in headers)  # every teacher's table has the paper column
    paper = [r for r in runs if "paper.source" in r.data.tags]
    assert paper and {r.data.tags["paper.source"] for r in paper} <= {t["paper"]["source"] for t in suite["trials"]
                                                                       if "paper" in t}


class TinyPytorchFid(torch.nn.Module):
    """A stand-in for pytorch-fid's network (`fid@pytorch-fid`): its weights file is only checked for; the network
    itself is proved against pytorch-fid's own FID in tests/test_metrics_pytorch_fid.py."""

    num_classes, batch, max_reference = None, 32, None

    def __init__(self, path: Path):
        from metrics import inception_pytorch_fid

        super().__init__()
        self.name, self.fingerprint = inception_pytorch_fid.NAME, "tiny"
        self.preprocessing, self.num_features = inception_pytorch_fid.PREPROCESSING, FEATURES
        self.proj = torch.nn.Linear(3 * 4 * 4, FEATURES)

    def features(self, images: torch.Tensor) -> torch.Tensor:
        from metrics.inception import to_uint8

        return self.proj(torch.nn.functional.adaptive_avg_pool2d(to_uint8(images).float() / 255, 4).flatten(1))


def test_the_dry_run_prices_the_training_data_fit_draws_once(capsys):
    """ARD's 2.56 M trajectories (and the held-out 256): 25 DDIM steps each at the measured step cost, priced by the
    first trial that draws them and shared by the others (one trajectory cache serves every student of the suite)."""
    assert main(["suite", str(ROOT / "suites" / "papers" / "ard-table1.yaml"), "--dry-run", "--device-kind",
                 "cpu-amd-epyc"]) == 0
    out = capsys.readouterr().out
    step = costs()["cpu-amd-epyc-fp32"]["dit-xl-2-256"].batches[1].seconds["step"]
    hours = (2_560_000 + 256) * 25 * step / 3600
    assert out.count(f"  fit: draws 2560256 teacher trajectories first: {hours:.3g} device-hours\n") == 1
    assert out.count("  fit: draws 2560256 teacher trajectories first: shared with trial 5, priced there\n") == 9


def test_ards_dry_run_total_includes_the_students_training(capsys):
    """Each student's 300 k iterations at its batch, priced at the measured float32 iteration of its kind (S, N) per
    sample, and the total is the sum of the sampling, the trajectories and the trainings."""
    assert main(["suite", str(ROOT / "suites" / "papers" / "ard-table1.yaml"), "--dry-run", "--device-kind",
                 "cpu-amd-epyc"]) == 0
    out = capsys.readouterr().out
    training = costs()["cpu-amd-epyc-fp32"]["dit-xl-2-256"].training[1]
    trial = out.split("trial 12/")[1].split("trial 13/")[0]  # ARD (N = 6), M4, 4 steps, batch 64
    hours = 300_000 * 64 * training.seconds["train ard S=4 N=6"] / 3600
    assert (f"  fit: trains 300000 iterations of batch 64: {hours:.3g} device-hours (train ard S=4 N=6 at batch 1's "
            f"cost per sample, an upper bound)") in trial
    assert f"  costs measured on {training.device} ({training.command})" in out
    assert out.count("  fit: trains 300000 iterations of batch ") == 10 and "not priced" not in out
    parts = [float(x) for x in re.findall(r"(?:estimated|first|batch \d+): ([\d.e+]+) device-hours", out)]
    total = float(re.search(r"total: 14 runs, \d+ of \d+ files missing, ([\d.e+]+) device-hours estimated for "
                            r"sampling, the teacher samples fit draws and the training", out).group(1))
    assert len(parts) == 14 + 1 + 10 and total == pytest.approx(sum(parts), rel=0.01)
    trainings = [float(x) for x in re.findall(r"fit: trains \d+ iterations of batch \d+: ([\d.e+]+) device-hours", out)]
    assert len(trainings) == 10 and sum(trainings) > 0.5 * total  # on a CPU, the trainings are most of it


def test_a_training_is_priced_once_per_student_and_unmeasured_kinds_say_so(tmp_path, capsys):
    """Two seeds of one student train it once (its cache key holds no trial seed); a kind of iteration with no
    measurement is not priced, named with the machine and how to measure it, and counted in the total's line."""
    folder = tmp_path / "costs"
    folder.mkdir()
    (folder / "cpu-x-fp32.yaml").write_text(yaml.safe_dump({"kind": "cpu-x-fp32", "teachers": {"dit-xl-2-256": {
        "length": 256, "batches": {1: {"seconds": {"step": 1.0, "student_step": 0.5}, "device": "d", "command": "c"}},
        "training": {2: {"seconds": {"train ard S=2 N=1": 3.0}, "device": "d2", "command": "c2"}}}}}))
    suite = tmp_path / "s.yaml"
    suite.write_text(yaml.safe_dump({"experiment": "t", "seeds": [0, 1], "defaults": {
        "teacher": "dit-xl-2-256", "n_samples": 10, "batch_size": 10}, "trials": [
            {"method": "ard", "params": {"student_steps": 2, "n_traj": 10, "train_steps": 100, "batch": 4}},
            {"method": "kd", "params": {"n_traj": 10, "train_steps": 100, "batch": 4}}]}))
    assert main(["suite", str(suite), "--dry-run", "--device-kind", "cpu-x", "--costs", str(folder)]) == 0
    out = capsys.readouterr().out
    priced = 100 * 4 * 3.0 / 3600  # batch 4 at batch 2's cost per sample
    assert out.count(f"  fit: trains 100 iterations of batch 4: {priced:.3g} device-hours (train ard S=2 N=1 at "
                     f"batch 2's cost per sample, an upper bound)") == 1
    assert "  costs measured on d2 (c2)" in out
    assert out.count("  fit: trains 100 iterations of batch 4: shared with trial 1, priced there") == 1
    assert out.count("  fit: trains 100 iterations of batch 4: not priced (no measured 'train ard S=1' of "
                     "dit-xl-2-256 on cpu-x-fp32 at a batch <= 4: time it with `--cost --latency --record` on that "
                     "machine)") == 1
    assert "(1 trainings not priced)" in out
