"""The files a trial needs from the user: checkpoints, reference statistics, evaluator folders, released students.

Every check of such a file at plan time goes through `require`. Normally a missing file stops the trial before any
work, in one line naming the file and the option that places it. Inside `audit()` (`accelbench ... --dry-run`)
nothing raises: each required path is recorded with whether it is there, so a dry run can list a paper suite's
files against an empty checkpoints folder.
"""
from __future__ import annotations

import json
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from core.errors import UserError


@dataclass(frozen=True)
class Needed:
    path: Path
    present: bool


_AUDIT: ContextVar[list[Needed] | None] = ContextVar("accelbench_file_audit", default=None)


def auditing() -> bool:
    return _AUDIT.get() is not None


@contextmanager
def audit() -> Iterator[list[Needed]]:
    """Record every `require`d path (in order, once each) instead of refusing the missing ones."""
    found: list[Needed] = []
    token = _AUDIT.set(found)
    try:
        yield found
    finally:
        _AUDIT.reset(token)


def require(path: Path, missing: str) -> bool:
    """Whether `path` (a file or a folder) is there. Outside an audit a missing path raises `UserError(missing)`;
    inside one it is recorded, and False tells the caller to skip what would read it."""
    present = path.exists()
    found = _AUDIT.get()
    if found is None:
        if not present:
            raise UserError(missing)
        return True
    if all(n.path != path for n in found):
        found.append(Needed(path, present))
    return present


def read_text(path: Path) -> str:
    """The text of a file the user provides; unreadable or not UTF-8 is one `UserError` naming it."""
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise UserError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    except UnicodeDecodeError as exc:
        raise UserError(f"{path}: not UTF-8 text (byte {exc.start}): damaged, or not the file expected") from None


def read_json(path: Path) -> Any:
    """The JSON value of a file the user provides (a config, annotations); not JSON is one `UserError` naming the
    file and where it breaks, not the decoder's traceback."""
    try:
        return json.loads(read_text(path))
    except json.JSONDecodeError as exc:
        raise UserError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno})") from None
