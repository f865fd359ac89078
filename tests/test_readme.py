"""README.md's headline is the report's own: its rows are the default suite's headline trials as the report prints
them, scripts/readme_headline.py writes them from a store and touches nothing else, and the README and the docs'
home page give the same two set-up commands and first trial."""
from __future__ import annotations

import importlib.util
import re
from pathlib import Path

from mlflow.tracking import MlflowClient

from bench.suite import load_suite
from core.config import config_dict
from core.names import HEADLINE_TAG, SPEEDUP_STEPS, SPEEDUP_WALL
from reports.report import load_runs
from reports.tables import TrialRun, build_markdown, headline_table
from tests.test_reports import SJD_KNOBS, log_trial

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("readme_headline", ROOT / "scripts" / "readme_headline.py")
readme_headline = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(readme_headline)
SUITE_COLUMNS = 5  # method, teacher, knobs, batch, seeds: what the suite decides; the cells after them are measured


def block(text: str) -> list[str]:
    """The lines between the README's headline markers."""
    return text.split(readme_headline.BEGIN + "\n")[1].split(readme_headline.END)[0].splitlines()


def table(lines: list[str]) -> list[list[str]]:
    """The cells of every markdown table line (header, rule and rows)."""
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in lines if line.startswith("|")]


def as_logged(p) -> TrialRun:
    """A planned trial as the report reads its run: knobs and sampling settings as MLflow params (strings), the key
    knobs and the headline rule's tag as the runner logs them (`Plan.headline`); speed-ups of 1 stand in for the
    measured cells, which this test does not compare."""
    t = p.trial
    return TrialRun(t.teacher, t.method, t.seed, t.n_samples, {k: str(v) for k, v in t.params.items()},
                    {k: str(v) for k, v in config_dict(p.sampling).items()}, p.reference,
                    {SPEEDUP_WALL: 1.0, SPEEDUP_STEPS: 1.0}, {HEADLINE_TAG: str(p.headline).lower()},
                    key_knobs=p.method_cls.key_knobs, batch_size=t.batch_size)


def test_the_readme_headline_rows_are_the_default_suites_headline_trials():
    suite = load_suite(str(readme_headline.DEMO_SUITE), checkpoints=ROOT / "checkpoints")
    expected = table(headline_table([as_logged(p) for p in suite.plans]))
    shown = table(block((ROOT / "README.md").read_text()))
    assert shown[:2] == expected[:2], "the README's headline has another header than the report's"
    assert [row[:SUITE_COLUMNS] for row in shown[2:]] == [row[:SUITE_COLUMNS] for row in expected[2:]], (
        "the README's headline rows are not the default suite's headline trials: after make demo, run "
        ".venv/bin/python scripts/readme_headline.py")


def test_the_script_writes_the_reports_headline_between_the_markers_and_nothing_else(tmp_path, capsys, fresh_store):
    uri = fresh_store
    client = MlflowClient(uri)
    exp = client.create_experiment("demo")
    start = 1_790_000_000_000 + 86_400_000  # log_trial's start on day 1
    for seed, noisy, seconds in ((0, 0.0, 60), (1, 1.0, 95)):  # seed 1's timings too spread: the row flagged ⚠
        run = log_trial(client, exp, "sjd", seed, SJD_KNOBS, ms=20.0, ref_ms=40.0, nfe=30.0, fid=2.0 + seed,
                        ref_fid=2.5, extra_metrics={"speedup_wall_noisy": noisy}, extra_tags={HEADLINE_TAG: "true"})
        client.set_terminated(run, "FINISHED", end_time=start + seconds * 1000)
    readme = tmp_path / "README.md"
    head, tail = "# Title\n\nAbove the block.\n\n", "\nBelow the block, `make demo` and all.\n"
    readme.write_text(f"{head}{readme_headline.BEGIN}\nby hand\n{readme_headline.END}\n{tail}")
    argv = ["--tracking-uri", uri, "--experiment", "demo", "--readme", str(readme)]

    assert readme_headline.main(argv) == 0
    text = readme.read_text()
    assert text.startswith(head + readme_headline.BEGIN + "\n") and text.endswith(readme_headline.END + "\n" + tail)
    lines = block(text)
    rows = [line for line in lines if line.startswith("|")]
    assert "\n".join(rows) in build_markdown(load_runs(uri, "demo"), "t")  # REPORT.md's headline, byte for byte
    assert table(rows)[2][:SUITE_COLUMNS + 1] == ["sjd", "digits-ar-t2i", "window=16, init=random", "1", "2",
                                                  "2.00× ± 0.00 ⚠"]
    statement = " ".join(lines[:lines.index("")])
    assert statement.startswith("From `make demo`: 2 runs, 1 min 35 s from the first one's start")
    assert "on Test CPU (device cpu, torch threads 1)" in statement
    assert readme_headline.main(argv) == 0 and readme.read_text() == text  # the same store, the same README

    readme.write_text(head + tail)
    assert readme_headline.main(argv) == 2 and readme.read_text() == head + tail
    assert "no line <!-- headline:begin --> followed by" in capsys.readouterr().err


def test_the_field_block_is_each_teachers_leaderboard_and_names_the_field_suites_settings(tmp_path, fresh_store):
    """`--field` writes the first rows of each teacher's LEADERBOARD.md table between the field markers, leaving the
    headline alone; the README's own field block lists only settings suites/field.yaml runs."""
    client = MlflowClient(fresh_store)
    exp = client.create_experiment("field")
    for method, ms, fid in (("sjd", 20.0, 2.5), ("jacobi", 10.0, 9.0)):
        for seed in (0, 1):
            log_trial(client, exp, method, seed, SJD_KNOBS if method == "sjd" else {"window": 16, "greedy": False},
                      ms=ms, ref_ms=40.0, nfe=30.0, fid=fid + seed * 0.1, ref_fid=2.5 + seed * 0.1)
    readme = tmp_path / "README.md"
    text = (f"{readme_headline.BEGIN}\nheadline\n{readme_headline.END}\n"
            f"{readme_headline.FIELD_BEGIN}\n{readme_headline.FIELD_END}\n")
    readme.write_text(text)
    assert readme_headline.main(["--field", "--tracking-uri", fresh_store, "--experiment", "field", "--readme",
                                 str(readme)]) == 0
    out = readme.read_text()
    assert out.startswith(f"{readme_headline.BEGIN}\nheadline\n{readme_headline.END}\n")
    field = out.split(readme_headline.FIELD_BEGIN + "\n")[1].split(readme_headline.FIELD_END)[0]
    assert "From `accelbench suite suites/field.yaml`: 4 runs" in " ".join(field.splitlines())
    ranks = [(row[0], row[1]) for row in table(field.splitlines())[2:]]
    assert ranks == [("1", "sjd"), ("—", "jacobi")]  # the faster Jacobi drifts 6.5 FID: beyond the tolerance
    # the README's block: every row a setting of the field suite
    suite = load_suite(str(readme_headline.FIELD_SUITE), checkpoints=ROOT / "checkpoints")
    methods = {p.trial.method for p in suite.plans}
    shown = (ROOT / "README.md").read_text().split(readme_headline.FIELD_BEGIN + "\n")[1].split(
        readme_headline.FIELD_END)[0]
    rows = table(shown.splitlines())
    assert len(rows) > 2 and all(row[1] in methods for row in rows if row[0] not in ("rank", "---")), (
        "the README's field block has a row of a method the field suite does not run: run "
        ".venv/bin/python scripts/readme_headline.py --field on its store")


def _fenced(text: str) -> list[str]:
    return [line for block in re.findall(r"```bash\n(.*?)```", text, re.S) for line in block.splitlines()]


def test_the_readme_and_the_docs_home_give_the_same_two_commands_and_first_trial():
    readme, home = (_fenced((ROOT / path).read_text()) for path in ("README.md", "docs/index.md"))
    setup = [line for line in readme if line.startswith("make ")]
    assert [line.split()[1] for line in setup] == ["demo", "test"]
    first_trial = next(line for line in readme if line.startswith("accelbench run "))
    assert home[:3] == [*setup, first_trial]
