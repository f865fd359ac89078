"""Optuna studies from specs: storage, sampler, the objective (one runner trial per seed), MLflow parent/child runs.

Scale-out is Optuna's own: any number of worker processes, on any machines, share one study through its storage
(SQLite for one process, a journal file for several local ones, PostgreSQL for many machines). With an RDB storage,
workers send heartbeats; a trial whose worker died is marked failed and retried
(`RetryHeartbeatStaleTrialCallback`). A worker rides out a restart of its database servers (the study's and MLflow's):
a call that loses its connection is made again, on a new one, until the server is back (`reconnecting`).
"""
from __future__ import annotations

import functools
import os
import socket
import statistics
import time
import warnings
from dataclasses import dataclass
from typing import Any, Callable

import optuna
import sqlalchemy.exc
from mlflow.entities import Metric, Param
from optuna.storages import RetryHeartbeatStaleTrialCallback
from optuna.trial import TrialState

from core.cache import Cache
from core.errors import UserError
from core.names import KIND_TAG, STUDY
from bench.runner import RunOptions, run_trial
from bench.tracking import ORPHAN_TAG, Tracker, check_reachable, owner_alive
from sweeps.spec import StudySpec

PARENT_ATTR = "mlflow_parent_run_id"
RUNS_ATTR = "mlflow_run_ids"
MAX_RETRY = 2
MAX_FAILURES = 3  # a worker stops after this many failed trials instead of failing forever
# A trial asked for after the study was full (several workers ask at once): pruned without running, and no trial of
# the study (not counted, not shown as one).
SURPLUS_ATTR = "surplus"
DONE = (TrialState.COMPLETE, TrialState.PRUNED)
DATABASES = ("postgresql", "mysql", "mssql")  # stores behind a server, which may restart under a running worker
RECONNECT_SECONDS = 120.0  # how long a call waits for its database server to come back before it fails


@dataclass(frozen=True)
class StorageOptions:
    url: str
    heartbeat: int = 10  # seconds between a running trial's heartbeats (RDB storages)
    grace: int = 30  # a running trial with no heartbeat for this long is failed and retried


def default_storage(workers: int) -> str:
    # SQLite locks under concurrent writers; Optuna's journal file is made for several local processes.
    return "sqlite:///optuna.db" if workers == 1 else "journal:optuna.journal"


def _failed_trial_handler(tracker: Tracker | None):
    """Tag a dead worker's MLflow runs `optuna_state` FAIL and end those still RUNNING KILLED, then retry its trial
    (Optuna's callback, up to MAX_RETRY times). KILLED, as `Tracker.end_orphans` ends a run whose process is gone:
    whichever of the two reaches the run first (another worker may start a trial of the same key before this
    handler runs), the run ends the same way."""
    retry = RetryHeartbeatStaleTrialCallback(max_retry=MAX_RETRY)

    def handle(study, trial):
        if tracker is not None:
            for run_id in trial.user_attrs.get(RUNS_ATTR, []):
                tracker.client.set_tag(run_id, "optuna_state", "FAIL")
                if tracker.client.get_run(run_id).info.status == "RUNNING":
                    tracker.client.set_tag(run_id, ORPHAN_TAG, f"worker {trial.user_attrs.get('worker', '?')} "
                                                               f"stopped: trial {trial.number} failed and is retried")
                    tracker.client.set_terminated(run_id, "KILLED")
        retry(study, trial)

    return handle


def reap_dead_local_workers(study: optuna.Study, tracker: Tracker | None) -> list[int]:
    """Journal storages have no heartbeat: fail and retry RUNNING trials whose worker, on this host, has exited.

    Workers on other hosts cannot be checked this way; use an RDB storage (heartbeats) across machines.
    """
    host, reaped = socket.gethostname(), []
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        worker_host, _, pid = trial.user_attrs.get("worker", "").rpartition(":")
        if worker_host != host or not pid.isdigit() or owner_alive(host, int(pid), None):
            continue
        study.tell(trial.number, state=TrialState.FAIL)
        _failed_trial_handler(tracker)(study, study.get_trials(deepcopy=False)[trial.number])
        reaped.append(trial.number)
    return reaped


def lost_connection(exc: BaseException | None) -> bool:
    """Whether an error, or one it was raised from, is a lost or refused database connection: how a restart of the
    server shows in a client (SQLAlchemy's pool_pre_ping, on in Optuna's engine here and in MLflow's, replaces the
    pooled connections the restart closed once the server is back)."""
    while exc is not None:
        if isinstance(exc, sqlalchemy.exc.OperationalError) or \
                isinstance(exc, sqlalchemy.exc.DBAPIError) and exc.connection_invalidated:
            return True
        exc = exc.__cause__
    return False


def reconnecting(call: Callable, *args: Any, **kwargs: Any) -> Any:
    """`call(*args, **kwargs)`, made again with back-off while its database connection is lost or refused, for up to
    RECONNECT_SECONDS; then its error is raised. The server rolls back a transaction whose connection drops, and what
    MLflow commits in several (a batch's params, metrics and tags) it takes again harmlessly: a call made again
    repeats nothing, unless the reply to a commit itself was lost."""
    delay, deadline = 0.25, time.monotonic() + RECONNECT_SECONDS
    while True:
        try:
            return call(*args, **kwargs)
        except Exception as exc:
            if not lost_connection(exc) or time.monotonic() + delay > deadline:
                raise
        time.sleep(delay)
        delay = min(2 * delay, 4.0)


def _reconnecting_method(method: Callable) -> Callable:
    @functools.wraps(method)
    def call(self, *args, **kwargs):
        return reconnecting(method, self, *args, **kwargs)

    return call


def _reconnecting_calls(*names: str):
    """A class decorator: the methods `names` of the class made `reconnecting`."""
    def decorate(cls):
        for name in names:
            setattr(cls, name, _reconnecting_method(getattr(cls, name)))
        return cls

    return decorate


# Every call of RDBStorage that opens a session of its own: the public ones and the private ones Optuna's cache
# (`optuna.storages._CachedStorage`, what a study wraps an RDBStorage in) and its heartbeat thread make.
@_reconnecting_calls(
    "create_new_study", "delete_study", "set_study_user_attr", "set_study_system_attr", "get_study_id_from_name",
    "get_study_name_from_id", "get_study_directions", "get_study_user_attrs", "get_study_system_attrs",
    "get_trial_user_attrs", "get_trial_system_attrs", "get_all_studies", "_create_new_trial", "_set_trial_param",
    "get_trial_param", "set_trial_state_values", "set_trial_intermediate_value", "set_trial_user_attr",
    "set_trial_system_attr", "get_trial_id_from_study_id_trial_number", "get_trial", "_get_trials",
    "_get_best_trial_id", "record_heartbeat", "_get_stale_trial_ids")
class ReconnectingRDBStorage(optuna.storages.RDBStorage):
    """Optuna's RDB storage on a database server, its calls `reconnecting`: a restart of the server delays them."""


class ReconnectingClient:
    """An `MlflowClient` of a database tracking store whose calls are `reconnecting` (what MLflow logs of each lost
    connection, with its traceback, `bench.tracking.client` keeps off the screen)."""

    def __init__(self, client):
        self._client = client

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._client, name)
        return functools.partial(reconnecting, attr) if callable(attr) else attr


def make_storage(opts: StorageOptions, tracker: Tracker | None = None):
    url = opts.url
    if url.startswith("journal:"):
        from optuna.storages.journal import JournalFileBackend

        return optuna.storages.JournalStorage(JournalFileBackend(url[len("journal:"):]))
    if not url.startswith(("sqlite:", "postgresql", "mysql")):
        raise UserError(f"unknown study storage {url!r}; use sqlite:///FILE, journal:FILE or postgresql://...")
    check_reachable(url, "study storage")
    sqlite = url.startswith("sqlite:")
    kwargs = {"connect_args": {"timeout": 60}} if sqlite else {"pool_pre_ping": True}
    try:
        with warnings.catch_warnings():  # heartbeats and their retry callback: "experimental" since Optuna 2.8, and
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)  # what a sweep relies on
            storage_class = optuna.storages.RDBStorage if sqlite else ReconnectingRDBStorage
            return storage_class(url, engine_kwargs=kwargs, heartbeat_interval=opts.heartbeat, grace_period=opts.grace,
                                 heartbeat_stale_trial_callback=_failed_trial_handler(tracker))
    except Exception as exc:  # an unreachable database: say which, before any work
        raise UserError(f"cannot open study storage {url}: {str(exc).splitlines()[0]}") from None


def make_sampler(spec: StudySpec):
    # Unseeded: workers sharing a study must not all propose the same first points.
    constraints = _constraints_of if spec.constraints else None
    if spec.sampler == "grid":
        return optuna.samplers.GridSampler({p.name: p.grid() for p in spec.space})
    if spec.sampler == "nsga2":
        return optuna.samplers.NSGAIISampler(constraints_func=constraints)
    return optuna.samplers.TPESampler(constraints_func=constraints)


def _constraints_of(trial) -> list[float]:
    return trial.user_attrs.get("constraints", [float("inf")])


def open_study(spec: StudySpec, storage, tracker: Tracker) -> optuna.Study:
    """Create or load the study; the first process to get here also creates the MLflow parent run."""
    pruner = optuna.pruners.MedianPruner() if spec.pruner == "median" else optuna.pruners.NopPruner()
    study = optuna.create_study(study_name=spec.study, storage=storage, directions=spec.directions,
                                sampler=make_sampler(spec), pruner=pruner, load_if_exists=True)
    names = [o.metric for o in spec.objectives]
    if study.metric_names != names:  # optuna-dashboard and the summaries label objectives with these, not "Objective 0"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)  # stable since Optuna 3.2
            study.set_metric_names(names)
    if PARENT_ATTR not in study.user_attrs:
        run = tracker.client.create_run(tracker.experiment_id, run_name=f"study:{spec.study}",
                                        tags={KIND_TAG: STUDY, "study_name": spec.study})
        # What a report needs to plot the study from MLflow alone: the objectives and the searched knobs.
        tracker.client.log_batch(run.info.run_id, params=[
            Param("objectives", ",".join(f"{o.metric}:{o.direction}" for o in spec.objectives)),
            Param("space", ",".join(p.name for p in spec.space)), Param("sampler", spec.sampler),
            Param("n_trials", str(spec.n_trials))])
        study.set_user_attr(PARENT_ATTR, run.info.run_id)
    return study


def finished_run(tracker: Tracker, key: str) -> tuple[str, dict[str, float]] | None:
    """(run id, metrics) of a finished run of the trial key, if the experiment has one."""
    runs = tracker.client.search_runs([tracker.experiment_id],
                                      f"tags.trial_key = '{key}' and attributes.status = 'FINISHED'", max_results=1)
    return (runs[0].info.run_id, dict(runs[0].data.metrics)) if runs else None


class Objective:
    def __init__(self, spec: StudySpec, study: optuna.Study, tracker: Tracker, cache: Cache, opts: RunOptions,
                 force: bool = False, reap_local: bool = False):
        self.spec, self.tracker, self.cache, self.opts, self.force = spec, tracker, cache, opts, force
        self.reap_local = reap_local  # journal storage: no heartbeats, so check local workers' pids instead
        self.parent = study.user_attrs[PARENT_ATTR]

    def __call__(self, trial: optuna.Trial):
        trial.set_user_attr("worker", f"{socket.gethostname()}:{os.getpid()}")
        if self.reap_local:
            reap_dead_local_workers(trial.study, self.tracker)
        if self._surplus(trial):
            trial.set_user_attr(SURPLUS_ATTR, True)
            trial.study.stop()
            raise optuna.TrialPruned(f"Surplus: the study already has its {self.spec.n_trials} trials under way")
        knobs = {p.name: p.suggest(trial) for p in self.spec.space}
        tags = {"mlflow.parentRunId": self.parent, "study_name": self.spec.study,
                "optuna_trial_number": str(trial.number)}
        per_seed: list[dict[str, float]] = []
        run_ids: list[str] = []

        def started(run_id):
            run_ids.append(run_id)
            trial.set_user_attr(RUNS_ATTR, list(run_ids))

        for step, seed in enumerate(self.spec.seeds):
            p = self.spec.trial(knobs, seed)
            found = None if self.force else finished_run(self.tracker, p.trial.key())
            if found is None:
                try:
                    metrics = run_trial(p, cache=self.cache, tracker=self.tracker, opts=self.opts, tags=tags,
                                        on_start=started)
                except Exception:
                    self._mark(run_ids, "FAIL")
                    raise
            else:  # e.g. the retry of a trial whose worker died after its run finished: the run is this trial's now
                run_id, metrics = found
                self.tracker.client.set_tag(run_id, "optuna_trial_number", str(trial.number))
                started(run_id)
            per_seed.append(metrics)
            if self.spec.pruner != "none":
                trial.report(self._value(per_seed, self.spec.objectives[0].metric), step)
                if trial.should_prune():
                    self._mark(run_ids, "PRUNED")
                    raise optuna.TrialPruned()
        trial.set_user_attr("constraints", [
            c.violation(self._value(per_seed, c.metric), self._value(per_seed, f"ref/{c.metric}"))
            for c in self.spec.constraints])
        self._mark(run_ids, "COMPLETE")
        values = [self._value(per_seed, o.metric) for o in self.spec.objectives]
        return values[0] if len(values) == 1 else values

    def _surplus(self, trial: optuna.Trial) -> bool:
        """Several workers can ask for a trial at once; only the first n_trials (by number, failed and surplus ones
        aside) run."""
        ahead = [t for t in trial.study.get_trials(deepcopy=False)
                 if t.number < trial.number and t.state != TrialState.FAIL and not t.user_attrs.get(SURPLUS_ATTR)]
        return len(ahead) >= self.spec.n_trials

    @staticmethod
    def _value(per_seed: list[dict], metric: str) -> float:
        missing = [i for i, m in enumerate(per_seed) if metric not in m]
        if missing:
            raise UserError(f"objective metric {metric!r} was not logged; add its metric to the base trial")
        return statistics.fmean(m[metric] for m in per_seed)

    def _mark(self, run_ids: list[str], state: str) -> None:
        for run_id in run_ids:
            self.tracker.client.set_tag(run_id, "optuna_state", state)


def finished(study: optuna.Study) -> int:
    """The study's finished trials: complete, or pruned by its pruner; what `n_trials` counts (surplus asks aside)."""
    return sum(t.state in DONE and not t.user_attrs.get(SURPLUS_ATTR) for t in study.get_trials(deepcopy=False))


def work(spec: StudySpec, storage_opts: StorageOptions, tracker: Tracker, cache: Cache, opts: RunOptions,
         force: bool = False) -> optuna.Study:
    """One worker: run trials until the study has `n_trials` finished trials. It gives up after MAX_FAILURES failed
    trials of its own, an error unless the other workers finished the study meanwhile."""
    if tracker.uri.startswith(DATABASES):
        tracker.client = ReconnectingClient(tracker.client)
    study = open_study(spec, make_storage(storage_opts, tracker), tracker)
    failures = []

    def stop(study, trial):
        if trial.state == TrialState.FAIL:
            failures.append(trial.number)
        if len(failures) >= MAX_FAILURES or finished(study) >= spec.n_trials:
            study.stop()

    if finished(study) < spec.n_trials:
        journal = storage_opts.url.startswith("journal:")
        study.optimize(Objective(spec, study, tracker, cache, opts, force, reap_local=journal), catch=(Exception,),
                       callbacks=[stop])
    if finished(study) >= spec.n_trials:
        _close_parent(study, spec, tracker)
    elif len(failures) >= MAX_FAILURES:
        raise UserError(f"worker stopped after {len(failures)} failed trials ({failures}); see their MLflow runs")
    return study


def _close_parent(study: optuna.Study, spec: StudySpec, tracker: Tracker) -> None:
    """The study has all its trials: put its outcome on the parent run and end it (again, harmlessly, per worker)."""
    run_id = study.user_attrs[PARENT_ATTR]
    metrics = {}
    try:  # no feasible trial (constraints) leaves no best value
        if len(spec.objectives) == 1:
            metrics[f"best_{spec.objectives[0].metric}"] = study.best_value
        else:
            metrics["pareto_front_size"] = float(len(study.best_trials))
    except ValueError:
        pass
    metrics["complete_trials"] = float(sum(t.state == TrialState.COMPLETE for t in study.get_trials(deepcopy=False)))
    tracker.client.log_batch(run_id, metrics=[Metric(k, v, 0, 0) for k, v in sorted(metrics.items())])
    tracker.client.set_terminated(run_id, "FINISHED")


def summary(study: optuna.Study) -> list[str]:
    every = study.get_trials(deepcopy=False)
    trials = [t for t in every if not t.user_attrs.get(SURPLUS_ATTR)]
    counts = {s.name.lower(): sum(t.state == s for t in trials) for s in TrialState}
    counts["surplus"] = len(every) - len(trials)
    lines = [f"study {study.study_name}: " + ", ".join(f"{n} {c}" for n, c in counts.items() if c)]
    try:
        best = study.best_trials
    except (ValueError, RuntimeError):
        best = []
    label = "best trial" if len(study.directions) == 1 else "Pareto front"
    names = study.metric_names or [f"objective {i}" for i in range(len(study.directions))]
    for t in best:
        values = ", ".join(f"{n}={v:.4g}" for n, v in zip(names, t.values))
        lines.append(f"  {label} #{t.number}: {values}; params={t.params}")
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    if complete and not best:  # Optuna's best trials are the feasible ones: say why there is none
        lines.append(f"  no best trial: all {len(complete)} complete trials violate a constraint (their "
                     f"`constraints` user attribute: > 0 is the violation)")
    return lines
