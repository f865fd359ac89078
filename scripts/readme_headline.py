"""README.md's headline, the report's own: the table `reports.tables.headline_table` opens REPORT.md with, read from
`make demo`'s MLflow store (the experiment of suites/default.yaml), under one statement of what the runs ran on and how
long they took: the CPU, device and torch threads from the runs' tags (the report's footer reads the same tags) and
the time from the first run's start to the last one's end. It replaces what lies between README's marker lines
(`BEGIN`, `END`) and nothing else, so a second run on the same store changes nothing. tests/test_readme.py checks
that the rows are the suite's headline trials.

usage: python scripts/readme_headline.py [--tracking-uri sqlite:///mlflow.db] [--experiment NAME] [--readme PATH]
"""
from __future__ import annotations

import argparse
import sys
import textwrap
from pathlib import Path

import yaml

from bench.tracking import tracking_uri
from core.errors import UserError
from reports.report import load_runs
from reports.tables import TrialRun, headline_table, tag_values

ROOT = Path(__file__).resolve().parent.parent
BEGIN, END = "<!-- headline:begin -->", "<!-- headline:end -->"
DEMO_SUITE = ROOT / "suites" / "default.yaml"  # what `make demo` runs
WIDTH = 120  # the README's line length


def duration(ms: int) -> str:
    minutes, seconds = divmod(round(ms / 1000), 60)
    return f"{minutes} min {seconds} s"


def block(runs: list[TrialRun]) -> list[str]:
    """The lines between the markers: the statement, then the headline table."""
    table = headline_table(runs)
    if not table:
        raise UserError(f"none of the {len(runs)} finished trial runs is a headline run (a paper method at its default "
                        f"key knobs): is this make demo's store?")
    span = max(r.end_time_ms for r in runs) - min(r.start_time_ms for r in runs)
    statement = (f"From `make demo`: {len(runs)} runs, {duration(span)} from the first one's start to the last one's "
                 f"end, on {tag_values(runs, 'cpu')} (device {tag_values(runs, 'device')}, torch threads "
                 f"{tag_values(runs, 'torch_threads')}); `scripts/readme_headline.py` wrote this statement and the "
                 f"table from the MLflow store:")
    return [*textwrap.wrap(statement, WIDTH, break_long_words=False, break_on_hyphens=False), "", *table]


def rewrite(text: str, lines: list[str]) -> str:
    """`text` with the lines between its marker lines replaced by `lines`."""
    head, begin, rest = text.partition(BEGIN + "\n")
    _, end, tail = rest.partition(END + "\n")
    if not begin or not end:
        raise UserError(f"the README has no line {BEGIN} followed by a line {END} to write the headline between")
    return head + begin + "\n".join(lines) + "\n" + end + tail


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tracking-uri", help="the MLflow store (default: $MLFLOW_TRACKING_URI, else "
                                               "sqlite:///mlflow.db, where make demo writes)")
    parser.add_argument("--experiment", default=yaml.safe_load(DEMO_SUITE.read_text())["experiment"],
                        help="the experiment (default: suites/default.yaml's, make demo's)")
    parser.add_argument("--readme", type=Path, default=ROOT / "README.md", help="the file to write (default README.md)")
    args = parser.parse_args(argv)
    uri = tracking_uri(args.tracking_uri)
    try:
        runs = load_runs(uri, args.experiment)
        args.readme.write_text(rewrite(args.readme.read_text(), block(runs)))
    except UserError as exc:
        print(f"readme_headline: {exc}", file=sys.stderr)
        return 2
    print(f"{args.readme}: the headline of {len(runs)} runs of {args.experiment} in {uri}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
