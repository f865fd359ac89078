"""Training helpers shared by the teachers' recipes and the distillation methods (DD, ARD): the learning-rate
schedule, the optimiser step and the EMA, so every trained object in the suite follows the same conventions."""
from __future__ import annotations

import contextlib
import math
from collections.abc import Iterable, Iterator

import torch
from tqdm import tqdm

_show_bars = True  # set by `progress_bars` (the runner, from RunOptions.progress: the CLI's --no-progress)


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


def training_steps(steps: int, desc: str) -> Iterable[int]:
    """range(steps), with a progress bar unless the caller of the trial asked for none."""
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


def optimizer_step(loss: torch.Tensor, opt: torch.optim.Optimizer, sched, params, clip: float = 1.0) -> None:
    """Backward, clip the gradient norm at `clip`, step the optimiser and the schedule."""
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, clip)
    opt.step()
    sched.step()


@torch.no_grad()
def ema_update(ema: torch.nn.Module, model: torch.nn.Module, decay: float, k: int) -> None:
    """ema <- d ema + (1 - d) model, parameter by parameter, with d = ema_decay(decay, k)."""
    d = ema_decay(decay, k)
    for pe, pm in zip(ema.parameters(), model.parameters()):
        pe.lerp_(pm, 1 - d)
