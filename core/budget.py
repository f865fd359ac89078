"""Time and memory budgets of a trial: a watchdog thread stops the trial with a clear error when one is exceeded.

The watchdog polls wall time and the process's resident memory (torch and every loaded library included) and, on a
breach, interrupts the main thread, which raises `BudgetExceeded` at its next Python instruction: the MLflow run ends
FAILED with the reason, the CLI prints one line and exits non-zero. A single long native call (one huge matmul) is
interrupted when it returns; native code that turns the interrupt into an error of its own still ends the trial with
`BudgetExceeded`.
"""
from __future__ import annotations

import _thread
import contextlib
import signal
import threading
import time
from collections.abc import Iterator

from core.errors import UserError

POLL_SECONDS = 0.05


class BudgetExceeded(UserError):
    """A trial went over its --time-budget or --memory-budget."""


@contextlib.contextmanager
def budget(seconds: float = 0.0, memory_mb: float = 0.0) -> Iterator[None]:
    """Run the block under the budgets (0 = none). Call from the main thread (signal handlers live there)."""
    if not seconds and not memory_mb:
        yield
        return
    import psutil

    reason: list[str] = []
    done = threading.Event()

    def watch():
        proc, t0 = psutil.Process(), time.monotonic()
        while not done.wait(POLL_SECONDS):
            elapsed, rss = time.monotonic() - t0, proc.memory_info().rss / 2**20
            if seconds and elapsed > seconds:
                reason.append(f"time budget of {seconds:g} s exceeded")
            elif memory_mb and rss > memory_mb:
                reason.append(f"memory budget of {memory_mb:g} MB exceeded (resident {rss:.0f} MB)")
            else:
                continue
            _thread.interrupt_main(signal.SIGUSR1)
            return

    def stop(signum, frame):
        raise BudgetExceeded(f"trial stopped: {reason[0]}")

    previous = signal.signal(signal.SIGUSR1, stop)
    watcher = threading.Thread(target=watch, name="accelbench-budget", daemon=True)
    watcher.start()
    try:
        yield
    except BudgetExceeded:
        raise
    except Exception as exc:
        if reason:  # the interrupt landed in Python code called from native code (torch.save's writer), which
            raise BudgetExceeded(f"trial stopped: {reason[0]}") from exc  # re-raised it as an error of its own
        raise
    finally:
        done.set()
        watcher.join()
        signal.signal(signal.SIGUSR1, previous)
