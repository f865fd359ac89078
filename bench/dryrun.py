"""A dry run (`accelbench suite FILE --dry-run`, `accelbench run ... --dry-run`): how a user plans a paper run offline.

For every trial, planned exactly as a real run plans it (names, knobs, metrics) but with its files listed instead of
refused (`core.files.audit`): the files it needs under `--checkpoints` and which are missing; the samples and forward
passes of each arm (`Method.passes`, the family's sampler for the reference arm); and an estimated cost in device-hours
from the per-pass costs the project's own cost benchmarks measured (`bench/costs.yaml`, each naming the device and the
command that measured it). Nothing is trained, loaded or logged.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

from core.config import read_yaml_mapping
from core.errors import UserError
from core.files import Needed
from core.trial import MAX_COUNT
from bench.plan import Plan
from methods.base import Passes, TeacherSampler

COSTS = Path(__file__).with_name("costs.yaml")
FREE_KINDS = ("lookup",)


@dataclass(frozen=True)
class Cost:
    """One teacher's measured cost at full size: seconds per pass of one sample, by kind (`methods.base.Passes`)."""

    length: int  # positions the sampler steps over: tokens generated, or a multi-scale teacher's scales
    seconds: dict[str, float]
    device: str
    command: str


@functools.cache
def costs(path: Path = COSTS) -> dict[str, Cost]:
    data = read_yaml_mapping(str(path), "cost table")
    out = {}
    for teacher, entry in data.items():
        try:
            out[teacher] = Cost(int(entry["length"]), {k: float(v) for k, v in entry["seconds"].items()},
                                str(entry["device"]), str(entry["command"]))
        except (KeyError, TypeError, ValueError, AttributeError):
            raise UserError(f"cost table {path}: entry {teacher!r} needs length, seconds (kind: s), device and "
                            f"command") from None
    return out


@dataclass(frozen=True)
class ArmCost:
    arm: str
    passes: Passes
    seconds: float | None  # all of the arm's samples, None when a kind has no measured cost
    unpriced: tuple[str, ...]


@dataclass(frozen=True)
class TrialCost:
    plan: Plan
    samples: int  # per arm, warm-up included
    arms: tuple[ArmCost, ...]  # empty when the teacher has no measured cost
    cost: Cost | None

    @property
    def seconds(self) -> float | None:
        if not self.arms or any(a.seconds is None for a in self.arms):
            return None
        return sum(a.seconds for a in self.arms)


def estimate(p: Plan, warmup: int) -> TrialCost:
    """The trial's arms, their passes and their cost (priced only with a measured cost for the teacher)."""
    samples = p.trial.n_samples + warmup * p.trial.batch_size
    cost = costs().get(p.trial.teacher)
    if cost is None:
        return TrialCost(p, samples, (), None)
    family = p.teacher_cls.family
    arms = {"ref": TeacherSampler.passes(p.sampling, family, cost.length)["method"],
            **p.method_cls.passes(p.config, family, cost.length)}
    out = []
    for arm, passes in arms.items():
        priced = {k: n for k, n in passes.counts.items() if k in cost.seconds or k in FREE_KINDS}
        unpriced = tuple(sorted(set(passes.counts) - set(priced)))
        seconds = None if unpriced else samples * sum(n * cost.seconds.get(k, 0.0) for k, n in priced.items())
        out.append(ArmCost(arm, passes, seconds, unpriced))
    return TrialCost(p, samples, tuple(out), cost)


def _hours(seconds: float | None) -> str:
    return "not priced" if seconds is None else f"{seconds / 3600:.3g} device-hours"


def _passes_text(passes: Passes) -> str:
    text = " + ".join(f"{n:g} {kind}" for kind, n in passes.counts.items()) or "none"
    return f"at most {text}" if passes.at_most else text


def report(title: str, checkpoints: Path, entries: list[tuple[Plan, list[Needed]]], warmup: int) -> str:
    """The dry run's text: the files, then a block per trial, then the totals."""
    lines = [title, "", f"files under --checkpoints {checkpoints.absolute()}:"]
    seen: dict[Path, bool] = {}
    for _, needed in entries:
        seen.update({n.path: n.present for n in needed})
    lines += [f"  {'ok     ' if present else 'MISSING'}  {path}" for path, present in seen.items()] or ["  (none)"]
    lines.append("")
    total, unpriced, devices = 0.0, 0, set()
    for i, (p, needed) in enumerate(entries, 1):
        t, est = p.trial, estimate(p, warmup)
        knobs = ", ".join(f"{k}={t.params[k]}" for k in p.method_cls.key_knobs if k in t.params)
        missing = sum(not n.present for n in needed)
        documents = "every document" if t.n_samples == MAX_COUNT else f"at most {t.n_samples} documents each"
        work = (f"lm-eval tasks {', '.join(p.tasks)}, {documents}" if p.tasks else
                f"{est.samples} samples per arm (batch {t.batch_size})")
        lines.append(f"trial {i}/{len(entries)}: {t.method}{f'[{knobs}]' if knobs else ''} on {t.teacher}, seed "
                     f"{t.seed}: {work}, {len(needed)} files ({missing} missing)")
        if paper := p.paper:
            lines.append(f"  paper: {', '.join(f'{k} {v}' for k, v in paper.items() if k != 'source')} "
                         f"({paper['source']})")
        if p.tasks:  # scored, not sampled: its passes depend on the documents' choices, known only from the data
            lines.append("  passes and cost: not planned (lm-eval scores the model's log-likelihoods; nothing is "
                         "sampled)")
        elif est.cost is None:
            lines.append(f"  passes and cost: not planned (no measured cost for teacher {t.teacher} in {COSTS.name})")
        for a in () if p.tasks else est.arms:
            lines.append(f"  {a.arm:<10} {_passes_text(a.passes)} per sample: {_hours(a.seconds)}"
                         + (f" (no measured cost of {', '.join(a.unpriced)})" if a.unpriced else ""))
        if p.method_cls.trains(p.config):
            lines.append("  fit: trains (or builds pairs) before sampling; not priced")
        if p.tasks or est.seconds is None:
            unpriced += 1
        else:
            total += est.seconds
            devices.add(f"{est.cost.device} ({est.cost.command})")
            lines.append(f"  estimated: {_hours(est.seconds)} on {est.cost.device}")
    lines += ["", f"total: {len(entries)} runs, {sum(not n for n in seen.values())} of {len(seen)} files missing, "
              f"{_hours(total)} estimated for sampling" + (f" ({unpriced} runs not priced)" if unpriced else ""),
              *(f"  per-pass costs measured on {d}" for d in sorted(devices)),
              "  A cost is seconds per pass of one sample, measured at full size and batch 1 (random weights: the "
              "cost does not depend on them), times passes times samples; batched sampling costs less per sample, "
              "and speculative arms are priced at their bound."]
    return "\n".join(lines)
