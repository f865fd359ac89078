"""Training helpers shared by the teachers' recipes, the metrics' feature extractors and the distillation methods:
the learning-rate schedule, the optimiser step, the EMA, thread pinning, progress bars and the report of a training
to the trial's tracker, so every trained object in the suite follows the same conventions."""
from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

_show_bars = True  # set by `progress_bars` (the runner, from RunOptions.progress: the CLI's --no-progress)
_reporter: Callable[[str, str, dict, dict], None] | None = None  # set by `training_reports` (the runner)


@contextlib.contextmanager
def progress_bars(show: bool) -> Iterator[None]:
    """Whether `training_steps` draws a bar inside the block: a teacher or student is trained deep inside a trial,
    where no options reach."""
    global _show_bars
    before, _show_bars = _show_bars, show
    try:
        yield
    finally:
        _show_bars = before


@contextlib.contextmanager
def training_reports(report: Callable[[str, str, dict, dict], None] | None) -> Iterator[None]:
    """Inside the block, every training of a registered object (`report_training`) goes to `report(name, key,
    params, info)`: a teacher, a companion LM or an evaluator trained on first use deep inside a trial is logged like
    the trial itself."""
    global _reporter
    before, _reporter = _reporter, report
    try:
        yield
    finally:
        _reporter = before


def report_training(name: str, key: str, params: dict[str, Any], info: dict[str, float]) -> None:
    """Tell the caller of the trial (if it listens) that `name` was just trained under cache key `key`."""
    if _reporter is not None:
        _reporter(name, key, params, info)


@contextlib.contextmanager
def threads(n: int) -> Iterator[None]:
    """torch's intra-op threads set to `n` inside the block. One thread for the small extractors trained on first use:
    their weights then do not depend on the core count (reduction order), and on a busy 2-core machine they trained
    many times slower on two."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@contextlib.contextmanager
def library_bars() -> Iterator[None]:
    """Inside the block, transformers' own bars (e.g. "Loading weights") follow the caller's choice too."""
    from transformers.utils import logging as hf_logging

    before = hf_logging.is_progress_bar_enabled()
    (hf_logging.enable_progress_bar if _show_bars else hf_logging.disable_progress_bar)()
    try:
        yield
    finally:
        (hf_logging.enable_progress_bar if before else hf_logging.disable_progress_bar)()


def training_steps(steps: int, desc: str) -> Iterable[int]:
    """range(steps), with a progress bar unless the caller of the trial asked for none."""
    from tqdm import tqdm  # here: the cost path (`make gpu-bench`) imports this module and trains nothing

    return tqdm(range(steps), desc=desc, unit="step", leave=False, disable=not _show_bars)


def warmup_cosine(opt: torch.optim.Optimizer, steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warm-up over the first 5 % of `steps`, then cosine decay to zero at `steps`."""
    warmup = max(1, steps // 20)
    return torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps)))


def ema_decay(decay: float, k: int) -> float:
    """The EMA decay at update k: (1 + k) / (10 + k) up to `decay`. A short run is otherwise averaged mostly into its
    initial weights (0.999 ** 150 = 0.86)."""
    return min(decay, (1 + k) / (10 + k))


def optimizer_step(loss: torch.Tensor, opt: torch.optim.Optimizer, sched, params, clip: float | None = 1.0) -> None:
    """Backward, clip the gradient norm at `clip` (None: no clipping), step the optimiser and the schedule."""
    opt.zero_grad(set_to_none=True)
    loss.backward()
    if clip is not None:
        torch.nn.utils.clip_grad_norm_(params, clip)
    opt.step()
    sched.step()


@torch.no_grad()
def ema_update(ema: torch.nn.Module, model: torch.nn.Module, decay: float, k: int) -> None:
    """ema <- d ema + (1 - d) model, parameter by parameter, with d = ema_decay(decay, k)."""
    d = ema_decay(decay, k)
    for pe, pm in zip(ema.parameters(), model.parameters()):
        pe.lerp_(pm, 1 - d)
