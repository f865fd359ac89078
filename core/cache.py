"""Content-addressed on-disk cache for trained teachers, students, trajectories and reference statistics.

Entries live at `<root>/<kind>/<key>.pt`: a header line naming the kind, the key, the payload's size and sha256, then
the `torch.save` payload. An entry the cache lacks is taken from the model zoo shipped with the project (`ModelZoo`:
trained teachers and students, compressed, listed with their sha256 in `zoo/manifest.json`) when the zoo has that
kind and key, and copied into the cache; otherwise it is built. A file whose header does not match its name or its
payload (truncated, corrupted, written by another version) is reported on stderr, deleted and rebuilt, never loaded.
Writes go to a temp file in the same directory and are renamed into place, so an interrupted build (Ctrl-C, SIGTERM,
SIGKILL) never leaves an entry, nor does a write that fails (a full disk: `WriteFailed`, naming the entry); a build
holds an exclusive lock on `<root>/.locks/<kind>-<key>.lock`, so processes building one key at once build it once.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import json
import lzma
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Callable

import torch

from core.errors import UserError, WriteFailed

DEFAULT_ROOT = Path(os.environ.get("ACCELBENCH_CACHE", Path.home() / ".cache" / "accelbench"))
MAGIC = b"ACCELBENCH-CACHE/1\n"
ZOO_ENV = "ACCELBENCH_ZOO"  # the model zoo's folder; "off": none (every entry is built)
PROJECT_ZOO = Path(__file__).resolve().parent.parent / "zoo"


def config_key(*parts: Any) -> str:
    """Hash of JSON-serialisable parts (configs as dicts, versions); the cache key of what they determine."""
    blob = json.dumps(parts, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


# The default of `--checkpoints`, the folder of the real checkpoints' files, read by the CLI alone: every reader of
# the folder is handed it (`bench.plan.plan`, `teachers.load_teacher`, a metric's and a method's arguments).
CHECKPOINTS_ENV = "ACCELBENCH_CHECKPOINTS"


def file_key(path: Path) -> str:
    """The identity of a large local file (a checkpoint) as part of a cache key: its resolved path, size and
    modification time, not its content (hashing gigabytes on every trial's plan would take longer than the trial's
    set-up). A changed file gets a new key; a renamed copy does too; a missing file keys as its path (the teacher
    refuses to load it anyway)."""
    if not path.is_file():
        return str(path)
    stat = path.stat()
    return hashlib.sha256(f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:16]


@contextlib.contextmanager
def writing(path: Path) -> Iterator[None]:
    """The block writes `path`: an `OSError` in it (a full disk, a read-only file system) is raised as `WriteFailed`
    naming `path`, one line, where the error itself names a temp file or nothing (`write` on a full disk)."""
    try:
        yield
    except OSError as exc:
        raise WriteFailed(path, exc.strerror) from exc


def write_atomically(path: Path, data: bytes) -> None:
    """`data` at `path`, atomically (a temp file in the same folder, synced, renamed into place): a process killed at
    any point, or a write failing (`WriteFailed`), leaves the old file or the new one, never a part."""
    with writing(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


class CorruptEntry(Exception):
    """A cache file that is not a complete, matching entry."""


def encode(kind: str, key: str, obj: Any) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    payload = buf.getvalue()
    header = {"kind": kind, "key": key, "bytes": len(payload), "sha256": hashlib.sha256(payload).hexdigest()}
    return MAGIC + json.dumps(header, sort_keys=True).encode() + b"\n" + payload


def decode(kind: str, key: str, data: bytes) -> Any:
    """The object in an entry's bytes; `CorruptEntry` saying what is wrong unless every check passes."""
    if not data.startswith(MAGIC):
        raise CorruptEntry("no AccelBench cache header (truncated, or written by an older version)")
    line, newline, payload = data[len(MAGIC):].partition(b"\n")
    try:
        header = json.loads(line) if newline else None
    except ValueError:
        header = None
    if not isinstance(header, dict):
        raise CorruptEntry("unreadable header")
    if (header.get("kind"), header.get("key")) != (kind, key):
        raise CorruptEntry(f"header names {header.get('kind')}/{header.get('key')}")
    if header.get("bytes") != len(payload):
        raise CorruptEntry(f"payload is {len(payload)} bytes, header says {header.get('bytes')}")
    if header.get("sha256") != hashlib.sha256(payload).hexdigest():
        raise CorruptEntry("payload checksum mismatch")
    try:
        return torch.load(io.BytesIO(payload), map_location="cpu", weights_only=False)
    except Exception as exc:  # a checksummed payload this code cannot unpickle (e.g. a renamed class)
        raise CorruptEntry(f"payload does not load: {type(exc).__name__}: {exc}") from None


class ModelZoo:
    """Cache entries shipped with the project: `<folder>/manifest.json` lists each one's kind, key, file (the entry's
    bytes, xz-compressed), sha256 and size of the decompressed entry, and what built it (`accelbench zoo build`)."""

    def __init__(self, folder: str | os.PathLike):
        self.folder = Path(folder)
        manifest = self.folder / "manifest.json"
        self.entries = ({(e["kind"], e["key"]): e for e in json.loads(manifest.read_text())["entries"]}
                        if manifest.is_file() else {})

    @classmethod
    def default(cls) -> "ModelZoo | None":
        """The zoo named by ACCELBENCH_ZOO, else the project's own; None when it is "off"."""
        setting = os.environ.get(ZOO_ENV, "")
        if setting == "off":
            return None
        if setting and not (Path(setting) / "manifest.json").is_file():  # else every entry would silently be built
            raise UserError(f"{ZOO_ENV}={setting}: no model zoo there (no manifest.json); unset it for the project's "
                            f"own zoo, or set it to 'off' to build every entry")
        return cls(setting or PROJECT_ZOO)

    def entry_bytes(self, kind: str, key: str) -> bytes | None:
        """The decompressed entry, checked against the manifest; None when the zoo has no such entry."""
        e = self.entries.get((kind, key))
        if e is None:
            return None
        try:
            data = lzma.decompress((self.folder / e["file"]).read_bytes())
        except (OSError, lzma.LZMAError) as exc:
            raise CorruptEntry(f"zoo file {e['file']} does not read: {exc}") from None
        if len(data) != e["bytes"] or hashlib.sha256(data).hexdigest() != e["sha256"]:
            raise CorruptEntry(f"zoo file {e['file']} does not match its sha256 in the manifest")
        return data


_DEFAULT = object()


class Cache:
    def __init__(self, root: str | os.PathLike | None = None, zoo: ModelZoo | None = _DEFAULT):
        self.root = Path(root) if root is not None else DEFAULT_ROOT
        self.zoo = ModelZoo.default() if zoo is _DEFAULT else zoo

    def path(self, kind: str, key: str) -> Path:
        return self.root / kind / f"{key}.pt"

    def load(self, kind: str, key: str) -> Any | None:
        """The entry, or None when there is none; a corrupt entry is reported, deleted and treated as missing."""
        path = self.path(kind, key)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return self._from_zoo(kind, key)
        try:
            return decode(kind, key, data)
        except CorruptEntry as exc:
            print(f"accelbench: cache entry {path} is corrupt ({exc}); deleting it and rebuilding", file=sys.stderr)
            path.unlink(missing_ok=True)
            return None

    def _from_zoo(self, kind: str, key: str) -> Any | None:
        """The zoo's entry of this kind and key, copied into the cache; None when the zoo has none (or a bad one)."""
        if self.zoo is None:
            return None
        try:
            data = self.zoo.entry_bytes(kind, key)
            obj = None if data is None else decode(kind, key, data)
        except CorruptEntry as exc:
            print(f"accelbench: model zoo entry {kind}/{key} is unusable ({exc}); building it instead", file=sys.stderr)
            return None
        if obj is not None:
            write_atomically(self.path(kind, key), data)
        return obj

    def save(self, kind: str, key: str, obj: Any) -> Path:
        path = self.path(kind, key)
        write_atomically(path, encode(kind, key, obj))
        return path

    @contextlib.contextmanager
    def lock(self, kind: str, key: str, wait: bool = True) -> Iterator[bool]:
        """Exclusive across processes (flock: released by the kernel when its holder dies, even by SIGKILL). Yields
        whether the lock is held: always with `wait`, False without it when another process holds it."""
        path = self.root / ".locks" / f"{kind}-{key}.lock"  # apart from the entries: a kind's folder holds only those
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a") as fh:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
            except BlockingIOError:
                yield False
                return
            try:
                yield True
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def get_or_build(self, kind: str, key: str | None, build: Callable[[], Any]) -> tuple[Any, bool]:
        """Return (object, was_cached). A None key (`keyed` of a teacher without a recipe key) builds without
        caching: nothing determines such an object that a later process could match."""
        if key is None:
            return build(), False
        obj = self.load(kind, key)
        if obj is not None:
            return obj, True
        with self.lock(kind, key):
            obj = self.load(kind, key)  # built by another process while this one waited for the lock
            if obj is not None:
                return obj, True
            obj = build()
            self.save(kind, key, obj)
        return obj, False

    def check(self) -> list[str]:
        """Delete what killed builds left (temp files no live build holds the lock of) and corrupt entries; one line
        per file removed."""
        removed = []
        for tmp in sorted(self.root.glob("*/.*.tmp")):
            key = tmp.name[1:].split(".", 1)[0]
            with self.lock(tmp.parent.name, key, wait=False) as free:
                if free:
                    tmp.unlink(missing_ok=True)
                    removed.append(f"{tmp}: temp file of an interrupted build")
        for path in sorted(self.root.glob("*/*.pt")):
            try:
                decode(path.parent.name, path.stem, path.read_bytes())
            except CorruptEntry as exc:
                path.unlink(missing_ok=True)
                removed.append(f"{path}: corrupt ({exc})")
        return removed


def teacher_key(teacher) -> str | None:
    """A registered teacher's recipe key; None for a teacher without one (test fakes): nothing keyed by it is cached."""
    key = getattr(type(teacher), "key", None)
    return key() if key is not None else None


def keyed(teacher, *parts: Any) -> str | None:
    """The cache key of what `teacher` and `parts` determine; None (build, do not cache) for a teacher without a
    recipe key."""
    tkey = teacher_key(teacher)
    return None if tkey is None else config_key(tkey, *parts)
