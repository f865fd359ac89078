"""A dry run (`accelbench suite FILE --dry-run`, `accelbench run ... --dry-run`): how a user plans a paper run offline.

For every trial, planned exactly as a real run plans it (names, knobs, metrics) but with its files listed instead of
refused (`core.files.audit`): the files it needs under `--checkpoints` and which are missing; the samples and forward
passes of each arm (`Method.passes`, the family's sampler for the reference arm); and an estimated cost in device-hours
on a device kind from the per-pass costs measured on that kind at each batch size. A kind is a machine and a precision
(`cpu-amd-epyc-fp32`, `nvidia-h100-80gb-hbm3-bf16`): `--device-kind` names the machine (default the current
device's) and each trial's `dtype` the precision, so costs measured in bfloat16 never price a float32 trial, nor one
machine's another's (`bench/costs/`: the project's cost benchmarks on this CPU, and what the cost mode recorded on other
devices, `--cost --latency --record`; each entry names the device and the command that measured it). Nothing is
trained, loaded or logged.
"""
from __future__ import annotations

import dataclasses
import functools
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.config import read_yaml_mapping
from core.errors import UserError
from core.files import Needed
from core.latency import LatencyProtocol
from core.paper import TEXT_KEYS
from core.trial import MAX_COUNT
from bench.plan import Plan
from methods.base import Passes, TeacherSampler, Training

COSTS = Path(__file__).with_name("costs")  # one file per device kind (a hand-measured one, a recorded one)
FREE_KINDS = ("lookup",)


@dataclass(frozen=True)
class Entry:
    """Seconds per pass of one sample by kind (`methods.base.Passes`) at one batch size, and what measured them."""

    seconds: dict[str, float]
    device: str
    command: str


@dataclass(frozen=True)
class Cost:
    """One teacher's measured cost at full size on one device kind, by batch size: its passes (`batches`), and the
    training iterations of its trainers (`training`: seconds per sample per iteration by `Training.kind`)."""

    length: int  # positions the sampler steps over: tokens generated, or a multi-scale teacher's scales
    batches: dict[int, Entry]
    training: dict[int, Entry] = dataclasses.field(default_factory=dict)

    def at(self, batch: int, training: bool = False) -> tuple[Entry, int] | None:
        """The entry for `batch`, else the largest measured batch below it (per sample it costs at least as much:
        an upper bound), else None; of the training iterations with `training`."""
        entries = self.training if training else self.batches
        below = [b for b in entries if b <= batch]
        return (entries[max(below)], max(below)) if below else None


def device_machine(device) -> str:
    """The machine a device's costs are filed under: the GPU's name in lower case with dashes
    (`nvidia-h100-80gb-hbm3`), or `cpu-` and the CPU's model (`cpu-intel-xeon`, `cpu-amd-epyc-7b13`)."""
    import torch

    from core.envinfo import cpu_model

    if device.type == "cuda":
        return _slug(torch.cuda.get_device_name(device))
    return "cpu-" + _slug(re.sub(r"\((r|tm)\)|\b(processor|cpu)\b|@.*", " ", cpu_model().lower()))


def _slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def device_kind(machine: str, dtype: str) -> str:
    """The kind costs are filed and priced under: the machine and the precision that measured them (`cpu-intel-xeon-
    bf16`); one kind's costs never stand for another's."""
    return f"{machine}-{dtype}"


def _entry(data: Any, where: str) -> Entry:
    try:
        return Entry({k: float(v) for k, v in data["seconds"].items()}, str(data["device"]), str(data["command"]))
    except (KeyError, TypeError, ValueError, AttributeError):
        raise UserError(f"{where}: an entry needs seconds (kind: s), device and command") from None


@functools.cache
def costs(folder: Path = COSTS) -> dict[str, dict[str, Cost]]:
    """Device kind -> teacher -> its measured cost, from every YAML file in `folder` (`kind:`, `teachers:`); a
    recorded file's batches (`<kind>.recorded.yaml`, read after the hand-measured one) replace the same batches, its
    training entries (a teacher's `training:`, by batch) the same training batches."""
    out: dict[str, dict[str, Cost]] = {}
    for path in sorted(folder.glob("*.yaml"), key=lambda f: (f.name.endswith(".recorded.yaml"), f.name)):
        data = read_yaml_mapping(str(path), "cost table")
        kind, teachers = data.get("kind"), data.get("teachers")
        if not isinstance(kind, str) or not isinstance(teachers, dict):
            raise UserError(f"cost table {path}: needs 'kind' (a device kind) and 'teachers' (name: entry)")
        for teacher, entry in teachers.items():
            where = f"cost table {path}: teacher {teacher!r}"
            if not isinstance(entry, dict) or not isinstance(entry.get("batches"), dict) or "length" not in entry:
                raise UserError(f"{where} needs length and batches (batch size: entry)")
            if not isinstance(entry.get("training", {}), dict):
                raise UserError(f"{where}: training needs batch size: entry")
            old = out.setdefault(kind, {}).get(teacher)
            merged = [{**(getattr(old, section) if old else {}),
                       **{int(b): _entry(e, f"{where}, {section} batch {b}")
                          for b, e in entry.get(section, {}).items()}} for section in ("batches", "training")]
            out[kind][teacher] = Cost(int(entry["length"]), *merged)
    return out


@dataclass(frozen=True)
class ArmCost:
    arm: str
    passes: Passes
    seconds: float | None  # all of the arm's samples, None when a kind has no measured cost
    unpriced: tuple[str, ...]
    priced_at: tuple[tuple[int, int], ...]  # (batch size, the measured batch size its samples were priced at)
    basis: str = ""  # how a speculative arm's data-dependent passes were set (`stated_passes`), empty otherwise


def teacher_length(teacher) -> int:
    """The positions the teacher's sampler steps over, as `Method.passes` reads them: a multi-scale teacher's scales,
    else its tokens (0 for an image diffusion teacher, whose passes are its steps)."""
    return len(teacher.patch_nums) if hasattr(teacher, "patch_nums") else getattr(teacher, "seq_len", 0)


@functools.lru_cache(maxsize=None)
def _built_length(teacher_cls: type, name: str) -> int:
    import torch

    return teacher_length(teacher_cls.random(name, torch.device("meta")))


def positions(p: Plan, folder: Path = COSTS) -> int | None:
    """The positions the trial's teacher steps over, for a device kind without its costs: as any kind's cost table
    records them (they do not depend on the device), else from its full-size random build on the meta device (no
    weights, no file read); None for a teacher with neither."""
    name = p.trial.teacher
    found = next((by_teacher[name].length for by_teacher in costs(folder).values() if name in by_teacher), None)
    if found is None and getattr(p.teacher_cls, "random", None) is not None:
        found = _built_length(p.teacher_cls, name)
    return found


def stated_passes(passes: Passes, paper: dict, ref: Passes) -> tuple[Passes, str]:
    """A speculative arm's passes at the acceptance its paper row states: the row's NFE per sample, or the reference
    arm's passes over the row's step compression (`speedup_steps`); the bound (`Passes.at_most`, one window per
    token) where the row states neither. Returns the passes and what they rest on, for the dry run to say."""
    if not passes.at_most or len(passes.counts) != 1:
        return passes, ""
    (kind, bound), source = next(iter(passes.counts.items())), paper.get("source", "the paper row")
    if nfe := paper.get("nfe"):
        return Passes({kind: min(bound, nfe)}), f"at the NFE {nfe:g} of {source}"
    if (ratio := paper.get("speedup_steps")) and ref.counts:
        return (Passes({kind: min(bound, sum(ref.counts.values()) / ratio)}),
                f"at the step compression {ratio:g}x of {source}")
    return passes, "at the bound (the row states no step compression or NFE)"


@dataclass(frozen=True)
class TrialCost:
    plan: Plan
    samples: int  # per arm, warm-up included
    arms: tuple[ArmCost, ...]  # empty when the teacher has no measured cost
    cost: Cost | None
    devices: tuple[str, ...] = ()  # what measured the entries used, with their commands
    # the training data `fit` draws from the teacher (`Method.generates`): (what, how many, seconds or None, a key
    # that names the same data drawn by another trial)
    data: tuple[str, int, float | None, tuple] | None = None
    # the training `fit` runs (`training_cost`): it, its seconds (None: not measured), what priced it, what measured it
    train: tuple[Training, float | None, str, str] | None = None

    @property
    def seconds(self) -> float | None:
        if not self.arms or any(a.seconds is None for a in self.arms):
            return None
        return sum(a.seconds for a in self.arms)


def estimate(p: Plan, warmup: int, machine: str, protocol: LatencyProtocol = LatencyProtocol(),
             folder: Path = COSTS, read: bool = False) -> TrialCost:
    """The trial's arms, their passes and their cost on `machine` at the trial's precision (its device kind; priced
    only with a measured cost for the teacher): the quality samples at the trial's batch size, and, with a
    `latency_batch`, the latency protocol's calls (at its floors of warm-up and count) at that batch. `read`: an
    earlier trial draws the reference arm's samples (`Plan.reference_draws`), so that arm is only timed
    (`bench.runner`)."""
    t = p.trial
    kind = device_kind(machine, t.dtype)
    samples = t.n_samples + warmup * t.batch_size
    at = t.latency_batch
    timed = [((protocol.warmup + protocol.min_count) * at, at)] if at else []
    work = [(samples, t.batch_size), *timed]
    cost = costs(folder).get(kind, {}).get(t.teacher)
    length = cost.length if cost is not None else positions(p, folder)
    if length is None:
        return TrialCost(p, samples, (), None)
    family = p.teacher_cls.family
    # a teacher-only trial draws once (`bench.runner`): its reference arm is its method arm's draws
    alone = issubclass(p.method_cls, TeacherSampler)
    arms = {**({} if alone else {"ref": TeacherSampler.passes(p.sampling, family, length)["method"]}),
            **p.method_cls.passes(p.config, family, length)}
    reference = "method" if alone else "ref"
    out, devices = [], set()
    for arm, passes in arms.items():
        passes, basis = stated_passes(passes, p.paper or {}, arms.get("ref", Passes())) if arm == "method" else (
            passes, "")
        if cost is None:  # the plan without its price: no pass of this teacher was measured on this kind
            out.append(ArmCost(arm, passes, None, (f"{t.teacher} on {kind}",), (), basis))
            continue
        seconds, unpriced, at = 0.0, set(), []
        for n, batch in timed if read and arm == reference else work:
            found = cost.at(batch)
            if found is None:
                unpriced.add(f"any batch <= {batch}")
                continue
            entry, measured = found
            at.append((batch, measured))
            devices.add(f"{entry.device} ({entry.command})")
            priced = {k: c for k, c in passes.counts.items() if k in entry.seconds or k in FREE_KINDS}
            unpriced |= set(passes.counts) - set(priced)
            seconds += n * sum(c * entry.seconds.get(k, 0.0) for k, c in priced.items())
        out.append(ArmCost(arm, passes, None if unpriced else seconds, tuple(sorted(unpriced)), tuple(at), basis))
    data = None
    train = training_cost(p, machine, length, folder)
    if cost is None:
        return TrialCost(p, samples, tuple(out), None, train=train)
    if generated := p.method_cls.generates(p.config, family, cost.length):
        what, n, passes = generated
        found = cost.at(t.batch_size)  # drawn at the trial's batch size, as the samplers are
        entry = found[0] if found else None
        priced = entry is not None and set(passes.counts) <= set(entry.seconds) | set(FREE_KINDS)
        seconds = n * sum(c * entry.seconds.get(k, 0.0) for k, c in passes.counts.items()) if priced else None
        data = (what, n, seconds, (t.teacher, what, n, repr(p.sampling)))
    return TrialCost(p, samples, tuple(out), cost, tuple(sorted(devices)), data, train)


def training_cost(p: Plan, machine: str, length: int, folder: Path = COSTS) -> tuple[Training, float | None, str,
                                                                                    str] | None:
    """The trial's training (`Method.training`) priced as iterations x batch x the measured seconds per sample of its
    kind of step, on `machine` in float32 (`fit` trains in float32 whatever the trial's dtype: `bench.runner`), at its
    batch or the largest measured batch below it (an upper bound). Returns (the training, its seconds or None, what
    priced it or why it is not priced, what measured it); None when `fit` trains nothing."""
    training = p.method_cls.training(p.config, p.teacher_cls.family, length)
    if training is None:
        return None
    kind = device_kind(machine, "fp32")
    cost = costs(folder).get(kind, {}).get(p.trial.teacher)
    found = cost.at(training.batch, training=True) if cost is not None else None
    if found is None or training.kind not in found[0].seconds:
        return training, None, (f"no measured {training.kind!r} of {p.trial.teacher} on {kind} at a batch <= "
                                f"{training.batch}: time it with `--cost --latency --record` on that machine"), ""
    entry, measured = found
    seconds = training.iterations * training.batch * entry.seconds[training.kind]
    how = f"{training.kind} at batch {measured}'s cost per sample" + (
        ", an upper bound" if measured != training.batch else "")
    return training, seconds, how, f"{entry.device} ({entry.command})"


def _hours(seconds: float | None) -> str:
    return "not priced" if seconds is None else f"{seconds / 3600:.3g} device-hours"


def _passes_text(passes: Passes) -> str:
    text = " + ".join(f"{n:g} {kind}" for kind, n in passes.counts.items()) or "none"
    return f"at most {text}" if passes.at_most else text


def report(title: str, checkpoints: Path, entries: list[tuple[Plan, list[Needed]]], warmup: int, machine: str,
           ranks: int = 1, protocol: LatencyProtocol = LatencyProtocol(), folder: Path = COSTS) -> str:
    """The dry run's text: the files, then a block per trial, then the totals, priced for `machine` (each trial at its
    precision's device kind) over `ranks` ranks from the costs in `folder`."""
    lines = [title, "", f"files under --checkpoints {checkpoints.absolute()}:"]
    seen: dict[Path, bool] = {}
    for _, needed in entries:
        seen.update({n.path: n.present for n in needed})
    lines += [f"  {'ok     ' if present else 'MISSING'}  {path}" for path, present in seen.items()] or ["  (none)"]
    lines.append("")
    known = costs(folder)
    kinds = sorted({device_kind(machine, p.trial.dtype) for p, _ in entries})
    if not set(kinds) & set(known):
        lines += [f"no measured costs for device kind {' or '.join(map(repr, kinds))} in {folder} (kinds with costs: "
                  f"{', '.join(sorted(known))}): nothing is priced; measure them on that device with "
                  f"`accelbench suite FILE --cost --latency --record`", ""]
    total, unpriced, devices = 0.0, 0, set()
    drawn: dict[tuple, int] = {}  # training data already priced, by key -> the trial that draws it first
    references: dict[str, int] = {}  # reference draws (`Plan.reference_draws`) -> the trial that draws them
    data_unpriced = train_unpriced = 0
    trained: dict[tuple, int] = {}  # trainings already priced, by the student's settings -> the first trial
    for i, (p, needed) in enumerate(entries, 1):
        t = p.trial
        first = None if p.tasks or not t.latency_batch else references.setdefault(p.reference_draws(), i)
        read = first is not None and first != i
        kind = device_kind(machine, t.dtype)
        est = estimate(p, warmup, machine, protocol, folder, read)
        knobs = ", ".join(f"{k}={t.params[k]}" for k in p.method_cls.key_knobs if k in t.params)
        missing = sum(not n.present for n in needed)
        documents = "every document" if t.n_samples == MAX_COUNT else f"at most {t.n_samples} documents each"
        work = (f"lm-eval tasks {', '.join(p.tasks)}, {documents}" if p.tasks else
                f"{est.samples} samples per arm (batch {t.batch_size})"
                + (f", latency timed at batch {t.latency_batch}" if t.latency_batch else ""))
        lines.append(f"trial {i}/{len(entries)}: {t.method}{f'[{knobs}]' if knobs else ''} on {t.teacher}, seed "
                     f"{t.seed}: {work}, {len(needed)} files ({missing} missing)")
        if paper := p.paper:
            lines.append(f"  paper: {', '.join(f'{k} {v:g}' for k, v in paper.items() if k not in TEXT_KEYS)} "
                         f"({paper['source']})" + (f"; note: {paper['note']}" if "note" in paper else ""))
        if p.tasks:  # scored, not sampled: its passes depend on the documents' choices, known only from the data
            lines.append("  passes and cost: not planned (lm-eval scores the model's log-likelihoods; nothing is "
                         "sampled)")
        elif not est.arms:
            lines.append(f"  passes and cost: not planned (teacher {t.teacher}'s length is in no cost table and it "
                         f"has no random build to read it from)")
        if read:
            lines.append(f"  reference draws: trial {first}'s, read from the cache (timed here, not drawn)")
        for a in () if p.tasks else est.arms:
            upper = [f"batch {b} at batch {m}'s" for b, m in a.priced_at if m != b]
            lines.append(f"  {a.arm:<10} {_passes_text(a.passes)} per sample{f' ({a.basis})' if a.basis else ''}: "
                         f"{_hours(a.seconds)}"
                         + (f" (no measured cost of {', '.join(a.unpriced)})" if a.unpriced else "")
                         + (f" ({', '.join(upper)} per-sample cost, the largest measured below: an upper bound)"
                            if upper and not a.unpriced else ""))
        if est.data is not None:
            what, n, seconds, key = est.data
            shared = drawn.get(key)
            lines.append(f"  fit: draws {n} teacher {what} first: " + (
                f"shared with trial {shared}, priced there" if shared else _hours(seconds)))
            if not shared:
                drawn[key] = i
                total += seconds or 0.0
                data_unpriced += seconds is None
        if est.train is not None:
            training, seconds, how, measured = est.train
            # a student is cached by its settings: the trials that share them (seeds) train it once
            shared = trained.setdefault((t.teacher, t.method, repr(p.config)), i)
            text = (f"shared with trial {shared}, priced there" if shared != i else
                    f"{_hours(seconds)} ({how})" if seconds is not None else f"not priced ({how})")
            lines.append(f"  fit: trains {training.iterations} iterations of batch {training.batch}: {text}")
            if shared == i:
                total += seconds or 0.0
                train_unpriced += seconds is None
                devices.update([measured] if measured else [])
        elif p.method_cls.trains(p.config) and est.data is None:
            lines.append("  fit: trains before sampling; not priced (the method states no training)")
        if p.tasks or est.seconds is None:
            unpriced += 1
        else:
            total += est.seconds
            devices.update(est.devices)
            lines.append(f"  estimated: {_hours(est.seconds)} on {kind}")
    wall = f", {total / ranks / 3600:.3g} h of wall time on {ranks} ranks" if ranks > 1 else ""
    lines.append("")
    if shared := [p for p, _ in entries if not p.tasks and p.trial.latency_batch]:
        lines.append(f"reference draws: {len(references)} drawn for {len(shared)} trials timed at a latency batch "
                     f"(those under the same reference settings read the first one's from the cache)")
    lines += [f"total: {len(entries)} runs, {sum(not n for n in seen.values())} of {len(seen)} files missing, "
              f"{_hours(total)} estimated for sampling, the teacher samples fit draws and the training, on "
              f"{' and '.join(kinds)}{wall}"
              + (f" ({unpriced} runs not priced)" if unpriced else "")
              + (f" ({data_unpriced} trials' training data not priced)" if data_unpriced else "")
              + (f" ({train_unpriced} trainings not priced)" if train_unpriced else ""),
              *(f"  costs measured on {d}" for d in sorted(devices)),
              "  A cost is seconds per pass of one sample, measured at full size at a batch size (random weights: "
              "the cost does not depend on them), times passes times samples; an arm is priced at its own batch size, "
              "or at the largest measured batch below it (an upper bound: batching lowers the cost per sample), and "
              "a speculative arm at the NFE or step compression its paper row states, at its bound where none."]
    return "\n".join(lines)
