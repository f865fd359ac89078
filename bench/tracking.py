"""MLflow logging of trials and teacher trainings, through `MlflowClient` with batched calls.

Default store: a SQLite file in the working directory (`sqlite:///mlflow.db`); `--tracking-uri` or
`MLFLOW_TRACKING_URI` override it. A run is always ended: FINISHED, FAILED, or KILLED on interruption (Ctrl-C, or
SIGTERM, which the CLI turns into an interruption). A run whose process was SIGKILLed stays RUNNING; its host / pid
tags let `accelbench doctor` find and mark it.

A store that cannot be written (a read-only SQLite file or folder, a read-only artifact folder) is refused before any
work; one that fills up or turns read-only during a run fails the write as `WriteFailed`, one line naming the file.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import logging
import os
import socket
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator
from urllib.parse import urlencode, urlsplit
from urllib.request import url2pathname

from core.errors import UserError, WriteFailed
from core.names import KIND_TAG, TRAINING

DEFAULT_URI = "sqlite:///mlflow.db"
TRAINING_EXPERIMENT = "accelbench-training"
# MLflow 3 opens an experiment on its GenAI overview unless it is a model-development one: the runs table, here.
EXPERIMENT_KIND = {"mlflow.experimentKind": "custom_model_development"}
# The experiments' descriptions in the MLflow UI (Markdown): one line per paragraph, as stores already hold them.
TRIALS_NOTE = (
    "AccelBench trials: one run per (method, teacher, knobs, seed). Each run samples the method and the teacher's own "
    "sampler (the reference arm, metrics `ref/...`) side by side in one process, on the same conditions and seed "
    "(coupled noise).\n\n"
    "Columns to add: metrics `speedup_wall`, `speedup_steps`, `nfe_per_sample`, `sec_per_sample_median`, "
    "`acceptance_rate`, the quality metrics (e.g. `fid.digits-cnn` and `ref/fid.digits-cnn`); params `teacher`, "
    "`method`, `seed` and the method's knobs (e.g. `window`, `init`, `cfg`).\n\n"
    "Filter e.g. `params.method = 'sjd' and params.window = '16'`; the dataset each run is scored against is its "
    "input.")
TRAINING_NOTE = (
    "Trainings of teachers, companion models and feature extractors triggered by AccelBench trials: one run each, with "
    "the recipe as params and the training figures (losses, test scores, seconds) as metrics; the `cache_key` tag "
    "names the cache entry it produced.")


ORPHAN_TAG = "accelbench.doctor"  # why a RUNNING run was ended KILLED after its process was gone
ERROR_TAG = "accelbench.error"  # why a run ended FAILED
DEFAULT_PORTS = {"http": 80, "https": 443, "postgresql": 5432, "mysql": 3306}
CONNECT_TIMEOUT = 3.0  # seconds; the clients' own retries take minutes against a server that is down


def tracking_uri(explicit: str | None = None) -> str:
    return explicit or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_URI


def check_reachable(url: str, what: str) -> None:
    """Fail fast, naming the URL, when the server of a network store (http(s), postgresql, mysql) cannot be reached."""
    parts = urlsplit(url)
    scheme = parts.scheme.split("+")[0]  # postgresql+psycopg -> postgresql
    if scheme not in DEFAULT_PORTS or not parts.hostname:
        return  # a file store (sqlite, journal, a local folder): nothing to connect to
    try:
        port = parts.port or DEFAULT_PORTS[scheme]
        socket.create_connection((parts.hostname, port), timeout=CONNECT_TIMEOUT).close()
    except (OSError, ValueError) as exc:
        shown = url.replace(f":{parts.password}@", ":***@") if parts.password else url
        raise UserError(f"cannot reach the {what} {shown}: {exc}") from None


# MLflow's tracking stores (mlflow.tracking._tracking_service.utils): another scheme fails deep in MLflow, after work
TRACKING_SCHEMES = ("", "file", "sqlite", "postgresql", "mysql", "mssql", "http", "https", "databricks")
SQLITE_HEADER = b"SQLite format 3\x00"


def check_tracking_uri(uri: str) -> None:
    """Fail fast, in one line naming the store: an unknown scheme, a SQLite store that is some other file, a server
    that cannot be reached."""
    scheme = urlsplit(uri).scheme.split("+")[0]
    if scheme not in TRACKING_SCHEMES:
        raise UserError(f"MLflow tracking store {uri}: unknown scheme {scheme!r}; use one of "
                        f"{', '.join(s + '://' for s in TRACKING_SCHEMES if s)} or a folder")
    path = sqlite_file(uri)
    if path is not None:
        try:
            head = path.read_bytes()[:16] if path.is_file() else SQLITE_HEADER
        except OSError as exc:
            raise UserError(f"MLflow tracking store {uri}: cannot read {path} ({exc.strerror})") from None
        if head and head != SQLITE_HEADER:
            raise UserError(f"MLflow tracking store {uri}: {path} is not a SQLite database")
    check_reachable(uri, "MLflow tracking store")


def sqlite_file(uri: str) -> Path | None:
    """The database file of a SQLite store; None for any other store."""
    return Path(uri[len("sqlite:///"):]) if uri.startswith("sqlite:///") else None


def local_folder(location: str) -> Path | None:
    """The folder of a local artifact location (a `file://` URI or a path); None for an artifact server's."""
    parts = urlsplit(location)
    return Path(url2pathname(parts.path)) if parts.scheme in ("", "file") else None


def unwritable(path: Path) -> WriteFailed | None:
    """Why `path` cannot be written, tried without changing anything; None when it can. An existing file is opened
    for writing, then a folder is made and removed in the nearest folder that exists (where SQLite makes its journal,
    MLflow a run's artifact folder): tried, not asked of `os.access`, so that the error says why, and because it says
    yes to root where the file system refuses (`core.config.writable_dir`)."""
    target = path
    try:
        if path.is_file():
            os.close(os.open(path, os.O_WRONLY))
        target = next(p for p in (path, *path.parents) if p.is_dir())
        os.rmdir(tempfile.mkdtemp(prefix=".accelbench-probe-", dir=target))
    except OSError as exc:
        return WriteFailed(target, exc.strerror)
    return None


# what a write that fails for want of space or of write access raises: the errors a store write turns into one line
WRITE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM})


def store_fault(exc: BaseException, db: Path | None) -> WriteFailed | None:
    """The write fault behind `exc`, raised by a write to a store whose SQLite file is `db` (None: not SQLite), as
    `WriteFailed` naming the file: a full disk or a read-only file system under the database or the artifacts. None
    for any other failure. MLflow raises SQLite's error as the cause of a SQLAlchemy error, the cause of its own."""
    import sqlite3

    while exc is not None:
        if isinstance(exc, OSError) and exc.errno in WRITE_ERRNOS and (exc.filename2 or exc.filename):
            return WriteFailed(exc.filename2 or exc.filename, exc.strerror)  # a copy's or a rename's: the destination
        if isinstance(exc, sqlite3.Error) and db is not None:
            code = getattr(exc, "sqlite_errorcode", 0) & 0xFF  # the primary code of an extended one
            if code == sqlite3.SQLITE_FULL:
                return WriteFailed(db, os.strerror(errno.ENOSPC))
            # SQLite says "readonly", "unable to open" (its journal) or, where a file system turned read-only under
            # its open file (ext4's errors=remount-ro), "disk I/O error": the file tells which, if any, it is
            if code in (sqlite3.SQLITE_READONLY, sqlite3.SQLITE_CANTOPEN, sqlite3.SQLITE_IOERR):
                return unwritable(db)
        exc = exc.__cause__ or exc.__context__
    return None


def accelbench_experiments(uri: str) -> tuple[Any, list]:
    """The store's client and its AccelBench experiments (those `Tracker` gave a kind tag), by name."""
    check_tracking_uri(uri)
    try:
        c = client(uri)
        experiments = c.search_experiments()
    except Exception as exc:
        raise UserError(f"cannot reach the MLflow tracking store {uri}: {str(exc).splitlines()[0]}") from None
    return c, sorted((e for e in experiments if e.tags.get("mlflow.experimentKind")), key=lambda e: e.name)


# MLflow 3.17's saved views of an experiment's runs page: an experiment tag `mlflow.sharedViewState.<id>` holding
# {"name", "createdAt", "state"}, `state` the JSON of the page's search facets (`searchFilter`, `orderByKey`, ...) and
# UI state (`selectedColumns`, `columnOrder`, `columnWidths`, `compareRunCharts`, `compareRunSections`, ...), as the
# page's "Save view" writes it. `?viewStateShareKey=<id>` opens one, but not beside a search facet in the URL: a view's
# filter goes in its state. These are the UI bundle's keys, no documented API: tests/test_ui.py renders the views.
VIEW_TAG = "mlflow.sharedViewState."


def column(kind: str, key: str) -> str:
    """A runs-table column as a view names it: `params.`method``, `metrics.`speedup_wall``, `attributes.`Run Name``."""
    return f"{kind}.`{key}`"


def save_view(c, experiment_id: str, view_id: str, name: str, state: dict[str, Any]) -> None:
    envelope = {"name": name, "createdAt": int(time.time() * 1000), "state": json.dumps(state)}
    c.set_experiment_tag(experiment_id, VIEW_TAG + view_id, json.dumps(envelope))


def runs_page_url(base: str, experiment_id: str, view_id: str | None = None, charts: bool = False) -> str:
    """An experiment's runs page in the MLflow UI at `base`, in a saved view, as its table or its charts. MLflow 3.17's
    UI opens an experiment on its GenAI side unless the URL (or the browser's last choice) says
    `workflowType=machine_learning`."""
    query = {"viewStateShareKey": view_id} if view_id else {}
    if charts:
        query["compareRunsMode"] = "CHART"
    query["workflowType"] = "machine_learning"
    return f"{base}/#/experiments/{experiment_id}/runs?{urlencode(query)}"


def owner_tags() -> dict[str, str]:
    """Which process owns a run: what `accelbench doctor` checks to tell a live run from an orphan."""
    import psutil

    me = psutil.Process()
    return {"accelbench.host": socket.gethostname(), "accelbench.pid": str(me.pid),
            "accelbench.pid_started": f"{me.create_time():.2f}"}


def owner_alive(host: str, pid: int, started: float | None) -> bool | None:
    """Whether the process that owns a run still runs: None when it is on another host (cannot be checked from here).
    A pid that now belongs to a process started at another time has been reused: the owner is gone."""
    import psutil

    if host != socket.gethostname():
        return None
    try:
        proc = psutil.Process(pid)
        return proc.status() != psutil.STATUS_ZOMBIE and (started is None or abs(proc.create_time() - started) < 1.0)
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:  # another user's live process
        return True


def artifact_location(uri: str) -> str | None:
    """Where a new experiment's artifacts go: for a SQLite store, `mlruns/` beside the database file (MLflow's default
    is `./mlruns` under whatever folder the command runs in); for a server, its own default."""
    db = sqlite_file(uri)
    return None if db is None else (db.parent / "mlruns").resolve().as_uri()


def _unlogged(record: logging.LogRecord) -> bool:
    """MLflow logs each database error with its traceback before raising it: the error raised is reported, once
    (a full disk or a read-only store as one line, `store_fault`)."""
    return not record.exc_info


def client(uri: str):
    """An `MlflowClient` of the store at `uri`, with the INFO lines MLflow and alembic write to stderr while they make
    a new SQLite store's tables silenced (their warnings and errors still show). Set after importing mlflow, whose
    logging configuration resets its child loggers' levels.

    A SQLite store is opened (its tables made or migrated: MLflow runs alembic when it first opens a store) under a
    lock file beside it: two processes opening a new store at once otherwise both migrate it and one fails
    ("Online migration expected to match one row", "duplicate column name")."""
    from mlflow.tracking import MlflowClient

    for name in ("mlflow.store", "alembic"):
        logging.getLogger(name).setLevel(logging.WARNING)
    logging.getLogger("mlflow.store.db.utils").addFilter(_unlogged)
    db = sqlite_file(uri)
    if db is None:
        return MlflowClient(tracking_uri=uri)
    lock = Path(f"{db}.lock")
    try:
        lock.parent.mkdir(parents=True, exist_ok=True)  # as MLflow makes a new store's folder
        fh = open(lock, "a")
    except OSError as exc:
        raise UserError(f"MLflow tracking store {uri}: cannot write in {lock.parent} ({exc.strerror})") from None
    with fh:
        fcntl.flock(fh, fcntl.LOCK_EX)  # released by the kernel if this process dies holding it
        c = MlflowClient(tracking_uri=uri)
        c.search_experiments(max_results=1)  # the store is opened (its tables made or migrated) by now
    return c


class Tracker:
    def __init__(self, uri: str, experiment: str):
        """The store at `uri`, refused (`UserError`) unless its SQLite file and the experiment's artifact folder can
        be written: a read-only store otherwise fails the run's first write, after the teacher is loaded (or trained),
        or its last, after sampling."""
        self.uri, self.db = uri, sqlite_file(uri)
        check_tracking_uri(uri)
        self._refuse_unwritable(self.db)
        self.client = client(uri)
        self.experiment_id = self._experiment(experiment)
        self._refuse_unwritable(local_folder(self.client.get_experiment(self.experiment_id).artifact_location))

    def _refuse_unwritable(self, path: Path | None) -> None:
        fault = None if path is None else unwritable(path)
        if fault is not None:
            raise UserError(f"MLflow tracking store {self.uri}: {fault}")

    @contextmanager
    def writing(self) -> Iterator[None]:
        """The block writes to the store: a full disk or a read-only file system under it is raised as `WriteFailed`,
        one line naming the file (`store_fault`); any other failure as it is."""
        try:
            yield
        except Exception as exc:
            fault = store_fault(exc, self.db)
            if fault is None:
                raise
            raise fault from exc

    def _experiment(self, name: str) -> str:
        note = TRAINING_NOTE if name == TRAINING_EXPERIMENT else TRIALS_NOTE
        tags = {**EXPERIMENT_KIND, "mlflow.note.content": note}
        try:
            exp = self.client.get_experiment_by_name(name)
            if exp is None:
                return self.client.create_experiment(name, artifact_location=artifact_location(self.uri), tags=tags)
            for key, value in tags.items():  # a store made by an older version
                if exp.tags.get(key) is None:
                    self.client.set_experiment_tag(exp.experiment_id, key, value)
            return exp.experiment_id
        except Exception as exc:  # any backend failure: say which store, before any work starts
            raise UserError(f"cannot reach the MLflow tracking store {self.uri}: {str(exc).splitlines()[0]}") from None

    @contextmanager
    def run(self, name: str, tags: dict[str, str], experiment: str | None = None) -> Iterator["RunLog"]:
        exp_id = self._experiment(experiment) if experiment else self.experiment_id
        with self.writing():
            run = self.client.create_run(exp_id, run_name=name, tags={**tags, **owner_tags()})
        try:
            yield RunLog(self, run.info.run_id)
        except KeyboardInterrupt:
            self._end(run.info.run_id, "KILLED")
            raise
        except BaseException as exc:
            self._end(run.info.run_id, "FAILED", f"{type(exc).__name__}: {exc}"[:5000])
            raise
        with self.writing():
            self.client.set_terminated(run.info.run_id, "FINISHED")

    def _end(self, run_id: str, status: str, error: str = "") -> None:
        """End a run that did not finish, with the error that stopped it as a tag, if the store still takes the
        writes. What stopped the run is what the caller reports, not the store's failure to record it (a full disk, a
        read-only store), after which the run stays RUNNING until the doctor, or a rerun of the trial, finds its
        process gone."""
        with contextlib.suppress(Exception):
            if error:
                self.client.set_tag(run_id, ERROR_TAG, error)
            self.client.set_terminated(run_id, status)

    def end_orphans(self, where: str = "", experiments: list[str] | None = None) -> list[tuple[str, str]]:
        """End KILLED every RUNNING run (of `experiments`, default all; matching the filter `where`) whose owner on
        this host is gone (SIGKILL leaves a run RUNNING); returns (run id, one line) per RUNNING run ended or left
        alone because it cannot be checked from here."""
        if experiments is None:
            experiments = [e.experiment_id for e in self.client.search_experiments()]
        if not experiments:
            return []
        query = "attributes.status = 'RUNNING'" + (f" and {where}" if where else "")
        found, page = [], None
        while True:
            runs = self.client.search_runs(experiments, query, max_results=1000, page_token=page)
            for run in runs:
                tags = run.data.tags
                host, pid = tags.get("accelbench.host"), tags.get("accelbench.pid", "")
                name = f"run {run.info.run_id} ({run.info.run_name}, experiment {run.info.experiment_id})"
                if host is None or not pid.isdigit():
                    found.append((run.info.run_id, f"{name}: RUNNING without owner tags; cannot tell whether it is "
                                                   f"alive"))
                    continue
                started = tags.get("accelbench.pid_started")
                alive = owner_alive(host, int(pid), float(started) if started else None)
                if alive is None:
                    found.append((run.info.run_id, f"{name}: RUNNING on {host} (pid {pid}); run the doctor on that "
                                                   f"host to check it"))
                elif not alive:
                    self.client.set_tag(run.info.run_id, ORPHAN_TAG, f"orphaned: process {pid} on {host} is gone")
                    self.client.set_terminated(run.info.run_id, "KILLED")
                    found.append((run.info.run_id, f"{name}: orphaned (process {pid} on {host} is gone): marked "
                                                   f"KILLED"))
            page = runs.token
            if not page:
                return found

    def log_training(self, name: str, key: str, params: dict[str, Any], info: dict[str, float]) -> None:
        """A teacher (or student) training is a run of its own, in the training experiment."""
        with self.run(f"train:{name}", {KIND_TAG: TRAINING, "cache_key": key},
                      experiment=TRAINING_EXPERIMENT) as log:
            log.log(params=params, metrics=info)


class RunLog:
    def __init__(self, tracker: Tracker, run_id: str):
        self.tracker, self.client, self.run_id = tracker, tracker.client, run_id

    def log(self, *, params: dict[str, Any] | None = None, metrics: dict[str, float] | None = None,
            tags: dict[str, str] | None = None) -> None:
        from mlflow.entities import Metric, Param, RunTag

        now = int(time.time() * 1000)
        with self.tracker.writing():
            self.client.log_batch(
                self.run_id,
                metrics=[Metric(k, float(v), now, 0) for k, v in sorted((metrics or {}).items())],
                params=[Param(k, str(v)) for k, v in sorted((params or {}).items())],
                tags=[RunTag(k, str(v)) for k, v in sorted((tags or {}).items())],
            )

    def log_dataset(self, name: str, source: dict[str, Any]) -> None:
        """The data the run's metrics compare samples with, as an MLflow dataset input (context "evaluation")."""
        from mlflow.entities import Dataset, DatasetInput, InputTag

        blob = json.dumps(source, sort_keys=True)
        digest = hashlib.sha256(f"{name}:{blob}".encode()).hexdigest()[:16]
        with self.tracker.writing():
            self.client.log_inputs(self.run_id, datasets=[DatasetInput(
                Dataset(name=name, digest=digest, source_type="accelbench", source=blob),
                tags=[InputTag("mlflow.data.context", "evaluation")])])

    def log_files(self, files: dict[str, bytes]) -> None:
        from core.cache import writing  # not at the top: it imports torch, which the store's readers (`ui`) need not

        with tempfile.TemporaryDirectory() as tmp:
            for name, data in files.items():
                with writing(Path(tmp) / name):  # a full temp folder, not the store's
                    (Path(tmp) / name).write_bytes(data)
            with self.tracker.writing():
                self.client.log_artifacts(self.run_id, tmp)


class NullTracker:
    """What a rank other than 0 of a data-parallel trial logs to: nothing (rank 0 logs the trial's one run)."""

    @contextmanager
    def run(self, name: str, tags: dict[str, str], experiment: str | None = None) -> Iterator["NullLog"]:
        yield NullLog()

    def log_training(self, name: str, key: str, params: dict[str, Any], info: dict[str, float]) -> None:
        pass


class NullLog:
    run_id = ""

    def log(self, **kwargs) -> None:
        pass

    def log_dataset(self, name: str, source: dict[str, Any]) -> None:
        pass

    def log_files(self, files: dict[str, bytes]) -> None:
        pass
