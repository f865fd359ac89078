"""The cost mode (`accelbench suite FILE --cost`, `accelbench run ... --cost`): what each arm of a trial costs at full
size, with no checkpoint: the numbers of the papers that do not depend on the weights (parameters, FLOPs, forward
passes, latency), reproduced from seeded random weights.

Every arm (the method's and the teacher's reference sampler) is built around the teacher's own configuration
(`teacher.random`: a real teacher at full size, random weights, no file read; a tiny teacher of the zoo is loaded as it
is) and the method's `stand_in` (random weights where `fit` would train or read a student). Then, per arm:

- FLOPs and NFE per sample: the arm draws one sample on the meta device (shapes only: nothing is computed, so a
  7-billion-parameter teacher costs seconds), its ops counted by torch's own FLOP formulas (those `FlopCounterMode`
  reads, `_Count`), attention on the math kernel (no formula covers a fused kernel on every backend), on one
  reference sample (`REFERENCE_SEED`). A multiply-add counts as 2 FLOPs; the papers (DiT's 118.6 GFLOPs a forward,
  ARD Table 1, fvcore's convention) count it once: both are logged (`gflops_per_sample`, `gmacs_per_sample`) and a
  paper's `gflops` is compared with our GMACs.
- parameters: those each network of the arm reads while it samples (the ops' inputs, matched to the networks'
  parameters), by network: a student that re-uses the teacher's layers counts them once.
- latency per sample, when asked (`--latency`; on by default on CUDA): the arm on the device, random weights,
  `core.latency`'s protocol at the trial's `latency_batch` (1 when unset), arms interleaved.

An arm whose passes depend on what it draws (speculative decoding's acceptance, a table of teacher samples) cannot
run on the meta device; it is priced from its declared passes (`Method.passes`) where they are priced by what was
counted (a lookup is free; `step`s at the reference arm's mean step), and says so; otherwise it is not counted, and
the output says why.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import yaml
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.flop_counter import flop_registry

from core import precision, training
from core.config import read_yaml_mapping
from core.envinfo import cpu_model, environment_tags
from core.errors import UserError
from core.latency import Latency, LatencyProtocol, measure
from core.names import COST, KIND_TAG, KNOBS_TAG, NFE_PER_SAMPLE, SKIPPED_TAG
from core.paper import paper_tags
from bench.dryrun import FREE_KINDS, costs, device_kind, device_machine, teacher_length
from bench.plan import Plan, run_name
from methods.base import TeacherSampler
from teachers import load_teacher

_COUNTED: dict[tuple, "ArmCost"] = {}


@dataclass(frozen=True)
class ArmCost:
    arm: str
    nfe: float | None  # forward passes per sample
    flops: float | None  # per sample, a multiply-add counted as 2 (FlopCounterMode's)
    params: dict[str, int] = field(default_factory=dict)  # per network the arm reads
    how: str = "counted"  # how the figures were obtained, or why they were not
    latency: Latency | None = None
    length: int = 0  # positions the teacher's sampler steps over (tokens; a multi-scale teacher's scales)

    @property
    def macs(self) -> float | None:
        return None if self.flops is None else self.flops / 2

    def metrics(self) -> dict[str, float]:
        out = {f"params.{k}": float(v) for k, v in self.params.items()}
        if self.params:
            out["params"] = float(sum(self.params.values()))
        if self.flops is not None:
            out.update(gflops_per_sample=self.flops / 1e9, gmacs_per_sample=self.flops / 2e9)
        if self.nfe is not None:
            out[NFE_PER_SAMPLE] = self.nfe
        if self.latency is not None:
            out.update(self.latency.metrics())
        return out


class _Count(TorchDispatchMode):
    """Counts FLOPs by torch's own formulas (`torch.utils.flop_counter.flop_registry`, what `FlopCounterMode` reads:
    a multiply-add as 2) without `FlopCounterMode`'s per-module tracking, which multiplies the time of a tiny model's
    sample; with `reads`, also records the identity of every tensor an op reads (the parameters among them are the ones
    the arm used)."""

    def __init__(self, reads: bool):
        super().__init__()
        self.flops, self.reads, self.ids = 0, reads, set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.reads:
            self.ids.update(id(a) for a in tree_flatten((args, kwargs))[0] if isinstance(a, torch.Tensor))
        formula = flop_registry.get(func._overloadpacket)
        if formula is None and func is not torch.ops.prim.device.default:
            # a composite op that inference mode leaves whole (aten.linear): its decomposition's ops are counted,
            # as FlopCounterMode does
            with self:
                out = func.decompose(*args, **kwargs)
            if out is not NotImplemented:
                return out
        out = func(*args, **kwargs)
        if formula is not None:
            self.flops += formula(*args, **kwargs, out_val=out)
        return out


def counted(fn, reads: bool = True) -> tuple[float, set[int], Any]:
    """Run `fn()` counting its FLOPs (a multiply-add as 2; attention on the math kernel, whose matrix products the
    formulas see) and, with `reads`, the tensors its ops read. Returns (FLOPs, the ids of the tensors read, what `fn`
    returned)."""
    mode = _Count(reads)
    with sdpa_kernel(SDPBackend.MATH), mode, torch.inference_mode():
        out = fn()
    return float(mode.flops), mode.ids, out


def _params_read(networks: list[torch.nn.Module], ids: set[int]) -> dict[str, int]:
    """The parameters among the tensors `ids` read, by network (its class name), each parameter counted once."""
    seen: set[int] = set()
    out: dict[str, int] = {}
    for net in networks:
        read = [p for p in net.parameters() if id(p) in ids and id(p) not in seen]
        seen.update(id(p) for p in read)
        if n := sum(p.numel() for p in read):
            name = type(net).__name__
            out[name if name not in out else f"{name}.{len(out)}"] = n
    return out


def build(p: Plan, device: torch.device, *, cache) -> tuple[Any, dict[str, Any]]:
    """The teacher at full size with random weights on `device` (a tiny teacher: loaded) and the trial's arms around
    it (its extra arms too: SDTT's GPT-2 and same-steps arms), each method's students standing in with random
    weights. Returns (teacher, {arm: method})."""
    teacher = full_size(p, device, cache=cache)
    method = p.method_cls(teacher, p.config)
    method.stand_in()
    extra = method.extra_arms(cache=cache, device=device, checkpoints=p.checkpoints,
                              random=getattr(p.teacher_cls, "random", None) is not None)
    return teacher, {"ref": TeacherSampler(teacher, p.sampling), "method": method, **extra}


def full_size(p: Plan, device: torch.device, *, cache):
    """The trial's teacher at full size with random weights on `device` (a tiny teacher of the zoo: loaded)."""
    t = p.trial
    random = getattr(p.teacher_cls, "random", None)
    if random is not None:
        return random(t.teacher, device)
    if getattr(p.teacher_cls, "checkpoints", None) is None:  # a zoo teacher: its files are the project's own
        return load_teacher(t.teacher, cache=cache, device=device, checkpoints=p.checkpoints, params=t.teacher_params)
    built = ", ".join(sorted(_random_teachers()))
    raise UserError(f"cost mode: teacher {t.teacher!r} has no full-size random build yet; it has one: {built}")


def _random_teachers() -> list[str]:
    from core.registry import TEACHERS

    return [name for name in TEACHERS.names() if getattr(TEACHERS.get(name), "random", None) is not None]


def count(p: Plan, *, cache) -> dict[str, ArmCost]:
    """Every arm's NFE, FLOPs and parameters per sample: one sample drawn on the meta device (a tiny teacher: on the
    CPU, with its own weights), arms that cannot run there priced from their passes."""
    has_random = getattr(p.teacher_cls, "random", None) is not None
    device = torch.device("meta" if has_random else "cpu")
    teacher, arms = build(p, device, cache=cache)
    how = "counted: one sample on the meta device" if has_random else "counted: one sample, the zoo's weights"
    return count_arms(p, teacher, arms, device, how)


REFERENCE_SEED = 0  # of the one sample an arm is counted on: the same whatever the trial's seed or process


def count_arms(p: Plan, teacher, arms: dict[str, Any], device: torch.device, how: str,
               reads: bool = True) -> dict[str, ArmCost]:
    """Each of `arms` (the reference arm first: an arm priced from passes reads its step cost) counted on `device`
    on one reference sample (`REFERENCE_SEED`'s condition and noise, whatever the trial's seed, so a count is a
    function of the teacher, the sampler and its settings alone): NFE, FLOPs and, with `reads`, the parameters read.
    On the meta device an arm whose passes depend on what it draws is priced from its passes (`_from_passes`);
    elsewhere it is counted as it ran (a speculative arm: on that sample's acceptance)."""
    networks = precision.networks(teacher, *arms.values())
    cond = teacher.conditions(1, torch.Generator().manual_seed(REFERENCE_SEED)).to(device)
    length, meta = teacher_length(teacher), device.type == "meta"
    out: dict[str, ArmCost] = {}
    for name, arm in arms.items():
        # counted once per process (a `ddim` row's method arm is its reference arm: a teacher's sampler under its
        # method name draws by `TeacherSampler.sample`, keyed as that; a trained student is keyed by its settings): a
        # speculative arm's count on one tiny teacher's sample took as long as its trial's 64 samples (the demo's
        # CSpD, measured), and the demo runs each setting at 3 seeds
        sampler = TeacherSampler.__name__ if type(arm).sample is TeacherSampler.sample else type(arm).__name__
        key = (getattr(teacher, "name", ""), repr(sorted(p.trial.teacher_params.items())), sampler, repr(arm.config),
               device.type, reads)
        if key in _COUNTED:
            out[name] = dataclasses.replace(_COUNTED[key], arm=name, length=length)
            continue
        try:
            generator = torch.Generator(device if not meta else "cpu").manual_seed(REFERENCE_SEED)
            flops, read, samples = counted(lambda: arm.sample(cond, generator=generator), reads)
        except (RuntimeError, NotImplementedError) as exc:
            if not meta:
                raise
            out[name] = _from_passes(p, name, out.get("ref"), exc, length)
            continue
        out[name] = _COUNTED[key] = ArmCost(name, samples.counters["nfe"] / len(cond), flops,
                                            _params_read(networks, read), how, length=length)
    return out


def _from_passes(p: Plan, arm: str, ref: ArmCost | None, exc: Exception, length: int) -> ArmCost:
    """An arm that cannot draw on the meta device, priced from its declared passes (`Method.passes` over `length`
    positions) where they are priced by what was counted."""
    family = p.teacher_cls.family
    passes = (TeacherSampler.passes(p.sampling, family, length)["method"] if arm == "ref" else
              p.method_cls.passes(p.config, family, length)[arm])
    kinds = set(passes.counts)
    if kinds <= set(FREE_KINDS):
        return ArmCost(arm, sum(passes.counts.values()), 0.0, {}, "priced from its passes: table lookups only")
    ref_steps = ref is not None and ref.flops is not None and ref.nfe
    if kinds == {"step"} and not passes.at_most and ref_steps:
        n = passes.counts["step"]
        return ArmCost(arm, n, ref.flops / ref.nfe * n, ref.params,
                       f"priced from its passes: {n:g} steps at the reference arm's mean step (its steps cost "
                       f"unequal amounts with a KV cache: an estimate)")
    why = str(exc).splitlines()[0][:80]
    return ArmCost(arm, None, None, {}, f"not counted: its passes depend on what it draws ({why})")


def time_arms(p: Plan, protocol: LatencyProtocol, *, cache) -> dict[str, ArmCost]:
    """Every arm's latency on the trial's device, random weights, at `latency_batch` (1 when unset), interleaved
    (nothing counted: `count` does that)."""
    t = p.trial
    teacher, arms = build(p, p.device, cache=cache)
    cond = teacher.conditions(t.latency_batch or 1, torch.Generator().manual_seed(t.seed)).to(p.device)
    with precision.tf32(p.device, t.tf32), precision.compiled(t.compile, *arms.values()), torch.inference_mode():
        times = time_calls(arms, cond, t, protocol, p.device)
    length = teacher_length(teacher)
    return {name: ArmCost(name, None, None, {}, "timed", latency, length) for name, latency in times.items()}


def time_arms_once(p: Plan, protocol: LatencyProtocol, timed: dict[tuple, Latency], *, cache) -> dict[str, ArmCost]:
    """`time_arms`, each arm timed once per `timed`: an arm whose latency is there (`_timing_key`: the same teacher,
    sampler, settings, batch and numerics, timed for an earlier row) is read back; the others, one per key (a `ddim`
    row's method arm is its reference arm), are timed interleaved and added. `make gpu-bench`
    (benchmarks/gpu_bench.py) times ARD's DDIM-25 reference once for its ten student rows, MDLM's 1024 steps once for
    SDTT's."""
    t = p.trial
    teacher, arms = build(p, p.device, cache=cache)
    keys = {name: _timing_key(p, arm) for name, arm in arms.items()}
    first: dict[tuple, str] = {}  # a key not timed yet -> the arm of this row timed for it
    for name in arms:
        if keys[name] not in timed:
            first.setdefault(keys[name], name)
    todo = {name: arms[name] for name in first.values()}
    if todo:
        cond = teacher.conditions(t.latency_batch or 1, torch.Generator().manual_seed(t.seed)).to(p.device)
        with precision.tf32(p.device, t.tf32), precision.compiled(t.compile, *todo.values()), torch.inference_mode():
            times = time_calls(todo, cond, t, protocol, p.device)
        timed.update({keys[name]: latency for name, latency in times.items()})

    def how(name: str) -> str:
        if name in todo:
            return "timed"
        if keys[name] in first:
            return f"timed as the {first[keys[name]]} arm (the same sampler and settings)"
        return "timed in an earlier row"

    length = teacher_length(teacher)
    return {name: ArmCost(name, None, None, {}, how(name), timed[keys[name]], length) for name in arms}


def _timing_key(p: Plan, arm) -> tuple:
    """What an arm's latency is a function of: the row's teacher and the arm's own (SDTT's GPT-2 arm), the sampler
    (a teacher's sampler under a method's name is the reference arm's) and its settings, the timed batch, seed,
    numerics and device."""
    t = p.trial
    sampler = TeacherSampler.__name__ if type(arm).sample is TeacherSampler.sample else type(arm).__name__
    return (t.teacher, repr(sorted(t.teacher_params.items())), getattr(arm.teacher, "name", ""), sampler,
            repr(arm.config), t.latency_batch or 1, t.seed, t.dtype, t.tf32, t.compile, str(p.device))


def time_calls(arms: dict[str, Any], cond: torch.Tensor, t, protocol: LatencyProtocol,
               device: torch.device) -> dict[str, Latency]:
    """The arms timed under the latency protocol (`core.latency`), interleaved, each call drawing a batch of `cond`
    with the trial's seed under its dtype: the cost mode's and a trial's `latency_batch` timing."""
    def call(arm):
        def run():
            with precision.autocast(device, t.dtype):
                arm.sample(cond, generator=torch.Generator(device).manual_seed(t.seed))
        return run

    return measure({name: call(arm) for name, arm in arms.items()}, protocol, device, len(cond))


# A training iteration is timed with at most 3 warm-up and 5 timed calls of the protocol's: each call is a full
# optimiser step (seconds at full size), the first one or two pay for the allocator and the optimiser's state.
TRAIN_WARMUP, TRAIN_COUNT = 3, 5


def time_training(p: Plan, protocol: LatencyProtocol, *, cache, at_most: int | None = None) -> ArmCost | None:
    """One training iteration of the trial's `fit` (`Method.train_step`: the same loss, optimiser and EMA) at full
    size, random weights, on the trial's device in float32 (as `fit` trains, whatever the trial's dtype), at the
    training's global batch, halved while it runs out of memory (a global batch is split over GPUs; per sample, a
    smaller batch costs at least as much: an upper bound, priced as such), or at `at_most` samples (a CPU's hand
    measurement). None when `fit` trains nothing. The arm is "train"; its latency is seconds per iteration of its
    batch."""
    t = p.trial
    teacher = full_size(p, p.device, cache=cache)  # no stand-in, no other arm: the memory is the training's
    training = p.method_cls.training(p.config, p.teacher_cls.family, teacher_length(teacher))
    if training is None:
        return None
    method = p.method_cls(teacher, p.config)
    calls = dataclasses.replace(protocol, warmup=min(protocol.warmup, TRAIN_WARMUP),
                                min_count=min(protocol.min_count, TRAIN_COUNT), min_seconds=0.0,
                                max_count=min(protocol.max_count, TRAIN_COUNT))
    batch = min(training.batch, at_most or training.batch)
    while True:
        try:
            with precision.tf32(p.device, False):  # `bench.runner` fits outside the trial's TF32 and autocast
                step = method.train_step(batch, torch.Generator().manual_seed(t.seed))
                latency = measure({"train": step}, calls, p.device, batch)["train"]
            break
        except torch.OutOfMemoryError:
            if batch == 1:
                raise
            batch, step = (batch + 1) // 2, None  # the failed call's student and optimiser go before the retry
            torch.cuda.empty_cache()
    how = f"timed: one {training.kind} iteration of batch {batch}" + (
        f" (the training's is {training.batch})" if batch != training.batch else "")
    return ArmCost("train", None, None, {}, how, latency, teacher_length(teacher))


def cost(p: Plan, *, cache, latency: LatencyProtocol | None) -> dict[str, ArmCost]:
    """Every arm's cost (`count`, and `time_arms` when `latency` is given), and with `latency` the training's
    iteration as the arm "train" (`time_training`) where `fit` trains."""
    arms = count(p, cache=cache)
    if latency is None:
        return arms
    times = time_arms(p, latency, cache=cache)
    arms = {name: dataclasses.replace(a, latency=times[name].latency) for name, a in arms.items()}
    if p.method_cls.trains(p.config) and (train := time_training(p, latency, cache=cache)) is not None:
        arms["train"] = train
    return arms


@dataclass(frozen=True)
class Record:
    """Where the cost mode writes what it timed for the dry run (`bench/costs/<kind>.recorded.yaml`) and the command
    that timed it."""

    folder: Path
    command: str


def record_costs(p: Plan, arms: dict[str, ArmCost], record: Record) -> list[str]:
    """Each timed arm whose passes are of one kind (`Method.passes`; a speculative arm's bound is not a count) as
    that kind's seconds per pass of one sample at the timed batch, into `<folder>/<kind>.recorded.yaml` (the device
    kind: this machine and the trial's precision) under the teacher and the batch size, beside what was there; the
    training's iteration (the arm "train") as its `Training.kind`'s seconds per sample, under the machine's float32
    kind. Returns what was recorded ("ref: step at batch 1")."""
    family, t = p.teacher_cls.family, p.trial
    done = []
    if (train := arms.get("train")) is not None and train.latency is not None:
        # `fit` trains in float32 whatever the trial's dtype: its step is filed under the machine's float32 kind
        training = p.method_cls.training(p.config, family, train.length)
        _record(p, record, "fp32", train.length, train.latency.batch,
                {training.kind: train.latency.median / train.latency.batch}, "training")
        done.append(f"train: {training.kind} at batch {train.latency.batch}")
    passes_of = {}
    for name, a in arms.items():
        if name == "train":
            continue
        passes = (TeacherSampler.passes(p.sampling, family, a.length)["method"] if name == "ref" else
                  p.method_cls.passes(p.config, family, a.length)[name])
        if a.latency is None or len(passes.counts) != 1 or passes.at_most:
            continue
        (pass_kind, n), = passes.counts.items()
        if pass_kind in FREE_KINDS or not n:
            continue
        # a teacher's "step" is its whole sampler's mean step: a truncated run (skip-n's first tokens, cheaper with
        # a short KV cache) would overwrite it with a smaller one, so only the teacher's own sampler records it
        if pass_kind == "step" and name != "ref" and not (name == "method" and issubclass(p.method_cls,
                                                                                           TeacherSampler)):
            continue
        passes_of.setdefault((a.length, a.latency.batch), []).append((name, pass_kind, a.latency.median / n))
    for (length, batch), timed in passes_of.items():
        _record(p, record, t.dtype, length, batch, {k: s / batch for _, k, s in timed})
        done += [f"{name}: {k} at batch {batch}" for name, k, _ in timed]
    return done


def _record(p: Plan, record: Record, dtype: str, length: int, batch: int, seconds: dict[str, float],
            section: str = "batches") -> None:
    """`seconds` (kind of pass -> seconds per pass of one sample, timed at `batch` in `dtype`) written into the
    recorded cost table of this machine and `dtype` under the trial's teacher (its `section`: the passes' batches,
    or its training's), beside what was there."""
    t = p.trial
    kind = device_kind(device_machine(p.device), dtype)
    path = record.folder / f"{kind}.recorded.yaml"
    data = read_yaml_mapping(str(path), "cost table") if path.exists() else {"kind": kind, "teachers": {}}
    teacher = data["teachers"].setdefault(t.teacher, {"length": length, "batches": {}})
    entry = teacher.setdefault(section, {}).setdefault(batch, {"seconds": {}})
    entry["seconds"].update(seconds)
    device = torch.cuda.get_device_name(p.device) if p.device.type == "cuda" else cpu_model()
    tf32 = t.tf32 and dtype == t.dtype  # training runs without TF32
    entry["device"] = (f"{device}, {precision.describe(p.device, dtype, tf32, t.compile and dtype == t.dtype)}, "
                       f"{torch.get_num_threads()} threads, the latency protocol")
    entry["command"] = record.command
    record.folder.mkdir(parents=True, exist_ok=True)
    path.write_text(RECORDED_HEADER + yaml.safe_dump(data, sort_keys=True, width=1000))
    costs.cache_clear()


RECORDED_HEADER = ("# Written by the cost mode (`accelbench suite FILE --cost --latency --record`): seconds per "
                   "pass of one sample,\n# by teacher, batch size and kind of pass, timed on this device kind "
                   "(bench/costs/cpu-amd-epyc-fp32.yaml explains the format).\n")


def run_cost(p: Plan, *, cache, tracker, latency: LatencyProtocol | None, threads: int,
             record: Record | None = None) -> dict[str, ArmCost]:
    """One trial's cost (`cost`) as one MLflow run tagged `accelbench.kind` = `cost`, with the trial's params, the
    paper's numbers as tags and how each arm was counted; with `record`, the arms' latencies written as per-pass
    costs for the dry run (`record_costs`). Returns the arms' costs; none for a row that cannot be counted (a
    teacher without a full-size random build, an arm that fails to build), whose run says why (`SKIPPED_TAG`): a
    suite's cost mode counts every row it can instead of stopping at the first it cannot."""
    t = p.trial
    device = torch.device("meta") if latency is None else p.device
    with training.threads(threads), tracker.run(f"cost {run_name(p)}", {
            KIND_TAG: COST, "trial_key": p.key(), "family": str(p.teacher_cls.family), **environment_tags(device),
            "precision": precision.describe(p.device, t.dtype, t.tf32, t.compile), **paper_tags(p.paper)}) as log:
        params = {k: v for k, v in t.to_dict().items() if k not in ("params", "teacher_params")}
        params.update(t.params)
        params.update({f"teacher.{k}": v for k, v in t.teacher_params.items()})
        params.update({"reference": p.reference, "threads": threads, "latency": "off" if latency is None else
                       ",".join(f"{k}={v}" for k, v in dataclasses.asdict(latency).items())})
        log.log(params=params, tags={KNOBS_TAG: ",".join(sorted(t.params)),
                                     "key_knobs": ",".join(p.method_cls.key_knobs)})
        try:
            arms = cost(p, cache=cache, latency=latency)
        except Exception as exc:  # noqa: BLE001 (a row that cannot be counted is listed with why; the others go on)
            reason = str(exc).splitlines()[0] if isinstance(exc, UserError) else (
                f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
            log.log(tags={SKIPPED_TAG: reason})
            return {}
        if record is not None and latency is not None:
            recorded = record_costs(p, arms, record)
            log.log(tags={"cost.recorded": ", ".join(recorded) or "nothing (no arm of a single kind of pass)"})
        metrics = {}
        for name, a in arms.items():
            prefix = "" if name == "method" else f"{name}/"
            metrics.update({prefix + k: v for k, v in a.metrics().items()})
        log.log(metrics=metrics, tags={f"cost.how.{name}": a.how for name, a in arms.items()})
    return arms
