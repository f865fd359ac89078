"""Suites and sweep workers as Slurm jobs (`--launcher slurm`, `bench.launch`) on a real cluster the tests start, and
torchrun's multi-node rendezvous as two node groups on this machine.

The cluster is Debian's slurm-wlm run as a site runs it, on one node (this machine), every file under the test's
temporary folder and every port free at run time: slurmctld and slurmd, authenticated by a munged of their own (a
key made here, its own socket), and slurmdbd over a MariaDB server of its own, because submitit reads how a job
without a result ended from Slurm's accounting (`sacct`). The node declares two GPUs whose device files are made here
(character devices with /dev/null's numbers): a job asks for `--gpus-per-node 2` as on a GPU node, and its two ranks
run on the CPU (gloo), there being no CUDA device.
"""
from __future__ import annotations

import os
import shutil
import socket
import stat
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import optuna
import pytest
import submitit
import yaml
from mlflow.tracking import MlflowClient
from optuna.trial import TrialState

from bench.launch import SlurmOptions, absolute_store
from bench.suite import load_suite
from cli import main
from core.errors import UserError
from sweeps.study import StorageOptions, make_storage
from tests.fakes import NO_CHECKPOINTS

DAEMONS = ("mungekey", "munged", "mariadb-install-db", "mariadbd", "slurmdbd", "slurmctld", "slurmd")
MISSING = [d for d in DAEMONS if shutil.which(d) is None]
needs_slurm = pytest.mark.skipif(
    bool(MISSING) or os.geteuid() != 0,
    reason=f"Slurm is not installed ({', '.join(MISSING)} missing): apt-get install slurm-wlm slurmdbd mariadb-server"
    if MISSING else "the test cluster's daemons run as root (SlurmUser=root) and it makes device files: run as root")
STARTUP = 60.0  # seconds a daemon may take to answer


def _free_ports(n: int) -> list[int]:
    """n distinct ports free now (held open together while the OS picks them)."""
    sockets = [socket.socket() for _ in range(n)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def _answers(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


def _wait(ready, what: str, procs: dict[str, subprocess.Popen], logs: Path, timeout: float = STARTUP) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        for name, proc in procs.items():
            if proc.poll() is not None:
                pytest.fail(f"{name} exited {proc.returncode} before {what}: "
                            f"{(logs / f'{name}.out').read_text()[-2000:]}")
        if time.monotonic() > deadline:
            pytest.fail(f"no {what} within {timeout:g} s")
        time.sleep(0.1)


def _queue() -> list[str]:
    """The ids of the jobs queued or running."""
    return subprocess.run(["squeue", "--noheader", "--format=%i"], capture_output=True, text=True,
                          check=True).stdout.split()


def _node_state() -> str:
    return subprocess.run(["sinfo", "--noheader", "--format=%T"], capture_output=True, text=True).stdout.strip()


def _configs(base: Path, ports: dict[str, int]) -> None:
    host = socket.gethostname().split(".")[0]
    hardware = subprocess.run(["slurmd", "-C"], capture_output=True, text=True, check=True).stdout.splitlines()[0]
    for i in range(2):  # the node's two "GPUs"
        os.mknod(base / f"gpu{i}", stat.S_IFCHR | 0o666, os.makedev(1, 3))
    (base / "gres.conf").write_text(f"NodeName={host} Name=gpu File={base}/gpu[0-1]\n")
    munge = f"{base}/munge.socket"
    (base / "slurm.conf").write_text("\n".join([
        "ClusterName=accelbench-test", f"SlurmctldHost={host}(127.0.0.1)", f"SlurmctldPort={ports['slurmctld']}",
        f"SlurmdPort={ports['slurmd']}", "SlurmUser=root", "SlurmdUser=root",
        "AuthType=auth/munge", "CredType=cred/munge", f"AuthInfo=socket={munge}",
        f"StateSaveLocation={base}/state", f"SlurmdSpoolDir={base}/spool",
        f"SlurmctldPidFile={base}/slurmctld.pid", f"SlurmdPidFile={base}/slurmd.pid",
        f"SlurmctldLogFile={base}/slurmctld.log", f"SlurmdLogFile={base}/slurmd.log",
        "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_CPU", "SchedulerType=sched/builtin", "MpiDefault=none", "ReturnToService=2",
        "KillWait=2",  # seconds from a cancel's SIGTERM (which submitit's job ignores) to its SIGKILL
        "JobAcctGatherType=jobacct_gather/none", "AccountingStorageType=accounting_storage/slurmdbd",
        "AccountingStorageHost=127.0.0.1", f"AccountingStoragePort={ports['slurmdbd']}",
        f"AccountingStoragePass={munge}",  # the munged slurmctld and sacct reach slurmdbd through
        "GresTypes=gpu", f"{hardware} NodeAddr=127.0.0.1 Gres=gpu:2",  # `slurmd -C`: NodeName=<host> CPUs=...
        f"PartitionName=test Nodes={host} Default=YES MaxTime=INFINITE State=UP", ""]))
    dbd = base / "slurmdbd.conf"
    dbd.write_text("\n".join([
        "AuthType=auth/munge", f"AuthInfo=socket={munge}", "DbdHost=localhost", "DbdAddr=127.0.0.1",
        f"DbdPort={ports['slurmdbd']}", "SlurmUser=root", f"PidFile={base}/slurmdbd.pid",
        f"LogFile={base}/slurmdbd.log", "StorageType=accounting_storage/mysql", "StorageHost=127.0.0.1",
        f"StoragePort={ports['mariadb']}", "StorageUser=root", "StorageLoc=slurm_acct", ""]))
    dbd.chmod(0o600)  # slurmdbd refuses a config others can read (it may hold the database's password)


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    """A one-node Slurm cluster with accounting, up until the module's tests are done; SLURM_CONF names it for every
    Slurm command this process and its children run (submitit's sbatch, srun in the jobs)."""
    base = tmp_path_factory.mktemp("slurm")
    for folder in ("state", "spool", "logs"):
        (base / folder).mkdir()
    logs = base / "logs"
    ports = dict(zip(("slurmctld", "slurmd", "slurmdbd", "mariadb"), _free_ports(4)))
    procs: dict[str, subprocess.Popen] = {}

    def start(name: str, *argv: str) -> None:
        with open(logs / f"{name}.out", "w") as out:
            procs[name] = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SLURM_CONF", str(base / "slurm.conf"))
        try:
            _configs(base, ports)
            subprocess.run(["mungekey", "--create", "--keyfile", str(base / "munge.key")], check=True)
            # --force: the socket's parent folders are the test's own (not world-searchable); every client is root.
            # 10 threads: Slurm's advice for the munged it uses
            start("munged", "munged", "--foreground", "--force", "--num-threads=10", f"--key-file={base}/munge.key",
                  f"--socket={base}/munge.socket", f"--pid-file={base}/munged.pid", f"--log-file={logs}/munged.log",
                  f"--seed-file={base}/munged.seed")
            _wait(lambda: (base / "munge.socket").exists(), "munge socket", procs, logs)
            subprocess.run(["mariadb-install-db", "--no-defaults", f"--datadir={base}/db", "--user=root",
                            "--auth-root-authentication-method=normal", "--skip-test-db"],
                           check=True, capture_output=True)
            start("mariadbd", "mariadbd", "--no-defaults", f"--datadir={base}/db", f"--socket={base}/mariadb.socket",
                  f"--port={ports['mariadb']}", "--bind-address=127.0.0.1", "--user=root", "--skip-log-bin",
                  f"--pid-file={base}/mariadbd.pid", "--innodb-buffer-pool-size=16M")
            _wait(lambda: _answers(ports["mariadb"]), "MariaDB server", procs, logs)
            start("slurmdbd", "slurmdbd", "-D")
            _wait(lambda: _answers(ports["slurmdbd"]), "slurmdbd", procs, logs)
            start("slurmctld", "slurmctld", "-D")
            _wait(lambda: _answers(ports["slurmctld"]), "slurmctld", procs, logs)
            start("slurmd", "slurmd", "-D")
            _wait(lambda: _node_state() == "idle", "idle node in sinfo", procs, logs)
            yield base
        finally:
            if "slurmd" in procs:  # no job outlives the cluster (a test that failed midway may leave one running)
                subprocess.run(["scancel", "--user", "root"], check=False)
                deadline = time.monotonic() + STARTUP
                while _queue() and time.monotonic() < deadline:
                    time.sleep(0.1)
            for proc in reversed(procs.values()):
                proc.terminate()
            for proc in reversed(procs.values()):
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            shutil.rmtree(base / "db", ignore_errors=True)  # 100 MB of MariaDB's own tables


def _suite(tmp_path: Path, experiment: str, trials: list[dict], **defaults) -> Path:
    path = tmp_path / f"{experiment}.yaml"
    path.write_text(yaml.safe_dump({"experiment": experiment, "defaults": defaults, "trials": trials}))
    return path


def _args(tmp_path: Path, *extra: str) -> list[str]:
    return ["--tracking-uri", f"sqlite:///{tmp_path}/mlflow.db", "--cache-dir", str(tmp_path / "cache"),
            "--out", str(tmp_path / "report"), "--no-progress", "--warmup", "0", *extra]


SLURM = ["--launcher", "slurm", "--timeout-min", "10"]  # a job that hangs ends in minutes


def _runs(uri: str, experiment: str) -> list:
    client = MlflowClient(uri)
    return client.search_runs([client.get_experiment_by_name(experiment).experiment_id],
                              "tags.`accelbench.kind` = 'trial'")


@needs_slurm
def test_a_suite_runs_each_trial_as_a_job_of_two_ranks_into_one_store_and_one_report(slurm, plugin, tmp_path,
                                                                                    fresh_store, capsys):
    trials = [{"teacher": "table-ar", "method": "sjd", "params": {"window": 2}},
              {"teacher": "table-ar", "method": "ar"}]
    suite = _suite(tmp_path, "cluster", trials, n_samples=6, batch_size=2)
    command = ["suite", str(suite), *SLURM, "--gpus-per-node", "2", *_args(tmp_path)]
    assert main(command) == 0
    out, err = capsys.readouterr()
    assert "ran 2 trials as Slurm jobs (0 failed), 0 already finished" in out, out + err
    assert err.count("Slurm job ") == 2 and str(tmp_path / "report" / "slurm") in err

    runs = {r.data.tags["trial_key"]: r for r in _runs(fresh_store, "cluster")}
    planned = {p.key() for p in load_suite(str(suite), checkpoints=NO_CHECKPOINTS).plans}
    assert runs.keys() == planned and {r.info.status for r in runs.values()} == {"FINISHED"}
    for run in runs.values():  # each job ran its trial on two ranks: 3 batches, 2 drawn by rank 0
        assert run.data.params["world_size"] == "2" and "samples_per_sec_rank1" in run.data.metrics
    report = (tmp_path / "report" / "REPORT.md").read_text()
    assert "sjd" in report and "table-ar" in report

    # the samples of one process, whatever the ranks (the same trials, another experiment of the store)
    one = _suite(tmp_path, "one", trials, n_samples=6, batch_size=2)
    assert main(["suite", str(one), "--tracking-uri", fresh_store, "--cache-dir", str(tmp_path / "cache"), "--out",
                 str(tmp_path / "one"), "--no-progress", "--warmup", "0"]) == 0
    for run in _runs(fresh_store, "one"):
        mine = runs[run.data.tags["trial_key"]].data.tags
        assert mine["samples_sha256.method"] == run.data.tags["samples_sha256.method"]

    capsys.readouterr()
    assert main(command) == 0  # nothing left to submit
    out, err = capsys.readouterr()
    assert "ran 0 trials as Slurm jobs (0 failed), 2 already finished" in out and "Slurm job" not in err


def _cancel_when(held: Path, returned: threading.Event) -> str | None:
    """The id of the one job, cancelled once its trial holds (`held` exists); None if the submitter returned first.
    Whatever happens here, no job is left holding until its time limit."""
    try:
        deadline = time.monotonic() + 120
        while not held.exists():
            if returned.is_set():
                return None
            assert time.monotonic() < deadline, "the job's trial did not reach its 4th batch"
            time.sleep(0.05)
        (job,) = _queue()
        subprocess.run(["scancel", job], check=True)
        return job
    except BaseException:
        subprocess.run(["scancel", "--user", "root"], check=False)
        raise


@needs_slurm
def test_a_job_killed_mid_trial_fails_and_its_trial_resumes_when_the_suite_is_submitted_again(slurm, plugin, tmp_path,
                                                                                            fresh_store, monkeypatch,
                                                                                            capsys):
    # the job's trial holds in its 4th batch (tests/plugins.py), 3 spooled: cancelled there, whatever the machine's
    # speed, by a thread of this process while its main thread submits the suite and waits for the job
    held = tmp_path / "held"
    monkeypatch.setenv("ACCELBENCH_TEST_HOLD_AFTER", f"3:{held}")
    # submitit waits 15 s for the result file of a job that ended without one, in case a network file system shows
    # it late; the jobs' folder is a local one here
    monkeypatch.setattr(submitit.core.core.Job, "_results_timeout_s", 0)
    suite = _suite(tmp_path, "killed", [{"teacher": "held-table-ar", "method": "ar"}], n_samples=8, batch_size=1)
    command = ["suite", str(suite), *SLURM, *_args(tmp_path)]
    returned = threading.Event()
    with ThreadPoolExecutor(1) as pool:
        cancelled = pool.submit(_cancel_when, held, returned)
        try:
            assert main(command) == 1
        finally:
            returned.set()
        job = cancelled.result()
    err = capsys.readouterr().err
    assert job is not None, err[-3000:]
    assert f"failed: trial 1/1 (ar[greedy=False] held-table-ar s0): Slurm job {job} ended CANCELLED" in err, err
    assert f"log {tmp_path / 'report' / 'slurm' / job}_0_log.err" in err

    monkeypatch.delenv("ACCELBENCH_TEST_HOLD_AFTER")
    assert main(command) == 0  # submitted again: the trial resumes in a new job
    runs = _runs(fresh_store, "killed")
    assert sorted(r.info.status for r in runs) == ["FINISHED", "KILLED"]
    resumed = next(r for r in runs if r.info.status == "FINISHED")
    killed = next(r for r in runs if r.info.status == "KILLED")
    assert resumed.data.tags["resumed_from"] == "3" and resumed.data.tags["resumed_run"] == killed.info.run_id
    assert (tmp_path / "report" / "REPORT.md").is_file()


@needs_slurm
def test_sweep_workers_run_as_jobs_sharing_one_study(slurm, plugin, tmp_path, fresh_store, monkeypatch, capsys):
    """Each worker's first trial waits until both workers hold one (tests/plugins.py's barrier teacher): the two
    jobs ran at once, on one study in a journal file both reach, a trial each."""
    monkeypatch.setenv("ACCELBENCH_TEST_BARRIER", f"{tmp_path}/barrier:2")
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump({
        "study": "s", "base": {"teacher": "barrier-table-ar", "method": "sjd", "n_samples": 2}, "n_trials": 2,
        "space": {"window": {"type": "int", "low": 1, "high": 6}},
        "objectives": [{"metric": "speedup_steps", "direction": "maximize"}]}))
    storage = f"journal:{tmp_path}/optuna.journal"
    assert main(["sweep", str(spec), *SLURM, "--workers", "2", "--storage", storage,
                 "--slurm-folder", str(tmp_path / "jobs"), "--tracking-uri", fresh_store,
                 "--cache-dir", str(tmp_path / "cache"), "--warmup", "0", "--no-progress"]) == 0
    assert capsys.readouterr().err.count("Slurm job ") == 2
    trials = optuna.load_study(study_name="s", storage=make_storage(StorageOptions(storage))).get_trials()
    assert sum(t.state == TrialState.COMPLETE for t in trials) == 2
    assert len({t.user_attrs["worker"] for t in trials}) == 2


def test_torchrun_as_two_node_groups_draws_the_samples_of_one_process(plugin, tmp_path, fresh_store):
    """Two torchrun agents, one per "node", meeting at a c10d rendezvous on 127.0.0.1, as on two hosts of a cluster."""
    trial = ["run", "--teacher", "table-ar", "--method", "sjd", "--param", "window=2", "--n-samples", "5",
             "--batch-size", "1", "--cache-dir", str(tmp_path / "cache"), "--no-progress", "--warmup", "0"]
    endpoint = f"127.0.0.1:{_free_ports(1)[0]}"
    nodes = [subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
                               "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--rdzv-id", "two-nodes",
                               "--max-restarts", "0", "-m", "cli", *trial, "--tracking-uri", fresh_store],
                              env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    for node in nodes:
        _, err = node.communicate(timeout=300)
        assert node.returncode == 0, err[-3000:]
    assert main([*trial, "--tracking-uri", fresh_store, "--experiment", "one"]) == 0
    (two,), (one,) = (_runs(fresh_store, experiment) for experiment in ("accelbench", "one"))
    assert two.data.params["world_size"] == "2" and "samples_per_sec_rank1" in two.data.metrics
    hashes = {k: v for k, v in one.data.tags.items() if k.startswith("samples_sha256.")}
    assert hashes and hashes == {k: v for k, v in two.data.tags.items() if k.startswith("samples_sha256.")}


@pytest.mark.parametrize("options, message", [
    ({"nodes": 0}, "--nodes must be an integer >= 1, got 0"),
    ({"gpus_per_node": -1}, "--gpus-per-node must be an integer >= 0, got -1"),
    ({"timeout_min": 0}, "--timeout-min must be an integer >= 1, got 0"),
    ({"cpus_per_task": 0}, "--cpus-per-task must be an integer >= 1, got 0"),
    ({"partition": "gpu queue"}, "--partition must be a Slurm partition name"),
])
def test_slurm_options_are_checked(tmp_path, options, message):
    with pytest.raises(UserError, match=message):
        SlurmOptions(tmp_path, **options)


@pytest.mark.usefixtures("fresh_store")  # the store `_args` names
def test_slurm_options_without_the_launcher_or_slurm_are_one_line(plugin, tmp_path, monkeypatch, capsys):
    suite = _suite(tmp_path, "e", [{"teacher": "table-ar", "method": "ar"}])
    assert main(["suite", str(suite), "--nodes", "2", *_args(tmp_path)]) == 2
    assert capsys.readouterr().err.strip() == "accelbench: error: --nodes is an option of --launcher slurm"
    monkeypatch.setenv("PATH", str(tmp_path / "no-slurm-here"))
    assert main(["suite", str(suite), *SLURM, *_args(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "missing: sbatch, srun, sacct" in err


def test_store_paths_are_made_absolute_for_jobs_that_start_elsewhere(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert absolute_store("sqlite:///mlflow.db") == f"sqlite:///{tmp_path}/mlflow.db"
    assert absolute_store("sqlite:////srv/m.db") == "sqlite:////srv/m.db"
    assert absolute_store("journal:optuna.journal") == f"journal:{tmp_path}/optuna.journal"
    assert absolute_store("mlruns") == f"{tmp_path}/mlruns"
    assert absolute_store("postgresql://u@db/x") == "postgresql://u@db/x"
    assert absolute_store("http://tracking:5000") == "http://tracking:5000"
