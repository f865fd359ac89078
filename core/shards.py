"""Training data that outgrows memory: records of a fixed layout written to disk in shards as they are generated, and
read back by index (ARD's trajectories, `methods.ard`).

`<cache root>/<kind>/<key>/` holds `meta.json` (the layout: each field's per-record shape and dtype, the record count,
the shard size) and `<shard:07d>.bin`: the shard's records, field after field (all its records' first field, then
all their second field...). A shard is written to a temp file and renamed into place (`write_atomically`), so a
process killed at any point leaves whole shards only, and a rerun makes just the missing ones: resumable like the
sample spool (`core.spool`). Shard j belongs to rank j mod N of a data-parallel world, so the ranks share the
generation and every shard is the same whoever made it.

Reads take a record's bytes (or some rows of a field) with `os.pread`, never mapping the files: resident memory holds
one batch however many records there are, and what the kernel caches of the files stays reclaimable page cache.
"""
from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch

from core.cache import write_atomically


@dataclass(frozen=True)
class Field:
    shape: tuple[int, ...]  # one record's
    dtype: torch.dtype

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


class Shards:
    """n records of `fields` in shards of `shard_size` records under `folder` (see the module's docstring)."""

    def __init__(self, folder: Path, fields: dict[str, Field], n: int, shard_size: int):
        if n < 1 or shard_size < 1:
            raise ValueError(f"need n >= 1 and shard_size >= 1, got {n} and {shard_size}")
        self.folder, self.fields, self.n, self.shard_size = folder, fields, n, shard_size
        meta = {"n": n, "shard_size": shard_size,
                "fields": {name: [list(f.shape), str(f.dtype)] for name, f in fields.items()}}
        path = folder / "meta.json"
        if path.is_file():
            found = json.loads(path.read_text())
            if found != meta:  # the key should have told them apart: never mix the two
                raise RuntimeError(f"{folder} holds records of another layout ({found}, here {meta}); delete it")
        else:
            write_atomically(path, json.dumps(meta, sort_keys=True).encode())

    @classmethod
    def in_cache(cls, root: Path, kind: str, key: str | None, fields: dict[str, Field], n: int,
                 shard_size: int) -> "Shards":
        """The records of cache entry `kind`/`key` under the cache root `root`; for a None key (a teacher without a
        cache key, e.g. a test's fake: nothing may be cached for it) a temp folder there, removed with the object."""
        (root / kind).mkdir(parents=True, exist_ok=True)
        folder = root / kind / key if key is not None else Path(tempfile.mkdtemp(prefix=".uncached-", dir=root / kind))
        shards = cls(folder, fields, n, shard_size)
        if key is None:
            weakref.finalize(shards, shutil.rmtree, folder, True)
        return shards

    def ranges(self) -> list[tuple[int, int]]:
        """Each shard's records, [start, stop)."""
        return [(s, min(s + self.shard_size, self.n)) for s in range(0, self.n, self.shard_size)]

    def _path(self, j: int) -> Path:
        return self.folder / f"{j:07d}.bin"

    def _length(self, j: int) -> int:
        return min(self.shard_size, self.n - j * self.shard_size)

    def has(self, j: int) -> bool:
        path = self._path(j)
        return path.is_file() and path.stat().st_size == self._length(j) * sum(f.nbytes for f in self.fields.values())

    def missing(self) -> list[int]:
        return [j for j in range(len(self.ranges())) if not self.has(j)]

    def write(self, j: int, records: dict[str, torch.Tensor]) -> None:
        """Shard j: for each field, its records as a (length, *shape) tensor of the field's dtype."""
        if set(records) != set(self.fields):
            raise ValueError(f"shard {j}: fields {sorted(records)}, the layout's are {sorted(self.fields)}")
        parts = []
        for name, f in self.fields.items():
            t = records[name]
            if tuple(t.shape) != (self._length(j), *f.shape) or t.dtype != f.dtype:
                raise ValueError(f"shard {j}: field {name} is {tuple(t.shape)} {t.dtype}, the layout's "
                                 f"{(self._length(j), *f.shape)} {f.dtype}")
            parts.append(t.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
        write_atomically(self._path(j), b"".join(parts))

    def read(self, name: str, idx: torch.Tensor, rows: Sequence[int] | None = None) -> torch.Tensor:
        """Field `name` of records `idx` (any order, repeats allowed): (len(idx), *shape), or with `rows` only those
        indices along the field's first axis: (len(idx), len(rows), *shape[1:])."""
        f = self.fields[name]
        row_bytes = f.nbytes // f.shape[0] if f.shape else f.nbytes
        spans = [(0, f.nbytes)] if rows is None else [(r * row_bytes, row_bytes) for r in rows]
        out = bytearray(len(idx) * sum(size for _, size in spans))
        view, at, fds = memoryview(out), 0, {}
        try:
            for i in idx.tolist():
                if not 0 <= i < self.n:
                    raise IndexError(f"record {i} of {self.n}")
                j, r = divmod(i, self.shard_size)
                if j not in fds:
                    fds[j] = os.open(self._path(j), os.O_RDONLY)
                field_at = 0
                for other_name, other in self.fields.items():  # the fields before this one, in shard j
                    if other_name == name:
                        break
                    field_at += self._length(j) * other.nbytes
                for offset, size in spans:
                    got = os.preadv(fds[j], [view[at : at + size]], field_at + r * f.nbytes + offset)
                    if got != size:
                        raise RuntimeError(f"{self._path(j)} is shorter than its layout says; delete {self.folder}")
                    at += size
        finally:
            for fd in fds.values():
                os.close(fd)
        shape = (len(idx), *(f.shape if rows is None else (len(rows), *f.shape[1:])))
        return torch.frombuffer(out, dtype=f.dtype).view(shape) if out else torch.empty(shape, dtype=f.dtype)
