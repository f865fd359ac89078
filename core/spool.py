"""A trial's samples on disk, one file per (arm, batch index), kept until the trial's run is logged: the trial resumes
from them when it is started again after a kill, and rank 0 scores the batches every rank wrote.

`<cache root>/.spool/<trial key>/` holds `trial.yaml` (what to rerun), `meta.json` (the code version that drew the
samples: a spool of another version is discarded, never mixed in) and `<arm>/<batch index>.pt`: the batch's samples
and conditions, its counters and its wall time as measured when it was drawn. A batch file is written to a temp file
and renamed into place, so a process killed at any point leaves whole batches only. Memory holds one chunk while
scoring, whatever the number of samples.
"""
from __future__ import annotations

import contextlib
import fcntl
import io
import json
import os
import shutil
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
import yaml

from core.cache import write_atomically

SPOOL_DIR = ".spool"


@dataclass
class Batch:
    data: torch.Tensor  # the method's samples (B, ...), on the CPU
    cond: torch.Tensor  # their conditions (B, ...)
    counters: Counter  # the method's counters over the batch ("nfe", "tokens", ...)
    seconds: float  # wall time of the sampler call that drew it


class ArmSpool:
    """One arm's batches, by index."""

    def __init__(self, folder: Path):
        folder.mkdir(parents=True, exist_ok=True)
        self.folder = folder

    def _path(self, i: int) -> Path:
        return self.folder / f"{i:07d}.pt"

    def has(self, i: int) -> bool:
        return self._path(i).is_file()

    def write(self, i: int, batch: Batch) -> None:
        buf = io.BytesIO()
        torch.save({"data": batch.data.cpu(), "cond": batch.cond.cpu(), "counters": dict(batch.counters),
                    "seconds": batch.seconds}, buf)
        write_atomically(self._path(i), buf.getvalue())

    def read(self, i: int) -> Batch:
        """Batch i; its tensors are memory-mapped, read from disk only when used (the runner reads every batch's
        counters and time first, and its samples later, a chunk at a time)."""
        d = torch.load(self._path(i), mmap=True)
        return Batch(d["data"], d["cond"], Counter(d["counters"]), d["seconds"])

    def chunks(self, n_batches: int, size: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """(samples, conditions) of batches 0..n_batches-1 in order, `size` at a time (the last chunk may be
        smaller)."""
        data, cond, held = [], [], 0
        for i in range(n_batches):
            b = self.read(i)
            data.append(b.data)
            cond.append(b.cond)
            held += len(b.data)
            while held >= size:
                d, c = torch.cat(data), torch.cat(cond)
                yield d[:size], c[:size]
                data, cond, held = [d[size:]], [c[size:]], held - size
        if held:
            yield torch.cat(data), torch.cat(cond)


class TrialSpool:
    """The spool folder of one trial: an `ArmSpool` per arm."""

    def __init__(self, folder: Path):
        folder.mkdir(parents=True, exist_ok=True)
        self.folder = folder

    def arm(self, name: str) -> ArmSpool:
        return ArmSpool(self.folder / name)

    def remove(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)


@contextlib.contextmanager
def claim(root: Path, trial, version: str) -> Iterator[TrialSpool]:
    """The trial's spool, held by this process (an exclusive lock, released by the kernel if it dies) for as long as
    the block runs; the caller removes it once the trial's run is logged. A spool drawn under another `version` is
    discarded first. When another live process holds the trial's spool (the same trial run twice at
    once), this one samples into a private spool, removed at the end: two processes never share batches. `version`:
    what the batches depend on beyond the trial (`bench.runner.spool_version`: the code version, the threads)."""
    base = root / SPOOL_DIR
    base.mkdir(parents=True, exist_ok=True)
    key = trial.key()
    with open(base / f"{key}.lock", "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            folder, private = base / key, False
        except BlockingIOError:
            folder, private = base / f"{key}.{os.getpid()}", True
            print(f"accelbench: another process is running trial {key}; sampling into a private spool, which "
                  f"will not resume", file=sys.stderr)
        meta = {"version": version, "trial_key": key}
        if (folder / "meta.json").is_file() and _read_json(folder / "meta.json") != meta:
            print(f"accelbench: the spooled samples in {folder} were drawn by another code version or thread "
                  f"count; starting the trial over", file=sys.stderr)
            shutil.rmtree(folder, ignore_errors=True)
        spool = TrialSpool(folder)
        if not (folder / "meta.json").is_file():
            write_atomically(folder / "trial.yaml", trial.to_yaml().encode())
            write_atomically(folder / "meta.json", json.dumps(meta, sort_keys=True).encode())
        try:
            yield spool
        finally:
            if private or not any(folder.glob("*/*.pt")):  # nothing another run could resume from
                spool.remove()
            fcntl.flock(lock, fcntl.LOCK_UN)


ARMS_DIR = ".arms"


@contextlib.contextmanager
def shared_arm(root: Path, key: str) -> Iterator[ArmSpool | None]:
    """The spool of an arm whose samples are a function of `key` alone (`bench.runner.reference_key`: the teacher, its
    sampler and settings, seed, sample count, code version, ...), kept under `<cache root>/.arms/<key>/` after the
    trial, so that every later trial needing the same draws reads them instead of drawing them again (delete the
    folder to reclaim the space). Held by this process (an exclusive lock) while the block runs; None when another
    live process holds it, drawing these samples now: the caller draws its own."""
    base = root / ARMS_DIR
    base.mkdir(parents=True, exist_ok=True)
    with open(base / f"{key}.lock", "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield None
            return
        try:
            yield ArmSpool(base / key)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _read_json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def resumable(root: Path) -> list[str]:
    """One line per trial with spooled samples under the cache `root` (a trial that was killed, or is running now)."""
    lines = []
    for folder in sorted((root / SPOOL_DIR).glob("*/")):
        if "." in folder.name or not any(folder.glob("*/*.pt")):  # a private spool (`claim`), or no batch yet
            continue
        arms = sorted(p for p in folder.iterdir() if p.is_dir())
        counts = {a.name: sum(1 for _ in a.glob("*.pt")) for a in arms}
        try:
            t = yaml.safe_load((folder / "trial.yaml").read_text())
            what = f"{t['method']} on {t['teacher']}, seed {t['seed']}, {t['n_samples']} samples in batches of " \
                   f"{t['batch_size']}"
        except (OSError, yaml.YAMLError, KeyError, TypeError):
            what = "its trial.yaml is unreadable"
        lines.append(f"trial {folder.name} ({what}): batches spooled per arm {counts}; rerun the same command to "
                     f"resume it")
    return lines
