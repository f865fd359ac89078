"""A sweep's workers ride out restarts of the PostgreSQL servers of its study and of its MLflow store."""
import concurrent.futures
import glob
import os
import pwd
import select
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import optuna
import pytest
import yaml
from mlflow.tracking import MlflowClient
from optuna.trial import TrialState

from bench.tracking import client as mlflow_client
from cli import main
from sweeps.study import RUNS_ATTR, ReconnectingClient, StorageOptions, make_storage


def _postgres_program(name: str) -> str | None:
    """A PostgreSQL program on PATH, or in the newest /usr/lib/postgresql/<version>/bin (Debian keeps them there)."""
    installed = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), key=lambda p: float(Path(p).parts[-3]))
    return shutil.which(name) or (installed[-1] if installed else None)


@dataclass
class Server:
    """A PostgreSQL server of the test's own: its data folder and log under `folder`."""

    folder: Path
    port: int
    pg_ctl: list[str]  # pg_ctl, as the user who owns the server

    def url(self, database: str) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def ctl(self, *args: str) -> None:
        subprocess.run([*self.pg_ctl, "-D", str(self.folder / "data"), "-l", str(self.folder / "log"), "-w", *args],
                       check=True, stdout=subprocess.DEVNULL)


def stop_until_missed(*servers: Server, timeout: float = 120.0) -> Callable[[], None]:
    """Stop the servers (fast mode: their clients' connections are cut) and listen on their ports; returns the wait
    that starts each server again once a client has tried to reach it while it was down: every restart is felt by a
    client, however the clients' calls fall in time."""
    for server in servers:
        server.ctl("-m", "fast", "stop")
    down = {socket.create_server(("127.0.0.1", server.port)): server for server in servers}

    def wait() -> None:
        deadline = time.monotonic() + timeout
        try:
            while down:
                knocked, _, _ = select.select(list(down), [], [], max(0.0, deadline - time.monotonic()))
                assert knocked, f"no client tried to reach the stopped server(s) within {timeout:g} s"
                for listener in knocked:
                    listener.accept()[0].close()
                    listener.close()
                    down.pop(listener).ctl("start")
        finally:
            for listener in down:
                listener.close()

    return wait


@pytest.fixture()
def postgres(tmp_path):
    """A factory of PostgreSQL servers of this test's own, each on a free port (TCP only, trust authentication) with
    the databases it is asked for; stopped at the end. PostgreSQL refuses to run as root: as root, a server runs as
    the `postgres` user (or `nobody`) in a folder of its own under the system's temporary folder, which pytest's
    tmp_path (private to root) is not."""
    initdb, pg_ctl = _postgres_program("initdb"), _postgres_program("pg_ctl")
    if not (initdb and pg_ctl):
        pytest.skip("PostgreSQL's initdb and pg_ctl are not installed (looked on PATH and in "
                    "/usr/lib/postgresql/*/bin)")
    import psycopg

    as_user = []
    if os.geteuid() == 0:
        user = "postgres" if "postgres" in {p.pw_name for p in pwd.getpwall()} else "nobody"
        as_user = ["runuser", "-u", user, "--"]
    servers: list[Server] = []

    def start(*databases: str) -> Server:
        if as_user:
            folder = Path(tempfile.mkdtemp(prefix="accelbench-postgres-"))
            shutil.chown(folder, as_user[2])
        else:
            folder = tmp_path / f"postgres-{len(servers)}"
            folder.mkdir()
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            server = Server(folder, s.getsockname()[1], [*as_user, pg_ctl])
        servers.append(server)  # from here on, the end of the test stops it and removes its folder
        subprocess.run([*as_user, initdb, "-D", str(folder / "data"), "-U", "postgres", "--auth=trust", "--no-sync",
                        "-E", "UTF8"], check=True, stdout=subprocess.DEVNULL)
        with open(folder / "data" / "postgresql.conf", "a") as conf:
            conf.write(f"port = {server.port}\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = ''\n"
                       f"fsync = off\n")
        server.ctl("start")
        with psycopg.connect(server.url("postgres"), autocommit=True) as admin:
            for database in databases:
                admin.execute(f"CREATE DATABASE {database}")
        return server

    yield start
    for server in servers:
        subprocess.run([*server.pg_ctl, "-D", str(server.folder / "data"), "-m", "immediate", "stop"],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if as_user:
            shutil.rmtree(server.folder, ignore_errors=True)


def test_a_sweep_rides_out_restarts_of_its_postgresql_servers(plugin, tmp_path, postgres, monkeypatch, capfd):
    """Two workers, each holding a trial of a few seconds (their first trials start together: the barrier teacher);
    the study's server and MLflow's restart under them, each down until a worker has tried to reach it (the study's
    with a heartbeat within a second, MLflow's at the latest when a trial ends and logs). The study still ends with
    every trial complete and every MLflow run finished, and no worker shows a traceback. The sweep runs in this
    process (its workers in their own, their output captured with its), the restarts on a thread beside it."""
    monkeypatch.setenv("ACCELBENCH_TEST_BARRIER", f"{tmp_path}/barrier:2")
    monkeypatch.chdir(tmp_path)  # MLflow keeps a server store's artifacts in ./mlruns
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump({
        "study": "s", "base": {"teacher": "slow-barrier-table-ar", "method": "sjd", "n_samples": 6}, "n_trials": 4,
        "space": {"temperature": {"type": "float", "low": 0.5, "high": 1.5}},  # a run per trial: no key twice
        "objectives": [{"metric": "speedup_steps", "direction": "maximize"}]}))
    study_server, mlflow_server = postgres("optuna"), postgres("mlflow")
    storage, mlflow = study_server.url("optuna"), mlflow_server.url("mlflow")
    client = MlflowClient(mlflow)
    client.search_experiments(max_results=1)  # MLflow makes the store's tables here, not racing the sweep to it
    ended = threading.Event()

    def restart_once_both_hold_a_trial():
        running, deadline = [], time.monotonic() + 180
        while len(running) < 2 and not ended.is_set() and time.monotonic() < deadline:
            experiment = client.get_experiment_by_name("accelbench-sweeps")
            if experiment is not None:
                running = client.search_runs([experiment.experiment_id], "tags.`accelbench.kind` = 'trial' and "
                                                                          "attributes.status = 'RUNNING'")
            time.sleep(0.1)
        assert len(running) == 2, "the two workers never held a trial at once"
        stop_until_missed(study_server, mlflow_server)()

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        restarts = pool.submit(restart_once_both_hold_a_trial)
        try:
            code = main(["sweep", str(spec), "--workers", "2", "--storage", storage, "--tracking-uri", mlflow,
                         "--cache-dir", str(tmp_path / "cache"), "--warmup", "0", "--no-progress", "--heartbeat", "1"])
        finally:
            ended.set()
        output = "".join(capfd.readouterr())
        assert restarts.exception() is None, f"{restarts.exception()}\n{output[-3000:]}"
    assert code == 0, output[-3000:]
    assert "Traceback" not in output, output[-5000:]

    every = optuna.load_study(study_name="s", storage=make_storage(StorageOptions(storage))).get_trials()
    trials = [t for t in every if not t.user_attrs.get("surplus")]  # a worker's ask once the study was full
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 4
    assert all(t.state == TrialState.PRUNED for t in every if t.user_attrs.get("surplus"))
    assert len({t.user_attrs["worker"] for t in trials}) == 2
    for t in trials:
        (run_id,) = t.user_attrs[RUNS_ATTR]
        run = client.get_run(run_id)
        assert (run.info.status, run.data.tags["optuna_state"]) == ("FINISHED", "COMPLETE")
        assert run.data.tags["optuna_trial_number"] == str(t.number)
    runs = client.search_runs([client.get_experiment_by_name("accelbench-sweeps").experiment_id])
    assert sorted((r.data.tags["accelbench.kind"], r.info.status) for r in runs) == \
        [("study", "FINISHED")] + [("trial", "FINISHED")] * 4


def test_an_mlflow_call_made_while_its_server_is_down_waits_for_it_quietly(postgres, capsys):
    """A call that starts while the server is down, which MLflow logs with its traceback before raising it: it is made
    again once the server is back, and nothing is shown."""
    server = postgres("mlflow")
    client = ReconnectingClient(mlflow_client(server.url("mlflow")))
    experiment = client.create_experiment("x")
    capsys.readouterr()
    waiting = threading.Thread(target=stop_until_missed(server))
    waiting.start()
    assert client.get_experiment(experiment).name == "x"
    waiting.join()
    err = capsys.readouterr().err
    assert "Traceback" not in err and "error" not in err.lower(), err
