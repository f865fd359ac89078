"""`accelbench doctor`: find and mark what a killed process left behind.

Ctrl-C and SIGTERM end a trial's MLflow run as KILLED; SIGKILL (or a power cut) cannot, and leaves the run RUNNING
forever. Every run carries its owner's host, pid and process start time (`bench.tracking.owner_tags`); a RUNNING run
whose owner on this host is gone is an orphan and is ended KILLED, with a tag saying why. Runs owned by other hosts
are listed, not touched: run the doctor there. In the cache, temp files of killed builds and corrupt entries are
deleted (`Cache.check`); a cache entry is only ever written whole, so nothing a later run would load needs fixing.
"""
from __future__ import annotations

from bench.cache import Cache
from bench.tracking import Tracker, owner_alive

DOCTOR_TAG = "accelbench.doctor"


def orphaned_runs(tracker: Tracker) -> list[str]:
    """One line per RUNNING run that is orphaned (now marked KILLED) or cannot be checked from here."""
    client, lines = tracker.client, []
    experiments = [e.experiment_id for e in client.search_experiments()]
    if not experiments:
        return lines
    page = None
    while True:
        runs = client.search_runs(experiments, "attributes.status = 'RUNNING'", max_results=1000, page_token=page)
        for run in runs:
            tags = run.data.tags
            host, pid = tags.get("accelbench.host"), tags.get("accelbench.pid", "")
            name = f"run {run.info.run_id} ({run.info.run_name}, experiment {run.info.experiment_id})"
            if host is None or not pid.isdigit():
                lines.append(f"{name}: RUNNING without owner tags; cannot tell whether it is alive")
                continue
            started = tags.get("accelbench.pid_started")
            alive = owner_alive(host, int(pid), float(started) if started else None)
            if alive is None:
                lines.append(f"{name}: RUNNING on {host} (pid {pid}); run the doctor on that host to check it")
            elif not alive:
                client.set_tag(run.info.run_id, DOCTOR_TAG, f"orphaned: process {pid} on {host} is gone")
                client.set_terminated(run.info.run_id, "KILLED")
                lines.append(f"{name}: orphaned (process {pid} on {host} is gone): marked KILLED")
        page = runs.token
        if not page:
            return lines


def doctor(tracker: Tracker, cache: Cache) -> list[str]:
    return orphaned_runs(tracker) + [f"cache: removed {line}" for line in cache.check()]
