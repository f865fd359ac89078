"""Data-parallel trials under torchrun (gloo, CPU processes) equal one process; a SIGKILLed trial resumes from its
spool to the numbers of an uninterrupted run; the trial's numerics fields."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import yaml
from mlflow.tracking import MlflowClient

from core import precision
from core.cache import Cache
from cli import main
from core.errors import UserError
from core.spool import SPOOL_DIR, Batch, claim, resumable
from core.timing import latency_stats
from core.trial import Trial
from bench.plan import plan
from teachers import load_teacher
from tests.fakes import NO_CHECKPOINTS

ROOT = Path(__file__).resolve().parent.parent

# One trial per family, each on a tiny registered teacher (tests/tiny_recipes.py), small enough for a test: an odd
# number of batches, so rank 0 draws one more than rank 1. `dd` and `ard` with `ddp` train on both ranks at once
# (their training data too: `dd`'s pairs, `ard`'s trajectories, split over the ranks), rank 1 drawing its batch with
# its own replica: equal to rank 0's cached one, which the one-process run reads, only if the ranks' gradients were
# averaged. Rank 0 scores the very samples it hashes, so one cheap quality metric (`entropy`) suffices here (FID's
# classifier, trained, then read back, is the SIGKILL test's). Two suites of about equal work, each launched once per
# module (`launched`).
DD = {"n_pairs": 600, "train_steps": 4, "batch": 16, "solver_steps": 3}  # 3 generation batches of pairs: 2 on rank 0
SUITES = {
    "tokens": [
        {"teacher": "digits-ar-t2i", "method": "sjd", "params": {"window": 4}, "batch_size": 1, "n_samples": 5},
        {"teacher": "digits-ar-c2i", "method": "dd", "params": {**DD, "ddp": True}},
        {"teacher": "digits-var-c2i", "method": "ar"},
        {"teacher": "wordnet-mdlm", "method": "mdlm", "params": {"steps": 4}, "metrics": ["entropy"]},
    ],
    "continuous": [
        {"teacher": "digits-mar-c2i", "method": "cspd", "params": {"gamma": 2, "steps": 2}},
        {"teacher": "digits-mar-masked-c2i", "method": "cspd", "params": {"gamma": 2, "steps": 2}},
        {"teacher": "digits-dit-c2i", "method": "ddim", "params": {"steps": 3}, "dtype": "bf16"},
        # 600 trajectories: shard 0 made by rank 0, 1 by rank 1
        {"teacher": "digits-dit-c2i", "method": "ard", "params": {"ddp": True, "steps": 8, "student_steps": 2,
                                                                 "n_traj": 600, "train_steps": 3, "batch": 4}},
    ],
}
# `sdtt`'s student of two ranks is not one process's (each rank draws its own batches): run on two ranks only, twice in
# one launch, told apart by a metric (which changes the trial's key, not its samples). lr 0.3: replicas left apart
# would sample other tokens (at 0.01 they did not, measured).
SDTT = {"teacher": "wordnet-mdlm", "method": "sdtt", "n_samples": 2, "batch_size": 1, "params": {
    "ddp": True, "steps": 4, "rounds": 1, "iters_per_round": 3, "batch": 4, "lr": 0.3, "ar_arm": False}}
TWO_RANKS_ONLY = {"tokens": [SDTT, {**SDTT, "metrics": ["entropy"]}]}
FAMILIES = {"tokens": {"ar-token", "multiscale-vq", "masked-diffusion-lm"},
            "continuous": {"continuous-ar", "masked-ar", "ode-diffusion"}}
TIMING = ("sec_per", "samples_per_sec", "speedup_wall", "compile_seconds")


def _env(**extra) -> dict[str, str]:
    return {**os.environ, "ACCELBENCH_PLUGINS": "tests.tiny_recipes_plugin", "PYTHONPATH": str(ROOT),
            "OMP_NUM_THREADS": "1", **extra}


def _cli(*args, nproc: int = 1) -> list[str]:
    launcher = ([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]
                if nproc > 1 else [sys.executable])
    return [*launcher, "-m", "cli", *args]


def _trial_runs(uri: str, experiment: str) -> dict[str, object]:
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(experiment)
    runs = client.search_runs([exp.experiment_id], "tags.`accelbench.kind` = 'trial'")
    return {r.data.tags["trial_key"]: r for r in runs}


def _same(a, b) -> None:
    """Same samples (hashes), same counts and quality metrics; timings differ, and `fit/` says whether the training
    was found in the cache."""
    hashes = {k: v for k, v in a.data.tags.items() if k.startswith("samples_sha256.")}
    assert hashes and hashes == {k: v for k, v in b.data.tags.items() if k.startswith("samples_sha256.")}
    untimed = {k: v for k, v in a.data.metrics.items() if not any(t in k for t in TIMING) and not k.startswith("fit/")}
    assert "nfe_per_sample" in untimed and untimed == {k: b.data.metrics[k] for k in untimed}


@dataclass(frozen=True)
class Launched:
    store: str  # the two-rank runs of suite `name` in experiment `name`, the one-process runs in `name-one`
    cache: Path  # every suite's: what rank 0 trained


@pytest.fixture(scope="module")
def launched(tmp_path_factory, migrated_store_file):
    """`launched(name)`: SUITES[name] run once per module, by the first test that asks, under torchrun on two ranks
    (with TWO_RANKS_ONLY[name]), then in this process from the same cache, into one store. The asking test uses
    `tiny_recipe` (this process's teachers must be the ranks')."""
    base = tmp_path_factory.mktemp("ddp")
    shutil.copyfile(migrated_store_file, base / "mlflow.db")
    out = Launched(f"sqlite:///{base}/mlflow.db", base / "cache")
    done = set()

    def launch(name: str) -> Launched:
        if name not in done:
            # no warm-up: a rank's first batch is then its first call of each arm, as batch 0 is one process's
            common = ["--cache-dir", str(out.cache), "--tracking-uri", out.store, "--no-progress", "--warmup", "0",
                      "--threads", "1"]
            for experiment, ranks in ((name, 2), (f"{name}-one", 1)):
                trials = SUITES[name] + (TWO_RANKS_ONLY.get(name, []) if ranks == 2 else [])
                suite = base / f"{experiment}.yaml"
                suite.write_text(yaml.safe_dump({"experiment": experiment, "trials": trials,
                                                 "defaults": {"n_samples": 6, "batch_size": 2}}))
                command = ["suite", str(suite), "--out", str(base / experiment), *common]
                if ranks == 2:
                    ran = subprocess.run(_cli(*command, nproc=2), env=_env(), capture_output=True, text=True,
                                         timeout=600)
                    assert ran.returncode == 0, ran.stderr[-3000:]
                else:  # from the cache the ranks filled: what rank 0 trained
                    assert main(command) == 0
            done.add(name)
        return out

    return launch


@pytest.mark.parametrize("suite", SUITES)
def test_torchrun_two_ranks_equal_one_process(suite, launched, tiny_recipe):
    ran = launched(suite)
    runs2, runs1 = _trial_runs(ran.store, suite), _trial_runs(ran.store, f"{suite}-one")
    assert len(runs1) == len(SUITES[suite]) and len(runs2) == len(runs1) + len(TWO_RANKS_ONLY.get(suite, []))
    runs2 = {key: runs2[key] for key in runs1}
    assert {r.data.tags["family"] for r in runs2.values()} == FAMILIES[suite]
    for key, run in runs2.items():
        assert run.data.params["world_size"] == "2" and runs1[key].data.params["world_size"] == "1"
        assert "samples_per_sec_rank1" in run.data.metrics and "ref/samples_per_sec_rank0" in run.data.metrics
        _same(run, runs1[key])
        if run.data.params.get("ddp") == "True":  # trained on both ranks, then read by the one process
            assert (run.data.metrics["fit/student_cached"], runs1[key].data.metrics["fit/student_cached"]) == (0, 1)
    bf16 = [r for r in runs2.values() if r.data.params["dtype"] == "bf16"]
    assert len(bf16) == sum(t.get("dtype") == "bf16" for t in SUITES[suite])
    assert all(r.data.tags["precision"] == "bf16 autocast, no tf32 (cpu)" for r in bf16)
    client = MlflowClient(ran.store)
    keys = [r.data.tags["cache_key"] for r in client.search_runs(
        [client.get_experiment_by_name("accelbench-training").experiment_id])]
    assert keys and len(keys) == len(set(keys))  # each teacher and student trained once, by rank 0
    assert not [p for p in (ran.cache / SPOOL_DIR).iterdir() if p.is_dir()]  # logged runs leave no spool


def test_dd_trained_with_ddp_on_two_ranks_equals_the_one_process_student(launched, tiny_recipe, tmp_path):
    """DDP's average of the ranks' gradients, each rank's loss its share over the global batch's target count: the
    one-process loss of the global batch, so two ranks train the student one process trains (to float rounding)."""
    two = launched("tokens").cache
    p = plan(Trial("digits-ar-c2i", "dd", params=DD), checkpoints=NO_CHECKPOINTS)
    teacher = load_teacher("digits-ar-c2i", cache=Cache(two), device=torch.device("cpu"), checkpoints=NO_CHECKPOINTS)
    p.method_cls(teacher, p.config).fit(cache=Cache(tmp_path), checkpoints=NO_CHECKPOINTS)  # pairs and student here
    (two_student,), (one,) = ([Cache(c).load("dd-students", f.stem) for f in (c / "dd-students").glob("*.pt")]
                              for c in (two, tmp_path))
    (two_pairs,), (one_pairs,) = ([Cache(c).load("dd-pairs", f.stem) for f in (c / "dd-pairs").glob("*.pt")]
                                  for c in (two, tmp_path))
    assert torch.equal(two_pairs["tokens"], one_pairs["tokens"])
    assert not any((two / "dd-pairs-parts").iterdir())  # the ranks' parts, gathered, are gone
    assert two_student["state_dict"].keys() == one["state_dict"].keys()
    for name, weight in one["state_dict"].items():
        torch.testing.assert_close(two_student["state_dict"][name], weight, rtol=1e-4, atol=1e-5, msg=name)


def test_sdtt_distilled_with_ddp_leaves_every_rank_the_student_rank_0_caches(launched, tiny_recipe):
    """Each rank distils on its own share of the global batch; with the gradients averaged every replica stays the
    same. The first `sdtt` trial of the launch (TWO_RANKS_ONLY) has rank 1 sample its batch with its own replica, the
    second with rank 0's cached one: the samples match only if the replicas did."""
    runs = {r.data.params["metrics"]: r for r in _trial_runs(launched("tokens").store, "tokens").values()
            if r.data.params["method"] == "sdtt"}
    first, second = runs[""], runs["entropy"]
    assert (first.data.metrics["fit/student_cached"], second.data.metrics["fit/student_cached"]) == (0.0, 1.0)
    assert first.data.tags["samples_sha256.method"] == second.data.tags["samples_sha256.method"]


def test_sigkilled_trial_resumes_to_the_uninterrupted_numbers(tmp_path, tiny_recipe, plugin, migrated_store_file,
                                                               capsys):
    """The trial is SIGKILLed in its 4th batch of 10, held there (tests/plugins.py) with 3 spooled."""
    cache, held = tmp_path / "cache", tmp_path / "held"
    trial = ["run", "--teacher", "held-digits-ar-c2i", "--method", "ar", "--n-samples", "40", "--batch-size", "4",
             "--metric", "fid", "--cache-dir", str(cache), "--no-progress", "--warmup", "0"]
    store, fresh = (f"sqlite:///{tmp_path}/{db}" for db in ("mlflow.db", "fresh.db"))
    for db in ("mlflow.db", "fresh.db"):
        shutil.copyfile(migrated_store_file, tmp_path / db)
    proc = subprocess.Popen(_cli(*trial, "--tracking-uri", store), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=_env(ACCELBENCH_PLUGINS="tests.tiny_recipes_plugin,tests.plugins",
                                                ACCELBENCH_TEST_HOLD_AFTER=f"3:{held}"))
    deadline = time.monotonic() + 300
    while not held.exists():
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "the trial did not reach its 4th batch"
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert [r.info.status for r in MlflowClient(store).search_runs(["1"])] == ["RUNNING"]

    # the rest in this process, with the same recipes and cache: what the killed process trained is loaded. The
    # doctor's store is another (it would end the killed run), empty until the uninterrupted run
    assert main(["doctor", "--tracking-uri", fresh, "--cache-dir", str(cache)]) == 0
    out = capsys.readouterr().out
    assert "resumable: trial" in out and "ar on held-digits-ar-c2i" in out, out

    assert main([*trial, "--tracking-uri", store]) == 0
    runs = MlflowClient(store).search_runs(["1"])
    assert sorted(r.info.status for r in runs) == ["FINISHED", "KILLED"]  # no RUNNING run left behind
    resumed = next(r for r in runs if r.info.status == "FINISHED")
    killed = next(r for r in runs if r.info.status == "KILLED")
    assert resumed.data.tags["resumed_from"] == "12" and resumed.data.tags["resumed_run"] == killed.info.run_id

    assert main([*trial, "--tracking-uri", fresh]) == 0
    uninterrupted = MlflowClient(fresh).search_runs(["1"])[0]
    assert "resumed_from" not in uninterrupted.data.tags
    _same(resumed, uninterrupted)
    assert "fid.digits-cnn" in resumed.data.metrics


def test_trial_numerics_fields_are_checked_and_keyed():
    with pytest.raises(UserError, match="dtype must be one of fp32, bf16, fp16, got 'fp64'"):
        Trial("t", "m", dtype="fp64")
    with pytest.raises(UserError, match="compile must be true or false"):
        Trial("t", "m", compile="yes")
    assert Trial("t", "m", dtype="bf16").key() != Trial("t", "m").key()


def test_latency_of_several_ranks_is_each_ranks_median_and_summed_throughput():
    stats = latency_stats([1.0, 3.0, 2.0, 2.0, 2.0, 6.0], [1, 1, 1, 1, 1, 1], ranks=[0, 1, 0, 1, 0, 1])
    assert stats["sec_per_sample_median"] == pytest.approx((2.0 + 3.0) / 2)  # the median of the ranks' medians
    assert stats["samples_per_sec_rank0"] == pytest.approx(3 / 5) and stats["samples_per_sec_rank1"] == 3 / 11
    assert stats["samples_per_sec"] == pytest.approx(3 / 5 + 3 / 11)
    assert latency_stats([1.0, 3.0], [1, 1]) == latency_stats([1.0, 3.0], [1, 1], ranks=[0, 0])


def test_compiled_blocks_run_eagerly_again_after_the_trial():
    class Owner:
        def __init__(self):
            self.network = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ModuleList([torch.nn.Linear(2, 2)]))

    owner = Owner()
    with precision.compiled(True, owner) as n:
        assert n == 1 and owner.network[1][0]._compiled_call_impl is not None  # the block of the list, not the net
    assert owner.network[1][0]._compiled_call_impl is None


def test_a_trial_run_twice_at_once_samples_into_a_private_spool(tmp_path, capsys):
    trial = Trial("some-teacher", "some-method")
    batch = Batch(torch.zeros(2, 3), torch.zeros(2, 1), Counter(nfe=2), 0.5)
    with claim(tmp_path, trial, "v1") as first:
        first.arm("method").write(0, batch)
        with claim(tmp_path, trial, "v1") as second:  # another process would hold the same lock
            assert second.folder != first.folder and not second.arm("method").has(0)
        assert not second.folder.exists() and "private spool" in capsys.readouterr().err
    assert first.arm("method").read(0).counters == Counter(nfe=2)  # kept: the trial can resume from it
    assert "batches spooled per arm {'method': 1}" in resumable(tmp_path)[0]
    with claim(tmp_path, trial, "v2") as third:  # drawn by another code version: never mixed in
        assert not third.arm("method").has(0)
    assert resumable(tmp_path) == []


def test_a_spool_drawn_on_another_thread_count_is_not_resumed():
    """Its batch times were measured on other threads: a resumed run would mix them into its wall figures."""
    from bench.runner import RunOptions, spool_version

    assert spool_version(RunOptions(threads=1)) != spool_version(RunOptions(threads=2))
    assert spool_version(RunOptions(threads=2, warmup=0)) == spool_version(RunOptions(threads=2))


def test_numerics_and_device_options_reach_the_trial_and_a_suites_trials(tmp_path):
    from cli import build_parser, options
    from cli.trials import _trial_from_args
    from bench.suite import load_suite

    parser = build_parser()
    args = parser.parse_args(["run", "--teacher", "t", "--method", "m", "--dtype", "bf16", "--tf32", "on", "--compile"])
    trial = _trial_from_args(args)
    assert (trial.dtype, trial.tf32, trial.compile) == ("bf16", True, True)
    defaults = _trial_from_args(parser.parse_args(["run", "--teacher", "t", "--method", "m"]))
    assert (defaults.dtype, defaults.tf32, defaults.compile) == ("fp32", False, False)
    suite = tmp_path / "suite.yaml"
    suite.write_text(yaml.safe_dump({"experiment": "e", "defaults": {"dtype": "bf16"}, "trials": [
        {"teacher": "digits-dit-c2i", "method": "ddim"},
        {"teacher": "digits-dit-c2i", "method": "ddim", "tf32": True}]}))
    kept = options.suite_fields(parser.parse_args(["suite", str(suite)]))
    kept_plans = load_suite(str(suite), checkpoints=NO_CHECKPOINTS, fields=kept).plans
    assert kept == {} and [p.trial.dtype for p in kept_plans] == ["bf16", "bf16"]
    forced = options.suite_fields(parser.parse_args(["suite", str(suite), "--dtype", "fp32", "--no-compile",
                                                     "--device", "cpu"]))
    plans = load_suite(str(suite), checkpoints=NO_CHECKPOINTS, fields=forced).plans
    assert [(p.trial.dtype, p.trial.tf32, p.trial.compile) for p in plans] == [("fp32", False, False),
                                                                                ("fp32", True, False)]
    assert all(p.trial.device == "cpu" and p.device.type == "cpu" for p in plans)
