"""A suite's trials, or a sweep's workers, as Slurm jobs through submitit (https://github.com/facebookincubator/submitit).

`submit_suite` submits one job per trial without a finished run: `nodes` x `gpus_per_node` tasks, each a rank of the
trial exactly as torchrun would start it (`submitit.helpers.TorchDistributedEnvironment` exports RANK, LOCAL_RANK,
WORLD_SIZE, MASTER_ADDR and MASTER_PORT from Slurm's variables, which `core.distributed.init` reads), running the trial
as `bench.suite.run_suite` runs it. `submit_commands` submits command lines, one process each (`accelbench worker`).
Submitit writes each job's script, pickled call, logs and result under `SlurmOptions.folder` and says when a job has
ended (its result file, or Slurm's accounting through `sacct`); nothing here schedules jobs or polls the queue.

The jobs log into the MLflow store and the cache folder of the command that submits them, so both must be reachable
from every node: their paths are made absolute here, and they must be on a file system the nodes share (or a
server, for the store). A job killed mid-trial leaves the batches it drew in the cache's spool (`core.spool`):
submitting the suite again runs only the trials without a finished run, each resuming from there.
"""
from __future__ import annotations

import functools
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from core import distributed
from core.cache import Cache
from core.errors import UserError
from core.trial import Trial
from bench.plan import plan, run_name
from bench.runner import RunOptions
from bench.suite import Suite, finished_keys, run_suite
from bench.tracking import TRAINING_EXPERIMENT, NullTracker, Tracker

# Slurm's commands submitit calls: sbatch submits, srun starts the tasks, sacct says how a job without a result ended.
CLIENTS = ("sbatch", "srun", "sacct")


@dataclass(frozen=True)
class SlurmOptions:
    """Where and how the jobs run; checked when made, before anything is submitted."""

    folder: Path  # submitit's files: job scripts, pickled calls, logs, results (a folder every node sees)
    nodes: int = 1  # per job: a trial's ranks span them
    gpus_per_node: int = 0  # one rank per GPU; 0: CPU jobs, one rank per node
    partition: str | None = None  # None: the cluster's default partition
    timeout_min: int = 24 * 60  # Slurm ends a job after this; its trial resumes when the suite is submitted again
    cpus_per_task: int | None = None  # CPU cores per rank; None: the cluster's default

    def __post_init__(self):
        counts = [("--nodes", self.nodes, 1), ("--gpus-per-node", self.gpus_per_node, 0),
                  ("--timeout-min", self.timeout_min, 1)]
        if self.cpus_per_task is not None:
            counts.append(("--cpus-per-task", self.cpus_per_task, 1))
        for option, value, low in counts:
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise UserError(f"{option} must be an integer >= {low}, got {value!r}")
        if self.partition is not None and not re.fullmatch(r"[\w.-]+", self.partition):
            raise UserError(f"--partition must be a Slurm partition name (letters, digits, '_', '.', '-'), got "
                            f"{self.partition!r}")
        object.__setattr__(self, "folder", Path(self.folder).absolute())

    @property
    def ranks_per_node(self) -> int:
        return self.gpus_per_node or 1


def absolute_store(url: str) -> str:
    """`url` with a relative file path made absolute: `sqlite:///PATH` (MLflow, Optuna), `journal:PATH` (Optuna's
    journal file, `sweeps.study`), `file:PATH` or a bare path (MLflow's file store); a server's URL as it is. A job
    starts in a folder of the cluster's choosing, where a relative path would name another file."""
    for prefix in ("sqlite:///", "journal:", "file:"):
        if url.startswith(prefix):
            return prefix + str(Path(url[len(prefix):]).absolute())
    return url if "://" in url else str(Path(url).absolute())


def _trial_job(experiment: str, trial: Trial, paper: dict[str, Any], tasks: tuple[str, ...], checkpoints: Path,
               uri: str, cache_root: Path, opts: RunOptions, force: bool) -> int:
    """One trial, in every task of its job: the task joins the trial's process group as the rank Slurm made it, plans
    the trial again on its node (the device and the files are the node's; the trial key is the same) and runs it as
    `bench.suite.run_suite` runs a suite's trial, which skips it if a finished run appeared meanwhile."""
    from submitit.helpers import TorchDistributedEnvironment

    # every GPU of the node stays visible, as under torchrun: `core.distributed` takes cuda:LOCAL_RANK
    TorchDistributedEnvironment().export(set_cuda_visible_devices=False)
    world = distributed.init(trial.device)
    p = plan(trial, checkpoints=checkpoints, paper=paper, tasks=tasks)
    tracker = Tracker(uri, experiment) if world.main else NullTracker()
    ran, _ = run_suite(Suite(experiment, (p,)), tracker=tracker, cache=Cache(cache_root), opts=opts, force=force)
    return ran


def _launch(slurm: SlurmOptions, name: str, calls: list[tuple[str, Callable[[], Any]]],
            ranks_per_node: int) -> list[str]:
    """Submit each (label, call) as one job of the same shape (a job array: one sbatch), wait until every job has
    ended, and return a line per job whose rank 0 did not return: its label, job id, how it ended and its log.
    Ctrl-C (or SIGTERM, which the CLI turns into one) cancels the jobs still queued or running."""
    import submitit
    from submitit.core.utils import FailedJobError
    from submitit.helpers import as_completed

    if missing := [c for c in CLIENTS if shutil.which(c) is None]:
        raise UserError(f"--launcher slurm needs Slurm's client commands on this machine's PATH; missing: "
                        f"{', '.join(missing)} (Debian: apt-get install slurm-client)")
    executor = submitit.AutoExecutor(folder=slurm.folder, cluster="slurm")
    executor.update_parameters(
        name=re.sub(r"[^\w.-]", "_", name), nodes=slurm.nodes, tasks_per_node=ranks_per_node,
        timeout_min=slurm.timeout_min, **({"gpus_per_node": slurm.gpus_per_node} if slurm.gpus_per_node else {}),
        **({"slurm_partition": slurm.partition} if slurm.partition else {}),
        **({"cpus_per_task": slurm.cpus_per_task} if slurm.cpus_per_task else {}))
    with executor.batch():
        jobs = [executor.submit(call) for _, call in calls]
    for (label, _), job in zip(calls, jobs):
        print(f"accelbench: {label}: Slurm job {job.job_id}, log {job.paths.stderr}", file=sys.stderr)
    try:
        for _ in as_completed(jobs, poll_frequency=1):
            pass
    except KeyboardInterrupt:
        for job in jobs:
            if not job.done():
                job.cancel(check=False)
        raise
    failed = []
    for (label, _), job in zip(calls, jobs):
        rank0 = job.task(0)  # the rank that logs; another rank's failure stops it too (a collective fails or hangs)
        error = rank0.exception()
        if error is not None:
            how = "raised an error" if isinstance(error, FailedJobError) else f"ended {job.state} before returning"
            failed.append(f"{label}: Slurm job {job.job_id} {how}; log {rank0.paths.stderr}")
    return failed


def submit_suite(suite: Suite, *, tracker: Tracker, cache: Cache, opts: RunOptions, slurm: SlurmOptions,
                 force: bool = False) -> tuple[int, int, list[str]]:
    """Submit a job per trial of the suite without a finished run in the experiment (every trial with `force`), wait
    for them; returns (trials submitted, trials skipped, a line per failed trial). The trial and lm-eval rows run as
    `bench.suite.run_suite` runs them, into `tracker`'s store and experiment and `cache`."""
    done = set() if force else finished_keys(tracker)
    todo = [p for p in suite.plans if p.key() not in done]
    if todo:
        Tracker(tracker.uri, TRAINING_EXPERIMENT)  # made here: two jobs making an experiment at once collide
        uri = absolute_store(tracker.uri)
        calls = [(f"trial {i}/{len(todo)} ({run_name(p)})",
                  functools.partial(_trial_job, suite.experiment, p.trial, p.paper, p.tasks, p.checkpoints.absolute(),
                                    uri, cache.root.absolute(), opts, force))
                 for i, p in enumerate(todo, 1)]
        failed = _launch(slurm, f"accelbench-{suite.experiment}", calls, slurm.ranks_per_node)
    else:
        failed = []
    return len(todo), len(suite.plans) - len(todo), failed


def submit_commands(slurm: SlurmOptions, name: str, commands: list[tuple[str, list[str]]]) -> list[str]:
    """Submit each (label, command line) as a job running it once on each of its nodes (a sweep's `accelbench worker`
    on one node: an Optuna worker is one process), wait for them; returns a line per command that failed."""
    from submitit.helpers import CommandFunction

    return _launch(slurm, name, [(label, CommandFunction(argv)) for label, argv in commands], 1)
