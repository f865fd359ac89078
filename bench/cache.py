"""Content-addressed on-disk cache for trained teachers, students, trajectories and reference statistics.

Entries live at `<root>/<kind>/<key>.pt`. Writes go to a temp file in the same directory and are renamed into
place, so an interrupted build never leaves a file that a later run would load.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Callable

import torch

DEFAULT_ROOT = Path(os.environ.get("ACCELBENCH_CACHE", Path.home() / ".cache" / "accelbench"))


def config_key(*parts: Any) -> str:
    """Hash of JSON-serialisable parts (configs as dicts, versions); the cache key of what they determine."""
    blob = json.dumps(parts, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


class Cache:
    def __init__(self, root: str | os.PathLike | None = None):
        self.root = Path(root) if root is not None else DEFAULT_ROOT

    def path(self, kind: str, key: str) -> Path:
        return self.root / kind / f"{key}.pt"

    def load(self, kind: str, key: str) -> Any | None:
        path = self.path(kind, key)
        if not path.exists():
            return None
        return torch.load(path, map_location="cpu", weights_only=False)

    def save(self, kind: str, key: str, obj: Any) -> Path:
        path = self.path(kind, key)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{key}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as fh:
                torch.save(obj, fh)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return path

    def get_or_build(self, kind: str, key: str, build: Callable[[], Any]) -> tuple[Any, bool]:
        """Return (object, was_cached)."""
        obj = self.load(kind, key)
        if obj is not None:
            return obj, True
        obj = build()
        self.save(kind, key, obj)
        return obj, False


def teacher_key(teacher) -> str | None:
    """A registered teacher's recipe key; None for a teacher without one (test fakes): nothing keyed by it is cached."""
    key = getattr(type(teacher), "key", None)
    return key() if key is not None else None
