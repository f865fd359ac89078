"""Validation of knobs against a frozen config dataclass.

Every method (and teacher) declares its knobs as a frozen dataclass; `build_config` turns a loose mapping (from the
CLI or YAML) into an instance, refusing unknown knobs and ill-typed values with a message naming the knob.
"""
from __future__ import annotations

import dataclasses
import typing
from typing import Any, Mapping

from bench.errors import UserError


def build_config(cls: type, params: Mapping[str, Any], *, owner: str) -> Any:
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    values = {}
    for name, raw in params.items():
        if name not in fields:
            raise UserError(f"{owner}: unknown knob {name!r}; valid: {', '.join(sorted(fields)) or '(none)'}")
        values[name] = _coerce(raw, hints[name], f"{owner}: knob {name!r}")
    try:
        return cls(**values)
    except (ValueError, TypeError) as exc:
        raise UserError(f"{owner}: {exc}") from None


def config_dict(cfg: Any) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


def _coerce(raw: Any, hint: Any, where: str) -> Any:
    """Accept a value of the declared type, or its string form from `--param k=v`."""
    origin = typing.get_origin(hint)
    if origin is typing.Literal:
        allowed = typing.get_args(hint)
        if raw in allowed:
            return raw
        raise UserError(f"{where} must be one of {', '.join(map(str, allowed))}, got {raw!r}")
    if hint is bool:
        if isinstance(raw, bool):
            return raw
        if isinstance(raw, str) and raw.lower() in ("true", "false", "1", "0", "yes", "no"):
            return raw.lower() in ("true", "1", "yes")
        raise UserError(f"{where} must be a boolean, got {raw!r}")
    if hint is int:
        if isinstance(raw, int) and not isinstance(raw, bool):
            return raw
        if isinstance(raw, str):
            try:
                return int(raw)
            except ValueError:
                pass
        raise UserError(f"{where} must be an integer, got {raw!r}")
    if hint is float:
        if isinstance(raw, (int, float)) and not isinstance(raw, bool):
            return float(raw)
        if isinstance(raw, str):
            try:
                return float(raw)
            except ValueError:
                pass
        raise UserError(f"{where} must be a number, got {raw!r}")
    if hint is str:
        if isinstance(raw, str):
            return raw
        raise UserError(f"{where} must be a string, got {raw!r}")
    raise TypeError(f"{where}: unsupported knob type {hint!r}")
