"""`accelbench suite`: validated up front, resumable by trial key, ends with a report."""
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


def test_suite_runs_what_is_missing_then_reports(tiny_recipe, tmp_path, cache_dir, capsys):
    path = write(tmp_path, SUITE)
    assert run(tmp_path, cache_dir, path) == 0
    assert "ran 4 trials, 0 already finished" in capsys.readouterr().out
    assert len(finished(tmp_path)) == 4
    first = (tmp_path / "report" / "REPORT.md").read_text()
    assert "| sjd | window=4, init=random |" in first and "| jacobi | window=4 |" in first
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
    from sweeps.spec import load_spec

    root = Path(__file__).resolve().parent.parent
    suites = sorted((root / "suites").glob("*.yaml"))
    specs = sorted((root / "sweeps" / "specs").glob("*.yaml"))
    assert {p.stem for p in suites} >= {"default", "dd"} and {p.stem for p in specs} >= {"sjd-window", "dd-timesteps"}
    for path in suites:
        assert load_suite(str(path), checkpoints=NO_CHECKPOINTS).plans, path
    for path in specs:
        assert load_spec(str(path), checkpoints=NO_CHECKPOINTS).objectives, path
