"""Validation of knobs against a frozen config dataclass.

Every method declares its knobs as a frozen dataclass; `build_config` turns a loose mapping (from the CLI or YAML)
into an instance, refusing unknown knobs and ill-typed values with a message naming the knob. A field whose type is
itself a dataclass (a method's `sampling`, its family's `SamplingConfig`) is embedded: its knobs are addressed flat,
by their own names, and `config_dict` flattens them back, so a knob name means one thing in a config.
"""
from __future__ import annotations

import dataclasses
import math
import os
import typing
from pathlib import Path
from typing import Any, Mapping

from core.errors import UserError


def read_yaml_mapping(path: str, what: str, fields: set[str] | None = None) -> dict:
    """Load a YAML file that must hold a mapping (of only `fields`, when given); every error names the file."""
    import yaml  # here, not at the top: the GPU check runs the methods with torch and pure-Python wheels alone

    class Loader(yaml.SafeLoader):
        """PyYAML keeps the last of a key given twice; a file that sets a knob twice is a mistake to point at."""

        def construct_mapping(self, node, deep=False):
            seen = set()
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *defaults`: later keys override it, by design
                    continue
                key = self.construct_object(key_node, deep=True)
                if key in seen:
                    raise UserError(f"{what} {path}: key {key!r} is given twice (line {key_node.start_mark.line + 1})")
                seen.add(key)
            return super().construct_mapping(node, deep)

    try:
        with open(path) as fh:
            data = yaml.load(fh, Loader=Loader)
    except OSError as exc:
        raise UserError(f"cannot read {what} {path}: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise UserError(f"cannot read {what} {path}: not UTF-8 text (byte {exc.start})") from None
    except yaml.YAMLError as exc:
        raise UserError(f"{what} {path} is not valid YAML: {str(exc).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise UserError(f"{what} {path}: expected a mapping, got {type(data).__name__}")
    unknown = sorted(set(data) - fields) if fields is not None else []
    if unknown:
        raise UserError(f"{what} {path}: unknown field {unknown[0]!r}; valid: {', '.join(sorted(fields))}")
    return data


def writable_dir(path: str | os.PathLike, what: str) -> Path:
    """`path`, checked without leaving anything behind: an existing folder we can write in, or one that can be made
    there (its nearest existing ancestor is a folder we can make a folder in); `UserError` naming `what` otherwise.
    A probe folder is made and removed, because `os.access` says yes to root even where the file system refuses
    (`/proc`)."""
    import tempfile

    path = Path(path).expanduser().absolute()
    try:
        path.resolve()
    except (RuntimeError, OSError) as exc:  # a symlink loop: `exists` says False and mkdir would fail on ELOOP
        raise UserError(f"{what} {path}: {exc}") from None
    existing = next(p for p in (path, *path.parents) if p.exists())
    if not existing.is_dir():
        raise UserError(f"{what} {path}: cannot create it ({existing} is not a folder)")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UserError(f"{what} {path}: {existing} is not writable")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".accelbench-probe-", dir=existing))
    except OSError as exc:
        raise UserError(f"{what} {path}: cannot create a folder in {existing} ({exc.strerror})") from None
    return path


def check_seeds(seeds, where: str) -> tuple[int, ...]:
    if not isinstance(seeds, list) or not seeds or not all(
            isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in seeds):
        raise UserError(f"{where}: 'seeds' must be a non-empty list of non-negative integers, got {seeds!r}")
    if len(set(seeds)) < len(seeds):  # a repeated seed reruns the same trial and reports it as one more seed
        raise UserError(f"{where}: 'seeds' repeats a seed: {seeds!r}")
    return tuple(seeds)


def knobs(cls: type) -> dict[str, tuple[Any, str | None]]:
    """Every knob of a config class: name -> (type, the embedded field it belongs to, or None for its own)."""
    hints = typing.get_type_hints(cls)
    out: dict[str, tuple[Any, str | None]] = {}
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            inner = typing.get_type_hints(hints[f.name])
            group = {g.name: (inner[g.name], f.name) for g in dataclasses.fields(hints[f.name])}
        else:
            group = {f.name: (hints[f.name], None)}
        clash = sorted(set(group) & set(out))
        if clash:  # a programming error in the config class, not a bad request
            raise TypeError(f"{cls.__name__}: knob {clash[0]!r} is declared twice (a method knob may not share a "
                            f"name with its sampling settings)")
        out.update(group)
    return out


def build_config(cls: type, params: Mapping[str, Any], *, owner: str) -> Any:
    declared = knobs(cls)
    own: dict[str, Any] = {}
    embedded: dict[str, dict[str, Any]] = {}
    for name, raw in params.items():
        if name not in declared:
            raise UserError(f"{owner}: unknown knob {name!r}; valid: {', '.join(sorted(declared)) or '(none)'}")
        hint, group = declared[name]
        value = _coerce(raw, hint, f"{owner}: knob {name!r}")
        if group is None:
            own[name] = value
        else:
            embedded.setdefault(group, {})[name] = value
    try:
        for group, values in embedded.items():
            own[group] = dataclasses.replace(_field_default(cls, group), **values)
        return cls(**own)
    except (ValueError, TypeError) as exc:
        raise UserError(f"{owner}: {exc}") from None


def _field_default(cls: type, name: str) -> Any:
    f = next(f for f in dataclasses.fields(cls) if f.name == name)
    return f.default if f.default is not dataclasses.MISSING else f.default_factory()


def config_dict(cfg: Any) -> dict[str, Any]:
    """The config's knobs, flat: embedded configs' fields by their own names."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        out.update(dataclasses.asdict(value) if dataclasses.is_dataclass(value) else {f.name: value})
    return out


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
        value = None
        if isinstance(raw, int) or (hint is float and isinstance(raw, float)):
            value = hint(raw)
        elif isinstance(raw, str):
            try:
                value = hint(raw)
            except ValueError:
                pass
        if value is None or not math.isfinite(value):  # "inf" and "nan" parse as floats; no knob means them
            raise UserError(f"{where} must be {kind}" + (" (finite)" if hint is float else "") + f", got {raw!r}")
        return value
    if hint is str:
        if isinstance(raw, str):
            return raw
        raise UserError(f"{where} must be a string, got {raw!r}")
    raise TypeError(f"{where}: unsupported knob type {hint!r}")
