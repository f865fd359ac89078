"""The model zoo: the trained entries the demo and the field suite need, built from the project's own recipes and
shipped with it.

The demo (`suites/default.yaml`) runs every method on its tiny teacher, the field suite (`suites/field.yaml`) every
method of the field on the tiny AR-token and VAR teachers; training those teachers and the DD, ARD and SDTT students
takes over an hour on 2 CPU cores. `build` trains them from scratch in an empty cache (the zoo off) by doing, for every
distinct trial of the suites, what the runner does before it samples (load the teacher, `fit` the
method, build its extra arms), then writes every cache entry of the zoo's kinds into `zoo/`: the entry's bytes
xz-compressed, with its kind, key (the hash of the recipe that made it), what it is, size, sha256 and the trials whose
fit asked for it (a teacher, loaded once per process, names the first) in `zoo/manifest.json`, and the command, code
version and time that built it. `core.cache.Cache` takes an entry from there when kind and key
match (`core.cache.ModelZoo`); `tests/test_zoo.py` fails when either suite would have to train anything the zoo should
hold, i.e. when a recipe changed and the zoo was not rebuilt (`accelbench zoo build`, `make zoo`).
"""
from __future__ import annotations

import datetime
import hashlib
import json
import lzma
import shutil
import tempfile
import time
from pathlib import Path

import torch
from tqdm import tqdm

from core.cache import PROJECT_ZOO, Cache, decode
from core.config import config_dict
from core.envinfo import PROJECT_ROOT, git_sha
from core.registry import TEACHERS
from bench.plan import Plan, run_name
from bench.suite import Suite
from core.training import progress_bars
from metrics.extractors import load_classifier
from teachers import load_teacher

# What takes minutes to build and is small enough to ship: teachers, students, DD's pair tokens (onestep*, skip-n),
# and the feature extractors of ZOO_EXTRACTORS. Everything else a trial needs (the digits extractors, reference
# features, text data, ARD's held-out trajectories) is built in seconds on first use.
ZOO_KINDS = ("teachers", "dd-students", "dd-pairs", "ard-students", "sdtt-ema", "extractors")
# (dataset, image size) of the classifiers the zoo holds beside the demo's entries: Fashion-MNIST's trains for 62 s on
# one thread (3 epochs of 60,000 images, measured), which its FID, KID and IS would otherwise spend on first use and
# tests/test_datasets.py on every run. Building the zoo needs the dataset (`apt-get install dataset-fashion-mnist`).
ZOO_EXTRACTORS = (("fashion-mnist", 28),)
DEMO_SUITE = PROJECT_ROOT / "suites" / "default.yaml"
ZOO_SUITES = (DEMO_SUITE, PROJECT_ROOT / "suites" / "field.yaml")  # what the zoo serves
COMMAND = "accelbench zoo build"


def distinct(plans: tuple[Plan, ...]) -> list[Plan]:
    """One plan per (teacher, method, config): the seeds and sample counts of a suite change nothing it trains."""
    seen, out = set(), []
    for p in plans:
        key = (p.trial.teacher, p.trial.method, json.dumps(config_dict(p.config), sort_keys=True, default=str))
        if key not in seen:
            seen.add(key)
            out.append(p)
    return out


def prepare(p: Plan, cache: Cache) -> None:
    """What the runner builds for a trial before sampling: the teacher, the fitted method, its extra arms."""
    teacher = load_teacher(p.trial.teacher, cache=cache, device=p.device, checkpoints=p.checkpoints,
                           params=p.trial.teacher_params)
    method = p.method_cls(teacher, p.config)
    method.fit(cache=cache, checkpoints=p.checkpoints)
    method.extra_arms(cache=cache, device=p.device, checkpoints=p.checkpoints)


class _Recording(Cache):
    """A cache that notes which trial asked for each entry (the manifest says what an entry is for)."""

    def __init__(self, root):
        super().__init__(root, zoo=None)
        self.users: dict[tuple[str, str], set[str]] = {}
        self.current = ""

    def get_or_build(self, kind, key, build):
        self.users.setdefault((kind, key), set()).add(self.current)
        return super().get_or_build(kind, key, build)


def build(suites: list[Suite], out: Path = PROJECT_ZOO, *, cache_dir: Path | None = None, progress: bool = True,
          extractors: tuple[tuple[str, int], ...] = ZOO_EXTRACTORS) -> dict:
    """Train everything `suites` need, and the classifiers of `extractors` ((dataset, image size) pairs), in an empty
    cache, then write the zoo's kinds of it to `out`; the manifest."""
    t0, code = time.perf_counter(), git_sha()  # the code that trains, before anything else can change it
    with tempfile.TemporaryDirectory(prefix="accelbench-zoo-") as tmp:
        cache = _Recording(cache_dir or tmp)
        # entries a kept cache already holds are taken, not trained: the manifest says how many, so its `seconds`
        # is read as what this build trained
        reused = sum(1 for kind in ZOO_KINDS for _ in (cache.root / kind).glob("*.pt"))
        with progress_bars(progress):
            plans = distinct(tuple(p for suite in suites for p in suite.plans))
            for p in tqdm(plans, desc="zoo: trials' teachers and students", unit="trial", disable=not progress):
                cache.current = run_name(p).rsplit(" s", 1)[0]  # e.g. "sdtt[divergence=kld,rounds=2,...] wordnet-mdlm"
                prepare(p, cache)
            for dataset, size in extractors:
                cache.current = f"the {dataset} classifier at {size} px"
                load_classifier(dataset, size, cache=cache, device=torch.device("cpu"))
        return write(cache, out, seconds=time.perf_counter() - t0, code=code, reused=reused)


def describe(kind: str, key: str) -> str:
    """What an entry is: the registered teacher whose recipe key it is, or its kind."""
    if kind == "teachers":
        # the zoo holds trained recipes: a teacher of local files (`at`) is never one
        names = [n for n, cls in TEACHERS.items()
                 if not hasattr(cls, "at") and not getattr(cls, "unavailable", lambda: None)() and cls.key() == key]
        return f"teacher {', '.join(names)}" if names else "teacher (no registered recipe has this key)"
    return {"dd-students": "DD student", "dd-pairs": "DD pair tokens (Alg. 1)", "ard-students": "ARD student",
            "sdtt-ema": "SDTT student (EMA weights of its last round)",
            "extractors": "feature extractor (metrics.extractors)"}.get(kind, kind)


def write(cache: _Recording, out: Path, *, seconds: float, code: str, reused: int = 0) -> dict:
    """Every entry of the zoo's kinds in `cache`, compressed into `out` (replacing what was there), and its manifest."""
    out.mkdir(parents=True, exist_ok=True)
    for kind in ZOO_KINDS:
        shutil.rmtree(out / kind, ignore_errors=True)
    entries = []
    for kind in ZOO_KINDS:
        for path in sorted((cache.root / kind).glob("*.pt")):
            data = path.read_bytes()
            decode(kind, path.stem, data)  # a whole, matching entry, or CorruptEntry
            target = out / kind / f"{path.stem}.pt.xz"
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(lzma.compress(data, preset=9))
            entries.append({"kind": kind, "key": path.stem, "what": describe(kind, path.stem),
                            "file": f"{kind}/{target.name}", "bytes": len(data),
                            "sha256": hashlib.sha256(data).hexdigest(), "xz_bytes": target.stat().st_size,
                            "for": sorted(cache.users.get((kind, path.stem), []))})
    manifest = {"built_by": COMMAND, "git_sha": code, "seconds": round(seconds, 1), "reused_entries": reused,
                "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
                "total_xz_bytes": sum(e["xz_bytes"] for e in entries), "entries": entries}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest
