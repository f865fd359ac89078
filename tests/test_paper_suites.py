"""Paper suites (suites/papers/): the papers' numbers as data, validated; a dry run plans each offline."""
from pathlib import Path

import pytest
import yaml

from bench.cli import main
from bench.dryrun import costs

ROOT = Path(__file__).resolve().parent.parent
PAPER_SUITES = sorted((ROOT / "suites" / "papers").glob("*.yaml"))


def test_there_is_a_paper_suite_for_every_paper():
    names = {p.name.split("-")[0] for p in PAPER_SUITES}
    assert len(PAPER_SUITES) >= 5 and names >= {"ard", "cspd", "dd", "sdtt", "sjd"}, names


@pytest.mark.parametrize("path", PAPER_SUITES, ids=lambda p: p.stem)
def test_a_paper_suite_dry_runs_offline_against_an_empty_checkpoints_folder(path, tmp_path, capsys, monkeypatch):
    """Exit 0 with nothing at hand: the files each trial needs, marked missing, its samples and passes per arm, and
    device-hours priced from the measured per-pass costs; nothing is written."""
    monkeypatch.chdir(tmp_path)
    empty = tmp_path / "checkpoints"
    empty.mkdir()
    assert main(["suite", str(path), "--dry-run", "--checkpoints", str(empty), "--cache-dir",
                 str(tmp_path / "cache")]) == 0
    out = capsys.readouterr().out
    assert "MISSING" in out and f"{empty}/" in out
    assert "samples per arm" in out and "device-hours estimated for sampling" in out
    data = yaml.safe_load(path.read_text())
    assert "paper" not in data.get("defaults", {})
    assert any("paper" in t for t in data["trials"]), "a paper suite carries the paper's numbers"
    assert all(t["paper"]["source"] for t in data["trials"] if "paper" in t)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoints"]  # no store, no cache, no report


def test_the_dry_run_prices_passes_with_the_measured_costs(tmp_path, capsys):
    """VAR-d16's own sampler: 10 scale passes per sample in each of the two arms, at the measured cost per pass."""
    assert main(["run", "--teacher", "var-d16", "--method", "ar", "--n-samples", "100", "--batch-size", "10",
                 "--warmup", "1", "--dry-run", "--checkpoints", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    per_arm = 110 * 10 * costs()["var-d16"].seconds["step"] / 3600  # 100 samples + a warm-up batch of 10
    assert f"ref        10 step per sample: {per_arm:.3g} device-hours" in out
    assert f"estimated: {2 * per_arm:.3g} device-hours on {costs()['var-d16'].device}" in out
    assert f"MISSING  {tmp_path}/var_d16.pth" in out and "(python benchmarks/real_var_cost.py --depth 16)" in out


def test_a_dry_run_of_a_teacher_without_measured_costs_lists_it_unpriced(capsys):
    assert main(["run", "--teacher", "digits-ar-c2i", "--method", "sjd", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "not planned (no measured cost for teacher digits-ar-c2i" in out and "1 runs not priced" in out


def write(tmp_path, trials, **extra):
    path = tmp_path / "suite.yaml"
    path.write_text(yaml.safe_dump({"experiment": "p", "defaults": {"teacher": "digits-ar-c2i", "n_samples": 4},
                                    "trials": trials, **extra}))
    return str(path)


@pytest.mark.parametrize("paper, message", [
    ({"fid": 2.0}, "'paper' needs a 'source' naming the paper's table and row"),
    ({"fid": 2.0, "bleu": 1.0, "source": "T1"}, "unknown paper key 'bleu'; valid: source, acceptance_rate"),
    ({"fid": "low", "source": "T1"}, "paper fid must be a finite number, got 'low'"),
    ([1, 2], "'paper' must be a mapping"),
])
def test_paper_numbers_are_checked_before_any_work(tmp_path, capsys, paper, message):
    path = write(tmp_path, [{"method": "ar", "paper": paper}])
    assert main(["suite", path, "--tracking-uri", f"sqlite:///{tmp_path}/m.db", "--cache-dir",
                 str(tmp_path / "cache")]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "trial 0" in err and "\n" not in err
    assert not (tmp_path / "m.db").exists()


def test_suite_overrides_set_a_knob_in_every_trial_that_has_it(tmp_path, capsys):
    from bench.suite import load_suite

    path = write(tmp_path, [{"method": "dd", "params": {"steps": 2}}, {"method": "sjd", "params": {"window": 4}}])
    suite = load_suite(path, n_samples=2, overrides={"train_steps": "3"})
    dd, sjd = (p.trial for p in suite.plans)
    assert dd.params["train_steps"] == 3 and dd.params["steps"] == 2 and "train_steps" not in sjd.params
    assert dd.n_samples == sjd.n_samples == 2
    assert main(["suite", path, "--dry-run", "--param", "no_such_knob=1"]) == 2
    assert "--param no_such_knob is a knob of none of its trials' methods" in capsys.readouterr().err
