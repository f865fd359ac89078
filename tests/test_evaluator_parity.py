"""The evaluator-parity table of docs/guide/papers.md ("Evaluator parity") covers every metric the paper suites ask
for: each (suite, metric) pair of the suites as the code plans them (`bench.suite.load_suite`: every trial's metric
specs, and the lm-eval task keys of a row scored on tasks) has a row, no row names a pair no suite has, and every test
a row names exists."""
from __future__ import annotations

import re
from pathlib import Path

from bench.suite import load_suite
from core import files
from metrics import lambada
from tests.fakes import NO_CHECKPOINTS

ROOT = Path(__file__).resolve().parent.parent
COLUMNS = ["suite", "metric", "our key (mode)", "the paper's number came from", "known to differ", "parity test"]


def parity_table() -> list[dict[str, str]]:
    """The rows of the table under "## Evaluator parity", by column."""
    text = (ROOT / "docs" / "guide" / "papers.md").read_text().split("## Evaluator parity", 1)[1]
    lines = [line for line in text.split("\n## ")[0].splitlines() if line.startswith("|")]
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    assert head == COLUMNS, head
    return [dict(zip(head, (c.strip() for c in line.strip("|").split("|")))) for line in lines[2:]]


def documented_pairs() -> set[tuple[str, str]]:
    return {(suite, metric) for row in parity_table() for suite in re.findall(r"`([\w.-]+\.yaml)`", row["suite"])
            for metric in re.findall(r"`([^`]+)`", row["metric"])}


def suite_pairs() -> set[tuple[str, str]]:
    """(suite file, metric spec or lm-eval key) of every planned trial of every paper suite."""
    pairs = set()
    for path in sorted((ROOT / "suites" / "papers").glob("*.yaml")):
        with files.audit():
            plans = load_suite(str(path), checkpoints=NO_CHECKPOINTS).plans
        for p in plans:
            pairs |= {(path.name, m.spec) for m in p.metrics}
            pairs |= {(path.name, key) for key in (lambada.directions(p.tasks) if p.tasks else ())}
    return pairs


def test_every_metric_a_paper_suite_asks_for_has_a_row_and_every_row_a_suite():
    documented, used = documented_pairs(), suite_pairs()
    assert used and not used - documented, f"pairs without a row in the parity table: {sorted(used - documented)}"
    assert not documented - used, f"rows no suite asks for: {sorted(documented - used)}"


def test_every_row_names_its_official_code_and_an_existing_test_or_says_unchecked():
    for row in parity_table():
        where = f"{row['suite']} {row['metric']}"
        assert row["our key (mode)"].startswith("`") and row["the paper's number came from"], where
        named = re.findall(r"`(tests/[\w/]+\.py)(?:::(\w+))?`", row["parity test"])
        assert named or "unchecked" in row["parity test"], where
        for file, test in named:
            assert (ROOT / file).exists(), f"{where}: {file}"
            assert not test or re.search(rf"^def {test}\(", (ROOT / file).read_text(), re.M), f"{where}: {test}"
