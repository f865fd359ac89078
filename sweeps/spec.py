"""Study specs: a YAML file that names a base trial, the knobs to search, the objective(s) and how to search.

```yaml
study: sjd-window                 # Optuna study name (and the MLflow parent run's name)
experiment: accelbench-sweeps     # MLflow experiment of the parent and child runs (default: accelbench-sweeps)
base: {teacher: digits-ar-t2i, method: sjd, n_samples: 32, metrics: [fid]}
space:
  window: {type: int, low: 1, high: 64, log: true}
  init: {type: categorical, choices: [random, repeat-left]}
objectives:                       # a metric the base trial logs (checked before any trial), and its direction
  - {metric: speedup_wall, direction: maximize}
constraints:                      # feasible iff metric <= ref/metric + max_over_ref (the teacher arm's value), or,
  - {metric: fid.digits-cnn, max_over_ref: 1.0}   # for a higher-is-better guard, metric >= ref/metric - min_under_ref
sampler: tpe                      # tpe (default, single objective), nsga2 (default, multi-objective), grid
pruner: none                      # none or median (prunes between seeds)
n_trials: 20
seeds: [0]                        # each Optuna trial runs the base trial once per seed; objectives are averaged
```
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.config import check_seeds, read_yaml_mapping
from core.errors import UserError
from core.names import NFE_PER_SAMPLE, SPEEDUP_FLOPS, SPEEDUP_STEPS, SPEEDUP_WALL
from bench.plan import Plan, plan
from bench.runner import ARM_KEYS
from core.trial import Trial
from methods.base import Method

SPEC_FIELDS = {"study", "experiment", "base", "space", "objectives", "constraints", "sampler", "pruner", "n_trials",
               "seeds"}
PARAM_TYPES = ("int", "float", "categorical")
SAMPLERS = ("tpe", "nsga2", "grid")
PRUNERS = ("none", "median")
# beyond `ARM_KEYS`: a method's own counters and the FLOPs add "<name>_per_sample", a data-parallel arm
# "samples_per_sec_rank<r>"
PER_ARM = re.compile(r".+_per_sample|samples_per_sec_rank\d+")
# The method against the reference arm: logged bare only.
COMPARISONS = frozenset({SPEEDUP_WALL, f"{SPEEDUP_WALL}_noisy", SPEEDUP_STEPS, SPEEDUP_FLOPS})


@dataclass(frozen=True)
class Param:
    name: str
    type: str
    low: float | None = None
    high: float | None = None
    log: bool = False
    step: float | None = None
    choices: tuple = ()

    def suggest(self, trial) -> Any:
        if self.type == "categorical":
            return trial.suggest_categorical(self.name, list(self.choices))
        if self.type == "int":
            return trial.suggest_int(self.name, int(self.low), int(self.high), log=self.log, step=int(self.step or 1))
        return trial.suggest_float(self.name, self.low, self.high, log=self.log, step=self.step)

    def grid(self) -> list:
        if self.type == "categorical":
            return list(self.choices)
        if self.type == "int":
            return list(range(int(self.low), int(self.high) + 1, int(self.step or 1)))
        raise UserError(f"space: grid sampling needs a 'step' or choices for float knob {self.name!r}")


@dataclass(frozen=True)
class Objective:
    metric: str
    direction: str  # "minimize" | "maximize"


@dataclass(frozen=True)
class Constraint:
    metric: str
    bound: float  # how far the metric may move past the reference arm's value, in its bad direction
    above: bool  # True: a ceiling (max_over_ref, lower is better); False: a floor (min_under_ref)

    def violation(self, value: float, ref: float) -> float:
        """<= 0 when feasible (Optuna's constraints_func convention)."""
        return value - ref - self.bound if self.above else ref - value - self.bound


@dataclass(frozen=True)
class StudySpec:
    study: str
    experiment: str
    base: dict
    space: tuple[Param, ...]
    objectives: tuple[Objective, ...]
    constraints: tuple[Constraint, ...]
    sampler: str
    pruner: str
    n_trials: int
    seeds: tuple[int, ...]
    checkpoints: Path  # the folder of the user's files (`--checkpoints`) every trial of the study is planned with

    @property
    def directions(self) -> list[str]:
        return [o.direction for o in self.objectives]

    def trial(self, knobs: dict, seed: int) -> Plan:
        """The planned trial of these knobs and seed."""
        base = dict(self.base)
        return plan(Trial.from_mapping({**base, "params": {**base.get("params", {}), **knobs}, "seed": seed}),
                    checkpoints=self.checkpoints)


def never_logged(key: str, p: Plan) -> str | None:
    """Why a trial planned as `p` never logs the metric `key`, or None when it may.

    The exact keys are known only once a trial has run: an extractor's name ("fid.digits-cnn",
    "fid.inception-v3-tf1.adm-in256"), a method's counters and extra arms, what its training reports. So this refuses
    what cannot match what is declared: a metric the trial does not compute, a key the runner never logs, an arm or a
    training the method does not have."""
    arm, sep, name = key.partition("/")
    if not sep:
        arm, name = "", key
    if arm == "fit":
        return None if p.method_cls.fit is not Method.fit else f"method {p.trial.method!r} trains nothing: no 'fit/'"
    if arm not in ("", "ref") and p.method_cls.extra_arms is Method.extra_arms:
        return f"method {p.trial.method!r} has no arm {arm!r}: its keys are bare, the teacher arm's under 'ref/'"
    if "." in name:  # a metric's key: "<metric>.<extractor>[...]" (`metrics.base.Metric.compute`)
        metric = name.split(".", 1)[0]
        computed = {m.cls.name: m for m in p.metrics}
        if metric not in computed:
            return (f"{metric!r} is not one of its metrics ({', '.join(m.spec for m in p.metrics) or 'none'}); name "
                    f"the metric in base.metrics")
        if computed[metric].unavailable:
            return f"metric {computed[metric].spec!r} cannot be computed here: {computed[metric].unavailable}"
        return None
    if name in COMPARISONS:
        return None if not arm else f"{name!r} compares the method's arm with the teacher's: it is logged bare only"
    if name in ARM_KEYS or PER_ARM.fullmatch(name):
        return None
    return (f"{name!r} is neither a key the runner logs (e.g. {SPEEDUP_WALL}, {NFE_PER_SAMPLE}, "
            f"sec_per_sample_median) nor a metric's ('<metric>.<extractor>', e.g. fid.digits-cnn)")


def _param(name: str, d: Any) -> Param:
    where = f"space: knob {name!r}"
    if not isinstance(d, dict) or d.get("type") not in PARAM_TYPES:
        raise UserError(f"{where}: needs 'type', one of {', '.join(PARAM_TYPES)}")
    if d["type"] == "categorical":
        if not isinstance(d.get("choices"), list) or not d["choices"]:
            raise UserError(f"{where}: categorical needs a non-empty 'choices' list")
        return Param(name, "categorical", choices=tuple(d["choices"]))
    low, high = d.get("low"), d.get("high")
    if not isinstance(low, (int, float)) or not isinstance(high, (int, float)) or low > high:
        raise UserError(f"{where}: needs numeric 'low' <= 'high', got {low!r}, {high!r}")
    if d.get("log") and low <= 0:
        raise UserError(f"{where}: log scale needs low > 0, got {low!r}")
    return Param(name, d["type"], float(low), float(high), bool(d.get("log", False)), d.get("step"))


def load_spec(path: str, *, checkpoints: Path, **overrides: Any) -> StudySpec:
    d = read_yaml_mapping(path, "study spec", SPEC_FIELDS)
    d.update({k: v for k, v in overrides.items() if v is not None})
    try:
        return _build(d, checkpoints)
    except UserError as exc:
        raise UserError(f"study spec {path}: {exc}") from None


def _build(d: dict, checkpoints: Path) -> StudySpec:
    if not isinstance(d.get("study"), str) or not d["study"]:
        raise UserError("'study' must be a non-empty name")
    if not isinstance(d.get("base"), dict) or not isinstance(d.get("space"), dict) or not d["space"]:
        raise UserError("'base' must be a trial mapping and 'space' a non-empty mapping of knobs")
    space = tuple(_param(k, v) for k, v in d["space"].items())
    objectives = []
    for o in d.get("objectives") or []:
        if not isinstance(o, dict) or o.get("direction") not in ("minimize", "maximize") or "metric" not in o:
            raise UserError(f"objective {o!r}: needs 'metric' and 'direction' (minimize or maximize)")
        objectives.append(Objective(o["metric"], o["direction"]))
    if not objectives:
        raise UserError("'objectives' must list at least one {metric, direction}")
    constraints = []
    for c in d.get("constraints") or []:
        bounds = [k for k in ("max_over_ref", "min_under_ref") if isinstance(c, dict) and k in c]
        if not isinstance(c, dict) or "metric" not in c or len(bounds) != 1 or set(c) != {"metric", *bounds} \
                or not isinstance(c[bounds[0]], (int, float)) or isinstance(c[bounds[0]], bool):
            raise UserError(f"constraint {c!r}: needs 'metric' and one numeric 'max_over_ref' or 'min_under_ref'")
        constraints.append(Constraint(c["metric"], float(c[bounds[0]]), bounds[0] == "max_over_ref"))
    sampler = d.get("sampler") or ("nsga2" if len(objectives) > 1 else "tpe")
    if sampler not in SAMPLERS:
        raise UserError(f"sampler must be one of {', '.join(SAMPLERS)}, got {sampler!r}")
    pruner = d.get("pruner") or "none"
    if pruner not in PRUNERS:
        raise UserError(f"pruner must be one of {', '.join(PRUNERS)}, got {pruner!r}")
    if pruner != "none" and len(objectives) > 1:
        raise UserError("pruning needs a single objective")
    n_trials = d.get("n_trials", 10)
    seeds = d.get("seeds", [0])
    if not isinstance(n_trials, int) or isinstance(n_trials, bool) or n_trials <= 0:
        raise UserError(f"n_trials must be a positive integer, got {n_trials!r}")
    seeds = check_seeds(seeds, "spec")
    spec = StudySpec(d["study"], d.get("experiment") or "accelbench-sweeps", dict(d["base"]), space,
                     tuple(objectives), tuple(constraints), sampler, pruner, n_trials, seeds, checkpoints)
    # Validate the base trial and every knob name now, with each knob at a value from its range.
    planned = spec.trial({p.name: (p.choices[0] if p.type == "categorical" else (int(p.low) if p.type == "int" else
                                                                                  p.low)) for p in space}, seeds[0])
    # A metric no trial logs would fail every trial of the study, one after the other: refused before the first.
    named = [(o.metric, f"objective metric {o.metric!r}") for o in objectives]
    for c in constraints:
        named += [(c.metric, f"constraint metric {c.metric!r}"),
                  (f"ref/{c.metric}", f"constraint metric {c.metric!r} is bounded by the teacher arm's "
                                      f"'ref/{c.metric}', which")]
    for key, subject in named:
        if why := never_logged(key, planned):
            raise UserError(f"{subject} is never logged by the base trial: {why}")
    if sampler == "grid":
        for p in space:
            p.grid()
    return spec
