"""The runner: one planned trial (`bench.plan`) = teacher -> fit -> warm-up -> timed sampling of both arms ->
metrics -> one MLflow run.

The reference arm (the teacher's own sampler, its family's, with the method's `sampling` config) runs in the same
process, on the same conditions and batch sizes, with its batches interleaved with the method's, so every speed-up
is a ratio measured side by side under the same machine load. Its draws are kept in the cache (`reference_key`):
a later trial under the same reference settings timed under the latency protocol (`latency_batch`) reads them.

`run_trial` samples and scores; `run_lambada` scores the model on lm-eval tasks instead (`accelbench lambada`, a
suite's lm-eval rows, `metrics.lambada`); `execute` is the path they share: under the budgets, with training runs
reported to the tracker, as one MLflow run.
"""
from __future__ import annotations

import contextlib
import hashlib
import io
import json
import math
import statistics
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from core import distributed, precision
from core.budget import budget
from core.cache import Cache
from core.config import config_dict
from core.envinfo import environment_tags, git_sha
from core.errors import UserError
from core.names import (HEADLINE_TAG, KIND_TAG, KNOBS_TAG, LAMBADA, NFE_PER_SAMPLE, SEC_PER_SAMPLE, SPEEDUP_FLOPS,
                         SPEEDUP_STEPS, SPEEDUP_WALL, TRIAL)
from core.paper import paper_tags
from core.rng import batch_seed
from core.samples import Samples
from core.spool import ArmSpool, Batch, TrialSpool, claim, shared_arm
from core.latency import Latency, LatencyProtocol, cv_pct
from core.timing import latency_stats, stopwatch
from bench import cost
from bench.plan import Plan, run_name
from bench.tracking import NullTracker, RunLog, Tracker
from core.training import progress_bars, threads, training_reports
from core.trial import Trial
from methods.base import TeacherSampler
from teachers import load_teacher


@dataclass(frozen=True)
class RunOptions:
    warmup: int = 2  # batches per arm before timing starts
    threads: int = 1  # torch intra-op threads while sampling (tiny models run faster on 1 thread here)
    progress: bool = True
    time_budget: float = 0.0  # seconds a trial may take, teacher training included; 0 = no limit
    memory_budget: float = 0.0  # MB of resident memory the process may reach during a trial; 0 = no limit
    latency: LatencyProtocol = LatencyProtocol()  # how a trial with a latency_batch times its arms

    def __post_init__(self):
        if self.warmup < 0 or self.threads < 1:
            raise UserError(f"--warmup must be >= 0 and --threads >= 1, got {self.warmup} and {self.threads}")
        if not (0 <= self.time_budget < math.inf and 0 <= self.memory_budget < math.inf):  # NaN fails both
            raise UserError(f"--time-budget and --memory-budget must be finite and >= 0 (0 = no limit), got "
                            f"{self.time_budget} and {self.memory_budget}")


SPREAD_SUFFIXES = (".std", ".seed_std")  # keys that measure a metric's spread, not its value


@dataclass
class ArmResult:
    spool: ArmSpool  # the samples and their conditions, on disk
    batch_seconds: list[float]
    batch_sizes: list[int]
    ranks: list[int]  # the rank that draws each batch
    counters: Counter
    compression: list[float]  # tokens per forward pass of each batch (per image at batch size 1)
    batch_passes: list[float]  # forward passes of each batch (its "nfe" counter)


def _batches(n: int, size: int) -> list[slice]:
    return [slice(i, min(i + size, n)) for i in range(0, n, size)]


def _sample_arms(arms: dict[str, Any], conds: torch.Tensor, trial: Trial, opts: RunOptions, device,
                 spools: dict[str, ArmSpool], world: distributed.World
                 ) -> tuple[dict[str, ArmResult] | None, dict[str, float]]:
    """Draw the batches this rank owns (batch i: rank i mod world size) that an arm's spool lacks, each arm's
    batches interleaved and timed, each batch spooled as it is drawn; then, on rank 0, every batch of every arm read
    back. Returns (the arms' results, or None on other ranks; the warm-up seconds per arm: with `compile`,
    compilation)."""
    from tqdm import tqdm  # here: `make gpu-bench` imports this module (through bench.suite) without tqdm

    batches = _batches(trial.n_samples, trial.batch_size)
    todo = [i for i in range(world.rank, len(batches), world.size)
            if not all(spools[name].has(i) for name in arms)]
    warmup: dict[str, float] = {}
    if todo:
        warm = torch.Generator(device).manual_seed(trial.seed + 1_000_003)
        for name, method in arms.items():
            if all(spools[name].has(i) for i in todo):  # read, not drawn (the reference arm's shared draws)
                continue
            seconds: list[float] = []
            with stopwatch(device, seconds):
                for _ in range(max(opts.warmup, trial.compile)):  # compilation never lands in a timed batch
                    with precision.autocast(device, trial.dtype):
                        method.sample(conds[: trial.batch_size], generator=warm)
            warmup[name] = seconds[0]
    for i in tqdm(todo, desc="sampling", unit="batch", disable=not opts.progress, leave=False):
        sl = batches[i]
        for name, method in arms.items():
            if spools[name].has(i):  # drawn before a kill, for this arm only
                continue
            seconds = []
            generator = torch.Generator(device).manual_seed(batch_seed(trial.seed, i))
            with stopwatch(device, seconds), precision.autocast(device, trial.dtype):
                out: Samples = method.sample(conds[sl], generator=generator)
            data = out.data.float() if out.data.is_floating_point() else out.data  # decoded and scored in float32
            spools[name].write(i, Batch(data, out.cond, out.counters, seconds[0]))
    world.barrier()
    if not world.main:
        return None, warmup
    results = {}
    for name in arms:
        r = results[name] = ArmResult(spools[name], [], [], [], Counter(), [], [])
        for i, sl in enumerate(batches):
            if not spools[name].has(i):
                raise UserError(f"rank 0 cannot see batch {i} of arm {name!r} in {spools[name].folder}: every rank "
                                f"must share the cache folder (--cache-dir on a file system all nodes mount)")
            b = spools[name].read(i)
            r.batch_seconds.append(b.seconds)
            r.batch_sizes.append(sl.stop - sl.start)
            r.ranks.append(i % world.size)
            r.counters.update(b.counters)
            r.compression.append(b.counters["tokens"] / b.counters["nfe"])
            r.batch_passes.append(b.counters["nfe"])
    return results, warmup


def _time_arms(arms: dict[str, Any], conds: torch.Tensor, t: Trial, protocol: LatencyProtocol,
               device: torch.device) -> dict:
    """The arms timed under the latency protocol at the trial's `latency_batch` (`bench.cost.time_calls`) on the
    trial's first conditions; rank 0 alone (the other ranks have finished drawing)."""
    batch = t.latency_batch
    cond = conds[:batch]
    if len(cond) < batch:  # fewer samples than the timed batch: the conditions repeat
        cond = cond.repeat((batch + len(cond) - 1) // len(cond), *([1] * (cond.dim() - 1)))[:batch]
    return cost.time_calls(arms, cond, t, protocol, device)


# What every arm of a trial logs (bare for the method's arm, under "<arm>/" for the others): its batch times
# (`latency_stats`, here of one batch), the latency protocol's figures, what `_arm_metrics` adds; a sweep's spec is
# checked against them (`sweeps.spec.never_logged`).
ARM_KEYS = frozenset({*latency_stats([1.0], [1]), *Latency((1.0,), 1, 0.0, 1.0).metrics(), "sec_per_sample_cv_pct",
                      "sec_per_pass_cv_pct", NFE_PER_SAMPLE, "step_compression", "acceptance_rate", "compile_seconds"})


def _arm_metrics(r: ArmResult, n: int) -> dict[str, float]:
    m = latency_stats(r.batch_seconds, r.batch_sizes, r.ranks)
    m["sec_per_sample_cv_pct"] = cv_pct([s / b for s, b in zip(r.batch_seconds, r.batch_sizes)])
    # the spread of the machine's speed: per forward pass, since a speculative sampler's work per sample varies with
    # what it accepts (SJD at batch 1: a CV of 10-20 % per sample on an idle machine, the timing itself steady)
    m["sec_per_pass_cv_pct"] = cv_pct([s / p for s, p in zip(r.batch_seconds, r.batch_passes)])
    m[NFE_PER_SAMPLE] = r.counters["nfe"] / n
    m["step_compression"] = sum(r.compression) / len(r.compression)
    if r.counters["drafts_verified"]:
        m["acceptance_rate"] = r.counters["drafts_accepted"] / r.counters["drafts_verified"]
    # every other counter a method keeps (draft passes, resampling tries, ...), per sample
    m.update({f"{k}_per_sample": v / n for k, v in r.counters.items() if k not in ("nfe", "tokens")})
    return m


SCORE_CHUNK = 256  # samples decoded and fed to the metrics at a time


def _score_arm(r: ArmResult, teacher, scorers: list, repeats: int,
               name: str) -> tuple[dict[str, float], str, bytes, str]:
    """Every metric's values on an arm's samples, read back from the spool a chunk at a time, a look at them (an 8x8
    grid of the first images, or every text, blank-line separated) and the sha256 of the samples and conditions in
    order (two runs drew the same samples iff they match). A stochastic metric is computed with seeds
    0..repeats-1: mean, and "<key>.seed_std"."""
    for metric in scorers:
        metric.reset()  # one metric object scores every arm against the same reference side
    grid, texts, digest = None, [], hashlib.sha256()
    for data, cond in r.spool.chunks(len(r.batch_sizes), SCORE_CHUNK):
        for tensor in (data, cond):  # bytes whatever the dtype (numpy has no bfloat16)
            digest.update(tensor.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
        decoded = teacher.decode(data)  # a (B, C, H, W) image batch, or B strings
        for metric in scorers:
            metric.update(decoded, cond)
        if isinstance(decoded, list):
            texts += decoded
        elif grid is None:  # chunks hold 256 samples: the first has the 64 of the grid
            grid = decoded[:64].float().cpu()
    values = {}
    for metric in scorers:
        if not metric.stochastic or repeats == 1:
            values.update(metric.compute(seed=0))
            continue
        runs = [metric.compute(seed=seed) for seed in range(repeats)]
        values.update({k: statistics.fmean(v[k] for v in runs) for k in runs[0]})
        values.update({f"{k}.seed_std": statistics.stdev(v[k] for v in runs)
                       for k in runs[0] if not k.endswith(SPREAD_SUFFIXES)})
    if texts:
        return values, f"{name}.txt", "\n\n".join(texts).encode(), digest.hexdigest()
    from torchvision.utils import save_image

    buf = io.BytesIO()
    big = torch.nn.functional.interpolate(grid, scale_factor=4, mode="nearest")
    save_image(big, buf, nrow=8, format="png", padding=2, pad_value=0.5)
    return values, f"{name}.png", buf.getvalue(), digest.hexdigest()


@dataclass
class Context:
    """What a trial's body gets: the plan, the loaded teacher, the fitted method, the open run, this rank's device."""

    plan: Plan
    teacher: Any
    method: Any
    fit_info: dict[str, float]
    cache: Cache
    log: RunLog
    device: torch.device


def execute(p: Plan, body: Callable[[Context], dict[str, float]], *, kind: str, name: str, cache: Cache,
            tracker: Tracker, opts: RunOptions, tags: dict[str, str] | None = None,
            on_start: Callable[[str], None] | None = None) -> dict[str, float]:
    """The shared path of every evaluation of a plan: budgets, progress switch, training runs reported to the
    tracker, the teacher loaded, one MLflow run (tagged `accelbench.kind` = `kind`) with the trial's params, the
    method built and fitted, then `body`, whose metrics are logged. `on_start` receives the run id as soon as the run
    exists, so a caller can find the run of a trial that never returns.

    In a data-parallel trial (`core.distributed`) every rank runs this; rank 0 alone logs, and it loads the teacher
    and fits the method first while the other ranks wait, so whatever is trained is trained once, by rank 0, into the
    shared cache, and the others load it from there; a method that trains with DDP (`trains_on_every_rank`) fits on
    every rank at once once the teacher is cached."""
    t, world = p.trial, distributed.world()
    device = world.device(p.device)
    if not world.main:
        tracker = NullTracker()
    with budget(opts.time_budget, opts.memory_budget), progress_bars(opts.progress and world.main), \
            training_reports(tracker.log_training):
        if not world.main:
            world.barrier()  # until rank 0 has the teacher (and, unless every rank fits, the method's training) cached
        teacher = load_teacher(t.teacher, cache=cache, device=device, checkpoints=p.checkpoints,
                               params=t.teacher_params)
        # Training (teachers, `fit`) keeps the process's threads (every core by default); sampling and scoring use
        # opts.threads. Measured on 2 idle cores: DD pairs 1.44x and DD student steps 1.63x faster on 2 threads than
        # on 1, the tiny samplers no faster.
        training_threads = torch.get_num_threads()
        with threads(opts.threads), tracker.run(name, {
                KIND_TAG: kind, "trial_key": p.key(), "teacher_key": str(p.teacher_cls.key()),
                "family": str(p.teacher_cls.family), **environment_tags(device),
                "precision": precision.describe(device, t.dtype, t.tf32, t.compile), **(tags or {})}) as log:
            if on_start is not None:
                on_start(log.run_id)
            # Knobs under their own names, so that the MLflow UI filters them as `params.window = '16'`; trial fields
            # and run settings beside them (a knob may not be named like one: `plan` refuses the config class).
            params = {k: v for k, v in t.to_dict().items() if k not in ("params", "teacher_params")}
            params.update(t.params)
            params.update({f"teacher.{k}": v for k, v in t.teacher_params.items()})
            params.update({f"ref.{k}": v for k, v in config_dict(p.sampling).items()})
            params.update({"metrics": ",".join(t.metrics), "reference": p.reference, "warmup": opts.warmup,
                           "threads": opts.threads, "world_size": world.size})
            log.log(params=params, tags={KNOBS_TAG: ",".join(sorted(t.params))})
            if hasattr(p.teacher_cls, "evaluation_data"):
                log.log_dataset(*p.teacher_cls.evaluation_data())
            method = p.method_cls(teacher, p.config)
            together = p.method_cls.trains_on_every_rank(p.config)
            if world.main and together:
                world.barrier()  # the teacher is cached: the other ranks load it and join the fit (DDP)
            with threads(training_threads):
                fit_info = method.fit(cache=cache, checkpoints=p.checkpoints)
            if world.main and not together:
                world.barrier()  # the other ranks may load and fit now: from the cache
            with precision.tf32(device, t.tf32):
                metrics = body(Context(p, teacher, method, fit_info, cache, log, device))
            log.log(metrics=metrics)
    return metrics


def run_trial(p: Plan, *, cache: Cache, tracker: Tracker, opts: RunOptions = RunOptions(),
              tags: dict[str, str] | None = None, on_start: Callable[[str], None] | None = None) -> dict[str, float]:
    """Run one planned trial and log it as one MLflow run; returns the logged metrics (on rank 0; other ranks of a
    data-parallel trial return {}). `tags` are added to the run (a sweep's parent run id, study and trial number).

    A run of this trial left RUNNING by a killed process is ended KILLED first, and the new run resumes from the
    trial's spooled samples (tags `resumed_from`: samples already drawn, `resumed_run`: the killed runs)."""
    world = distributed.world()
    tags = {**paper_tags(p.paper), **(tags or {})}
    # reference draws are shared between trials timed under the latency protocol anyway (`latency_batch`): for the
    # others, side-by-side timing of both arms' quality batches costs less than the protocol's calls would
    share = world.main and p.trial.latency_batch > 0
    with claim(cache.root, p.trial, spool_version(opts)) if world.main else contextlib.nullcontext() as spool, \
            shared_arm(cache.root, reference_key(p)) if share else contextlib.nullcontext() as shared:
        if world.main:
            ended = [run_id for run_id, line in tracker.end_orphans(f"tags.trial_key = '{p.trial.key()}'",
                                                                    [tracker.experiment_id]) if "KILLED" in line]
            if ended:
                tags["resumed_run"] = ",".join(ended)
        # every rank writes into rank 0's spools
        spool = TrialSpool(Path(world.broadcast(str(spool.folder) if world.main else None)))
        folder = world.broadcast(str(shared.folder) if world.main and shared is not None else None)
        shared = ArmSpool(Path(folder)) if folder else None
        metrics = execute(p, lambda ctx: _sample_and_score(ctx, opts, spool, shared), kind=TRIAL, name=run_name(p),
                          cache=cache, tracker=tracker, opts=opts, tags=tags, on_start=on_start)
        if world.main:  # logged: the spooled samples have served
            spool.remove()
    return metrics


def run_lambada(p: Plan, *, cache: Cache, tracker: Tracker, opts: RunOptions = RunOptions(),
                tags: dict[str, str] | None = None) -> dict[str, float]:
    """Score a plan's model on its lm-eval tasks (`Plan.tasks`, `metrics.lambada`: at most `n_samples` documents each,
    under the trial's dtype) instead of sampling, as one MLflow run tagged `accelbench.kind` = `lambada`, with the
    metrics' directions and the paper's numbers as a trial's are: `accelbench lambada` and a suite's lm-eval rows."""
    from metrics import lambada

    t = p.trial

    def score(ctx: Context) -> dict[str, float]:
        with tempfile.TemporaryDirectory() as folder, precision.autocast(ctx.device, t.dtype):
            values = lambada.run_tasks(ctx.teacher, ctx.method, tasks=p.tasks, cache=ctx.cache, n=t.n_samples,
                                       folder=Path(folder), device=ctx.device, checkpoints=p.checkpoints,
                                       progress=opts.progress)
        ctx.log.log(tags={"key_knobs": ",".join(p.method_cls.key_knobs),  # the report's knobs column, as a trial's
                          **{f"higher_is_better.{k}": str(v).lower() for k, v in lambada.directions(p.tasks).items()}})
        return values

    return execute(p, score, kind=LAMBADA, name=f"lambada[{','.join(p.tasks)}] {run_name(p)}", cache=cache,
                   tracker=tracker, opts=opts, tags={**paper_tags(p.paper), "lm_eval.tasks": ",".join(p.tasks),
                                                     **(tags or {})})


def spool_version(opts: RunOptions) -> str:
    """What a spooled batch's samples and wall time depend on beyond the trial: the code version and the torch
    threads it was drawn on. A resumed trial reads batches drawn under the same, never timings of another thread
    count beside its own (`core.spool.claim` discards a spool of another)."""
    return f"{git_sha()} threads={opts.threads}"


def reference_key(p: Plan) -> str:
    """The key of the reference arm's draws (`Plan.reference_draws`, with the teacher's weights and the code
    version): the folder of the cache's shared arm spool (`core.spool.shared_arm`)."""
    blob = json.dumps([p.reference_draws(), str(p.teacher_cls.key()), git_sha()])
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _spooled(spools: dict[str, ArmSpool], t: Trial) -> int:
    """Samples every arm already holds in its spool (0 unless the trial resumes or reads another trial's draws)."""
    return sum(sl.stop - sl.start for i, sl in enumerate(_batches(t.n_samples, t.batch_size))
               if all(s.has(i) for s in spools.values()))


def _sample_and_score(ctx: Context, opts: RunOptions, spool: TrialSpool, shared: ArmSpool | None) -> dict[str, float]:
    """Both arms drawn (or read), timed and scored. In a trial with a `latency_batch`, the reference arm's draws (a
    teacher-only trial's method arm: the same) go to the cache's shared spool `shared` (None: not shared, or another
    process holds it), which every such trial with the same `reference_key` reads instead of drawing again; the
    draws' batch times are then another trial's, so every arm's wall figures come from the latency protocol run
    here."""
    p, t, teacher, method, device = ctx.plan, ctx.plan.trial, ctx.teacher, ctx.method, ctx.device
    world = distributed.world()
    # A teacher-only trial (the method is the teacher's own sampler: its reference arm has the same sampler, settings
    # and seed) draws once; the reference arm's figures are those draws, not a second copy of them.
    alone = isinstance(method, TeacherSampler)
    arms = {"method": method, **({} if alone else {"ref": TeacherSampler(teacher, p.sampling)}),
            **method.extra_arms(cache=ctx.cache, device=device, checkpoints=p.checkpoints)}
    conds = teacher.conditions(t.n_samples, torch.Generator(device).manual_seed(t.seed)).to(device)
    spools = {name: spool.arm(name) for name in arms}
    reference = "method" if alone else "ref"
    if shared is not None:
        spools[reference] = shared
    batches = range(len(_batches(t.n_samples, t.batch_size)))
    read = world.broadcast(shared is not None and any(shared.has(i) for i in batches) if world.main else None)
    spooled = _spooled(spools, t) if world.main else 0
    world.barrier()  # counted before any rank draws
    with precision.compiled(t.compile, *arms.values()):
        results, warmup = _sample_arms(arms, conds, t, opts, device, spools, world)
        # the latency protocol at the paper's timed batch, apart from the quality batches (rank 0, once the ranks drew)
        timed = _time_arms(arms, conds, t, opts.latency, device) if results is not None and t.latency_batch else {}
    if results is None:  # not rank 0: its batches are in the spool
        return {}
    if alone:
        arms["ref"] = method
        timed = {**timed, "ref": timed["method"]} if timed else {}
    metrics = {f"fit/{k}": v for k, v in ctx.fit_info.items()}
    # FLOPs per sample of every arm, counted on one reference sample (`bench.cost.count_arms`): a speed-up no
    # machine's load moves
    ordered = {"ref": arms["ref"], **{k: v for k, v in arms.items() if k != "ref"}}
    for name, a in cost.count_arms(p, teacher, ordered, device, "counted: one reference sample", reads=False).items():
        prefix = "" if name == "method" else f"{name}/"
        metrics.update({prefix + k: v for k, v in a.metrics().items() if k.startswith(("gflops", "gmacs"))})
    if t.compile:  # the warm-up calls compile; the timed batches do not include it
        metrics.update({("" if name == "method" else f"{name}/") + "compile_seconds": v for name, v in warmup.items()})
    scorers = [m.cls(teacher, cache=ctx.cache, device=device, checkpoints=p.checkpoints, extractor=m.extractor)
               for m in p.metrics if m.unavailable is None]
    artifacts, hashes, scored = {}, {}, {}
    for name, r in results.items():
        arm = _arm_metrics(r, t.n_samples)
        if read:  # the batch times of draws read from the shared spool are another trial's: the protocol's instead
            arm = {k: v for k, v in arm.items() if not k.startswith(("sec_per_", "samples_per_sec"))}
            arm[SEC_PER_SAMPLE] = timed[name].median / timed[name].batch
        values, file_name, artifacts[file_name], hashes[f"samples_sha256.{name}"] = _score_arm(
            r, arms[name].teacher, scorers, t.metric_repeats, "samples" if name == "method" else f"{name}_samples")
        scored[name] = {**arm, **values}
    if alone:
        scored["ref"], hashes["samples_sha256.ref"] = scored["method"], hashes["samples_sha256.method"]
    for name, values in scored.items():
        metrics.update({("" if name == "method" else f"{name}/") + k: v for k, v in values.items()})
    if timed:
        for name, latency in timed.items():
            metrics.update({("" if name == "method" else f"{name}/") + k: v for k, v in latency.metrics().items()})
        metrics[SPEEDUP_WALL] = timed["ref"].median / timed["method"].median
        cvs = [timed["method"].cv, timed["ref"].cv]
    else:
        metrics[SPEEDUP_WALL] = metrics["ref/" + SEC_PER_SAMPLE] / metrics[SEC_PER_SAMPLE]
        cvs = [metrics["sec_per_pass_cv_pct"], metrics["ref/sec_per_pass_cv_pct"]]
    # a speed-up between arms whose timings spread too widely to trust is flagged, not averaged away
    metrics[SPEEDUP_WALL + "_noisy"] = float(max(cvs) > opts.latency.cv_bound)
    metrics[SPEEDUP_STEPS] = metrics["ref/" + NFE_PER_SAMPLE] / metrics[NFE_PER_SAMPLE]
    if metrics.get("gflops_per_sample"):
        metrics[SPEEDUP_FLOPS] = metrics["ref/gflops_per_sample"] / metrics["gflops_per_sample"]
    ctx.log.log(tags={
        "key_knobs": ",".join(p.method_cls.key_knobs),
        HEADLINE_TAG: str(p.headline).lower(),  # the report's headline row for the method is one of these
        # Directions travel with the numbers, so a report needs nothing but the store.
        **{f"higher_is_better.{k}": str(m.cls.higher_is_better).lower()
           for m in p.metrics for k in metrics
           if k.startswith(m.cls.name + ".") and not k.endswith(SPREAD_SUFFIXES)},
        **{f"unavailable.{m.spec.replace('@', '.')}": m.unavailable for m in p.metrics if m.unavailable},
        **{f"caveat.{k}": v for k, v in method.caveats().items()},
        **hashes, **({"resumed_from": str(spooled)} if spooled else {}),
        **({"reference_draws": shared.folder.name, "reference_read": str(read).lower()} if shared else {})})
    ctx.log.log_files({**artifacts, "trial.yaml": t.to_yaml().encode()})
    return metrics
