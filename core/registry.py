"""Name -> entry registries for teachers, methods and metrics (lm-eval style), resolved lazily.

A package declares its entries as import paths (`METHODS.register("sjd", "methods.sjd:SJD")` in
`methods/__init__.py`); an entry's module is imported the first time its name is looked up, so importing one method
imports no other. Plugins may register objects directly (`@METHODS.register("my-method")`). The built-in packages
and the modules named by `ACCELBENCH_PLUGINS` (comma-separated, imported in every process, sweep workers included)
are read on the first lookup. An unknown name is a `UserError` that lists the valid names, so a typo on the command
line is one clear line. A prefix may stand for a family of names (`TEACHERS.register_prefix("hf:", ...)`: the
teacher `hf:gpt2` is the causal LM in the folder `gpt2`): its factory makes the entry of each full name.
"""
from __future__ import annotations

import importlib
import os
from typing import Any, Callable, Iterator

from core.errors import UserError

# Packages whose __init__ declares the built-in entries (import paths only: reading them imports no entry).
BUILTIN_PACKAGES = ("teachers", "methods", "metrics")
PLUGINS_ENV = "ACCELBENCH_PLUGINS"


class Registry:
    def __init__(self, kind: str):
        self.kind = kind
        self._entries: dict[str, Any] = {}  # name -> the entry, or its "module:attribute" path until first use
        self._prefixes: dict[str, Any] = {}  # prefix -> a factory (full name -> entry), or its import path

    def register(self, name: str, target: Any = None) -> Callable[[Any], Any] | None:
        """Register `target` (an object, or a "module:attribute" path imported on first use) under `name`; without
        a target, a decorator that registers what it decorates."""
        if target is None:
            def add(obj: Any) -> Any:
                self.register(name, obj)
                return obj

            return add
        if name in self._entries:
            raise ValueError(f"{self.kind} {name!r} registered twice")
        if isinstance(target, str) and ":" not in target:
            raise ValueError(f"{self.kind} {name!r}: an import path is 'module:attribute', got {target!r}")
        self._entries[name] = target
        return None

    def register_prefix(self, prefix: str, factory: str) -> None:
        """Names starting with `prefix` resolve to `factory(name)` ("module:attribute", imported on first use)."""
        if prefix in self._prefixes:
            raise ValueError(f"{self.kind} prefix {prefix!r} registered twice")
        self._prefixes[prefix] = factory

    def get(self, name: str) -> Any:
        _load_declarations()
        prefix = next((p for p in self._prefixes if name.startswith(p) and len(name) > len(p)), None)
        if name not in self._entries and prefix is not None:
            return _resolve(self._prefixes[prefix])(name)
        try:
            entry = self._entries[name]
        except KeyError:
            valid = [*sorted(self._entries), *(f"{p}<...>" for p in self._prefixes)]
            raise UserError(f"unknown {self.kind} {name!r}; valid: {', '.join(valid)}") from None
        if isinstance(entry, str):
            entry = self._entries[name] = _resolve(entry)
        return entry

    def prefixes(self) -> list[str]:
        _load_declarations()
        return sorted(self._prefixes)

    def names(self) -> list[str]:
        _load_declarations()
        return sorted(self._entries)

    def items(self) -> Iterator[tuple[str, Any]]:
        """Every entry, resolved (imports every module behind the registry)."""
        for name in self.names():
            yield name, self.get(name)


def _resolve(path: str) -> Any:
    module, _, attr = path.partition(":")
    return getattr(importlib.import_module(module), attr)


TEACHERS = Registry("teacher")
METHODS = Registry("method")
METRICS = Registry("metric")
_loaded: set[str] = set()


def _load_declarations() -> None:
    plugins = [m.strip() for m in os.environ.get(PLUGINS_ENV, "").split(",") if m.strip()]
    for module in (*BUILTIN_PACKAGES, *plugins):
        if module in _loaded:
            continue
        _loaded.add(module)
        try:
            importlib.import_module(module)
        except ImportError as exc:
            if module in BUILTIN_PACKAGES:
                raise
            _loaded.discard(module)
            raise UserError(f"cannot import plugin {module!r} from {PLUGINS_ENV}: {exc}") from None
