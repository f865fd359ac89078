"""Registry plugin for tests that start worker processes: instant teachers over the enumerable table model, and the
official DiT, LlamaGen, Emu3, Lumina-mGPT, Anole, VAR (and CoDe's pair) and MAR loaders on tiny files.

Loaded with ACCELBENCH_PLUGINS=tests.plugins, so subprocesses see the same entries as the test.
"""
import os
import signal
import socket
import time
from pathlib import Path

from core.registry import TEACHERS
from teachers.tiny.registered import DigitsARClass
from tests.fakes import TableAR, TinyEmu3, TinyLlamaGen, TinyOfficialDiT, TinyOfficialMAR, TinyVAR
from tests.fakes_chameleon import TinyAnole, TinyLumina

TEACHERS.register("tiny-official-dit", TinyOfficialDiT)  # the official loaders on tiny random-weight files
TEACHERS.register("tiny-llamagen", TinyLlamaGen)
TEACHERS.register("tiny-emu3", TinyEmu3)
TEACHERS.register("tiny-lumina", TinyLumina)
TEACHERS.register("tiny-anole", TinyAnole)
TEACHERS.register("tiny-var", TinyVAR)
TEACHERS.register("tiny-code-drafter", "tests.fakes:TinyCoDeDrafter")
TEACHERS.register("tiny-code-refiner", "tests.fakes:TinyCoDeRefiner")
TEACHERS.register("tiny-mar-official", TinyOfficialMAR)
TEACHERS.register("tiny-llamagen-t2i", "tests.fakes_llamagen_t2i:TinyLlamaGenT2I")

BARRIER_ENV = "ACCELBENCH_TEST_BARRIER"  # "<folder>:<n>": `barrier-table-ar` loads once n processes are loading it
HOLD_ENV = "ACCELBENCH_TEST_HOLD"  # "<file>": `slow-table-ar`'s first pass creates the file and never returns
KILL_ENV = "ACCELBENCH_TEST_KILL"  # "<file>": `killed-table-ar` SIGKILLs the first process to make a pass, pid here
HOLD_AFTER_ENV = "ACCELBENCH_TEST_HOLD_AFTER"  # "<n>:<file>": a `HeldAfter` teacher's process holds in its batch n + 1


@TEACHERS.register("table-ar")
class TableARTeacher(TableAR):
    """The table AR model as a registered teacher: nothing to train, microseconds per token."""

    @classmethod
    def key(cls) -> str:
        return f"{cls.__name__}-v1".ljust(20, "0")

    @classmethod
    def load(cls, name, *, cache, device):
        return cls(vocab=4, seq_len=8, grid=(2, 4))


@TEACHERS.register("slow-table-ar")
class SlowTableARTeacher(TableARTeacher):
    """The table teacher with 20 ms per forward pass, so a trial lasts long enough to be killed mid-way. With
    HOLD_ENV set, its first pass says so in that file and waits for the signal the test sends: the process is caught
    mid-pass whatever the speed of the machine."""

    def extend(self, state, tokens):
        if hold := os.environ.get(HOLD_ENV):
            Path(hold).touch()
            while True:
                time.sleep(0.05)
        time.sleep(0.02)
        return super().extend(state, tokens)


@TEACHERS.register("barrier-table-ar")
class BarrierTableARTeacher(TableARTeacher):
    """The table teacher, loaded (once per process) only when every one of n processes has started to load it: a
    sweep over it has n workers sharing its first n trials, whatever the order and the speed the workers start at."""

    @classmethod
    def load(cls, name, *, cache, device, timeout=120.0):
        folder, n = os.environ[BARRIER_ENV].rsplit(":", 1)
        Path(folder).mkdir(parents=True, exist_ok=True)
        (Path(folder) / str(os.getpid())).touch()
        deadline = time.monotonic() + timeout
        while len(list(Path(folder).iterdir())) < int(n):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name}: {n} processes did not all load within {timeout:g} s")
            time.sleep(0.05)
        return super().load(name, cache=cache, device=device)


@TEACHERS.register("slow-barrier-table-ar")
class SlowBarrierTableARTeacher(BarrierTableARTeacher, SlowTableARTeacher):
    """Both: n workers start their first trials together, and each trial lasts long enough to be caught mid-way."""


@TEACHERS.register("killed-table-ar")
class KilledTableARTeacher(TableARTeacher):
    """The table teacher that kills one worker of a sweep mid-trial, whatever the speed and the order of the workers:
    the first process to make a pass (its trial running, its MLflow run started) writes its pid to the file KILL_ENV
    names and SIGKILLs itself. A pass in any other process first waits until that process is gone (a zombie is gone,
    as the reaper of dead workers counts it), so no other worker can finish the study before there is a dead
    worker's trial to retry."""

    victim_gone = False  # in this process: from then on, a pass is the table teacher's

    def extend(self, state, tokens, timeout=120.0):
        if not KilledTableARTeacher.victim_gone:
            from bench.tracking import owner_alive

            victim = Path(os.environ[KILL_ENV])
            mine = victim.with_name(f"{victim.name}.{os.getpid()}")
            mine.write_text(str(os.getpid()))
            try:
                os.link(mine, victim)  # atomic: one process makes the file, and it holds that process's whole pid
            except FileExistsError:
                pass
            else:
                os.kill(os.getpid(), signal.SIGKILL)
            deadline = time.monotonic() + timeout
            while owner_alive(socket.gethostname(), int(victim.read_text()), None):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the process killed-table-ar kills did not die within {timeout:g} s")
                time.sleep(0.05)
            KilledTableARTeacher.victim_gone = True
        return super().extend(state, tokens)


class HeldAfter:
    """A teacher mixin: with HOLD_AFTER_ENV set, the process's call n + 1 of `start` (its batch n + 1, under the `ar`
    sampler without warm-up) creates the file and never returns, so that a test kills a trial mid-batch with exactly n
    batches spooled, whatever the speed of the machine."""

    starts = 0  # in this process

    def start(self, *args, **kwargs):
        if hold := os.environ.get(HOLD_AFTER_ENV):
            n, file = hold.split(":", 1)
            HeldAfter.starts += 1
            if HeldAfter.starts > int(n):
                Path(file).touch()
                while True:
                    time.sleep(0.05)
        return super().start(*args, **kwargs)


@TEACHERS.register("held-table-ar")
class HeldTableARTeacher(HeldAfter, TableARTeacher):
    """The table teacher, held after n batches (HOLD_AFTER_ENV)."""


@TEACHERS.register("held-digits-ar-c2i")
class HeldDigitsARClass(HeldAfter, DigitsARClass):
    """digits-ar-c2i, trained from its recipe (whatever patches it: tests/tiny_recipes.py) and cached as it is, held
    after n batches (HOLD_AFTER_ENV)."""
