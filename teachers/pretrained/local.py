"""What every teacher made of local files shares: where its files are, the one line that names the missing ones, and
its key.

A subclass declares its files by their official names relative to the checkpoints folder (`local_files`), the
Hugging Face folders among them whose weights are safetensors shards (`weight_folders`), what else determines its
weights (`key_parts`) and where the files come from (`hint`); `files`, `unavailable` and `key` follow from them, so
every loader refuses a missing file in the same words and keys its weights by the same rule.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar, Mapping

from core.cache import CHECKPOINTS_ENV, config_key, file_key
from core.errors import UserError

_BOUND: dict[tuple[type, Path], type] = {}


class LocalFilesTeacher:
    """A mixin over a family's teacher class: the files of a teacher loaded from the checkpoints folder.

    The registered class names no folder; `at(checkpoints)` is the class reading the files of that folder
    (`teachers.teacher_class`, with the folder the user gave as `--checkpoints`)."""

    checkpoints: ClassVar[Path | None] = None
    # The settings a trial may give the teacher (`Trial.teacher_params`): name -> (default, valid values; () for a
    # file, named relative to the checkpoints folder or absolute). A subclass adds its own to its bases'.
    params: ClassVar[dict[str, tuple[str, tuple[str, ...]]]] = {}
    settings: ClassVar[dict[str, str]] = {}  # a bound class's values of every one of `params` (`at`)

    @classmethod
    def at(cls, checkpoints: Path, params: Mapping[str, Any] | None = None) -> type:
        """This teacher reading its files in `checkpoints`, with the settings `params` (the defaults of the others;
        an unknown name or a value outside its choices refused in one line): one subclass per (class, folder,
        settings), so that each is also one entry of `teachers.load_teacher`'s per-process cache."""
        given = dict(params or {})
        if unknown := sorted(set(given) - set(cls.params)):
            valid = f"valid: {', '.join(sorted(cls.params))}" if cls.params else "it takes none"
            raise UserError(f"teacher {cls.__name__}: unknown teacher param {unknown[0]!r}; {valid}")
        settings = {name: str(given.get(name, default)) for name, (default, _) in cls.params.items()}
        for name, value in settings.items():
            choices = cls.params[name][1]
            if choices and value not in choices:
                raise UserError(f"teacher {cls.__name__}: teacher param {name} must be one of {', '.join(choices)}, "
                                f"got {value!r}")
        key = (cls, Path(checkpoints), tuple(settings.items()))
        if key not in _BOUND:
            _BOUND[key] = type(cls.__name__, (cls,), {"checkpoints": Path(checkpoints), "settings": settings,
                                                      "__doc__": cls.__doc__, "__module__": cls.__module__,
                                                      "__qualname__": cls.__qualname__})
        return _BOUND[key]

    @classmethod
    def setting(cls, name: str) -> str:
        """The value of one of `params`: the bound class's, or its default on a class bound to none (a test's
        fake)."""
        return cls.settings.get(name, cls.params[name][0])

    @classmethod
    def root(cls) -> Path:
        """The folder `local_files` are in: the checkpoints folder this class was bound to (a test's fake reads its
        tiny files elsewhere)."""
        if cls.checkpoints is None:
            raise TypeError(f"{cls.__name__} names no checkpoints folder: use {cls.__name__}.at(folder) "
                            f"(teachers.teacher_class)")
        return cls.checkpoints

    @classmethod
    def local_files(cls) -> tuple[str, ...]:
        """The files the teacher reads, relative to `root()`, each of which must be there."""
        raise NotImplementedError

    @classmethod
    def weight_folders(cls) -> tuple[str, ...]:
        """The Hugging Face folders (relative to `root()`) whose weights are safetensors shards: one must be there,
        and every file of the folder is part of the key (shards are named by their count, so none can be listed)."""
        return ()

    @classmethod
    def hint(cls) -> str:
        """What to place in the checkpoints folder and where it comes from, for `unavailable`'s line."""
        raise NotImplementedError

    @classmethod
    def key_parts(cls) -> tuple[Any, ...]:
        """What besides the files' identities determines the weights: configurations, settings, the loader's
        version."""
        raise NotImplementedError

    @classmethod
    def files(cls) -> tuple[Path, ...]:
        """The files the teacher needs (a dry run lists them): `local_files` under `root()`, and those a mixin adds
        (the prompt file)."""
        root = cls.root()
        return tuple(root / name for name in cls.local_files())

    @classmethod
    def missing(cls) -> list[Path]:
        """Every one of `local_files` that is not there, then a shard of each weight folder that has none."""
        root = cls.root()
        missing = [root / name for name in cls.local_files() if not (root / name).is_file()]
        folders = [cls.root() / name for name in cls.weight_folders()]
        return missing + [folder / "model.safetensors" for folder in folders if not any(folder.glob("*.safetensors"))]

    @classmethod
    def unavailable(cls) -> str | None:
        """One line naming every missing file, the folder they belong in and the option; None when all are there."""
        missing = cls.missing()
        if not missing:
            return None
        return (f"missing {' and '.join(map(str, missing))}: place {cls.hint()} in {cls.root()}, or name the folder "
                f"that holds them with --checkpoints or {CHECKPOINTS_ENV}")

    @classmethod
    def require_files(cls) -> None:
        """Refuse to load, in `unavailable`'s one line, while a file is missing."""
        if reason := cls.unavailable():
            raise UserError(reason)

    @classmethod
    def key_files(cls) -> tuple[Path, ...]:
        """The files whose identities key the weights: `files()` and every file of the weight folders (the folder's
        own path where it is not one)."""
        folders = [cls.root() / name for name in cls.weight_folders()]
        inside = [p for f in folders for p in (sorted(f.iterdir()) if f.is_dir() else [f])]
        return (*(p for p in cls.files() if not any(f in p.parents for f in folders)), *inside)

    @classmethod
    def key(cls) -> str:
        return config_key(*cls.key_parts(), [file_key(p) for p in cls.key_files()])
