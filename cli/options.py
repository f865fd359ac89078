"""Options shared by the `accelbench` subcommands, declared once: where results go, where the cache lives, how trials
run (threads, warm-up, progress bars, budgets), and the trial fields of `run` and `lambada`."""
from __future__ import annotations

import argparse
import os
from pathlib import Path

from core.errors import UserError

DEFAULT_EXPERIMENT = "accelbench"


def store(sp: argparse.ArgumentParser, experiment: bool = False) -> None:
    sp.add_argument("--tracking-uri", help="MLflow tracking URI (default $MLFLOW_TRACKING_URI or sqlite:///mlflow.db)")
    if experiment:
        sp.add_argument("--experiment", default=DEFAULT_EXPERIMENT, help="MLflow experiment name")


def cache(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--cache-dir", help="cache root (default $ACCELBENCH_CACHE or ~/.cache/accelbench)")


def open_cache(args):
    """The cache of `--cache-dir`, its folder checked writable (or creatable) before any work."""
    from core.cache import DEFAULT_ROOT, Cache
    from core.config import writable_dir

    return Cache(writable_dir(args.cache_dir or DEFAULT_ROOT, "cache directory (--cache-dir)"))


def report_dir(args, experiment: str):
    """The report folder of `--out` (default results/<experiment>), checked writable (or creatable) before any work."""
    from pathlib import Path

    from core.config import writable_dir

    return writable_dir(args.out or Path("results") / experiment, "report directory (--out)")


def checkpoints(sp: argparse.ArgumentParser) -> None:
    """`--checkpoints`: the one place the folder's default is read; every command hands the folder down from here."""
    from core.cache import CHECKPOINTS_ENV

    sp.add_argument("--checkpoints", metavar="DIR", type=lambda s: Path(s).expanduser(),
                    default=Path(os.environ.get(CHECKPOINTS_ENV) or "checkpoints").expanduser(),
                    help="folder of the real checkpoints' files, by their official names (default "
                         f"${CHECKPOINTS_ENV} or ./checkpoints)")


def dry_run(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--dry-run", action="store_true",
                    help="plan only: list the files each trial needs under --checkpoints (and which are missing), the "
                         "samples and forward passes per arm and the estimated device-hours; nothing is trained, "
                         "loaded or logged")
    sp.add_argument("--device-kind", metavar="MACHINE",
                    help="with --dry-run: price for this machine (cpu-amd-epyc, nvidia-h100-80gb-hbm3, ...; default "
                         "the current device's), each trial at its dtype: the device kind <machine>-<dtype> of a file "
                         "of --costs")
    sp.add_argument("--ranks", type=int, default=1, metavar="N",
                    help="with --dry-run: the ranks (GPUs) a trial runs on: wall time is the device-hours over N")
    sp.add_argument("--costs", type=Path, metavar="DIR",
                    help="the measured per-pass costs, one YAML file per device kind (default bench/costs/ of the "
                         "project); --cost --latency --record writes there")


def cost(sp: argparse.ArgumentParser) -> None:
    """--cost, --record and --latency: the cost mode of `run` and `suite` (`bench.cost`)."""
    sp.add_argument("--cost", action="store_true",
                    help="the cost mode: every arm at full size with seeded random weights (no checkpoint needed): "
                         "parameters, FLOPs and NFE per sample, and latency (--latency); logged as cost runs, "
                         "COST.md beside the report")
    sp.add_argument("--record", action="store_true",
                    help="with --cost --latency: write each timed arm's per-pass cost into --costs "
                         "(<device kind>.recorded.yaml), for dry runs to price plans on this device")
    sp.add_argument("--latency", action=argparse.BooleanOptionalAction, default=None,
                    help="with --cost: time every arm under the latency protocol on the trial's device (default: on "
                         "CUDA only; a full-size teacher's sample takes minutes on a CPU)")


def latency_protocol(args):
    from core.latency import LatencyProtocol

    return LatencyProtocol(warmup=args.latency_warmup, min_count=args.latency_min_count,
                           min_seconds=args.latency_min_seconds)


def execution(sp: argparse.ArgumentParser, experiment: bool = False) -> None:
    """The options of every command that runs trials (run, suite, sweep, worker, lambada)."""
    store(sp, experiment)
    cache(sp)
    checkpoints(sp)
    sp.add_argument("--threads", type=int, default=1, help="torch threads while sampling (default 1)")
    sp.add_argument("--warmup", type=int, default=2, help="warm-up batches per arm before timing (default 2)")
    sp.add_argument("--no-progress", action="store_true", help="no progress bars")
    sp.add_argument("--latency-warmup", type=int, default=10, metavar="N",
                    help="latency protocol (a trial's latency_batch, the cost mode): warm-up calls per arm at "
                         "the timed batch (default 10)")
    sp.add_argument("--latency-min-count", type=int, default=10, metavar="N",
                    help="latency protocol: timed calls per arm, at least (default 10)")
    sp.add_argument("--latency-min-seconds", type=float, default=1.0, metavar="S",
                    help="latency protocol: timed seconds per arm, at least (default 1)")
    sp.add_argument("--time-budget", type=float, default=0.0, metavar="SECONDS",
                    help="stop a trial that takes longer, teacher training included (default 0 = no limit)")
    sp.add_argument("--memory-budget", type=float, default=0.0, metavar="MB",
                    help="stop a trial when the process's resident memory exceeds this (libraries included; "
                         "default 0 = no limit)")


def execution_argv(args) -> list[str]:
    """The execution options of `args` as command-line arguments (for worker processes)."""
    argv = ["--threads", str(args.threads), "--warmup", str(args.warmup), "--time-budget", str(args.time_budget),
            "--memory-budget", str(args.memory_budget), "--latency-warmup", str(args.latency_warmup),
            "--latency-min-count", str(args.latency_min_count), "--latency-min-seconds", str(args.latency_min_seconds)]
    for flag, value in (("--tracking-uri", args.tracking_uri), ("--cache-dir", args.cache_dir),
                        ("--checkpoints", args.checkpoints.absolute())):
        if value is not None:
            argv += [flag, str(value)]
    return argv + (["--no-progress"] if args.no_progress else [])


SLURM_OPTIONS = {"nodes": "--nodes", "gpus_per_node": "--gpus-per-node", "partition": "--partition",
                 "timeout_min": "--timeout-min", "cpus_per_task": "--cpus-per-task", "slurm_folder": "--slurm-folder"}


def launcher(sp: argparse.ArgumentParser, what: str) -> None:
    """--launcher and the Slurm job options of `suite` and `sweep` (`bench.launch`); unset, `SlurmOptions`' defaults."""
    sp.add_argument("--launcher", choices=("local", "slurm"), default="local",
                    help=f"local: in this process (default); slurm: {what}, submitted to Slurm through submitit; "
                         "the command waits for them (docs/cluster.md)")
    slurm = sp.add_argument_group("Slurm jobs (--launcher slurm)")
    slurm.add_argument("--nodes", type=int, help="nodes per job; a trial's ranks span them (default 1)")
    slurm.add_argument("--gpus-per-node", type=int, metavar="N",
                       help="GPUs per node, one rank each (default 0: a CPU job, one rank per node)")
    slurm.add_argument("--partition", help="Slurm partition (default: the cluster's)")
    slurm.add_argument("--timeout-min", type=int, metavar="MIN",
                       help="minutes before Slurm ends a job (default 1440); its trial resumes when resubmitted")
    slurm.add_argument("--cpus-per-task", type=int, metavar="N", help="CPU cores per rank (default: the cluster's)")
    slurm.add_argument("--slurm-folder", metavar="DIR",
                       help="submitit's job scripts, logs and results, on a file system every node sees (default "
                            "results/<experiment>/slurm)")


def slurm_options(args, folder):
    """The `SlurmOptions` of `--launcher slurm` (jobs' files in `--slurm-folder`, default `folder`, checked writable),
    or None for `--launcher local`, which refuses the Slurm options rather than ignore them."""
    from bench.launch import SlurmOptions
    from core.config import writable_dir

    given = {k: getattr(args, k) for k in SLURM_OPTIONS if getattr(args, k) is not None}
    if args.launcher != "slurm":
        if given:
            raise UserError(f"{SLURM_OPTIONS[next(iter(given))]} is an option of --launcher slurm")
        return None
    given["folder"] = writable_dir(given.pop("slurm_folder", folder), "Slurm job folder (--slurm-folder)")
    return SlurmOptions(**given)


def run_options(args):
    from bench.runner import RunOptions

    return RunOptions(warmup=args.warmup, threads=args.threads, progress=not args.no_progress,
                      time_budget=args.time_budget, memory_budget=args.memory_budget, latency=latency_protocol(args))


def numerics_options(sp: argparse.ArgumentParser, default: bool) -> None:
    """--dtype, --tf32 and --compile: a trial's fields (`run`, with their defaults) or overrides of every suite trial's
    (`suite`, unset: each trial keeps the suite file's, e.g. a paper's own precision)."""
    keep = " (default: each trial's own, from the suite file)"
    sp.add_argument("--dtype", choices=("fp32", "bf16", "fp16"), default="fp32" if default else None,
                    help="the arms' compute dtype: fp16/bf16 under autocast" + (" (default fp32)" if default else keep))
    sp.add_argument("--tf32", choices=("on", "off"), default="off" if default else None,
                    help="TF32 matmuls on CUDA (no effect on the CPU)" + (" (default off)" if default else keep))
    sp.add_argument("--compile", action="store_true" if default else argparse.BooleanOptionalAction,
                    default=False if default else None,
                    help="torch.compile the networks' blocks in both arms; compilation is timed apart (warm-up)"
                         + ("" if default else keep))


def suite_fields(args) -> dict:
    """The --device / --dtype / --tf32 / --compile a suite command sets, as trial fields (those left unset are
    absent)."""
    given = {"device": args.device, "dtype": args.dtype, "tf32": None if args.tf32 is None else args.tf32 == "on",
             "compile": args.compile}
    return {k: v for k, v in given.items() if v is not None}


def method_knobs(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--param", action="append", default=[], metavar="KEY=VALUE", help="a method knob; repeatable")


def parse_params(items: list[str], option: str = "--param") -> dict[str, str]:
    params = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UserError(f"{option} expects KEY=VALUE, got {item!r}")
        if key.strip() in params:  # the last would silently win
            raise UserError(f"{option} {key.strip()} is given twice ({params[key.strip()]!r} and {value.strip()!r})")
        params[key.strip()] = value.strip()
    return params
