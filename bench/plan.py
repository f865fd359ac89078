"""A trial's plan: every name, knob, file and device checked, and the config resolved, before any work.

`plan` is what every command calls first (`run`, `suite`, `sweep`, `lambada`, a dry run); the runner
(`bench.runner`) executes the `Plan` it returns. A plan builds nothing: no teacher is loaded and no method
constructed, so a mistake in trial 40 of a suite is refused before trial 1 starts.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from core import files
from core.config import build_config, config_dict, knobs
from core.envinfo import resolve_device
from core.errors import UserError
from core.registry import METHODS, METRICS
from core.trial import Trial
from teachers import teacher_class


@dataclass(frozen=True)
class MetricPlan:
    """A requested metric, "name" or "name@extractor", checked before any work."""

    spec: str
    cls: Any
    extractor: str | None
    unavailable: str | None  # why it cannot be computed here (the run is tagged instead); None when it can

    @classmethod
    def parse(cls, spec: str, checkpoints: Path) -> "MetricPlan":
        name, at, extractor = spec.partition("@")
        metric_cls = METRICS.get(name)
        if at and not extractor:
            raise UserError(f"metric {spec!r}: name an extractor after '@' or drop the '@'")
        return cls(spec, metric_cls, extractor or None, metric_cls.check(extractor or None, checkpoints))



@dataclass
class Plan:
    """A validated trial: everything resolved, nothing built yet."""

    trial: Trial  # params resolved to the full config
    teacher_cls: Any
    method_cls: Any
    config: Any
    metrics: list[MetricPlan]
    device: torch.device
    checkpoints: Path  # the folder of the user's files (`--checkpoints`), where everything the trial reads is found
    paper: dict[str, Any] = dataclasses.field(default_factory=dict)  # the paper's numbers (`core.paper`), if any
    needs: tuple[files.Needed, ...] = ()  # the files it reads from the user, listed when planned in a dry run
    # lm-eval tasks its model is scored on instead of sampled (`accelbench lambada`, a suite's lm-eval rows,
    # `metrics.lambada`); empty: a trial, sampled and scored by its metrics
    tasks: tuple[str, ...] = ()

    def key(self) -> str:
        """The trial's key, or, scored on lm-eval tasks, the key of the trial and its tasks: never a sampled
        trial's."""
        if not self.tasks:
            return self.trial.key()
        return hashlib.sha256(json.dumps([self.trial.key(), *self.tasks]).encode()).hexdigest()[:16]

    @property
    def sampling(self) -> Any:
        """The family's sampling settings in the method's config: what the reference arm samples with."""
        return self.method_cls.sampling_of(self.config)

    @property
    def reference(self) -> str:
        """The name of the reference arm's sampler (the family's own sampler's registry name)."""
        return self.teacher_cls.family.sampler

    @property
    def headline(self) -> bool:
        """Whether the trial is a paper method (`Method.headline`) at its default key knobs: its run is tagged
        `accelbench.headline`, and the report's headline row for the method is chosen among such runs
        (`reports.tables.headline_table`)."""
        defaults = config_dict(self.method_cls.config_class(self.teacher_cls.family)())
        return self.method_cls.headline and all(self.trial.params.get(k) == defaults.get(k)
                                                for k in self.method_cls.key_knobs)

    def reference_draws(self) -> str:
        """What the reference arm's samples are a function of, as JSON (a teacher-only trial's method arm is the same
        draws): the teacher and its settings, the sampler's, the numerics, seed, sample count, batch and device kind.
        Trials that agree draw the same samples, so the first draws them and the others read them (`bench.runner`;
        the teacher's weights and the code version join the key where it runs)."""
        t = self.trial
        return json.dumps([t.teacher, dict(t.teacher_params), config_dict(self.sampling), t.dtype, t.tf32, t.compile,
                           t.seed, t.n_samples, t.batch_size, self.device.type], sort_keys=True, default=str)


def check_family(method: str, method_cls, teacher: str, teacher_cls) -> None:
    family = teacher_cls.family
    if family not in method_cls.families:
        raise UserError(f"method {method!r} does not accept teacher {teacher!r} (family {family}); it accepts: "
                        f"{', '.join(str(f) for f in method_cls.families)}")
    if teacher_cls.modality not in method_cls.modalities:
        raise UserError(f"method {method!r} needs a teacher that generates {' or '.join(method_cls.modalities)}; "
                        f"teacher {teacher!r} generates {teacher_cls.modality}")


RUN_FIELDS = frozenset({f.name for f in dataclasses.fields(Trial)} | {"reference", "warmup", "threads"})


def plan(trial: Trial, *, checkpoints: Path, paper: dict[str, Any] | None = None, tasks=()) -> Plan:
    """Validate a trial before any work: names, family and modality, knobs, batch size, device, the files it needs
    (inside `core.files.audit()`, a dry run, they are listed in `Plan.needs` instead of refused). `paper` holds the
    paper's numbers for this trial, already checked (`core.paper.check_paper`); `tasks`, the lm-eval tasks its model
    is scored on instead (`metrics.lambada.check`), their data files required like the teacher's."""
    if not files.auditing():
        return _plan(trial, checkpoints, paper, tasks)
    with files.audit() as needed:
        p = _plan(trial, checkpoints, paper, tasks)
    return dataclasses.replace(p, needs=tuple(needed))


def _plan(trial: Trial, checkpoints: Path, paper: dict[str, Any] | None, tasks) -> Plan:
    teacher_cls = teacher_class(trial.teacher, checkpoints, trial.teacher_params)
    method_cls = METHODS.get(trial.method)
    metrics = [MetricPlan.parse(m, checkpoints) for m in trial.metrics]
    check_family(trial.method, method_cls, trial.teacher, teacher_cls)
    for m in metrics:
        if m.cls.modality != teacher_cls.modality:
            valid = sorted(name for name, cls in METRICS.items() if cls.modality == teacher_cls.modality)
            raise UserError(f"metric {m.spec!r} scores {m.cls.modality} samples; teacher {trial.teacher!r} "
                            f"generates {teacher_cls.modality}; valid metrics: {', '.join(valid)}")
        m.cls.check_teacher(trial.teacher, teacher_cls, m.extractor, checkpoints)
        if trial.n_samples < m.cls.min_samples:
            raise UserError(f"metric {m.spec!r} needs at least {m.cls.min_samples} samples per arm, got n_samples "
                            f"{trial.n_samples}")
    owner = f"method {trial.method!r}"
    config_cls = method_cls.config_class(teacher_cls.family)
    clash = sorted(set(knobs(config_cls)) & RUN_FIELDS)
    if clash:  # a programming error in the method: its knob would overwrite a run's field in MLflow
        raise TypeError(f"{config_cls.__name__}: knob {clash[0]!r} is named like a trial field; rename it")
    config = build_config(config_cls, trial.params, owner=owner)
    try:
        config = method_cls.with_files(config, checkpoints)
    except ValueError as exc:
        raise UserError(f"{owner}: {exc}") from None
    if teacher_cls.family.check is not None:
        try:
            teacher_cls.family.check(teacher_cls, method_cls.sampling_of(config))
        except ValueError as exc:
            raise UserError(f"{owner} on teacher {trial.teacher!r}: {exc}") from None
    for batch in {trial.batch_size, trial.latency_batch or trial.batch_size}:
        if refusal := method_cls.batch_refusal(teacher_cls, batch):
            raise UserError(f"method {trial.method!r}: {refusal}")
    device = resolve_device(trial.device)
    if files.auditing():
        for path in getattr(teacher_cls, "files", tuple)():
            files.require(path, "")
    elif missing := getattr(teacher_cls, "unavailable", lambda: None)():
        raise UserError(f"teacher {trial.teacher!r}: {missing}")
    for path, missing in method_cls.required_files(config, checkpoints).items():
        files.require(path, missing)
    if tasks:
        from metrics import lambada

        tasks = lambada.check(tasks, trial.teacher, teacher_cls, trial.metrics, checkpoints)
    resolved = dataclasses.replace(trial, params=config_dict(config), device=str(device))
    return Plan(resolved, teacher_cls, method_cls, config, metrics, device, checkpoints, dict(paper or {}),
                tasks=tuple(tasks))



def run_name(p: Plan) -> str:
    """e.g. "sjd[window=16,init=random] digits-ar-t2i s0": the MLflow UI's run column tells settings apart. A knob set
    to "" (SDTT's `student`: none, the student is distilled here) is left out: it names nothing."""
    t = p.trial
    shown = ",".join(f"{k}={t.params[k]}" for k in p.method_cls.key_knobs if t.params.get(k, "") != "")
    return f"{t.method}[{shown}] {t.teacher} s{t.seed}" if shown else f"{t.method} {t.teacher} s{t.seed}"
