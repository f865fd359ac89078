"""Reliability: bad input, interruption (SIGTERM, SIGKILL + doctor), an unreachable store, determinism, budgets and
sample memory. Cache integrity: tests/test_cache.py; killed sweep workers: tests/test_soak.py."""
from __future__ import annotations

import functools
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
import weakref
from pathlib import Path

import psutil
import pytest
import torch
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mlflow.tracking import MlflowClient

import core.budget
from core.budget import BudgetExceeded, budget
from core.cache import decode
from cli import main
from core.errors import UserError
from core.registry import METHODS
from bench.suite import load_suite
from core.trial import Trial
from methods.teacher_samplers import ARSampler
from sweeps.spec import load_spec
from tests.fakes import NO_CHECKPOINTS


def runs(uri: str, experiment: str = "accelbench"):
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(experiment)
    return client.search_runs([exp.experiment_id]) if exp else []


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens once the socket is closed


# ---- bad input ----------------------------------------------------------------------------------------------------

def test_argparse_errors_are_one_line(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["run", "--n-samples", "many"])
    err = capsys.readouterr().err.strip()
    assert exit_.value.code == 2 and len(err.splitlines()) == 1 and "--n-samples" in err and "'many'" in err


NAMES = st.sampled_from(["teacher", "method", "params", "metrics", "n_samples", "batch_size", "seed", "device",
                         "metric_repeats", "experiment", "seeds", "defaults", "trials", "study", "base", "space",
                         "objectives", "constraints", "sampler", "pruner", "n_trials", "window", "type", "low", "high",
                         "choices", "metric", "direction", "max_over_ref", "log", "step"])
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-5, 100), st.floats(allow_nan=True),
                    st.text(max_size=8), st.sampled_from(["table-ar", "sjd", "ar", "fid", "int", "minimize", "tpe"]))
VALUES = st.recursive(SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.one_of(NAMES, st.text(max_size=6)), inner, max_size=5)),
    max_leaves=12)
DOCUMENTS = st.one_of(VALUES, st.dictionaries(NAMES, VALUES, max_size=8))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(doc=DOCUMENTS, loader=st.sampled_from([functools.partial(load_suite, checkpoints=NO_CHECKPOINTS),
                                              functools.partial(load_spec, checkpoints=NO_CHECKPOINTS),
                                              Trial.from_yaml]))
def test_fuzzed_yaml_files_load_or_fail_with_one_clean_error(plugin, tmp_path, doc, loader):
    path = tmp_path / "fuzz.yaml"
    path.write_text(yaml.safe_dump(doc))
    try:
        loader(str(path))
    except UserError as exc:
        assert str(exc) and "\n" not in str(exc)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(params=st.lists(st.text(max_size=12), max_size=4))
def test_fuzzed_params_on_the_cli_fail_with_one_clean_line(plugin, tmp_path, capsys, params):
    capsys.readouterr()  # hypothesis reuses the fixture across examples
    args = ["run", "--teacher", "table-ar", "--method", "sjd", "--tracking-uri", "http://127.0.0.1:1",
            *[a for p in params for a in ("--param", p)]]
    try:
        code = main(args)  # valid params reach the store check, which fails: nothing runs either way
    except SystemExit as exit_:  # argparse: e.g. a value starting with "-" reads as an option
        code = exit_.code
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "Traceback" not in err


# ---- interruption -------------------------------------------------------------------------------------------------

def _run(tmp_path, store, *args) -> list[str]:
    return ["run", "--tracking-uri", store, "--cache-dir", str(tmp_path / "cache"), "--warmup", "0", "--no-progress",
            *args]


def _start(tmp_path, store, *args):
    """`_run` in a child process, its teacher stopped in its first pass (tests/plugins.py, HOLD_ENV): `tmp_path /
    "held"` then appears. The store must have its tables already (`fresh_store`): a child migrating a new SQLite
    store while this process reads it fails either of them."""
    env = {**os.environ, "ACCELBENCH_TEST_HOLD": str(tmp_path / "held")}
    return subprocess.Popen([sys.executable, "-m", "cli", *_run(tmp_path, store, *args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)


def _wait_until(predicate, proc, timeout=60.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        time.sleep(0.1)
    pytest.fail("timed out")


def _held(tmp_path, store):
    return (tmp_path / "held").exists() and any(r.info.status == "RUNNING" for r in runs(store))


# onestep* first builds Distilled Decoding's (noise, tokens) pairs, a cache entry built under a lock; the hold
# catches the build in its first pass however many pairs it makes, and a few are all the run after it has to make
PAIRS = ["--teacher", "slow-table-ar", "--method", "onestep*", "--param", "n_pairs=4", "--n-samples", "2"]


def _cache_files(tmp_path):
    return sorted(p for p in (tmp_path / "cache").rglob("*") if p.is_file() and p.suffix != ".lock")


def test_sigterm_mid_build_ends_the_run_killed_and_the_next_run_starts_clean(plugin, tmp_path, fresh_store):
    store = fresh_store
    proc = _start(tmp_path, store, *PAIRS)
    _wait_until(lambda: _held(tmp_path, store) and list((tmp_path / "cache").rglob("*.lock")), proc)  # building pairs
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM and "terminated" in err and "Traceback" not in err
    assert [r.info.status for r in runs(store)] == ["KILLED"]
    assert _cache_files(tmp_path) == []  # no entry, no temp file

    assert main(_run(tmp_path, store, *PAIRS)) == 0  # the same trial again, here: another process than the killed one
    assert sorted(r.info.status for r in runs(store)) == ["FINISHED", "KILLED"]
    for path in _cache_files(tmp_path):  # whole, checksummed entries
        decode(path.parent.name, path.stem, path.read_bytes())


def test_sigkill_leaves_an_orphan_that_doctor_marks_killed(plugin, tmp_path, fresh_store, capsys):
    store = fresh_store
    proc = _start(tmp_path, store, "--teacher", "slow-table-ar", "--method", "sjd", "--n-samples", "500")
    _wait_until(lambda: _held(tmp_path, store), proc)
    (tmp_path / "cache" / "things").mkdir(parents=True)
    (tmp_path / "cache" / "things" / ".abc.x1.tmp").write_bytes(b"half a")  # what a killed build leaves
    proc.kill()
    proc.wait()
    client = MlflowClient(store)
    exp = client.get_experiment_by_name("accelbench").experiment_id
    elsewhere = client.create_run(exp, tags={"accelbench.host": "other-host", "accelbench.pid": "1"}).info.run_id
    mine = client.create_run(exp, tags={"accelbench.host": socket.gethostname(), "accelbench.pid": str(os.getpid()),
                                        "accelbench.pid_started": f"{psutil.Process().create_time()}"})

    assert main(["doctor", "--tracking-uri", store, "--cache-dir", str(tmp_path / "cache")]) == 0
    out = capsys.readouterr().out
    assert "orphaned" in out and "marked KILLED" in out and "other-host" in out and ".abc.x1.tmp" in out
    status = {r.info.run_id: r.info.status for r in runs(store)}
    orphan = next(r for r in runs(store) if r.info.run_id not in (elsewhere, mine.info.run_id))
    assert orphan.info.status == "KILLED" and "is gone" in orphan.data.tags["accelbench.doctor"]
    assert status[elsewhere] == "RUNNING" and status[mine.info.run_id] == "RUNNING"  # not ours to judge / alive
    assert not list((tmp_path / "cache").rglob("*.tmp"))


def test_every_run_names_its_owner(plugin, tmp_path, fresh_store):
    store = fresh_store
    assert main(["run", "--teacher", "table-ar", "--method", "ar", "--n-samples", "2", "--tracking-uri", store,
                 "--cache-dir", str(tmp_path), "--no-progress"]) == 0
    (run,) = runs(store)
    assert run.data.tags["accelbench.host"] == socket.gethostname()
    assert run.data.tags["accelbench.pid"] == str(os.getpid())


# ---- tracking store down ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("scheme", ["http", "postgresql"])
def test_an_unreachable_store_fails_fast_naming_the_url_before_any_work(scheme, plugin, tmp_path, capsys):
    url = f"{scheme}://user:secret@127.0.0.1:{_closed_port()}/db"
    t0 = time.perf_counter()
    code = main(["run", "--teacher", "digits-ar-t2i", "--method", "sjd", "--tracking-uri", url,
                 "--cache-dir", str(tmp_path / "cache")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and time.perf_counter() - t0 < 10
    assert "cannot reach the MLflow tracking store" in err and url.replace("secret", "***") in err
    assert "secret" not in err and not (tmp_path / "cache").exists()  # no teacher trained


def test_an_unreachable_study_storage_fails_fast(plugin, tmp_path, capsys):
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump({"study": "s", "base": {"teacher": "table-ar", "method": "sjd"},
                                    "space": {"window": {"type": "int", "low": 1, "high": 4}},
                                    "objectives": [{"metric": "speedup_steps", "direction": "maximize"}]}))
    url = f"postgresql://postgres@127.0.0.1:{_closed_port()}/test"
    code = main(["sweep", str(spec), "--storage", url, "--tracking-uri", f"sqlite:///{tmp_path}/m.db"])
    assert code == 2 and f"cannot reach the study storage {url}" in capsys.readouterr().err


# ---- determinism --------------------------------------------------------------------------------------------------

MACHINE_DEPENDENT = ("sec_per_", "samples_per_sec", "speedup_wall", "fit/", "seconds")  # wall-clock figures


def test_the_same_trial_and_seed_give_identical_samples_and_metrics(tiny_recipe, tmp_path, fresh_store):
    store = fresh_store
    # 8 batches of one sample, each drawn from its own seed (seed, i): a batch drawn from another stream, or one
    # that SJD's acceptance draws differently, changes the samples and FID as surely as among 16
    args = ["run", "--teacher", "digits-ar-t2i", "--method", "sjd", "--param", "window=4", "--metric", "fid",
            "--n-samples", "8", "--seed", "3", "--tracking-uri", store, "--cache-dir", str(tmp_path / "cache"),
            "--warmup", "0", "--no-progress"]
    assert main(args) == 0 and main(args) == 0
    first, second = runs(store)
    assert first.data.tags["trial_key"] == second.data.tags["trial_key"]
    stable = {k for k in first.data.metrics if not any(m in k for m in MACHINE_DEPENDENT)}
    assert "fid.digits-cnn" in stable and "nfe_per_sample" in stable
    assert {k: first.data.metrics[k] for k in stable} == {k: second.data.metrics[k] for k in stable}
    client = MlflowClient(store)
    grids = [Path(client.download_artifacts(r.info.run_id, "samples.png", str(tmp_path / r.info.run_id))).read_bytes()
             for r in (first, second)]
    assert grids[0] == grids[1]
    assert main(["report", "--tracking-uri", store, "--out", str(tmp_path / "report")]) == 0
    text = (tmp_path / "report" / "REPORT.md").read_text()
    assert "Reproducibility: a trial" in text and "wall times and wall speed-ups vary" in text


# ---- resource limits ----------------------------------------------------------------------------------------------

class Hoarder(ARSampler):
    """AR that also allocates 16 MB per call and never frees it: a trial whose memory grows without bound."""

    hoard: list = []

    def sample(self, cond, *, generator):
        self.hoard.append(torch.ones(4, 2**20))
        return super().sample(cond, generator=generator)


class Watched(ARSampler):
    """AR that records, at every call, how many of its earlier outputs are still alive somewhere."""

    outputs: list = []
    alive_max = 0

    def sample(self, cond, *, generator):  # no reference cycles: refcounting frees a dropped output at once
        Watched.alive_max = max(Watched.alive_max, sum(ref() is not None for ref in self.outputs))
        out = super().sample(cond, generator=generator)
        self.outputs.append(weakref.ref(out.data))
        return out


class BudgetClock:
    """Stands in for the `time` module of core.budget: a clock that only `Stalled` moves, and that counts the
    watchdog's looks at it."""

    def __init__(self):
        self.now, self.reads = 0.0, 0

    def monotonic(self) -> float:
        self.reads += 1
        return self.now


class Stalled(ARSampler):
    """AR whose every call takes 1 s on the budget's clock (`clock`, set by the test), then waits until the watchdog
    has judged that time: however slow the machine, a 1.5 s budget stops the trial in the second call."""

    clock: BudgetClock

    def sample(self, cond, *, generator):
        self.clock.now += 1.0
        seen = self.clock.reads
        (watchdog,) = [t for t in threading.enumerate() if t.name == "accelbench-budget"]
        while self.clock.reads < seen + 2:  # a second look after the move: the first one let the trial go on
            time.sleep(0.001)  # the watchdog's interrupt lands here, as BudgetExceeded
            if not watchdog.is_alive():  # pytest.fail's error is no Exception: the budget cannot re-raise it as its own
                pytest.fail("the budget's watchdog ended without stopping the trial")
        return super().sample(cond, generator=generator)


def _run_in_process(tmp_path, store, method, *extra):
    return main(_run(tmp_path, store, "--teacher", "table-ar", "--method", method, *extra))


def test_a_trial_over_its_memory_budget_stops_with_a_clear_message(plugin, tmp_path, fresh_store, capsys,
                                                                   monkeypatch):
    store = fresh_store
    monkeypatch.setitem(METHODS._entries, "hoarder", Hoarder)
    limit = psutil.Process().memory_info().rss / 2**20 + 200
    # 300 calls hoard 4.8 GB, 24x the budget, which stopped it after 11 to 27 here (100,000 samples cost seconds of
    # bookkeeping for their batches, and an unstopped trial all the memory there is)
    code = _run_in_process(tmp_path, store, "hoarder", "--n-samples", "300", "--memory-budget", f"{limit:.0f}")
    err = capsys.readouterr().err.strip()
    Hoarder.hoard.clear()
    assert code == 2 and f"memory budget of {limit:.0f} MB exceeded" in err.splitlines()[-1]  # above: MLflow's logs
    (run,) = runs(store)
    assert run.info.status == "FAILED" and "memory budget" in run.data.tags["accelbench.error"]


def test_a_trial_over_its_time_budget_stops_with_a_clear_message(plugin, tmp_path, fresh_store, capsys, monkeypatch):
    # On the budget's own clock loading the teacher and opening the run take no time, and each call 1 s: the trial
    # stops in the same call on an idle or a loaded machine (a wall-clock budget stopped it anywhere, or not in time).
    clock = BudgetClock()
    monkeypatch.setattr(core.budget, "time", clock)
    monkeypatch.setattr(Stalled, "clock", clock, raising=False)
    monkeypatch.setitem(METHODS._entries, "stalled", Stalled)
    store = fresh_store
    code = _run_in_process(tmp_path, store, "stalled", "--n-samples", "5", "--time-budget", "1.5")
    err = capsys.readouterr().err.strip()
    assert code == 2 and "time budget of 1.5 s exceeded" in err and clock.now == 2  # without a budget: 0 and 5 s
    assert [r.info.status for r in runs(store)] == ["FAILED"]


def test_an_interrupt_that_native_code_turns_into_its_own_error_still_reads_as_the_budget():
    # As torch.save does when the interrupt lands in the Python file writer it calls ("basic_ios::clear")
    with pytest.raises(BudgetExceeded, match="time budget of 0.1 s exceeded") as caught:
        with budget(seconds=0.1):
            try:
                deadline = time.monotonic() + 10
                while time.monotonic() < deadline:  # short sleeps: the interrupt lands between two, not after 10 s
                    time.sleep(0.01)
            except BudgetExceeded:
                raise RuntimeError("basic_ios::clear: iostream error") from None
    assert isinstance(caught.value.__cause__, RuntimeError)
    with pytest.raises(RuntimeError, match="unrelated"), budget(seconds=10):
        raise RuntimeError("unrelated")  # within the budget an error is left as it is


def test_samples_are_not_kept_in_memory_while_sampling(plugin, tmp_path, fresh_store, monkeypatch):
    store = fresh_store
    monkeypatch.setitem(METHODS._entries, "watched", Watched)
    code = _run_in_process(tmp_path, store, "watched", "--n-samples", "10", "--batch-size", "2")
    assert code == 0 and len(Watched.outputs) == 6  # 5 batches, and the one sample its FLOPs are counted on
    assert Watched.alive_max <= 1  # before spooling, every batch sampled so far was held until scoring: 4 of them
    (run,) = runs(store)
    assert run.data.metrics["nfe_per_sample"] > 0


def open_stores_with_another_process(stores: list[str], folder: Path, cache: Path) -> None:
    """`accelbench doctor` on each store in turn, each opened once the other process that runs this has come to it
    too (a file per process and store in `folder`); a process that fails leaves its error there for the other."""
    failed = folder / "failed"
    for i, store in enumerate(stores):
        (folder / f"{i}.{os.getpid()}").touch()
        deadline = time.monotonic() + 120
        while len(list(folder.glob(f"{i}.*"))) < 2:
            assert not failed.exists(), f"the other process failed:\n{failed.read_text()}"
            assert time.monotonic() < deadline, f"the other process did not come to store {i} within 120 s"
            time.sleep(0.01)
        try:
            assert main(["doctor", "--tracking-uri", store, "--cache-dir", str(cache)]) == 0
        except BaseException:
            failed.write_text(f"store {i}: {traceback.format_exc()[-2000:]}")
            raise


def test_two_first_runs_at_once_on_a_new_sqlite_store_both_open_it(tmp_path):
    """MLflow migrates a new SQLite store when it first opens it; two processes doing so at once collided ("Online
    migration expected to match one row", "duplicate column name") until the opening took a lock. Two new stores,
    each opened by this process and a child once both have come to it: without the lock the first failed, 8 times
    in 8 here. One child for both: a process per store cost seconds of start-up each, and tested nothing more."""
    stores = [f"sqlite:///{tmp_path}/s{i}/mlflow.db" for i in range(2)]
    (tmp_path / "barrier").mkdir()
    code = ("import json, pathlib, sys; from tests.test_reliability import open_stores_with_another_process as f; "
            "f(json.loads(sys.argv[1]), pathlib.Path(sys.argv[2]), pathlib.Path(sys.argv[3]))")
    argv = [sys.executable, "-c", code, json.dumps(stores), str(tmp_path / "barrier"), str(tmp_path / "cache")]
    child = subprocess.Popen(argv, cwd=Path(__file__).resolve().parent.parent, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        open_stores_with_another_process(stores, tmp_path / "barrier", tmp_path / "cache")
        _, err = child.communicate(timeout=300)
        assert child.returncode == 0, err[-2000:]
    finally:
        child.kill()
        child.wait()
