"""The runner: one trial = teacher -> fit -> warm-up -> timed sampling of both arms -> metrics -> one MLflow run.

The reference arm (the teacher's own sampler, its family's, with the method's `sampling` config) runs in the same
process, on the same conditions and batch sizes, with its batches interleaved with the method's, so every speed-up
is a ratio measured side by side under the same machine load.

`plan` validates a trial once, before any work; `run_trial` and `run_task` (an evaluation of the method's model that
is not sampling, e.g. `metrics.lambada`) take the plan and run it the same way: under the budgets, with training
runs reported to the tracker, as one MLflow run.
"""
from __future__ import annotations

import dataclasses
import io
import statistics
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
from tqdm import tqdm

from bench import files
from bench.budget import budget
from bench.cache import Cache
from bench.config import build_config, config_dict, knobs
from bench.envinfo import environment_tags, resolve_device
from bench.errors import UserError
from bench.paper import paper_tags
from bench.registry import METHODS, METRICS, TEACHERS
from bench.samples import Samples
from bench.spool import Spool
from bench.timing import latency_stats, stopwatch
from bench.tracking import RunLog, Tracker
from bench.training import progress_bars, threads, training_reports
from bench.trial import Trial
from methods.base import OwnSampler
from teachers import load_teacher


@dataclass(frozen=True)
class RunOptions:
    warmup: int = 2  # batches per arm before timing starts
    threads: int = 1  # torch intra-op threads while sampling (tiny models run faster on 1 thread here)
    progress: bool = True
    time_budget: float = 0.0  # seconds a trial may take, teacher training included; 0 = no limit
    memory_budget: float = 0.0  # MB of resident memory the process may reach during a trial; 0 = no limit

    def __post_init__(self):
        if self.warmup < 0 or self.threads < 1:
            raise UserError(f"--warmup must be >= 0 and --threads >= 1, got {self.warmup} and {self.threads}")
        if self.time_budget < 0 or self.memory_budget < 0:
            raise UserError(f"--time-budget and --memory-budget must be >= 0 (0 = no limit), got "
                            f"{self.time_budget} and {self.memory_budget}")


@dataclass(frozen=True)
class MetricPlan:
    """A requested metric, "name" or "name@extractor", checked before any work."""

    spec: str
    cls: Any
    extractor: str | None
    unavailable: str | None  # why it cannot be computed here (the run is tagged instead); None when it can

    @classmethod
    def parse(cls, spec: str) -> "MetricPlan":
        name, at, extractor = spec.partition("@")
        metric_cls = METRICS.get(name)
        if at and not extractor:
            raise UserError(f"metric {spec!r}: name an extractor after '@' or drop the '@'")
        return cls(spec, metric_cls, extractor or None, metric_cls.check(extractor or None))


SPREAD_SUFFIXES = (".std", ".seed_std")  # keys that measure a metric's spread, not its value


@dataclass
class Plan:
    """A validated trial: everything resolved, nothing built yet."""

    trial: Trial  # params resolved to the full config
    teacher_cls: Any
    method_cls: Any
    config: Any
    metrics: list[MetricPlan]
    device: torch.device
    paper: dict[str, Any] = dataclasses.field(default_factory=dict)  # the paper's numbers (`bench.paper`), if any
    needs: tuple[files.Needed, ...] = ()  # the files it reads from the user, listed when planned in a dry run

    @property
    def sampling(self) -> Any:
        """The family's sampling settings in the method's config: what the reference arm samples with."""
        return self.method_cls.sampling_of(self.config)

    @property
    def reference(self) -> str:
        """The name of the reference arm's sampler (the family's own sampler's registry name)."""
        return self.teacher_cls.family.sampler


def check_family(method: str, method_cls, teacher: str, teacher_cls) -> None:
    family = teacher_cls.family
    if family not in method_cls.families:
        raise UserError(f"method {method!r} does not accept teacher {teacher!r} (family {family}); it accepts: "
                        f"{', '.join(str(f) for f in method_cls.families)}")
    if teacher_cls.modality not in method_cls.modalities:
        raise UserError(f"method {method!r} needs a teacher that generates {' or '.join(method_cls.modalities)}; "
                        f"teacher {teacher!r} generates {teacher_cls.modality}")


RUN_FIELDS = frozenset({f.name for f in dataclasses.fields(Trial)} | {"reference", "warmup", "threads"})


def plan(trial: Trial, *, paper: dict[str, Any] | None = None) -> Plan:
    """Validate a trial before any work: names, family and modality, knobs, batch size, device, the files it needs
    (inside `bench.files.audit()`, a dry run, they are listed in `Plan.needs` instead of refused). `paper` holds the
    paper's numbers for this trial, already checked (`bench.paper.check_paper`)."""
    if not files.auditing():
        return _plan(trial, paper)
    with files.audit() as needed:
        p = _plan(trial, paper)
    return dataclasses.replace(p, needs=tuple(needed))


def _plan(trial: Trial, paper: dict[str, Any] | None) -> Plan:
    teacher_cls = TEACHERS.get(trial.teacher)
    method_cls = METHODS.get(trial.method)
    metrics = [MetricPlan.parse(m) for m in trial.metrics]
    check_family(trial.method, method_cls, trial.teacher, teacher_cls)
    for m in metrics:
        if m.cls.modality != teacher_cls.modality:
            valid = sorted(name for name, cls in METRICS.items() if cls.modality == teacher_cls.modality)
            raise UserError(f"metric {m.spec!r} scores {m.cls.modality} samples; teacher {trial.teacher!r} "
                            f"generates {teacher_cls.modality}; valid metrics: {', '.join(valid)}")
        m.cls.check_teacher(trial.teacher, teacher_cls, m.extractor)
    owner = f"method {trial.method!r}"
    config_cls = method_cls.config_class(teacher_cls.family)
    clash = sorted(set(knobs(config_cls)) & RUN_FIELDS)
    if clash:  # a programming error in the method: its knob would overwrite a run's field in MLflow
        raise TypeError(f"{config_cls.__name__}: knob {clash[0]!r} is named like a trial field; rename it")
    config = build_config(config_cls, trial.params, owner=owner)
    if teacher_cls.family.check is not None:
        try:
            teacher_cls.family.check(teacher_cls, method_cls.sampling_of(config))
        except ValueError as exc:
            raise UserError(f"{owner} on teacher {trial.teacher!r}: {exc}") from None
    if method_cls.batch_size_one and trial.batch_size != 1:
        raise UserError(f"method {trial.method!r} decodes one sequence at a time: batch_size must be 1, "
                        f"got {trial.batch_size}")
    device = resolve_device(trial.device)
    if files.auditing():
        for path in getattr(teacher_cls, "files", tuple)():
            files.require(path, "")
    elif missing := getattr(teacher_cls, "unavailable", lambda: None)():
        raise UserError(f"teacher {trial.teacher!r}: {missing}")
    for path, missing in method_cls.required_files(config).items():
        files.require(path, missing)
    resolved = dataclasses.replace(trial, params=config_dict(config), device=str(device))
    return Plan(resolved, teacher_cls, method_cls, config, metrics, device, dict(paper or {}))


@dataclass
class ArmResult:
    spool: Spool  # the samples and their conditions, on disk
    batch_seconds: list[float]
    batch_sizes: list[int]
    counters: Counter
    compression: list[float]  # tokens per forward pass of each batch (per image at batch size 1)


def _batches(n: int, size: int) -> list[slice]:
    return [slice(i, min(i + size, n)) for i in range(0, n, size)]


def _sample_arms(arms: dict[str, Any], conds: torch.Tensor, trial: Trial, opts: RunOptions, device, folder: Path):
    gens = {name: torch.Generator(device).manual_seed(trial.seed) for name in arms}
    warm = torch.Generator(device).manual_seed(trial.seed + 1_000_003)
    for _ in range(opts.warmup):
        for method in arms.values():
            method.sample(conds[: trial.batch_size], generator=warm)
    results = {name: ArmResult(Spool(folder / name), [], [], Counter(), []) for name in arms}
    for sl in tqdm(_batches(trial.n_samples, trial.batch_size), desc="sampling", unit="batch",
                   disable=not opts.progress, leave=False):
        for name, method in arms.items():
            r = results[name]
            with stopwatch(device, r.batch_seconds):
                out: Samples = method.sample(conds[sl], generator=gens[name])
            r.spool.append(out.data, out.cond)
            r.batch_sizes.append(sl.stop - sl.start)
            r.counters.update(out.counters)
            r.compression.append(out.counters["tokens"] / out.counters["nfe"])
    return results


def _arm_metrics(r: ArmResult, n: int) -> dict[str, float]:
    m = latency_stats(r.batch_seconds, r.batch_sizes)
    m["nfe_per_sample"] = r.counters["nfe"] / n
    m["step_compression"] = sum(r.compression) / len(r.compression)
    if r.counters["drafts_verified"]:
        m["acceptance_rate"] = r.counters["drafts_accepted"] / r.counters["drafts_verified"]
    # every other counter a method keeps (draft passes, resampling tries, ...), per sample
    m.update({f"{k}_per_sample": v / n for k, v in r.counters.items() if k not in ("nfe", "tokens")})
    return m


SCORE_CHUNK = 256  # samples decoded and fed to the metrics at a time


def _score_arm(spool: Spool, teacher, scorers: list, repeats: int, name: str) -> tuple[dict[str, float], str, bytes]:
    """Every metric's values on an arm's samples, read back from the spool a chunk at a time, and a look at them (an
    8x8 grid of the first images, or every text, blank-line separated). A stochastic metric is computed with seeds
    0..repeats-1: mean, and "<key>.seed_std"."""
    for metric in scorers:
        metric.reset()  # one metric object scores every arm against the same reference side
    grid, texts = None, []
    for data, cond in spool.chunks(SCORE_CHUNK):
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
        return values, f"{name}.txt", "\n\n".join(texts).encode()
    from torchvision.utils import save_image

    buf = io.BytesIO()
    big = torch.nn.functional.interpolate(grid, scale_factor=4, mode="nearest")
    save_image(big, buf, nrow=8, format="png", padding=2, pad_value=0.5)
    return values, f"{name}.png", buf.getvalue()


@dataclass
class Context:
    """What a trial's body gets: the plan, the loaded teacher, the fitted method, the open run."""

    plan: Plan
    teacher: Any
    method: Any
    fit_info: dict[str, float]
    cache: Cache
    log: RunLog


def execute(p: Plan, body: Callable[[Context], dict[str, float]], *, kind: str, name: str, cache: Cache,
            tracker: Tracker, opts: RunOptions, tags: dict[str, str] | None = None,
            on_start: Callable[[str], None] | None = None) -> dict[str, float]:
    """The shared path of every evaluation of a plan: budgets, progress switch, training runs reported to the
    tracker, the teacher loaded, one MLflow run (tagged `accelbench.kind` = `kind`) with the trial's params, the
    method built and fitted, then `body`, whose metrics are logged. `on_start` receives the run id as soon as the run
    exists, so a caller can find the run of a trial that never returns."""
    t = p.trial
    with budget(opts.time_budget, opts.memory_budget), progress_bars(opts.progress), \
            training_reports(tracker.log_training):
        teacher = load_teacher(t.teacher, cache=cache, device=p.device)
        # Training (teachers, `fit`) keeps the process's threads (every core by default); sampling and scoring use
        # opts.threads. Measured on 2 idle cores: DD pairs 1.44x and DD student steps 1.63x faster on 2 threads than
        # on 1, the tiny samplers no faster.
        training_threads = torch.get_num_threads()
        with threads(opts.threads), tracker.run(name, {
                "accelbench.kind": kind, "trial_key": t.key(), "teacher_key": str(p.teacher_cls.key()),
                "family": str(p.teacher_cls.family), **environment_tags(p.device), **(tags or {})}) as log:
            if on_start is not None:
                on_start(log.run_id)
            # Knobs under their own names, so that the MLflow UI filters them as `params.window = '16'`; trial fields
            # and run settings beside them (a knob may not be named like one: `plan` refuses the config class).
            params = {k: v for k, v in t.to_dict().items() if k != "params"}
            params.update(t.params)
            params.update({f"ref.{k}": v for k, v in config_dict(p.sampling).items()})
            params.update({"metrics": ",".join(t.metrics), "reference": p.reference, "warmup": opts.warmup,
                           "threads": opts.threads})
            log.log(params=params, tags={"accelbench.knobs": ",".join(sorted(t.params))})
            if hasattr(p.teacher_cls, "evaluation_data"):
                log.log_dataset(*p.teacher_cls.evaluation_data())
            method = p.method_cls(teacher, p.config)
            with threads(training_threads):
                fit_info = method.fit(cache=cache)
            metrics = body(Context(p, teacher, method, fit_info, cache, log))
            log.log(metrics=metrics)
    return metrics


def run_trial(p: Plan, *, cache: Cache, tracker: Tracker, opts: RunOptions = RunOptions(),
              tags: dict[str, str] | None = None, on_start: Callable[[str], None] | None = None) -> dict[str, float]:
    """Run one planned trial and log it as one MLflow run; returns the logged metrics. `tags` are added to the run
    (a sweep's parent run id, study and trial number)."""
    return execute(p, lambda ctx: _sample_and_score(ctx, opts), kind="trial", name=run_name(p), cache=cache,
                   tracker=tracker, opts=opts, tags={**paper_tags(p.paper), **(tags or {})}, on_start=on_start)


def run_name(p: Plan) -> str:
    """e.g. "sjd[window=16,init=random] digits-ar-t2i s0": the MLflow UI's run column tells settings apart."""
    t = p.trial
    shown = ",".join(f"{k}={t.params[k]}" for k in p.method_cls.key_knobs if k in t.params)
    return f"{t.method}[{shown}] {t.teacher} s{t.seed}" if shown else f"{t.method} {t.teacher} s{t.seed}"


def _sample_and_score(ctx: Context, opts: RunOptions) -> dict[str, float]:
    p, t, teacher, method = ctx.plan, ctx.plan.trial, ctx.teacher, ctx.method
    arms = {"method": method, "ref": OwnSampler(teacher, p.sampling),
            **method.extra_arms(cache=ctx.cache, device=p.device)}
    conds = teacher.conditions(t.n_samples, torch.Generator(p.device).manual_seed(t.seed)).to(p.device)
    metrics = {f"fit/{k}": v for k, v in ctx.fit_info.items()}
    scorers = [m.cls(teacher, cache=ctx.cache, device=p.device, extractor=m.extractor)
               for m in p.metrics if m.unavailable is None]
    artifacts = {}
    with tempfile.TemporaryDirectory(prefix="accelbench-samples-") as folder:
        results = _sample_arms(arms, conds, t, opts, p.device, Path(folder))
        for name, r in results.items():
            prefix = "" if name == "method" else f"{name}/"
            arm = _arm_metrics(r, t.n_samples)
            values, file_name, content = _score_arm(r.spool, arms[name].teacher, scorers, t.metric_repeats,
                                                    "samples" if name == "method" else f"{name}_samples")
            metrics.update({prefix + k: v for k, v in {**arm, **values}.items()})
            artifacts[file_name] = content
    metrics["speedup_wall"] = metrics["ref/sec_per_sample_median"] / metrics["sec_per_sample_median"]
    metrics["speedup_steps"] = metrics["ref/nfe_per_sample"] / metrics["nfe_per_sample"]
    defaults = config_dict(p.method_cls.config_class(p.teacher_cls.family)())
    at_defaults = all(p.trial.params.get(k) == defaults.get(k) for k in p.method_cls.key_knobs)
    ctx.log.log(tags={
        "key_knobs": ",".join(p.method_cls.key_knobs),
        # a paper method at its default key knobs: the report's headline row for the method
        "accelbench.headline": str(p.method_cls.headline and at_defaults).lower(),
        # Directions travel with the numbers, so a report needs nothing but the store.
        **{f"higher_is_better.{k}": str(m.cls.higher_is_better).lower()
           for m in p.metrics for k in metrics
           if k.startswith(m.cls.name + ".") and not k.endswith(SPREAD_SUFFIXES)},
        **{f"unavailable.{m.spec.replace('@', '.')}": m.unavailable for m in p.metrics if m.unavailable},
        **{f"caveat.{k}": v for k, v in method.caveats().items()}})
    ctx.log.log_files({**artifacts, "trial.yaml": t.to_yaml().encode()})
    return metrics
