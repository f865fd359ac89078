"""Registry plugin for tests that start worker processes: instant teachers over the enumerable table model, and the
official DiT, LlamaGen, Emu3, Lumina-mGPT, Anole, VAR and MAR loaders on tiny files.

Loaded with ACCELBENCH_PLUGINS=tests.plugins, so subprocesses see the same entries as the test.
"""
import os
import time
from pathlib import Path

from core.registry import TEACHERS
from tests.fakes import TableAR, TinyEmu3, TinyLlamaGen, TinyOfficialDiT, TinyOfficialMAR, TinyVAR
from tests.fakes_chameleon import TinyAnole, TinyLumina

TEACHERS.register("tiny-official-dit", TinyOfficialDiT)  # the official loaders on tiny random-weight files
TEACHERS.register("tiny-llamagen", TinyLlamaGen)
TEACHERS.register("tiny-emu3", TinyEmu3)
TEACHERS.register("tiny-lumina", TinyLumina)
TEACHERS.register("tiny-anole", TinyAnole)
TEACHERS.register("tiny-var", TinyVAR)
TEACHERS.register("tiny-mar-official", TinyOfficialMAR)
TEACHERS.register("tiny-llamagen-t2i", "tests.fakes_llamagen_t2i:TinyLlamaGenT2I")

BARRIER_ENV = "ACCELBENCH_TEST_BARRIER"  # "<folder>:<n>": `barrier-table-ar` loads once n processes are loading it
HOLD_ENV = "ACCELBENCH_TEST_HOLD"  # "<file>": `slow-table-ar`'s first pass creates the file and never returns


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
