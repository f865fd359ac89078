"""A paper's reported numbers for one trial of a paper suite, carried as data beside the trial.

A paper suite (`suites/papers/<paper>-<table>.yaml`) gives a trial the numbers the paper reports for the same setting:

    paper: {fid: 1.84, nfe: 4, source: "ARD Table 1, DiT-XL/2 ARD 4 steps"}

Paper numbers live in suite files only, never in code. They are not part of the trial (the trial key does not change
with them): the runner logs them as tags `paper.<key>` on the trial's run, and the report prints them beside the
measured columns with the difference. A key is a quality metric's name (`fid`, matching every extractor's column of
that metric, e.g. `fid.inception-v3-tf1.adm-in256`) or its full key, or one of the speed columns below. A `note`
(one line) is what the report must say under the table about this row's paper numbers, e.g. that the released code
cannot reproduce them (SJD's Anole "SJD (ISP)" rows): it prints the note as the row's footnote.
"""
from __future__ import annotations

import math
from typing import Any, Collection, Mapping

from core.errors import UserError
from core.names import NFE_PER_SAMPLE, SPEEDUP_STEPS, SPEEDUP_WALL

# Paper keys of the report's speed columns -> the run metric each is compared with.
SPEED_KEYS = {"nfe": NFE_PER_SAMPLE, "speedup_wall": SPEEDUP_WALL, "speedup_steps": SPEEDUP_STEPS,
              "acceptance_rate": "acceptance_rate", "step_compression": "step_compression"}
# Paper keys of the cost mode's columns (`bench.cost`) -> its run metric: parameters (a count), GFLOPs per sample in
# the papers' convention (a multiply-add counted once: DiT's 118.6, ARD Table 1; compared with our GMACs) and seconds
# per sample (DD Table 1's "Time"; ARD Table 1's latency in ms / 1000).
COST_KEYS = {"params": "params", "gflops": "gmacs_per_sample", "latency": "latency_per_sample_median"}
TAG_PREFIX = "paper."
TEXT_KEYS = ("source", "note")  # the paper keys whose values are text, not numbers


def check_paper(data: Any, where: str, keys: Collection[str] | None = None) -> dict[str, Any]:
    """The validated `paper:` mapping of a suite entry: numbers under metric or speed keys (or, for an entry scored on
    lm-eval tasks, under one of its full metric `keys`), a `source` string naming the table and row, and an optional
    one-line `note` (the report's footnote to the row). Errors are one line naming `where`."""
    from core.registry import METRICS

    if not isinstance(data, Mapping):
        raise UserError(f"{where}: 'paper' must be a mapping of metric -> the paper's number, with a 'source'")
    source = data.get("source")
    if not isinstance(source, str) or not source.strip():
        raise UserError(f"{where}: 'paper' needs a 'source' naming the paper's table and row")
    note = data.get("note", "")
    if not isinstance(note, str) or "\n" in note or ("note" in data and not note.strip()):
        raise UserError(f"{where}: paper note must be one line of text, got {note!r}")
    names = set(METRICS.names())
    for key, value in data.items():
        if key in TEXT_KEYS:
            continue
        if keys is not None and key not in keys:
            raise UserError(f"{where}: unknown paper key {key!r}; valid: source, {', '.join(keys)}, note")
        if keys is None and key.split(".")[0] not in names and key not in SPEED_KEYS and key not in COST_KEYS:
            valid = ", ".join(sorted(names | set(SPEED_KEYS) | set(COST_KEYS)))
            raise UserError(f"{where}: unknown paper key {key!r}; valid: source, {valid} (or a full metric key), "
                            f"note")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise UserError(f"{where}: paper {key} must be a finite number, got {value!r}")
    return dict(data)


def paper_tags(paper: Mapping[str, Any]) -> dict[str, str]:
    """The run tags that carry a trial's paper numbers (`paper.fid` = "1.84", `paper.source` = "...")."""
    return {f"{TAG_PREFIX}{k}": str(v) for k, v in paper.items()}


def from_tags(tags: Mapping[str, str]) -> dict[str, Any]:
    """The paper numbers of a run's tags (numbers as floats, `source` and `note` as text); empty when the run has
    none."""
    out: dict[str, Any] = {}
    for tag, value in tags.items():
        if tag.startswith(TAG_PREFIX):
            key = tag[len(TAG_PREFIX):]
            out[key] = value if key in TEXT_KEYS else float(value)
    return out
