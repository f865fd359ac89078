"""Name -> class registries for teachers, methods and metrics (lm-eval style).

An unknown name is a `UserError` that lists the valid names, so a typo on the command line is one clear line.
"""
from __future__ import annotations

import importlib
import os
from typing import Callable, Generic, Iterator, TypeVar

from bench.errors import UserError

T = TypeVar("T")


class Registry(Generic[T]):
    def __init__(self, kind: str):
        self.kind = kind
        self._entries: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        def add(obj: T) -> T:
            if name in self._entries:
                raise ValueError(f"{self.kind} {name!r} registered twice")
            self._entries[name] = obj
            return obj

        return add

    def get(self, name: str) -> T:
        _load_builtin_entries()
        try:
            return self._entries[name]
        except KeyError:
            raise UserError(f"unknown {self.kind} {name!r}; valid: {', '.join(sorted(self._entries))}") from None

    def names(self) -> list[str]:
        _load_builtin_entries()
        return sorted(self._entries)

    def items(self) -> Iterator[tuple[str, T]]:
        for name in self.names():
            yield name, self._entries[name]


TEACHERS: Registry = Registry("teacher")
METHODS: Registry = Registry("method")
METRICS: Registry = Registry("metric")


def _load_builtin_entries() -> None:
    # Registration happens at import of the packages; importing here (not at module top) avoids import cycles.
    import methods  # noqa: F401
    import metrics  # noqa: F401
    import teachers  # noqa: F401

    # ACCELBENCH_PLUGINS: comma-separated modules that register more entries (in every process, workers included).
    for module in filter(None, os.environ.get("ACCELBENCH_PLUGINS", "").split(",")):
        try:
            importlib.import_module(module.strip())
        except ImportError as exc:
            raise UserError(f"cannot import plugin {module!r} from ACCELBENCH_PLUGINS: {exc}") from None
