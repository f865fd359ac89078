"""README.md's headline, the report's own: the table `reports.tables.headline_table` opens REPORT.md with, read from
`make demo`'s MLflow store (the experiment of suites/default.yaml), under one statement of what the runs ran on and how
long they took: the CPU, device and torch threads from the runs' tags (the report's footer reads the same tags) and
the time from the first run's start to the last one's end. It replaces what lies between README's marker lines
(`BEGIN`, `END`) and nothing else, so a second run on the same store changes nothing. tests/test_readme.py checks
that the rows are the suite's headline trials. With `--field`, the same for suites/field.yaml's store: the first
`FIELD_TOP` rows of each teacher's leaderboard (`reports.leaderboard`), between the field markers.

usage: python scripts/readme_headline.py [--field] [--tracking-uri sqlite:///mlflow.db] [--experiment NAME]
                                         [--readme PATH]
"""
from __future__ import annotations

import argparse
import sys
import textwrap
from pathlib import Path

import yaml

from bench.tracking import tracking_uri
from core.errors import UserError
from reports.leaderboard import leaderboard
from reports.report import load_runs
from reports.tables import TrialRun, headline_table, report_order, tag_values

ROOT = Path(__file__).resolve().parent.parent
BEGIN, END = "<!-- headline:begin -->", "<!-- headline:end -->"
DEMO_SUITE = ROOT / "suites" / "default.yaml"  # what `make demo` runs
FIELD_BEGIN, FIELD_END = "<!-- field:begin -->", "<!-- field:end -->"
FIELD_SUITE = ROOT / "suites" / "field.yaml"
FIELD_TOP = 5  # rows of each teacher's leaderboard the README shows (LEADERBOARD.md has them all)
WIDTH = 120  # the README's line length


def duration(ms: int) -> str:
    minutes, seconds = divmod(round(ms / 1000), 60)
    return f"{minutes} min {seconds} s"


def statement(runs: list[TrialRun], command: str, what: str) -> list[str]:
    """The one statement of what the runs ran on and how long they took."""
    span = max(r.end_time_ms for r in runs) - min(r.start_time_ms for r in runs)
    text = (f"From `{command}`: {len(runs)} runs, {duration(span)} from the first one's start to the last one's "
            f"end, on {tag_values(runs, 'cpu')} (device {tag_values(runs, 'device')}, torch threads "
            f"{tag_values(runs, 'torch_threads')}); `scripts/readme_headline.py` wrote this statement and {what} "
            f"from the MLflow store:")
    return textwrap.wrap(text, WIDTH, break_long_words=False, break_on_hyphens=False)


def block(runs: list[TrialRun]) -> list[str]:
    """The lines between the markers: the statement, then the headline table."""
    table = headline_table(runs)
    if not table:
        raise UserError(f"none of the {len(runs)} finished trial runs is a headline run (a paper method at its default "
                        f"key knobs): is this make demo's store?")
    return [*statement(runs, "make demo", "the table"), "", *table]


def field_block(runs: list[TrialRun]) -> list[str]:
    """The lines between the field markers: the statement, then each teacher's leaderboard, its first rows."""
    if not runs:
        raise UserError("no finished trial runs: is this the store of accelbench suite suites/field.yaml?")
    out = statement(runs, "accelbench suite suites/field.yaml", f"the first {FIELD_TOP} rows of each table")
    for teacher in sorted({r.teacher for r in runs}):
        board = leaderboard(report_order([r for r in runs if r.teacher == teacher]))
        out += ["", f"{teacher} (drift tolerance {board.tolerance:.3g}, twice the teacher arm's spread over seeds):",
                "", *board.lines[: 2 + FIELD_TOP]]
    return out


def rewrite(text: str, lines: list[str], begin_marker: str = BEGIN, end_marker: str = END) -> str:
    """`text` with the lines between its marker lines replaced by `lines`."""
    head, begin, rest = text.partition(begin_marker + "\n")
    _, end, tail = rest.partition(end_marker + "\n")
    if not begin or not end:
        raise UserError(f"the README has no line {begin_marker} followed by a line {end_marker} to write between")
    return head + begin + "\n".join(lines) + "\n" + end + tail


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tracking-uri", help="the MLflow store (default: $MLFLOW_TRACKING_URI, else "
                                               "sqlite:///mlflow.db, where make demo writes)")
    parser.add_argument("--field", action="store_true",
                        help="write the field's leaderboards (suites/field.yaml's store) between the field markers")
    parser.add_argument("--experiment", help="the experiment (default: suites/default.yaml's, make demo's; with "
                                             "--field suites/field.yaml's)")
    parser.add_argument("--readme", type=Path, default=ROOT / "README.md", help="the file to write (default README.md)")
    args = parser.parse_args(argv)
    uri = tracking_uri(args.tracking_uri)
    args.experiment = args.experiment or yaml.safe_load((FIELD_SUITE if args.field else DEMO_SUITE).read_text())[
        "experiment"]
    try:
        runs = load_runs(uri, args.experiment)
        text = args.readme.read_text()
        args.readme.write_text(rewrite(text, field_block(runs), FIELD_BEGIN, FIELD_END) if args.field
                               else rewrite(text, block(runs)))
    except UserError as exc:
        print(f"readme_headline: {exc}", file=sys.stderr)
        return 2
    print(f"{args.readme}: the {'leaderboards' if args.field else 'headline'} of {len(runs)} runs of "
          f"{args.experiment} in {uri}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
