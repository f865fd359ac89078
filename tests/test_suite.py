"""`accelbench suite`: validated up front, resumable by trial key, ends with a report."""
import pytest
import yaml
from mlflow.tracking import MlflowClient

from cli import main
from tests.fakes import NO_CHECKPOINTS

SUITE = {
    "experiment": "mini",
    "seeds": [0, 1],
    "defaults": {"n_samples": 3, "metrics": ["fid"]},
    "trials": [{"teacher": "digits-ar-t2i", "method": "sjd", "params": {"window": 4}},
               {"teacher": "digits-ar-t2i", "method": "jacobi", "params": {"window": 4, "greedy": True}}],
}


def write(tmp_path, data):
    path = tmp_path / "suite.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def run(tmp_path, cache_dir, path, *extra):
    return main(["suite", path, "--tracking-uri", f"sqlite:///{tmp_path}/mlflow.db", "--cache-dir", str(cache_dir),
                 "--out", str(tmp_path / "report"), "--warmup", "0", "--no-progress", *extra])


def finished(tmp_path):
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    exp = client.get_experiment_by_name("mini")
    return client.search_runs([exp.experiment_id], "attributes.status = 'FINISHED'")


@pytest.mark.usefixtures("fresh_store")  # a copy of the migrated store at tmp_path/mlflow.db
def test_suite_runs_what_is_missing_then_reports(tiny_recipe, tmp_path, cache_dir, capsys):
    path = write(tmp_path, SUITE)
    assert run(tmp_path, cache_dir, path) == 0
    assert "ran 4 trials, 0 already finished" in capsys.readouterr().out
    assert len(finished(tmp_path)) == 4
    first = (tmp_path / "report" / "REPORT.md").read_text()
    assert "| sjd | window=4, init=random, verify=exact |" in first and "| jacobi | window=4 |" in first
    more = dict(SUITE, seeds=[0, 1, 2])
    assert run(tmp_path, cache_dir, write(tmp_path, more)) == 0
    assert "ran 2 trials, 4 already finished" in capsys.readouterr().out
    assert len(finished(tmp_path)) == 6


def test_a_bad_trial_stops_the_suite_before_any_work(tmp_path, cache_dir, capsys):
    bad = dict(SUITE, trials=SUITE["trials"] + [{"teacher": "digits-ar-t2i", "method": "sjd", "params": {"w": 1}}])
    assert run(tmp_path, tmp_path / "cache", write(tmp_path, bad)) == 2
    assert "trial 2: method 'sjd': unknown knob 'w'" in capsys.readouterr().err
    assert not (tmp_path / "cache").exists() and not (tmp_path / "mlflow.db").exists()


def test_every_shipped_suite_and_study_spec_validates():
    """The suites and sweep specs in the repository name real teachers, methods, knobs and metrics."""
    from pathlib import Path

    from bench.suite import load_suite
    from core import files
    from sweeps.spec import load_spec

    root = Path(__file__).resolve().parent.parent
    suites = sorted((root / "suites").glob("*.yaml"))
    specs = sorted((root / "sweeps" / "specs").glob("*.yaml"))
    assert {p.stem for p in suites} >= {"default", "dd"} and {p.stem for p in specs} >= {"sjd-window", "dd-timesteps"}
    for path in suites:  # the files a suite reads are listed, not required (zipar-llamagen's are a release's)
        with files.audit():
            assert load_suite(str(path), checkpoints=NO_CHECKPOINTS).plans, path
    for path in specs:
        assert load_spec(str(path), checkpoints=NO_CHECKPOINTS).objectives, path


@pytest.mark.usefixtures("fresh_store")  # a copy of the migrated store at tmp_path/mlflow.db
def test_a_suite_draws_its_shared_reference_arm_once(plugin, tmp_path, monkeypatch):
    """Three trials on one teacher under the same reference settings, timed under the latency protocol at batch 2:
    `ar` (teacher-only: its one arm is the reference draws, drawn once), then `sjd` at two windows, which read those
    draws from the cache instead of drawing them. Counted: the rows the teacher's sampler starts. The reference
    arm's figures equal those of a trial that draws its own (a fresh cache: nothing to read)."""
    from bench import cost
    from core.registry import TEACHERS

    teacher_cls, rows = TEACHERS.get("table-ar"), []
    start = teacher_cls.start
    monkeypatch.setattr(teacher_cls, "start",
                        lambda self, cond, **kw: rows.append(len(cond)) or start(self, cond, **kw))
    monkeypatch.setattr(cost, "_COUNTED", {})  # FLOPs are counted on one sample per sampler, once per process
    suite = {"experiment": "shared", "defaults": {"teacher": "table-ar", "n_samples": 20, "batch_size": 2,
                                                  "latency_batch": 2},
             "trials": [{"method": "ar"}, {"method": "sjd", "params": {"window": 2}},
                        {"method": "sjd", "params": {"window": 3}}]}
    protocol = ["--latency-warmup", "0", "--latency-min-count", "1", "--latency-min-seconds", "0"]
    assert run(tmp_path, tmp_path / "cache", write(tmp_path, suite), *protocol) == 0
    # ar: 20 drawn, 1 counted, its arm timed once at batch 2; each sjd: its 20, 1 counted, the reference read, both
    # arms timed once; the reference sampler counted once, as the ar trial's own arm (`bench.cost` keys a teacher's
    # sampler as one, whichever trial runs it). Drawing the reference again: 2 x 20 more.
    assert sum(rows) == (20 + 1 + 2) + (20 + 1 + 2 * 2) + (20 + 1 + 2 * 2)
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    ar, w2, w3 = sorted(client.search_runs([client.get_experiment_by_name("shared").experiment_id]),
                        key=lambda r: r.info.start_time)
    assert [r.data.tags["reference_read"] for r in (ar, w2, w3)] == ["false", "true", "true"]
    assert ar.data.tags["samples_sha256.method"] == ar.data.tags["samples_sha256.ref"] == \
        w2.data.tags["samples_sha256.ref"] == w3.data.tags["samples_sha256.ref"]
    assert ar.data.metrics["speedup_wall"] == 1.0 and "latency_per_sample_median" in w2.data.metrics
    own = {k: v for k, v in ar.data.metrics.items() if "/" not in k and f"ref/{k}" in ar.data.metrics}
    assert own and all(ar.data.metrics[f"ref/{k}"] == v for k, v in own.items())

    store = f"sqlite:///{tmp_path}/fresh.db"  # sharing off: the second trial alone, on a fresh cache
    assert main(["run", "--teacher", "table-ar", "--method", "sjd", "--param", "window=2", "--n-samples", "20",
                 "--batch-size", "2", "--latency-batch", "2", "--tracking-uri", store, "--cache-dir",
                 str(tmp_path / "fresh"), "--warmup", "0", "--no-progress", *protocol]) == 0
    fresh_client = MlflowClient(store)
    (fresh,) = fresh_client.search_runs([fresh_client.get_experiment_by_name("accelbench").experiment_id])
    assert fresh.data.tags["reference_read"] == "false"
    assert fresh.data.tags["samples_sha256.ref"] == w2.data.tags["samples_sha256.ref"]
    untimed = {k for k in fresh.data.metrics if k.startswith("ref/") and not any(
        m in k for m in ("sec_per", "samples_per_sec", "latency", "compile"))}
    assert "ref/nfe_per_sample" in untimed
    assert {k: fresh.data.metrics[k] for k in untimed} == {k: w2.data.metrics[k] for k in untimed}
