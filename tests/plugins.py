"""Registry plugin for tests that start worker processes: instant teachers over the enumerable table model.

Loaded with ACCELBENCH_PLUGINS=tests.plugins, so subprocesses see the same entries as the test.
"""
import time

from bench.registry import TEACHERS
from tests.fakes import TableAR


@TEACHERS.register("table-ar")
class TableARTeacher(TableAR):
    """The table AR model as a registered teacher: nothing to train, microseconds per token."""

    reference_method = "ar"

    @classmethod
    def key(cls) -> str:
        return f"{cls.__name__}-v1".ljust(20, "0")

    @classmethod
    def load(cls, name, *, cache, device, on_trained=None):
        return cls(vocab=4, seq_len=8, grid=(2, 4))


@TEACHERS.register("slow-table-ar")
class SlowTableARTeacher(TableARTeacher):
    """The table teacher with 20 ms per forward pass, so a trial lasts long enough to be killed mid-way."""

    def extend(self, state, tokens):
        time.sleep(0.02)
        return super().extend(state, tokens)
