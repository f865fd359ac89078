"""Study specs: a YAML file that names a base trial, the knobs to search, the objective(s) and how to search.

```yaml
study: sjd-window                 # Optuna study name (and the MLflow parent run's name)
experiment: accelbench-sweeps     # MLflow experiment of the parent and child runs (default: accelbench-sweeps)
base: {teacher: digits-ar-t2i, method: sjd, n_samples: 32, metrics: [fid]}
space:
  window: {type: int, low: 1, high: 64, log: true}
  init: {type: categorical, choices: [random, repeat-left]}
objectives:                       # a metric logged by the runner, and its direction
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

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.config import check_seeds, read_yaml_mapping
from core.errors import UserError
from bench.plan import Plan, plan
from core.trial import Trial

SPEC_FIELDS = {"study", "experiment", "base", "space", "objectives", "constraints", "sampler", "pruner", "n_trials",
               "seeds"}
PARAM_TYPES = ("int", "float", "categorical")
SAMPLERS = ("tpe", "nsga2", "grid")
PRUNERS = ("none", "median")


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
    spec.trial({p.name: (p.choices[0] if p.type == "categorical" else (int(p.low) if p.type == "int" else p.low))
                for p in space}, seeds[0])
    if sampler == "grid":
        for p in space:
            p.grid()
    return spec
