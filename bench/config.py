"""Validation of knobs against a frozen config dataclass.

Every method (and teacher) declares its knobs as a frozen dataclass; `build_config` turns a loose mapping (from the
CLI or YAML) into an instance, refusing unknown knobs and ill-typed values with a message naming the knob.
"""
from __future__ import annotations

import dataclasses
import typing
from typing import Any, Mapping

import yaml

from bench.errors import UserError


def read_yaml_mapping(path: str, what: str, fields: set[str] | None = None) -> dict:
    """Load a YAML file that must hold a mapping (of only `fields`, when given); every error names the file."""
    try:
        with open(path) as fh:
            data = yaml.safe_load(fh)
    except OSError as exc:
        raise UserError(f"cannot read {what} {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise UserError(f"{what} {path} is not valid YAML: {str(exc).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise UserError(f"{what} {path}: expected a mapping, got {type(data).__name__}")
    unknown = sorted(set(data) - fields) if fields is not None else []
    if unknown:
        raise UserError(f"{what} {path}: unknown field {unknown[0]!r}; valid: {', '.join(sorted(fields))}")
    return data


def check_seeds(seeds, where: str) -> tuple[int, ...]:
    if not isinstance(seeds, list) or not seeds or not all(
            isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in seeds):
        raise UserError(f"{where}: 'seeds' must be a non-empty list of non-negative integers, got {seeds!r}")
    return tuple(seeds)


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
    if hint in (int, float):
        kind = "an integer" if hint is int else "a number"
        if isinstance(raw, bool):
            raise UserError(f"{where} must be {kind}, got {raw!r}")
        if isinstance(raw, int) or (hint is float and isinstance(raw, float)):
            return hint(raw)
        if isinstance(raw, str):
            try:
                return hint(raw)
            except ValueError:
                pass
        raise UserError(f"{where} must be {kind}, got {raw!r}")
    if hint is str:
        if isinstance(raw, str):
            return raw
        raise UserError(f"{where} must be a string, got {raw!r}")
    raise TypeError(f"{where}: unsupported knob type {hint!r}")
