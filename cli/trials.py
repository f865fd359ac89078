"""`accelbench run`, `suite` and `lambada`: the commands that plan trials and run them through the runner."""
from __future__ import annotations

import sys

from cli import options
from core.errors import UserError
from core.names import NFE_PER_SAMPLE, SEC_PER_SAMPLE

CORPUS_PASSAGES = 500  # `accelbench lambada`'s default on the corpus task alone


def _trial_from_args(args):
    from core.trial import Trial

    if args.config:
        if args.teacher or args.method:
            raise UserError("give either a trial YAML file or --teacher/--method, not both")
        return Trial.from_yaml(args.config)
    if not args.teacher or not args.method:
        raise UserError("run needs --teacher and --method (or a trial YAML file)")
    return Trial(teacher=args.teacher, method=args.method, params=options.parse_params(args.param),
                 metrics=tuple(args.metric), n_samples=args.n_samples, batch_size=args.batch_size,
                 latency_batch=args.latency_batch,
                 seed=args.seed, device=args.device, metric_repeats=args.metric_repeats, dtype=args.dtype,
                 tf32=args.tf32 == "on", compile=args.compile,
                 teacher_params=options.parse_params(args.teacher_param, "--teacher-param"))


def _store_line(uri: str, args, experiment: str) -> str:
    return (f"logged to MLflow: {uri} (experiment {experiment!r}); browse with: accelbench ui"
            + (f" --tracking-uri {uri}" if args.tracking_uri else ""))


def _dry_run(title: str, load, args, warmup: int) -> int:
    """Plan with the files listed instead of refused, print the plan priced for `--device-kind` (`bench.dryrun`),
    touch nothing else."""
    import torch

    from bench import dryrun
    from core import files

    if args.ranks < 1:
        raise UserError(f"--ranks must be >= 1, got {args.ranks}")
    with files.audit():
        plans = load()
    machine = args.device_kind or dryrun.device_machine(torch.device("cuda" if torch.cuda.is_available() else "cpu"))
    print(dryrun.report(title, args.checkpoints, [(p, list(p.needs)) for p in plans], warmup, machine, args.ranks,
                        options.latency_protocol(args), args.costs or dryrun.COSTS))
    return 0


def _cost(load, args) -> int:
    """The cost mode (`bench.cost`): every plan of `load()` -> (experiment, plans) at full size with random weights
    (planned with its files listed, not required), one cost run each, then COST.md, printed."""
    import shlex

    from bench.cost import Record, run_cost
    from bench.dryrun import COSTS
    from bench.plan import run_name
    from bench.tracking import Tracker, tracking_uri
    from core import files
    from reports.report import write_cost_report

    with files.audit():
        experiment, plans = load()
    protocol, uri = options.latency_protocol(args), tracking_uri(args.tracking_uri)
    cache, out = options.open_cache(args), options.report_dir(args, experiment)
    tracker = Tracker(uri, experiment)
    record = Record(args.costs or COSTS, shlex.join(["accelbench", *args.argv])) if args.record else None
    if record is not None and args.latency is False:
        raise UserError("--record writes what --latency times: drop --no-latency")
    for i, p in enumerate(plans, 1):
        timed = args.latency if args.latency is not None else record is not None or p.device.type == "cuda"
        print(f"cost {i}/{len(plans)}: {run_name(p)}" + (" (timed)" if timed else ""), file=sys.stderr, flush=True)
        run_cost(p, cache=cache, tracker=tracker, latency=protocol if timed else None, threads=args.threads,
                 record=record)
    path = write_cost_report(uri, experiment, out)
    print(path.read_text())
    print(f"cost table: {path}\n" + _store_line(uri, args, experiment))
    return 0


def cmd_run(args) -> int:
    from core import distributed
    from bench.plan import plan
    from bench.runner import run_trial
    from bench.tracking import NullTracker, Tracker, tracking_uri

    if args.dry_run:
        return _dry_run("dry run of one trial", lambda: [plan(_trial_from_args(args), checkpoints=args.checkpoints)],
                        args, args.warmup)
    if args.cost:
        return _cost(lambda: (args.experiment, [plan(_trial_from_args(args), checkpoints=args.checkpoints)]), args)
    # validate everything before touching the store or building anything
    p = plan(_trial_from_args(args), checkpoints=args.checkpoints)
    opts = options.run_options(args)
    world = distributed.init(p.trial.device)
    for m in p.metrics:
        if m.unavailable and world.main:
            print(f"accelbench: not computed: {m.unavailable}", file=sys.stderr)
    uri = tracking_uri(args.tracking_uri)
    cache = options.open_cache(args)
    tracker = Tracker(uri, args.experiment) if world.main else NullTracker()
    run_ids: list[str] = []
    metrics = run_trial(p, cache=cache, tracker=tracker, opts=opts, on_start=run_ids.append)
    if not world.main:  # rank 0 logs and prints the trial
        return 0
    print(format_result(p.trial.method, p.reference, metrics))
    compiled = {k: v for k, v in metrics.items() if k.endswith("compile_seconds")}
    if compiled:  # the warm-up compiles; the times above exclude it
        print("compile (warm-up) seconds: " + ", ".join(f"{k.split('/')[0] if '/' in k else 'method'} {v:.1f}"
                                                         for k, v in sorted(compiled.items())))
    print(f"\nrun id: {run_ids[0]} (experiment {args.experiment!r}; accelbench ui --compare takes two run ids)\n"
          + _store_line(uri, args, args.experiment))
    return 0


def format_result(method: str, reference: str, m: dict[str, float]) -> str:
    """A small markdown table: the method arm, the reference arm and any extra baseline arm of the same run; speed-ups
    are against the reference arm."""
    quality = sorted(k for k in m if "." in k and "/" not in k)
    extra = sorted({k.split("/")[0] for k in m if k.endswith("/" + NFE_PER_SAMPLE)} - {"ref"})
    head = ["arm", "NFE/sample", "tokens/step", "ms/sample (median)", "speed-up wall", "speed-up steps", *quality]
    rows = []
    ref_sec, ref_nfe = m["ref/" + SEC_PER_SAMPLE], m["ref/" + NFE_PER_SAMPLE]
    for arm, prefix in ((method, ""), (f"{reference} (reference)", "ref/"), *((a, f"{a}/") for a in extra)):
        rows.append([arm, f"{m[prefix + NFE_PER_SAMPLE]:.1f}", f"{m[prefix + 'step_compression']:.2f}",
                     f"{1000 * m[prefix + SEC_PER_SAMPLE]:.1f}",
                     f"{ref_sec / m[prefix + SEC_PER_SAMPLE]:.2f}x",
                     f"{ref_nfe / m[prefix + NFE_PER_SAMPLE]:.2f}x",
                     *(f"{m.get(prefix + q, float('nan')):.2f}" for q in quality)])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def cmd_suite(args) -> int:
    from core import distributed
    from bench.suite import load_suite, run_suite
    from bench.tracking import NullTracker, Tracker, tracking_uri
    from reports.report import write_report

    overrides = options.parse_params(args.param)
    if args.dry_run:
        def load():
            return load_suite(args.file, checkpoints=args.checkpoints, n_samples=args.n_samples, overrides=overrides,
                              fields=options.suite_fields(args)).plans

        return _dry_run(f"dry run of suite {args.file}", load, args, args.warmup)
    if args.cost:
        if args.launcher == "slurm":
            raise UserError("--cost runs on this machine: drop --launcher slurm")

        def load_suite_plans():
            s = load_suite(args.file, checkpoints=args.checkpoints, n_samples=args.n_samples, overrides=overrides,
                           fields=options.suite_fields(args))
            return s.experiment, s.plans

        return _cost(load_suite_plans, args)
    suite = load_suite(args.file, checkpoints=args.checkpoints, n_samples=args.n_samples, overrides=overrides,
                       fields=options.suite_fields(args))  # planned before anything runs
    opts, uri = options.run_options(args), tracking_uri(args.tracking_uri)
    cache, out = options.open_cache(args), options.report_dir(args, suite.experiment)
    slurm = options.slurm_options(args, out / "slurm")
    if slurm is None:
        world = distributed.init(args.device or "auto")
        tracker = Tracker(uri, suite.experiment) if world.main else NullTracker()
        ran, skipped = run_suite(suite, tracker=tracker, cache=cache, opts=opts, force=args.force)
        if not world.main:  # rank 0 reports
            return 0
        failed, where = [], ""
    else:  # a job per trial; the report once they have all ended
        from bench.launch import submit_suite

        ran, skipped, failed = submit_suite(suite, tracker=Tracker(uri, suite.experiment), cache=cache, opts=opts,
                                            slurm=slurm, force=args.force)
        where = f" as Slurm jobs ({len(failed)} failed)"
    print(f"suite {suite.experiment}: ran {ran} trials{where}, {skipped} already finished in the store")
    for line in failed:
        print(f"accelbench: failed: {line}", file=sys.stderr)
    path = write_report(uri, suite.experiment, out)
    print(f"report: {path}")
    print(_store_line(uri, args, suite.experiment))
    if failed:
        print("accelbench: the same command again runs the failed trials, each resuming from the samples it drew",
              file=sys.stderr)
    return 1 if failed else 0


def cmd_lambada(args) -> int:
    """lm-eval tasks (`--task`: lm-eval's own on local data, or the LAMBADA-format task of a tiny teacher's corpus)
    scored for a text teacher or a method's model, as a runner task: planned, budgeted, logged as one run."""
    from core.trial import MAX_COUNT, Trial
    from bench.plan import plan
    from bench.runner import run_lambada
    from bench.tracking import Tracker, tracking_uri
    from core.registry import TEACHERS
    from metrics import lambada

    tasks = tuple(args.task) or (lambada.CORPUS,)
    n = args.n if args.n is not None else CORPUS_PASSAGES if tasks == (lambada.CORPUS,) else MAX_COUNT  # every doc

    def load():
        method = args.method or TEACHERS.get(args.teacher).family.sampler  # no method: the teacher itself
        return [plan(Trial(teacher=args.teacher, method=method, params=options.parse_params(args.param), n_samples=n,
                           seed=args.seed, device=args.device, dtype=args.dtype),
                     checkpoints=args.checkpoints, tasks=tasks)]

    if args.dry_run:
        return _dry_run("dry run of lm-eval tasks", load, args, 0)
    p, = load()
    opts, uri = options.run_options(args), tracking_uri(args.tracking_uri)
    metrics = run_lambada(p, cache=options.open_cache(args), tracker=Tracker(uri, args.experiment), opts=opts)
    t = p.trial
    for task in tasks:
        what = (f"the LAMBADA-style task of {t.teacher}'s corpus" if task == lambada.CORPUS else
                f"lm-eval's {task} on {t.teacher}")
        prefix = lambada.CORPUS_KEY if task == lambada.CORPUS else task
        values = ", ".join(f"{k.split('.', 1)[1]} {metrics[k]:.4f}" for k in lambada.directions([task]))
        print(f"{t.method} on {what} ({metrics[prefix + '.documents']:.0f} documents): {values}")
    print(_store_line(uri, args, args.experiment))
    return 0


def register(sub) -> None:
    r = sub.add_parser("run", help="run one trial (method x teacher) and log it to MLflow")
    r.add_argument("config", nargs="?", help="a trial YAML file (instead of --teacher/--method/...)")
    r.add_argument("--teacher", help="teacher registry name (see `accelbench list`)")
    r.add_argument("--method", help="method registry name (see `accelbench list`)")
    options.method_knobs(r)
    r.add_argument("--teacher-param", action="append", default=[], metavar="KEY=VALUE",
                   help="a teacher setting, e.g. prompts=PartiPrompts.tsv (a file in --checkpoints); repeatable")
    r.add_argument("--metric", action="append", default=[], metavar="NAME[@EXTRACTOR]",
                   help="a quality metric, e.g. fid or fid@inception; repeatable")
    r.add_argument("--metric-repeats", type=int, default=1,
                   help="seeds over which stochastic metrics (KID, IS) are repeated: mean and .seed_std (default 1)")
    r.add_argument("--n-samples", type=int, default=64, help="samples per arm (default 64)")
    r.add_argument("--batch-size", type=int, default=1, help="samples per sampler call (default 1)")
    r.add_argument("--latency-batch", type=int, default=0, metavar="N",
                   help="time the arms under the latency protocol at this batch, apart from the quality batches, "
                        "for speedup_wall (a paper's timed batch; default 0: the quality batches are timed)")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N (default auto)")
    options.numerics_options(r, default=True)
    options.dry_run(r)
    options.cost(r)
    r.add_argument("--out", help="with --cost: where COST.md goes (default results/<experiment>)")
    options.execution(r, experiment=True)
    r.set_defaults(func=cmd_run)

    su = sub.add_parser("suite", help="run the trials of a suite file that are not finished yet, then write the report")
    su.add_argument("file", help="suite YAML (see suites/default.yaml)")
    su.add_argument("--out", help="report directory (default results/<experiment>)")
    su.add_argument("--force", action="store_true", help="rerun trials that already have a finished run")
    su.add_argument("--n-samples", type=int, help="replace every trial's sample count (a quick pass over a paper "
                                                   "suite; the trials' keys change with it)")
    su.add_argument("--param", action="append", default=[], metavar="KEY=VALUE",
                    help="set a knob in every trial whose method has it (e.g. train_steps=10 for a quick pass); "
                         "repeatable")
    su.add_argument("--device", help="every trial's device: auto, cpu, cuda or cuda:N (default: each trial's own, "
                                     "auto unless the file sets one; a trial's key includes it)")
    options.numerics_options(su, default=False)
    options.dry_run(su)
    options.cost(su)
    options.execution(su)
    options.launcher(su, "a job per trial without a finished run")
    su.set_defaults(func=cmd_suite)

    lb = sub.add_parser("lambada", help="LAMBADA and lm-eval's multiple-choice tasks (local data) for a text model")
    lb.add_argument("--teacher", required=True, help="a text teacher (and, for the corpus task, its corpus)")
    lb.add_argument("--method", help="score this method's model (e.g. an SDTT student) instead of the teacher")
    options.method_knobs(lb)
    lb.add_argument("--task", action="append", default=[], metavar="TASK",
                    help="lm-eval's own task on its data under --checkpoints (lambada_openai, arc_easy, "
                         "arc_challenge, hellaswag, mathqa, piqa, winogrande: <checkpoints>/lm-eval/<task>.<split>"
                         ".jsonl), or corpus (a LAMBADA-format task from a tiny teacher's held-out documents); "
                         "repeatable (default corpus)")
    lb.add_argument("--n", type=int, help=f"documents per task, at most (default: every document; {CORPUS_PASSAGES} "
                                          f"passages for the corpus task alone)")
    lb.add_argument("--seed", type=int, default=0)
    lb.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N (default auto)")
    lb.add_argument("--dtype", choices=("fp32", "bf16", "fp16"), default="fp32",
                    help="the model's compute dtype, under autocast (default fp32; SDTT's models run in bf16)")
    options.dry_run(lb)
    options.execution(lb, experiment=True)
    lb.set_defaults(func=cmd_lambada)
