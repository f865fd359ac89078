"""A suite's cost mode counts every row it can: a row that cannot be counted (its teacher has no full-size random
build) is listed in COST.md with its reason, and the rows after it are counted."""
import yaml
from mlflow.tracking import MlflowClient

import cli
from core.names import SKIPPED_TAG
from core.registry import TEACHERS
from tests.fakes import TinyVAR


class NoRandomVAR(TinyVAR):
    """The tiny VAR loader without a random build: the cost mode cannot count it (a real release's files only)."""

    random = None


def test_a_row_that_cannot_be_counted_is_listed_and_the_rest_go_on(plugin, monkeypatch, tmp_path, fresh_store,
                                                                   capsys):
    monkeypatch.setitem(TEACHERS._entries, "no-random-var", NoRandomVAR)
    suite = tmp_path / "suite.yaml"
    suite.write_text(yaml.safe_dump({"experiment": "rows", "seeds": [0], "defaults": {"n_samples": 4}, "trials": [
        {"teacher": "tiny-var", "method": "ar"},
        {"teacher": "no-random-var", "method": "ar"},
        {"teacher": "tiny-var", "method": "skip-scales", "params": {"skip": 1}}]}))
    assert cli.main(["suite", str(suite), "--cost", "--tracking-uri", fresh_store, "--out", str(tmp_path / "out"),
                     "--cache-dir", str(tmp_path / "cache"), "--no-progress"]) == 0
    client = MlflowClient(fresh_store)
    runs = client.search_runs([client.get_experiment_by_name("rows").experiment_id])
    assert len(runs) == 3 and all(r.info.status == "FINISHED" for r in runs)
    skipped = [r for r in runs if SKIPPED_TAG in r.data.tags]
    assert [r.data.params["teacher"] for r in skipped] == ["no-random-var"]
    assert "has no full-size random build" in skipped[0].data.tags[SKIPPED_TAG]
    table = (tmp_path / "out" / "COST.md").read_text()
    row = next(line for line in table.splitlines() if line.startswith("| no-random-var |"))
    assert "not counted: cost mode: teacher 'no-random-var' has no full-size random build yet" in row
    counted = [line for line in table.splitlines() if line.startswith("| tiny-var |")]
    assert len(counted) == 2 and all("counted: one sample on the meta device" in line for line in counted)
    assert "GFLOPs (2 per MAC)" in table  # both conventions
