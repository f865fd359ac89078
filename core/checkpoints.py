"""Reading the official checkpoint files: trusted local pickles of tensors, some wrapped with their training state."""
from __future__ import annotations

import argparse
import pickle
import re
import zipfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, TypeVar

import torch

from core.errors import UserError
from core.files import read_json

T = TypeVar("T")


def read_state_dict(path: Path, wrappers: tuple[str, ...]) -> dict[str, torch.Tensor]:
    """The state dict in `path`: under the first of `wrappers` the file has (e.g. "ema", "model"), else the file
    itself. Loaded with `weights_only` (tensors and containers only), allowing the argparse "args" entry that training
    checkpoints carry (docs/checkpoints.md, trap T1). A file that is not such a checkpoint (damaged, cut short, a
    pickle of other objects, a bare tensor) is one `UserError` naming it: torch's own errors run to thirty lines."""
    with torch_load_errors(path), torch.serialization.safe_globals([argparse.Namespace]):
        blob = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(blob, dict):
        raise UserError(f"{path}: holds a {type(blob).__name__}, not a state dict (a mapping of names to tensors)")
    for wrapper in wrappers:
        if isinstance(blob.get(wrapper), dict):
            return blob[wrapper]
    return blob


@contextmanager
def torch_load_errors(path: Path) -> Iterator[None]:
    """Turn what `torch.load` (or `torch.jit.load`, or a library loading a checkpoint with it) raises on a file that is
    not a checkpoint of tensors into one `UserError` naming `path`: a pickle of other objects, random bytes, a zip
    archive cut short."""
    try:
        yield
    except pickle.UnpicklingError as exc:
        found = re.search(r"Unsupported global: GLOBAL (\S+)", str(exc))
        if found:
            raise UserError(f"{path}: holds objects other than tensors ({found[1]}), which we do not unpickle; "
                            f"expected a checkpoint of tensors") from None
        raise UserError(f"{path}: not a PyTorch checkpoint, or a damaged one (unreadable pickle)") from None
    except (FileNotFoundError, PermissionError, IsADirectoryError) as exc:
        raise UserError(f"{path}: cannot read it ({exc.strerror})") from None
    except (RuntimeError, EOFError, ValueError, OSError) as exc:  # OSError: a seek past the end of a cut zip
        why = str(exc).split(". ")[0].strip() or "the file ends early"
        raise UserError(f"{path}: not a PyTorch checkpoint, or a truncated one ({why[:200]})") from None


def check_whole(path: Path) -> None:
    """A look at a checkpoint file that loads nothing, for planning: a torch zip archive (`torch.save`'s format, and
    TorchScript's) whose central directory reads, a safetensors header that parses, or a legacy `torch.save` pickle.
    A file of random bytes or cut short is one `UserError` naming it before any trial work; what the file holds is
    checked when it loads (`read_state_dict`, `torch_load_errors`)."""
    if path.suffix == ".safetensors":
        from safetensors import safe_open

        with safetensors_errors(path), safe_open(path, framework="pt"):
            return
    try:
        with path.open("rb") as fh:
            first = fh.read(1)
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as archive:
                archive.namelist()
            return
    except zipfile.BadZipFile as exc:
        raise UserError(f"{path}: a damaged zip archive ({exc}), not a whole PyTorch checkpoint") from None
    except OSError as exc:
        raise UserError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    if first != b"\x80":  # every pickle since protocol 2 opens with PROTO; a pre-zip torch.save is one
        raise UserError(f"{path}: not a PyTorch checkpoint: neither a zip archive (a file cut short has lost the "
                        f"archive's directory at its end) nor a pickle")


@contextmanager
def safetensors_errors(path: Path) -> Iterator[None]:
    """Turn what safetensors raises on a damaged file (a header that does not parse, a file shorter than its header
    says) into one `UserError` naming `path`."""
    from safetensors import SafetensorError

    try:
        yield
    except SafetensorError as exc:
        raise UserError(f"{path}: not a safetensors file, or a truncated one ({str(exc)[:200]})") from None
    except OSError as exc:
        raise UserError(f"{path}: cannot read it ({exc.strerror or exc})") from None


def read_safetensors(path: Path, device: str = "cpu") -> dict[str, torch.Tensor]:
    """The tensors of a .safetensors file on `device`; a damaged one is one line (`safetensors_errors`)."""
    from safetensors.torch import load_file

    with safetensors_errors(path):
        return load_file(path, device=device)


def read_config(folder: Path, **expected: str) -> dict[str, Any]:
    """`folder`/config.json as a mapping, each field of `expected` checked (`model_type="emu3"`; diffusers'
    `_class_name="AutoencoderKL"`): a file that is not JSON, or the folder of another model, is one `UserError` naming
    the file, before a library would build the wrong model from it with a warning."""
    path = folder / "config.json"
    config = read_json(path)
    if not isinstance(config, dict):
        raise UserError(f"{path}: holds a JSON {type(config).__name__}, not a model configuration (an object)")
    for field, value in expected.items():
        if config.get(field) != value:
            raise UserError(f"{path}: {field} is {config.get(field)!r}, expected {value!r}: the folder of another "
                            f"model")
    return config


def from_folder(load: Callable[..., T], folder: Path, **kwargs: Any) -> T:
    """`load(folder, **kwargs)`, a transformers or diffusers `from_pretrained` of a folder the user provides. Whatever
    of its files the library cannot read (a config that is not JSON, a shard cut short, a tokenizer of another format)
    is one `UserError` naming the folder and the library's first line; running out of memory is not the folder's
    fault and passes through."""
    try:
        return load(folder, **kwargs)
    except (UserError, torch.OutOfMemoryError):
        raise
    except Exception as exc:
        owner = getattr(getattr(load, "__self__", None), "__name__", getattr(load, "__qualname__", "the library"))
        line = next((line.strip() for line in str(exc).splitlines() if line.strip()), "")
        raise UserError(f"{folder}: {owner} cannot load it ({type(exc).__name__}: {line[:300]})") from exc


def mismatch(exc: RuntimeError) -> str:
    """What `load_state_dict` found wrong (missing or unexpected keys, or a shape), in one line of <= 300 characters:
    the line after its header."""
    lines = str(exc).splitlines()
    return (lines[1] if len(lines) > 1 else lines[0]).strip()[:300]
