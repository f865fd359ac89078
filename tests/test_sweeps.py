"""Optuna sweeps: specs, MLflow parent/child runs, resume, and several workers on SQLite, journal and PostgreSQL."""
import signal
import subprocess
import sys
import uuid

import optuna
import pytest
import yaml
from mlflow.tracking import MlflowClient
from optuna.trial import TrialState

from cli import main
from core.errors import UserError
from sweeps.spec import load_spec
from tests.fakes import NO_CHECKPOINTS



@pytest.fixture(autouse=True)
def _plugin(plugin):
    """Every test here runs workers over the table teachers."""


def spec_file(tmp_path, teacher="table-ar", n_trials=3, **extra):
    spec = {"study": "s", "base": {"teacher": teacher, "method": "sjd", "n_samples": 4},
            "space": {"window": {"type": "int", "low": 1, "high": 6}}, "n_trials": n_trials,
            "objectives": [{"metric": "speedup_steps", "direction": "maximize"}], **extra}
    path = tmp_path / f"spec-{uuid.uuid4().hex[:6]}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return str(path)


def sweep(tmp_path, spec, storage, *extra, mlflow=None):
    return main(["sweep", spec, "--storage", storage, "--tracking-uri", mlflow or f"sqlite:///{tmp_path}/mlflow.db",
                 "--cache-dir", str(tmp_path / "cache"), "--warmup", "0", *extra])


def trials(storage_url, name="s"):
    from sweeps.study import StorageOptions, make_storage

    return optuna.load_study(study_name=name, storage=make_storage(StorageOptions(storage_url))).get_trials()


def mlflow_runs(uri):
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("accelbench-sweeps")
    return client.search_runs([exp.experiment_id])


@pytest.mark.parametrize("extra, message", [
    ({"space": {"window": {"type": "int", "low": 5, "high": 1}}}, "needs numeric 'low' <= 'high'"),
    ({"space": {"windw": {"type": "int", "low": 1, "high": 4}}}, "unknown knob 'windw'"),
    ({"space": {"window": {"type": "integer"}}}, "needs 'type', one of int, float, categorical"),
    ({"objectives": []}, "'objectives' must list at least one"),
    ({"sampler": "cmaes"}, "sampler must be one of tpe, nsga2, grid"),
    ({"n_trials": 0}, "n_trials must be a positive integer"),
    ({"trials": 3}, "unknown field 'trials'"),
])
def test_bad_specs_are_refused(tmp_path, extra, message):
    with pytest.raises(UserError, match=message):
        load_spec(spec_file(tmp_path, **extra), checkpoints=NO_CHECKPOINTS)


@pytest.mark.parametrize("extra, message", [
    ({"objectives": [{"metric": "fid.digits-cnn", "direction": "minimize"}]},
     "objective metric 'fid.digits-cnn' is never logged by the base trial: 'fid' is not one of its metrics (none)"),
    ({"objectives": [{"metric": "speedup_wal", "direction": "maximize"}]},
     "'speedup_wal' is neither a key the runner logs"),
    ({"objectives": [{"metric": "ref/speedup_steps", "direction": "maximize"}]},
     "'speedup_steps' compares the method's arm with the teacher's: it is logged bare only"),
    ({"objectives": [{"metric": "fit/loss", "direction": "minimize"}]}, "method 'sjd' trains nothing"),
    ({"objectives": [{"metric": "ar/nfe_per_sample", "direction": "minimize"}]}, "method 'sjd' has no arm 'ar'"),
    ({"constraints": [{"metric": "speedup_wall", "min_under_ref": 0.1}]},
     "constraint metric 'speedup_wall' is bounded by the teacher arm's 'ref/speedup_wall', which is never logged"),
])
def test_a_metric_the_base_trial_never_logs_is_refused_before_any_work(tmp_path, capsys, extra, message):
    assert sweep(tmp_path, spec_file(tmp_path, **extra), f"sqlite:///{tmp_path}/optuna.db") == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "optuna.db").exists() and not (tmp_path / "mlflow.db").exists()  # no study, no parent run


def test_the_metric_check_passes_every_key_a_trial_logs(tmp_path, fresh_store):
    """Its declared keys against those of a real trial, timed under the latency protocol too: none refused."""
    from bench.runner import RunOptions, run_trial
    from bench.tracking import Tracker
    from core.cache import Cache
    from core.latency import LatencyProtocol
    from sweeps.spec import never_logged

    base = {"teacher": "table-ar", "method": "sjd", "n_samples": 4, "latency_batch": 2}
    planned = load_spec(spec_file(tmp_path, base=base), checkpoints=NO_CHECKPOINTS).trial({"window": 2}, 0)
    protocol = LatencyProtocol(warmup=0, min_count=2, max_count=2, min_seconds=0.0)
    metrics = run_trial(planned, cache=Cache(tmp_path / "cache"), tracker=Tracker(fresh_store, "t"),
                        opts=RunOptions(warmup=0, progress=False, latency=protocol))
    assert {"latency_per_sample_median", "ref/sec_per_sample_median", "speedup_wall", "gflops_per_sample",
            "acceptance_rate"} <= set(metrics)
    assert {k: why for k in metrics if (why := never_logged(k, planned))} == {}


def test_a_metrics_key_is_checked_against_the_base_trials_metrics(tmp_path, monkeypatch):
    base = {"teacher": "digits-ar-t2i", "method": "sjd", "n_samples": 50, "metrics": ["fid"]}
    spec = load_spec(spec_file(tmp_path, base=base, objectives=[{"metric": "fid.digits-cnn", "direction": "minimize"}],
                               constraints=[{"metric": "fid.digits-cnn.seed_std", "max_over_ref": 1.0}]),
                     checkpoints=NO_CHECKPOINTS)
    assert [o.metric for o in spec.objectives] == ["fid.digits-cnn"]
    with pytest.raises(UserError, match=r"'kid' is not one of its metrics \(fid\); name the metric in base.metrics"):
        load_spec(spec_file(tmp_path, base=base, objectives=[{"metric": "kid.digits-cnn", "direction": "minimize"}]),
                  checkpoints=NO_CHECKPOINTS)
    # a metric that cannot be computed here is tagged on the runs, not logged: SDTT's spec without SmolLM2's weights
    monkeypatch.setenv("ACCELBENCH_SMOLLM2_GGUF", str(tmp_path / "absent.gguf"))
    with pytest.raises(UserError, match="objective metric 'gen_ppl.smollm2-135m-instruct-q4' is never logged by the "
                                        "base trial: metric 'gen_ppl' cannot be computed here: gen_ppl: no SmolLM2"):
        load_spec("sweeps/specs/sdtt-divergence.yaml", checkpoints=NO_CHECKPOINTS)


def test_sqlite_sweep_logs_parent_and_children_and_resumes(tmp_path, capsys, fresh_store):
    storage, spec = f"sqlite:///{tmp_path}/optuna.db", spec_file(tmp_path, sampler="grid")
    assert sweep(tmp_path, spec, storage) == 0
    assert "best trial" in capsys.readouterr().out
    ts = trials(storage)
    assert [t.state for t in ts] == [TrialState.COMPLETE] * 3
    runs = mlflow_runs(fresh_store)
    (parent,) = [r for r in runs if r.data.tags.get("accelbench.kind") == "study"]
    assert parent.info.status == "FINISHED" and parent.data.metrics["complete_trials"] == 3
    assert parent.data.metrics["best_speedup_steps"] == max(t.value for t in trials(storage))
    children = [r for r in runs if r.data.tags.get("accelbench.kind") == "trial"]
    assert len(children) == 3 and {r.data.tags["mlflow.parentRunId"] for r in children} == {parent.info.run_id}
    assert sorted(r.data.tags["optuna_trial_number"] for r in children) == ["0", "1", "2"]
    assert {r.data.tags["optuna_state"] for r in children} == {"COMPLETE"}
    for t in ts:  # the objective is the logged metric of that trial's run
        (run,) = [r for r in children if r.data.tags["optuna_trial_number"] == str(t.number)]
        assert t.value == pytest.approx(run.data.metrics["speedup_steps"])
    assert sweep(tmp_path, spec, storage) == 0  # rerun: the study is already complete
    assert len(trials(storage)) == 3
    assert sweep(tmp_path, spec, storage, "--n-trials", "5") == 0  # continue the same study
    ts = trials(storage)
    assert len(ts) == 5 and len({t.number for t in ts}) == 5
    children = [r for r in mlflow_runs(fresh_store) if r.data.tags["accelbench.kind"] == "trial"]
    assert len(children) == 5  # one run per trial: nothing recomputed on the reruns
    out = tmp_path / "report"
    assert main(["report", "--experiment", "accelbench-sweeps", "--tracking-uri", fresh_store, "--out", str(out)]) == 0
    text = (out / "REPORT.md").read_text()
    assert "study_history_s.png" in text and "study_importances_s.png" in text
    assert (out / "study_history_s.png").exists() and (out / "study_importances_s.png").exists()


def test_multi_objective_spec_yields_a_pareto_front(tmp_path, capsys, fresh_store):
    storage = f"sqlite:///{tmp_path}/optuna.db"
    spec = spec_file(tmp_path, n_trials=6, objectives=[{"metric": "speedup_steps", "direction": "maximize"},
                                                        {"metric": "nfe_per_sample", "direction": "minimize"}])
    assert sweep(tmp_path, spec, storage) == 0
    study = optuna.load_study(study_name="s", storage=storage)
    assert len(study.directions) == 2 and study.best_trials
    assert study.metric_names == ["speedup_steps", "nfe_per_sample"]  # what optuna-dashboard labels its axes with
    assert main(["studies", "--storage", storage]) == 0
    assert "Pareto front #" in capsys.readouterr().out


def _assert_exactly(storage, n):
    """n complete trials, unique numbers; any other trial is a surplus ask that never ran."""
    ts = trials(storage)
    numbers = [t.number for t in ts]
    assert len(numbers) == len(set(numbers))
    assert sum(t.state == TrialState.COMPLETE for t in ts) == n
    assert all(t.state == TrialState.COMPLETE or t.user_attrs.get("surplus") for t in ts)
    return ts


def test_journal_backend_with_two_local_workers(tmp_path, monkeypatch, fresh_store):
    """The two workers share the study: each one's first trial waits until both hold one (a barrier in the teacher's
    load), so neither can finish the study before the other starts, however they are scheduled."""
    monkeypatch.setenv("ACCELBENCH_TEST_BARRIER", f"{tmp_path}/barrier:2")
    storage, spec = f"journal:{tmp_path}/optuna.journal", spec_file(tmp_path, teacher="barrier-table-ar", n_trials=4)
    assert sweep(tmp_path, spec, storage, "--workers", "2") == 0
    ts = _assert_exactly(storage, 4)
    assert len({t.user_attrs["worker"] for t in ts}) == 2


def test_postgres_two_workers(tmp_path, pg_database, fresh_store):
    """Killed workers on PostgreSQL: tests/test_soak.py."""
    spec = spec_file(tmp_path, n_trials=4)
    assert sweep(tmp_path, spec, pg_database, "--workers", "2") == 0
    _assert_exactly(pg_database, 4)


def _sweep_process(tmp_path, spec, storage, *extra):
    """`accelbench sweep` in a process of its own: its whole output as a user sees it, Optuna's log lines included."""
    return subprocess.Popen([sys.executable, "-m", "cli", "sweep", spec, "--storage", storage, "--tracking-uri",
                             f"sqlite:///{tmp_path}/mlflow.db", "--cache-dir", str(tmp_path / "cache"), "--warmup", "0",
                             "--no-progress", *extra], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def test_a_surplus_ask_is_pruned_quietly_and_the_exit_code_says_whether_the_study_is_done(tmp_path, capsys,
                                                                                            fresh_store):
    """A worker elsewhere holds trial 0 of a 2-trial study while this sweep runs: after the sweep's trial 1, its next
    ask finds both trials under way, a surplus, pruned without running and without a traceback. The sweep fails
    while trial 0 runs elsewhere, and succeeds once it is complete; no summary counts the surplus as a failure."""
    from bench.tracking import Tracker
    from sweeps.study import StorageOptions, make_storage, open_study

    storage, spec = f"sqlite:///{tmp_path}/optuna.db", spec_file(tmp_path, n_trials=2)
    study = open_study(load_spec(spec, checkpoints=NO_CHECKPOINTS), make_storage(StorageOptions(storage)),
                       Tracker(fresh_store, "accelbench-sweeps"))
    elsewhere = study.ask()
    elsewhere.set_user_attr("worker", "another-host:1")
    first = _sweep_process(tmp_path, spec, storage)
    out, err = first.communicate(timeout=300)
    assert first.returncode == 2, err
    assert err.strip().splitlines()[-1] == "accelbench: error: study s has 1 of 2 trials finished and 1 running"
    assert "Trial 2 pruned. Surplus: the study already has its 2 trials under way" in err
    assert "Traceback" not in out + err and "fail" not in out
    study.tell(elsewhere, 1.0)
    assert sweep(tmp_path, spec, storage) == 0
    assert capsys.readouterr().out.startswith("study s: complete 2, surplus 1\n")
    assert [t.state for t in trials(storage)] == [TrialState.COMPLETE, TrialState.COMPLETE, TrialState.PRUNED]


def test_a_worker_killed_mid_trial_has_its_trial_retried_and_the_sweep_succeeds(tmp_path, monkeypatch, capsys,
                                                                                  fresh_store):
    """One of the sweep's two workers is SIGKILLed mid-pass, its trial running and its MLflow run started (the
    killed teacher: whichever worker makes the first pass dies, and the other one's passes wait until it is gone).
    The journal has no heartbeats: the other worker finds the dead worker's trial, fails it, ends its run KILLED and
    retries it, and finishes the study. The sweep succeeds, with a note on the worker."""
    monkeypatch.setenv("ACCELBENCH_TEST_KILL", str(tmp_path / "killed"))
    storage = f"journal:{tmp_path}/optuna.journal"
    spec = spec_file(tmp_path, teacher="killed-table-ar", n_trials=3)
    assert sweep(tmp_path, spec, storage, "--workers", "2") == 0
    err = capsys.readouterr().err
    assert any(f"accelbench: note: 1 of 2 workers failed (exit codes {codes}); the study has all its trials\n" in err
               for codes in ([-signal.SIGKILL, 0], [0, -signal.SIGKILL])), err
    ts = trials(storage)
    (killed,) = [t for t in ts if t.state == TrialState.FAIL]
    assert killed.user_attrs["worker"].endswith(f":{(tmp_path / 'killed').read_text()}")
    retried = [t for t in ts if t.system_attrs.get("failed_trial") == killed.number]
    assert retried and retried[0].state == TrialState.COMPLETE
    assert sum(t.state == TrialState.COMPLETE for t in ts) == 3
    client = MlflowClient(fresh_store)
    runs = client.search_runs([client.get_experiment_by_name("accelbench-sweeps").experiment_id],
                              f"tags.optuna_trial_number = '{killed.number}'")
    # ended by the reaper or, when a trial of the same key started first, by its orphan sweep: KILLED either way
    assert runs and all(r.info.status == "KILLED" and r.data.tags["optuna_state"] == "FAIL" for r in runs)


def test_constraints_bound_a_metric_on_its_bad_side_of_the_teacher_arm(tmp_path):
    spec = load_spec(spec_file(tmp_path, constraints=[{"metric": "sec_per_sample_median", "max_over_ref": 1.0},
                                                      {"metric": "samples_per_sec", "min_under_ref": 0.1}]),
                     checkpoints=NO_CHECKPOINTS)
    ceiling, floor = spec.constraints
    assert ceiling.violation(3.4, 2.5) < 0 < ceiling.violation(3.6, 2.5)  # may exceed the teacher's time by 1.0
    assert floor.violation(3.95, 4.0) < 0 < floor.violation(3.85, 4.0)  # may fall 0.1 below its throughput
    for bad in ({"metric": "fid.digits-cnn"}, {"metric": "x", "max_over_ref": 1, "min_under_ref": 1},
                {"metric": "x", "max_over_ref": "1"}, {"metric": "x", "min_under_ref": 1, "typo": 2}):
        with pytest.raises(UserError, match="one numeric 'max_over_ref' or 'min_under_ref'"):
            load_spec(spec_file(tmp_path, constraints=[bad]), checkpoints=NO_CHECKPOINTS)


def test_a_sweeps_storage_opens_without_optunas_experimental_warnings(tmp_path):
    """Heartbeats and their retry callback are what a sweep relies on: not a warning on every worker's start."""
    import warnings

    from sweeps.study import StorageOptions, make_storage

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        make_storage(StorageOptions(f"sqlite:///{tmp_path}/optuna.db"))
    assert not [w for w in caught if issubclass(w.category, optuna.exceptions.ExperimentalWarning)]


def test_the_summary_says_why_no_trial_is_best_when_every_one_violates_a_constraint():
    from sweeps.study import summary

    study = optuna.create_study(storage=optuna.storages.InMemoryStorage(), study_name="c")
    for x in (0.2, 0.4):  # Optuna reads a trial's constraints from this system attribute (`Trial.set_constraint`)
        study.add_trial(optuna.trial.create_trial(value=x, system_attrs={"constraints": [1.0]}))
    assert summary(study) == ["study c: complete 2", "  no best trial: all 2 complete trials violate a constraint "
                              "(their `constraints` user attribute: > 0 is the violation)"]


def test_an_unreachable_study_storage_is_one_line_before_the_mlflow_store_is_touched(tmp_path, capsys):
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert sweep(tmp_path, spec_file(tmp_path), f"postgresql://postgres@127.0.0.1:{port}/optuna") == 2
    err = capsys.readouterr().err
    assert "cannot reach the study storage" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "mlflow.db").exists()  # no empty experiment left behind
