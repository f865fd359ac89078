"""Soak: 20 short trials through 2 workers on PostgreSQL while a worker is SIGKILLed and restarted at random, twice; the
Optuna study and the MLflow store must end consistent: every trial exactly once, nothing left RUNNING."""
from __future__ import annotations

import random
import subprocess
import sys
import time

import yaml
from mlflow.tracking import MlflowClient
from optuna.trial import TrialState

from cli import main
from bench.tracking import Tracker
from sweeps.spec import load_spec
from sweeps.study import StorageOptions, make_storage, open_study
from tests.fakes import NO_CHECKPOINTS

N_TRIALS = 20
KILLS = 2
SPACING = N_TRIALS // (KILLS + 1)  # at most this many complete trials between kills


def _worker(tmp_path, spec, storage, mlflow):
    argv = [sys.executable, "-m", "cli", "worker", spec, "--storage", storage, "--tracking-uri", mlflow,
            "--cache-dir", str(tmp_path / "cache"), "--warmup", "0", "--heartbeat", "1", "--grace", "3"]
    return subprocess.Popen(argv, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def test_soak_twenty_trials_two_workers_random_kills(plugin, tmp_path, pg_database, fresh_store, capsys):
    # A float knob: every trial has its own trial key, so "exactly once" is checkable per key.
    spec = tmp_path / "soak.yaml"
    spec.write_text(yaml.safe_dump({
        "study": "soak", "base": {"teacher": "slow-table-ar", "method": "sjd", "n_samples": 2},
        "space": {"temperature": {"type": "float", "low": 0.5, "high": 1.5}}, "n_trials": N_TRIALS,
        "objectives": [{"metric": "speedup_steps", "direction": "maximize"}]}))
    mlflow = fresh_store
    tracker = Tracker(mlflow, "accelbench-sweeps")
    # opened once: each poll below reads only its trials
    study = open_study(load_spec(str(spec), checkpoints=NO_CHECKPOINTS), make_storage(StorageOptions(pg_database)),
                       tracker)
    workers = [_worker(tmp_path, str(spec), pg_database, mlflow) for _ in range(2)]
    rng, kills, deadline = random.Random(0), 0, time.time() + 400
    next_kill = rng.randint(1, SPACING)  # complete trials before the next kill: kills spread over the study
    while kills < KILLS and any(w.poll() is None for w in workers) and time.time() < deadline:
        time.sleep(0.2)
        now = study.get_trials()
        busy = {int(t.user_attrs["worker"].split(":")[1]) for t in now
                if t.state == TrialState.RUNNING and "worker" in t.user_attrs}
        victims = [i for i, w in enumerate(workers) if w.pid in busy]
        if victims and sum(t.state == TrialState.COMPLETE for t in now) >= next_kill:
            # SIGKILL a worker in the middle of a trial, and start a fresh one
            i = rng.choice(victims)
            workers[i].kill()
            workers[i].wait()
            workers[i] = _worker(tmp_path, str(spec), pg_database, mlflow)
            kills += 1
            next_kill += rng.randint(1, SPACING)
    for w in workers:
        assert w.wait(timeout=max(1, deadline - time.time())) == 0, w.stderr.read().decode()[-2000:]
    assert main(["doctor", "--tracking-uri", mlflow, "--cache-dir", str(tmp_path / "cache")]) == 0
    capsys.readouterr()

    assert kills == KILLS
    trials = study.get_trials()
    states = [t.state for t in trials]
    assert states.count(TrialState.COMPLETE) == N_TRIALS
    assert not {TrialState.RUNNING, TrialState.WAITING} & set(states)
    killed = [t for t in trials if t.state == TrialState.FAIL and not t.user_attrs.get("surplus")]
    assert len(killed) >= KILLS - 1  # a kill can land just after a trial's result was stored
    retried = {n for t in trials for n in t.system_attrs.get("retry_history", [])}
    assert {t.number for t in killed} <= retried, [(t.number, t.state, t.system_attrs) for t in trials]

    client = MlflowClient(mlflow)
    exp = client.get_experiment_by_name("accelbench-sweeps").experiment_id
    runs = client.search_runs([exp], "tags.`accelbench.kind` = 'trial'", max_results=10_000)
    assert not [r for r in runs if r.info.status == "RUNNING"]
    finished = [r.data.tags["trial_key"] for r in runs if r.info.status == "FINISHED"]
    assert len(finished) == len(set(finished))  # no trial computed twice
    complete = {r.data.tags["trial_key"] for r in runs
                if r.data.tags.get("optuna_state") == "COMPLETE" and r.info.status == "FINISHED"}
    assert set(finished) == complete and len(complete) == N_TRIALS
    parent = client.search_runs([exp], "tags.`accelbench.kind` = 'study'")[0]
    assert parent.info.status == "FINISHED" and parent.data.metrics["complete_trials"] == N_TRIALS
