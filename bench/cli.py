"""The `accelbench` command line: run a trial or a suite, write a report, list what is registered, open the MLflow UI."""
from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import traceback
from pathlib import Path

from bench.errors import UserError

DEFAULT_EXPERIMENT = "accelbench"


def _parse_params(items: list[str]) -> dict[str, str]:
    params = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UserError(f"--param expects KEY=VALUE, got {item!r}")
        params[key.strip()] = value.strip()
    return params


def _trial_from_args(args):
    from bench.trial import Trial

    if args.config:
        if args.teacher or args.method:
            raise UserError("give either a trial YAML file or --teacher/--method, not both")
        return Trial.from_yaml(args.config)
    if not args.teacher or not args.method:
        raise UserError("run needs --teacher and --method (or a trial YAML file)")
    return Trial(teacher=args.teacher, method=args.method, params=_parse_params(args.param),
                 metrics=tuple(args.metric), n_samples=args.n_samples, batch_size=args.batch_size,
                 seed=args.seed, device=args.device, metric_repeats=args.metric_repeats)


def cmd_run(args) -> int:
    from bench.cache import Cache
    from bench.runner import RunOptions, plan, run_trial
    from bench.tracking import Tracker, tracking_uri

    trial = _trial_from_args(args)
    checked = plan(trial)  # validate everything before touching the store or building anything
    for m in checked.metrics:
        if m.unavailable:
            print(f"accelbench: not computed: {m.unavailable}", file=sys.stderr)
    opts = RunOptions(warmup=args.warmup, threads=args.threads, progress=not args.no_progress,
                      time_budget=args.time_budget, memory_budget=args.memory_budget)
    uri = tracking_uri(args.tracking_uri)
    tracker = Tracker(uri, args.experiment)
    metrics = run_trial(trial, cache=Cache(args.cache_dir), tracker=tracker, opts=opts)
    print(format_result(trial.method, checked.reference, metrics))
    print(f"\nlogged to MLflow: {uri} (experiment {args.experiment!r}); browse with: accelbench ui"
          + (f" --tracking-uri {uri}" if args.tracking_uri else ""))
    return 0


def format_result(method: str, reference: str, m: dict[str, float]) -> str:
    """A small markdown table: the method arm, the reference arm and any extra baseline arm of the same run; speed-ups
    are against the reference arm."""
    quality = sorted(k for k in m if "." in k and "/" not in k)
    extra = sorted({k.split("/")[0] for k in m if k.endswith("/nfe_per_sample")} - {"ref"})
    head = ["arm", "NFE/sample", "tokens/step", "ms/sample (median)", "speed-up wall", "speed-up steps", *quality]
    rows = []
    ref_sec, ref_nfe = m["ref/sec_per_sample_median"], m["ref/nfe_per_sample"]
    for arm, prefix in ((method, ""), (f"{reference} (reference)", "ref/"), *((a, f"{a}/") for a in extra)):
        rows.append([arm, f"{m[prefix + 'nfe_per_sample']:.1f}", f"{m[prefix + 'step_compression']:.2f}",
                     f"{1000 * m[prefix + 'sec_per_sample_median']:.1f}",
                     f"{ref_sec / m[prefix + 'sec_per_sample_median']:.2f}x",
                     f"{ref_nfe / m[prefix + 'nfe_per_sample']:.2f}x",
                     *(f"{m.get(prefix + q, float('nan')):.2f}" for q in quality)])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def cmd_suite(args) -> int:
    from bench.cache import Cache
    from bench.runner import RunOptions
    from bench.suite import load_suite, run_suite
    from bench.tracking import Tracker, tracking_uri
    from reports.report import write_report

    suite = load_suite(args.file)  # every trial validated before anything runs
    opts = RunOptions(warmup=args.warmup, threads=args.threads, progress=not args.no_progress,
                      time_budget=args.time_budget, memory_budget=args.memory_budget)
    uri = tracking_uri(args.tracking_uri)
    tracker = Tracker(uri, suite.experiment)
    ran, skipped = run_suite(suite, tracker=tracker, cache=Cache(args.cache_dir), opts=opts, force=args.force)
    print(f"suite {suite.experiment}: ran {ran} trials, {skipped} already finished in the store")
    path = write_report(uri, suite.experiment, Path(args.out or Path("results") / suite.experiment))
    print(f"report: {path}")
    print(f"MLflow store: {uri}; browse with: accelbench ui" + (f" --tracking-uri {uri}" if args.tracking_uri else ""))
    return 0


def cmd_report(args) -> int:
    from bench.tracking import tracking_uri
    from reports.report import write_report

    path = write_report(tracking_uri(args.tracking_uri), args.experiment,
                        Path(args.out or Path("results") / args.experiment), args.filter or "")
    print(f"report: {path}")
    return 0


def _sweep_context(args, workers: int):
    from bench.cache import Cache
    from bench.runner import RunOptions
    from bench.tracking import Tracker, tracking_uri
    from sweeps.spec import load_spec
    from sweeps.study import StorageOptions, default_storage

    spec = load_spec(args.spec, n_trials=args.n_trials)
    storage = StorageOptions(args.storage or default_storage(workers), args.heartbeat, args.grace)
    opts = RunOptions(warmup=args.warmup, threads=args.threads, progress=False, time_budget=args.time_budget,
                      memory_budget=args.memory_budget)
    tracker = Tracker(tracking_uri(args.tracking_uri), spec.experiment)
    return spec, storage, tracker, Cache(args.cache_dir), opts


def _worker_argv(args, storage_url: str) -> list[str]:
    argv = [sys.executable, "-m", "bench.cli", "worker", args.spec, "--storage", storage_url,
            "--heartbeat", str(args.heartbeat), "--grace", str(args.grace), "--threads", str(args.threads),
            "--warmup", str(args.warmup), "--time-budget", str(args.time_budget),
            "--memory-budget", str(args.memory_budget)]
    for flag, value in (("--n-trials", args.n_trials), ("--tracking-uri", args.tracking_uri),
                        ("--cache-dir", args.cache_dir)):
        if value is not None:
            argv += [flag, str(value)]
    return argv + (["--force"] if args.force else [])


def cmd_sweep(args) -> int:
    from sweeps.study import make_storage, open_study, summary, work

    if args.workers < 1:
        raise UserError(f"--workers must be >= 1, got {args.workers}")
    spec, storage, tracker, cache, opts = _sweep_context(args, args.workers)
    study = open_study(spec, make_storage(storage, tracker), tracker)  # one parent run, made before any worker
    if args.workers == 1:
        work(spec, storage, tracker, cache, opts, force=args.force)
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
        if any(codes):
            raise UserError(f"{sum(c != 0 for c in codes)} of {args.workers} workers failed (exit codes {codes})")
    print("\n".join(summary(study)))  # the storage is read afresh: the workers' trials are all there
    print(f"study storage: {storage.url}; MLflow: {tracker.uri} (experiment {spec.experiment!r})")
    return 0


def cmd_worker(args) -> int:
    from sweeps.study import work

    spec, storage, tracker, cache, opts = _sweep_context(args, 1)
    if args.storage is None:
        raise UserError("worker needs --storage (the study's database or journal file)")
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

    storage = make_storage(StorageOptions(args.storage))
    print(f"optuna-dashboard on http://{args.host}:{args.port} for {args.storage} (Ctrl-C to stop)")
    run_server(storage, host=args.host, port=args.port)
    return 0


def cmd_lambada(args) -> int:
    import tempfile

    import torch

    from bench.cache import Cache
    from bench.config import build_config
    from bench.registry import METHODS, TEACHERS
    from bench.runner import check_family
    from bench.tracking import Tracker, tracking_uri
    from metrics.lambada import lambada
    from teachers import load_teacher

    teacher_cls = TEACHERS.get(args.teacher)
    if getattr(teacher_cls, "modality", "image") != "text":
        raise UserError(f"lambada needs a text teacher, got {args.teacher!r} ({teacher_cls.family})")
    if args.n < 1:
        raise UserError(f"--n must be >= 1, got {args.n}")
    method_cls = METHODS.get(args.method) if args.method else None
    if method_cls is not None:
        check_family(args.method, method_cls, args.teacher, teacher_cls)
    config = build_config(method_cls.config_class(teacher_cls.family), _parse_params(args.param),
                          owner=f"method {args.method!r}") if method_cls else None
    cache = Cache(args.cache_dir)
    tracker = Tracker(tracking_uri(args.tracking_uri), args.experiment)
    teacher = load_teacher(args.teacher, cache=cache, device=torch.device("cpu"), on_trained=tracker.log_training)
    method = method_cls(teacher, config) if method_cls else None
    if method is not None:
        method.fit(cache=cache)
    model = "smollm2-135m" if args.smollm2 else args.method or args.teacher
    with tempfile.TemporaryDirectory() as folder:
        scores = lambada(teacher, cache=cache, n=args.n, folder=Path(folder), method=method, on_smollm2=args.smollm2)
    with tracker.run(f"lambada:{model}:{args.teacher}", {"accelbench.kind": "lambada"}) as log:
        log.log(params={"teacher": args.teacher, "model": model, "n": args.n, "method": args.method or "",
                        **{f"params.{k}": v for k, v in _parse_params(args.param).items()}},
                metrics={f"lambada.{k}": v for k, v in scores.items()})
    print(f"{model} on the LAMBADA-style task of {args.teacher}'s corpus ({args.n} passages max): "
          f"acc {scores['acc']:.4f}, perplexity {scores['perplexity']:.2f}")
    return 0


def cmd_doctor(args) -> int:
    from bench.cache import Cache
    from bench.doctor import doctor
    from bench.tracking import Tracker, tracking_uri

    uri = tracking_uri(args.tracking_uri)
    lines = doctor(Tracker(uri, DEFAULT_EXPERIMENT), Cache(args.cache_dir))
    print("\n".join(lines) if lines else f"nothing to fix in {uri} and the cache")
    return 0


def cmd_list(args) -> int:
    from bench.registry import METHODS, METRICS, TEACHERS

    def doc(obj) -> str:
        return (obj.__doc__ or "").strip().splitlines()[0] if obj.__doc__ else ""

    print("teachers:")
    for name, cls in TEACHERS.items():
        print(f"  {name:<16} [{cls.family}] {doc(cls)}")
    print("methods:")
    for name, cls in METHODS.items():
        print(f"  {name:<16} families: {', '.join(cls.families)}. {doc(cls)}")
    print("metrics:")
    for name, cls in METRICS.items():
        arrow = "higher is better" if cls.higher_is_better else "lower is better"
        print(f"  {name:<16} ({arrow}) {doc(cls)}")
    return 0


def cmd_ui(args) -> int:
    from bench.tracking import tracking_uri

    uri = tracking_uri(args.tracking_uri)
    # One worker and no job runner: the UI starts in ~20 s instead of ~70 s on 2 cores.
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    cmd = [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri, "--host", args.host,
           "--port", str(args.port), "--workers", "1"]
    print(f"MLflow UI on http://{args.host}:{args.port} for {uri} (Ctrl-C to stop)")
    return subprocess.call(cmd, env=env)


class Parser(argparse.ArgumentParser):
    def error(self, message: str):
        """One line, like every other bad input (argparse prints the whole usage first)."""
        self.exit(2, f"accelbench: error: {message} (see: {self.prog} --help)\n")


def _budget_args(sp) -> None:
    sp.add_argument("--time-budget", type=float, default=0.0, metavar="SECONDS",
                    help="stop a trial that takes longer, teacher training included (default 0 = no limit)")
    sp.add_argument("--memory-budget", type=float, default=0.0, metavar="MB",
                    help="stop a trial when the process's resident memory exceeds this (libraries included; "
                         "default 0 = no limit)")


def build_parser() -> argparse.ArgumentParser:
    uri_help = "MLflow tracking URI (default $MLFLOW_TRACKING_URI or sqlite:///mlflow.db)"
    cache_help = "cache root (default $ACCELBENCH_CACHE or ~/.cache/accelbench)"
    p = Parser(prog="accelbench", description=__doc__)
    p.add_argument("--debug", action="store_true", help="show tracebacks for errors")
    sub = p.add_subparsers(dest="command", required=True)

    r = sub.add_parser("run", help="run one trial (method x teacher) and log it to MLflow")
    r.add_argument("config", nargs="?", help="a trial YAML file (instead of --teacher/--method/...)")
    r.add_argument("--teacher", help="teacher registry name (see `accelbench list`)")
    r.add_argument("--method", help="method registry name (see `accelbench list`)")
    r.add_argument("--param", action="append", default=[], metavar="KEY=VALUE", help="a method knob; repeatable")
    r.add_argument("--metric", action="append", default=[], metavar="NAME[@EXTRACTOR]",
                   help="a quality metric, e.g. fid or fid@inception; repeatable")
    r.add_argument("--metric-repeats", type=int, default=1,
                   help="seeds over which stochastic metrics (KID, IS) are repeated: mean and .seed_std (default 1)")
    r.add_argument("--n-samples", type=int, default=64, help="samples per arm (default 64)")
    r.add_argument("--batch-size", type=int, default=1, help="samples per sampler call (default 1)")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N (default auto)")
    r.add_argument("--experiment", default=DEFAULT_EXPERIMENT, help="MLflow experiment name")
    r.add_argument("--tracking-uri", help=uri_help)
    r.add_argument("--cache-dir", help=cache_help)
    r.add_argument("--threads", type=int, default=1, help="torch threads while sampling (default 1)")
    r.add_argument("--warmup", type=int, default=2, help="warm-up batches per arm before timing (default 2)")
    r.add_argument("--no-progress", action="store_true", help="no progress bars")
    _budget_args(r)
    r.set_defaults(func=cmd_run)

    su = sub.add_parser("suite", help="run the trials of a suite file that are not finished yet, then write the report")
    su.add_argument("file", help="suite YAML (see suites/default.yaml)")
    su.add_argument("--tracking-uri", help=uri_help)
    su.add_argument("--cache-dir", help=cache_help)
    su.add_argument("--out", help="report directory (default results/<experiment>)")
    su.add_argument("--force", action="store_true", help="rerun trials that already have a finished run")
    su.add_argument("--threads", type=int, default=1, help="torch threads while sampling (default 1)")
    su.add_argument("--warmup", type=int, default=2, help="warm-up batches per arm before timing (default 2)")
    su.add_argument("--no-progress", action="store_true", help="no progress bars")
    _budget_args(su)
    su.set_defaults(func=cmd_suite)

    def sweep_args(sp, storage_help):
        sp.add_argument("spec", help="study spec YAML (see sweeps/specs/)")
        sp.add_argument("--storage", help=storage_help)
        sp.add_argument("--n-trials", type=int, help="finished trials the study should reach (default: the spec's)")
        sp.add_argument("--tracking-uri", help=uri_help)
        sp.add_argument("--cache-dir", help=cache_help)
        sp.add_argument("--force", action="store_true", help="recompute trials that already have a finished run")
        sp.add_argument("--heartbeat", type=int, default=10, help="seconds between heartbeats (RDB storages)")
        sp.add_argument("--grace", type=int, default=30,
                        help="seconds without a heartbeat before a trial is failed and retried")
        sp.add_argument("--threads", type=int, default=1, help="torch threads while sampling (default 1)")
        sp.add_argument("--warmup", type=int, default=2, help="warm-up batches per arm (default 2)")
        _budget_args(sp)

    sw = sub.add_parser("sweep", help="run an Optuna study from a spec, locally or with several workers")
    sweep_args(sw, "study storage: sqlite:///FILE, journal:FILE or postgresql://... (default sqlite:///optuna.db, "
                   "or journal:optuna.journal with --workers > 1)")
    sw.add_argument("--workers", type=int, default=1, help="worker processes on this machine (default 1)")
    sw.set_defaults(func=cmd_sweep)

    wk = sub.add_parser("worker", help="join an existing study from any machine")
    sweep_args(wk, "the study's storage (required), e.g. postgresql://user@host/db")
    wk.set_defaults(func=cmd_worker)

    st = sub.add_parser("studies", help="list the studies in a storage with their best trials / Pareto fronts")
    st.add_argument("--storage", default="sqlite:///optuna.db", help="study storage (default sqlite:///optuna.db)")
    st.set_defaults(func=cmd_studies)

    db = sub.add_parser("dashboard", help="open optuna-dashboard on a study storage")
    db.add_argument("--storage", default="sqlite:///optuna.db", help="study storage (default sqlite:///optuna.db)")
    db.add_argument("--host", default="127.0.0.1")
    db.add_argument("--port", type=int, default=8080)
    db.set_defaults(func=cmd_dashboard)

    rp = sub.add_parser("report", help="write REPORT.md and plots from an MLflow experiment")
    rp.add_argument("--experiment", default=DEFAULT_EXPERIMENT, help="MLflow experiment name")
    rp.add_argument("--filter", help="extra MLflow search filter, e.g. \"params.teacher = 'digits-ar-t2i'\"")
    rp.add_argument("--out", help="report directory (default results/<experiment>)")
    rp.add_argument("--tracking-uri", help=uri_help)
    rp.set_defaults(func=cmd_report)

    lb = sub.add_parser("lambada", help="LAMBADA-style last-word accuracy / perplexity (lm-eval) on a text corpus")
    lb.add_argument("--teacher", required=True, help="a text teacher: its corpus gives the passages")
    lb.add_argument("--method", help="score this method's model (e.g. an SDTT student) instead of the teacher")
    lb.add_argument("--param", action="append", default=[], metavar="KEY=VALUE", help="a method knob; repeatable")
    lb.add_argument("--smollm2", action="store_true", help="score SmolLM2-135M (lm-eval's hf backend) instead")
    lb.add_argument("--n", type=int, default=500, help="passages (default 500)")
    lb.add_argument("--experiment", default=DEFAULT_EXPERIMENT, help="MLflow experiment name")
    lb.add_argument("--tracking-uri", help=uri_help)
    lb.add_argument("--cache-dir", help=cache_help)
    lb.set_defaults(func=cmd_lambada)

    dr = sub.add_parser("doctor", help="mark RUNNING runs whose process is gone KILLED; clean the cache of what "
                                       "killed builds left")
    dr.add_argument("--tracking-uri", help=uri_help)
    dr.add_argument("--cache-dir", help=cache_help)
    dr.set_defaults(func=cmd_doctor)

    ls = sub.add_parser("list", help="list registered teachers, methods and metrics")
    ls.set_defaults(func=cmd_list)

    ui = sub.add_parser("ui", help="start the MLflow UI on the tracking store")
    ui.add_argument("--tracking-uri", help=uri_help)
    ui.add_argument("--host", default="127.0.0.1")
    ui.add_argument("--port", type=int, default=5000)
    ui.set_defaults(func=cmd_ui)
    return p


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the process is, so it unwinds like Ctrl-C: runs end KILLED, temp files are removed."""


def _terminate(signum, frame):
    raise Terminated()


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing may reach a hub; fail at once instead of retrying
    args = build_parser().parse_args(argv)
    previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        return args.func(args)
    except UserError as exc:
        if args.debug:
            traceback.print_exc()
        print(f"accelbench: error: {exc}", file=sys.stderr)
        return 2
    except Terminated:
        print("accelbench: terminated", file=sys.stderr)
        return 128 + signal.SIGTERM
    except KeyboardInterrupt:
        print("accelbench: interrupted", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())
