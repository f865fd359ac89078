"""Faults during work: a read-only MLflow store (before the run, and turning read-only mid-run) and a full disk under
the spool, the cache or the store. Each ends in one line naming the file and the cause, the run ended FAILED with
the reason where the store can still record it, and the spool and the cache intact: the same command, once the space
or the access is back, resumes from the samples drawn.

Real faults: a small tmpfs filled to the last page, a read-only bind mount. Both need root (CAP_SYS_ADMIN); where
mounting is not permitted the tests are skipped, saying so. A fault lands at a fixed call of a method (`Fault`),
never after a sleep."""
from __future__ import annotations

import errno
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest
from mlflow.tracking import MlflowClient

from bench.tracking import ERROR_TAG, Tracker
from cli import main
from core.cache import decode
from core.registry import METHODS
from methods.onestep import OneStep
from methods.teacher_samplers import ARSampler

FULL = "No space left on device"
READ_ONLY = "Read-only file system"


@dataclass
class Fault:
    """Runs `action` once, at the `at`-th tick (a faulty method's call): the fault lands at the same point of a trial
    however fast the machine."""

    action: Callable[[], None] | None = None
    at: int = 1
    ticks: int = 0

    def tick(self) -> None:
        self.ticks += 1
        if self.ticks == self.at and self.action is not None:
            action, self.action = self.action, None  # once: the rerun draws without it
            action()


class FaultyAR(ARSampler):
    """The teacher's AR sampler, ticking `fault` before each call: batch i is drawn in tick i + 1 (no warm-up)."""

    fault: Fault

    def sample(self, cond, *, generator):
        self.fault.tick()
        return super().sample(cond, generator=generator)


class FaultyOneStep(OneStep):
    """`onestep*`, ticking `fault` before it fits: before it builds and saves its pair dataset, a cache entry."""

    fault: Fault

    def fit(self, *, cache, checkpoints):
        self.fault.tick()
        return super().fit(cache=cache, checkpoints=checkpoints)


@pytest.fixture()
def fault(plugin, monkeypatch) -> Fault:
    """The faulty methods registered for this test, and the `Fault` they tick, not armed yet."""
    f = Fault()
    for name, cls in (("faulty-ar", FaultyAR), ("faulty-onestep", FaultyOneStep)):
        monkeypatch.setitem(METHODS._entries, name, cls)
        monkeypatch.setattr(cls, "fault", f, raising=False)
    return f


class Mounts:
    """mount(8) for one test; what is still mounted at its end is unmounted lazily (MLflow keeps a store's database
    open, which would make a plain unmount fail as busy)."""

    def __init__(self):
        self.mounted: list[Path] = []

    def _mount(self, *args: str) -> None:
        done = subprocess.run(["mount", *args], capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(done.stderr.strip().splitlines()[0])  # mount(8) adds a line about dmesg

    def tmpfs(self, folder: Path, size: str) -> Path:
        folder.mkdir(parents=True, exist_ok=True)
        self._mount("-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder))
        self.mounted.append(folder)
        return folder

    def read_only(self, path: Path) -> None:
        """`path` (a file or a folder) read-only from now on, for root too: a read-only bind mount over it. A file
        opened before stays writable through its descriptor, which belongs to the mount below (MLflow's pooled
        connection to a database); what is opened or made by name from now on (SQLite's journal) is refused."""
        self._mount("--bind", str(path), str(path))
        self.mounted.append(path)
        self._mount("-o", "remount,bind,ro", str(path))

    def undo(self, path: Path) -> None:
        subprocess.run(["umount", str(path)], check=True)
        self.mounted.remove(path)


@pytest.fixture()
def mounts(tmp_path):
    if shutil.which("mount") is None:
        pytest.skip("no mount(8) here: the fault tests make a real full disk (tmpfs), a read-only store (bind mount)")
    m = Mounts()
    try:
        m.undo(m.tmpfs(tmp_path / "probe", "4k"))
    except RuntimeError as exc:
        pytest.skip(f"mounting is not permitted here ({exc}): the fault tests make a real full disk (tmpfs) and a "
                    f"read-only store (bind mount), which needs root (CAP_SYS_ADMIN)")
    yield m
    for path in reversed(m.mounted):
        subprocess.run(["umount", "-l", str(path)], check=True)


def fill(folder: Path) -> Path:
    """`folder`'s file system filled to the last page by the file `folder/filler`: delete it to free it."""
    filler = folder / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
    try:
        while True:
            os.write(fd, bytes(1 << 16))  # the write that does not fit writes what fits, the next one fails
    except OSError as exc:
        assert exc.errno == errno.ENOSPC
    finally:
        os.close(fd)
    return filler


@pytest.fixture(scope="module")
def new_store(tmp_path_factory) -> Path:
    """A new SQLite store's file, its tables made once: a copy is a new store without MLflow's migrations (seconds
    each)."""
    db = tmp_path_factory.mktemp("new-store") / "mlflow.db"
    MlflowClient(f"sqlite:///{db}").search_experiments()
    return db


def _store(new_store: Path, folder: Path) -> str:
    folder.mkdir(exist_ok=True)
    shutil.copyfile(new_store, folder / "mlflow.db")
    return f"sqlite:///{folder}/mlflow.db"


def _run(tmp_path: Path, uri: str, method: str, *args: str) -> int:
    return main(["run", "--teacher", "table-ar", "--method", method, "--n-samples", "4", "--tracking-uri", uri,
                 "--cache-dir", str(tmp_path / "cache"), "--warmup", "0", "--no-progress", *args])


def _runs(uri: str) -> list:
    client = MlflowClient(uri)
    return sorted(client.search_runs([client.get_experiment_by_name("accelbench").experiment_id]),
                  key=lambda r: r.info.start_time)


def _spool(tmp_path: Path) -> Path:
    (folder,) = (tmp_path / "cache" / ".spool").glob("*/")
    return folder


def _left_over(tmp_path: Path) -> list[Path]:
    """What failed writes left in the cache: temp files."""
    return sorted((tmp_path / "cache").rglob("*.tmp"))


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err[-3000:]
    return err


# ---- a read-only store ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("what", ["database", "store folder", "artifact folder"])
def test_a_read_only_store_is_refused_before_any_work(what, plugin, mounts, new_store, tmp_path, capsys, monkeypatch):
    # Every session opens the database anew, as a new `accelbench` process does: a connection this process opened
    # before the mount (MLflow pools them) would still write.
    monkeypatch.setenv("MLFLOW_SQLALCHEMYSTORE_POOLCLASS", "NullPool")
    store = tmp_path / "store"
    uri = _store(new_store, store)
    Tracker(uri, "accelbench")  # a store used before: its experiment made
    (store / "mlruns").mkdir()
    mounts.read_only({"database": store / "mlflow.db", "store folder": store,
                      "artifact folder": store / "mlruns"}[what])
    code = _run(tmp_path, uri, "ar")
    named = store / "mlruns" if what == "artifact folder" else store / "mlflow.db"
    assert _one_line(capsys) == f"accelbench: error: MLflow tracking store {uri}: cannot write {named}: {READ_ONLY}"
    assert code == 2 and not (tmp_path / "cache").exists()  # no spool claimed, no teacher loaded, nothing drawn


def test_a_store_turning_read_only_mid_run_fails_in_one_line_and_the_rerun_resumes(fault, mounts, new_store,
                                                                                   tmp_path, capsys):
    store = tmp_path / "store"
    uri = _store(new_store, store)
    # in the second batch: the run and its params are written, its metrics are not
    fault.action, fault.at = (lambda: mounts.read_only(store)), 2
    assert _run(tmp_path, uri, "faulty-ar") == 1
    assert _one_line(capsys) == f"accelbench: cannot write {store / 'mlflow.db'}: {READ_ONLY}"
    assert len(list((_spool(tmp_path) / "method").glob("*.pt"))) == 4 and not _left_over(tmp_path)

    mounts.undo(store)
    assert _run(tmp_path, uri, "faulty-ar") == 0
    failed, rerun = _runs(uri)
    # the store could not record the end: RUNNING until the doctor, or the next process's rerun, finds the owner gone
    assert failed.info.status == "RUNNING" and ERROR_TAG not in failed.data.tags
    assert rerun.info.status == "FINISHED" and rerun.data.tags["resumed_from"] == "4"


# ---- a full disk ---------------------------------------------------------------------------------------------------

def test_a_full_disk_under_the_spool_fails_in_one_line_and_the_rerun_resumes(fault, mounts, new_store, tmp_path,
                                                                             capsys):
    uri = _store(new_store, tmp_path / "store")
    cache = mounts.tmpfs(tmp_path / "cache", "1m")
    fault.action, fault.at = (lambda: fill(cache)), 3  # in the third batch: two are spooled
    assert _run(tmp_path, uri, "faulty-ar") == 1
    batch = _spool(tmp_path) / "method" / "0000002.pt"
    line = f"cannot write {batch}: {FULL}"
    assert _one_line(capsys) == f"accelbench: {line}"
    (failed,) = _runs(uri)
    assert failed.info.status == "FAILED" and failed.data.tags[ERROR_TAG] == f"WriteFailed: {line}"
    assert sorted(p.name for p in batch.parent.iterdir()) == ["0000000.pt", "0000001.pt"] and not _left_over(tmp_path)

    (cache / "filler").unlink()
    assert _run(tmp_path, uri, "faulty-ar") == 0
    rerun = _runs(uri)[1]
    assert rerun.info.status == "FINISHED" and rerun.data.tags["resumed_from"] == "2"


def test_a_full_disk_under_the_cache_fails_in_one_line_leaving_no_part_of_the_entry(fault, mounts, new_store,
                                                                                    tmp_path, capsys):
    uri = _store(new_store, tmp_path / "store")
    cache = mounts.tmpfs(tmp_path / "cache", "1m")
    fault.action = (lambda: fill(cache))  # as the method fits: its pair dataset does not fit
    pairs = ["--param", "n_pairs=16", "--n-samples", "2"]
    assert _run(tmp_path, uri, "faulty-onestep", *pairs) == 1
    line = _one_line(capsys)[len("accelbench: "):]
    assert re.fullmatch(rf"cannot write {re.escape(str(cache))}/dd-pairs/\w+\.pt: {FULL}", line), line
    (failed,) = _runs(uri)
    assert failed.info.status == "FAILED" and failed.data.tags[ERROR_TAG] == f"WriteFailed: {line}"
    assert not list(cache.glob("dd-pairs/*")) and not _left_over(tmp_path)  # no part of the entry, no temp file

    (cache / "filler").unlink()
    assert _run(tmp_path, uri, "faulty-onestep", *pairs) == 0
    assert _runs(uri)[1].info.status == "FINISHED"
    (entry,) = (cache / "dd-pairs").iterdir()
    decode("dd-pairs", entry.stem, entry.read_bytes())  # whole, checksummed


def test_a_full_disk_under_the_store_database_fails_in_one_line_and_the_rerun_resumes(fault, mounts, new_store,
                                                                                      tmp_path, capsys):
    store = mounts.tmpfs(tmp_path / "store", "4m")
    uri = _store(new_store, store)
    fault.action, fault.at = (lambda: fill(store)), 2  # second batch: the run and its params written, not its metrics
    assert _run(tmp_path, uri, "faulty-ar") == 1
    assert _one_line(capsys) == f"accelbench: cannot write {store / 'mlflow.db'}: {FULL}"
    assert len(list((_spool(tmp_path) / "method").glob("*.pt"))) == 4 and not _left_over(tmp_path)

    (store / "filler").unlink()
    assert _run(tmp_path, uri, "faulty-ar") == 0
    failed, rerun = _runs(uri)
    assert failed.info.status == "RUNNING"  # its end could not be recorded either
    assert rerun.info.status == "FINISHED" and rerun.data.tags["resumed_from"] == "4"


def test_a_full_disk_under_the_artifacts_fails_in_one_line_and_the_rerun_resumes(plugin, mounts, new_store, tmp_path,
                                                                                 capsys):
    store = tmp_path / "store"
    uri = _store(new_store, store)
    artifacts = mounts.tmpfs(store / "mlruns", "1m")
    filler = fill(artifacts)  # the database has room: the run is recorded, its files are not
    assert _run(tmp_path, uri, "ar") == 1
    (failed,) = _runs(uri)
    line = _one_line(capsys)[len("accelbench: "):]
    files = re.escape(f"{artifacts}/{failed.info.run_id}/artifacts/")
    assert re.fullmatch(rf"cannot write {files}(samples\.png|trial\.yaml): {FULL}", line), line
    assert failed.info.status == "FAILED" and failed.data.tags[ERROR_TAG] == f"WriteFailed: {line}"
    assert len(list((_spool(tmp_path) / "method").glob("*.pt"))) == 4 and not _left_over(tmp_path)

    filler.unlink()
    assert _run(tmp_path, uri, "ar") == 0
    rerun = _runs(uri)[1]
    assert rerun.info.status == "FINISHED" and rerun.data.tags["resumed_from"] == "4"
