"""`accelbench doctor`: find and mark what a killed process left behind.

Ctrl-C and SIGTERM end a trial's MLflow run as KILLED; SIGKILL (or a power cut) cannot, and leaves the run RUNNING
forever. Every run carries its owner's host, pid and process start time (`bench.tracking.owner_tags`); a RUNNING run
whose owner on this host is gone is an orphan and is ended KILLED, with a tag saying why. Runs owned by other hosts
are listed, not touched: run the doctor there. In the cache, temp files of killed builds and corrupt entries are
deleted (`Cache.check`); a cache entry is only ever written whole, so nothing a later run would load needs fixing.
Trials with spooled samples (`core.spool`: killed mid-way, or running now) are listed: the same command resumes them.
"""
from __future__ import annotations

from core.cache import Cache
from core.spool import resumable
from bench.tracking import Tracker


def doctor(tracker: Tracker, cache: Cache) -> list[str]:
    return ([line for _, line in tracker.end_orphans()] + [f"cache: removed {line}" for line in cache.check()]
            + [f"resumable: {line}" for line in resumable(cache.root)])
