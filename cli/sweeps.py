"""`accelbench sweep`, `worker`, `studies` and `dashboard`: Optuna studies of a spec, on one or many workers."""
from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from cli import options
from cli.serve import check_port_free
from core.errors import UserError


def _context(args, workers: int):
    from bench.tracking import Tracker, check_reachable, tracking_uri
    from sweeps.spec import load_spec
    from sweeps.study import StorageOptions, default_storage

    spec = load_spec(args.spec, checkpoints=args.checkpoints, n_trials=args.n_trials)
    storage = StorageOptions(args.storage or default_storage(workers), args.heartbeat, args.grace)
    opts = options.run_options(args)
    check_reachable(storage.url, "study storage")  # before the tracker makes the study's experiment
    tracker = Tracker(tracking_uri(args.tracking_uri), spec.experiment)
    return spec, storage, tracker, options.open_cache(args), opts


def _worker_argv(args, storage_url: str) -> list[str]:
    argv = [sys.executable, "-m", "cli", "worker", args.spec, "--storage", storage_url,
            "--heartbeat", str(args.heartbeat), "--grace", str(args.grace), *options.execution_argv(args)]
    if args.n_trials is not None:
        argv += ["--n-trials", str(args.n_trials)]
    return argv + (["--force"] if args.force else [])


def _check_goal(study, spec, trouble: str) -> None:
    """A sweep succeeds when its study has every trial it asks for, whatever its workers went through on the way (a
    failed trial retried, a worker that gave up while the others finished: in their output and in MLflow); `trouble`
    says what happened to its workers, if anything did."""
    from optuna.trial import TrialState

    from sweeps.study import finished

    done = finished(study)
    if done < spec.n_trials:
        running = sum(t.state == TrialState.RUNNING for t in study.get_trials(deepcopy=False))
        raise UserError(f"study {spec.study} has {done} of {spec.n_trials} trials finished"
                        + (f" and {running} running" if running else "") + (f"; {trouble}" if trouble else ""))
    if trouble:
        print(f"accelbench: note: {trouble}; the study has all its trials", file=sys.stderr)


def cmd_sweep(args) -> int:
    from sweeps.study import make_storage, open_study, summary, work

    if args.workers < 1:
        raise UserError(f"--workers must be >= 1, got {args.workers}")
    spec, storage, tracker, cache, opts = _context(args, args.workers)
    slurm = options.slurm_options(args, Path("results") / spec.experiment / "slurm")
    if slurm is not None and slurm.nodes != 1:
        raise UserError(f"a sweep worker is one process on one node: --nodes must be 1, got {slurm.nodes}")
    study = open_study(spec, make_storage(storage, tracker), tracker)  # one parent run, made before any worker
    if slurm is not None:  # a job per worker, every path in its command line absolute
        from bench.launch import absolute_store, submit_commands

        shared = argparse.Namespace(**{**vars(args), "spec": str(Path(args.spec).absolute()),
                                       "tracking_uri": absolute_store(tracker.uri), "cache_dir": str(cache.root)})
        argv = _worker_argv(shared, absolute_store(storage.url))
        failed = submit_commands(slurm, f"accelbench-{spec.study}",
                                 [(f"worker {i}/{args.workers}", argv) for i in range(1, args.workers + 1)])
        for line in failed:
            print(f"accelbench: failed: {line}", file=sys.stderr)
        trouble = f"{len(failed)} of {args.workers} worker jobs failed (listed above)" if failed else ""
    elif args.workers == 1:
        work(spec, storage, tracker, cache, opts, force=args.force)
        trouble = ""
    else:
        procs = [subprocess.Popen(_worker_argv(args, storage.url)) for _ in range(args.workers)]
        try:
            codes = [p.wait() for p in procs]
        except KeyboardInterrupt:  # the workers end their runs KILLED too
            for p in procs:
                p.terminate()
            for p in procs:
                p.wait()
            raise
        trouble = f"{sum(c != 0 for c in codes)} of {args.workers} workers failed (exit codes {codes})" \
            if any(codes) else ""
    print("\n".join(summary(study)))  # the storage is read afresh: the workers' trials are all there
    print(f"study storage: {storage.url}; MLflow: {tracker.uri} (experiment {spec.experiment!r})")
    _check_goal(study, spec, trouble)
    return 0


def cmd_worker(args) -> int:
    from sweeps.study import work

    if args.storage is None:
        raise UserError("worker needs --storage (the study's database or journal file)")
    spec, storage, tracker, cache, opts = _context(args, 1)
    work(spec, storage, tracker, cache, opts, force=args.force)
    return 0


def cmd_studies(args) -> int:
    import optuna

    from sweeps.study import StorageOptions, make_storage, summary

    storage = make_storage(StorageOptions(args.storage))
    names = sorted(s.study_name for s in optuna.get_all_study_summaries(storage))
    if not names:
        print(f"no studies in {args.storage}")
    for name in names:
        print("\n".join(summary(optuna.load_study(study_name=name, storage=storage))))
    return 0


def cmd_dashboard(args) -> int:
    from optuna_dashboard import run_server

    from sweeps.study import StorageOptions, make_storage

    check_port_free(args.host, args.port)
    storage = make_storage(StorageOptions(args.storage))
    print(f"optuna-dashboard on http://{args.host}:{args.port} for {args.storage} (Ctrl-C to stop)")
    run_server(storage, host=args.host, port=args.port)
    return 0


def register(sub) -> None:
    def study_args(sp, storage_help):
        sp.add_argument("spec", help="study spec YAML (see sweeps/specs/)")
        sp.add_argument("--storage", help=storage_help)
        sp.add_argument("--n-trials", type=int, help="finished trials the study should reach (default: the spec's)")
        sp.add_argument("--force", action="store_true", help="recompute trials that already have a finished run")
        sp.add_argument("--heartbeat", type=int, default=10, help="seconds between heartbeats (RDB storages)")
        sp.add_argument("--grace", type=int, default=30,
                        help="seconds without a heartbeat before a trial is failed and retried")
        options.execution(sp)

    sw = sub.add_parser("sweep", help="run an Optuna study from a spec, locally or with several workers")
    study_args(sw, "study storage: sqlite:///FILE, journal:FILE or postgresql://... (default sqlite:///optuna.db, "
                   "or journal:optuna.journal with --workers > 1)")
    sw.add_argument("--workers", type=int, default=1,
                    help="worker processes on this machine, or worker jobs with --launcher slurm (default 1)")
    options.launcher(sw, "a job per worker (--workers)")
    sw.set_defaults(func=cmd_sweep)

    wk = sub.add_parser("worker", help="join an existing study from any machine")
    study_args(wk, "the study's storage (required), e.g. postgresql://user@host/db")
    wk.set_defaults(func=cmd_worker)

    for name, helptext, func in (
            ("studies", "list the studies in a storage with their best trials / Pareto fronts", cmd_studies),
            ("dashboard", "open optuna-dashboard on a study storage", cmd_dashboard)):
        sp = sub.add_parser(name, help=helptext)
        sp.add_argument("--storage", default="sqlite:///optuna.db", help="study storage (default sqlite:///optuna.db)")
        if name == "dashboard":
            sp.add_argument("--host", default="127.0.0.1")
            sp.add_argument("--port", type=int, default=8080)
        sp.set_defaults(func=func)
