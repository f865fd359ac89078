"""A trial's numerics: the dtype its samplers compute in, TF32 matmuls on CUDA, torch.compile.

`dtype` bf16 or fp16 runs each arm's sampler under `torch.autocast` (weights stay float32; matmuls and convolutions
compute in the low precision, reductions such as softmax and norms in float32, as autocast's op lists decide). The
papers' own scripts either autocast (MAR's `torch.cuda.amp.autocast`, VAR's demo) or cast the weights (LlamaGen's
`--precision bf16`, Emu3's `torch_dtype=bfloat16`); autocast is the one switch that applies to every teacher and
student unchanged, and it is what we do for all of them. Samples are decoded and scored in float32.

A method may run a part of its arm in another dtype than the trial's where the release does (DD's students run in
float32 beside a bfloat16 teacher: `methods.dd`, `student_dtype`): `autocast` nests, the inner dtype replacing the
trial's inside it, fp32 turning autocast off.

`compile` wraps the repeated blocks of every network the arms run (the modules inside an `nn.ModuleList`: transformer
blocks, DiT blocks; a network without such a list is compiled whole) in `torch.compile`; the first calls, the
warm-up, pay for compilation, and the runner logs their time apart from the timed sampling.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

LIBRARY_TYPES = {"builtins", "torch", "numpy", "collections"}  # objects of these hold no network of a trial
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@contextlib.contextmanager
def autocast(device: torch.device, dtype: str) -> Iterator[None]:
    """`dtype` as the compute dtype inside the block: the trial's around a sampler call, or a part of an arm's inside
    it (fp32 switches an enclosing autocast off). A device autocast does not know (the cost mode's meta device)
    computes in its weights' dtype either way."""
    if not torch.amp.is_autocast_available(device.type) or (
            dtype == "fp32" and not torch.is_autocast_enabled(device.type)):
        yield
        return
    with torch.autocast(device.type, dtype=DTYPES[dtype], enabled=dtype != "fp32"):
        yield


@contextlib.contextmanager
def tf32(device: torch.device, on: bool) -> Iterator[None]:
    """TF32 matmuls and convolutions on CUDA inside the block (the backends' flags restored after); the CPU has no
    TF32, so there it changes nothing."""
    if device.type != "cuda":
        yield
        return
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = on
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


def networks(*owners: Any, depth: int = 2) -> list[torch.nn.Module]:
    """The distinct `nn.Module`s held by `owners` (a teacher, a method): their attributes, and the attributes of the
    plain objects they hold (a teacher's target and draft models), `depth` levels down."""
    seen: dict[int, torch.nn.Module] = {}

    def visit(obj: Any, level: int) -> None:
        for value in vars(obj).values():
            if isinstance(value, torch.nn.Module):
                seen.setdefault(id(value), value)
            elif level < depth and hasattr(value, "__dict__") and not isinstance(value, type) \
                    and type(value).__module__.split(".")[0] not in LIBRARY_TYPES:
                visit(value, level + 1)

    for owner in owners:
        visit(owner, 1)
    return list(seen.values())


@contextlib.contextmanager
def compiled(on: bool, *owners: Any) -> Iterator[int]:
    """Inside the block, the repeated blocks of every network of `owners` run through `torch.compile`
    (`nn.Module.compile`): the modules of each network's outermost `nn.ModuleList`s, or the network itself when it has
    none. Yields how many modules are compiled (0 when `on` is false). Shapes are dynamic, since a KV cache grows by a
    token per step. After the block the modules run eagerly again: a teacher outlives its trial in a process (a
    suite), and the next trial may not ask for compilation."""
    modules = []
    if on:
        for net in networks(*owners):
            blocks, taken = [], []
            for name, module in net.named_modules():
                if isinstance(module, torch.nn.ModuleList) and not any(name.startswith(t + ".") for t in taken):
                    taken.append(name)
                    blocks += list(module)
            modules += blocks or [net]
    for module in modules:
        module.compile(dynamic=True)
    try:
        yield len(modules)
    finally:
        for module in modules:
            module._compiled_call_impl = None  # what `nn.Module.compile` set: back to the eager forward


def describe(device: torch.device, dtype: str, tf32_on: bool, compile_on: bool) -> str:
    """The numerics of a trial in one line, for its run's tags and the report's environment footer."""
    parts = [dtype if dtype == "fp32" else f"{dtype} autocast"]
    parts.append(f"tf32 {'on' if tf32_on else 'off'}" if device.type == "cuda" else "no tf32 (cpu)")
    return ", ".join(parts + (["torch.compile"] if compile_on else []))
