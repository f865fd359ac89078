"""Reading the official checkpoint files: trusted local pickles of tensors, some wrapped with their training state."""
from __future__ import annotations

import argparse
from pathlib import Path

import torch


def read_state_dict(path: Path, wrappers: tuple[str, ...]) -> dict[str, torch.Tensor]:
    """The state dict in `path`: under the first of `wrappers` the file has (e.g. "ema", "model"), else the file
    itself. Loaded with `weights_only` (tensors and containers only), allowing the argparse "args" entry that training
    checkpoints carry (real_checkpoints.md T1)."""
    with torch.serialization.safe_globals([argparse.Namespace]):
        blob = torch.load(path, map_location="cpu", weights_only=True)
    for wrapper in wrappers:
        if isinstance(blob, dict) and isinstance(blob.get(wrapper), dict):
            return blob[wrapper]
    return blob


def mismatch(exc: RuntimeError) -> str:
    """What `load_state_dict` found wrong (missing or unexpected keys, or a shape), in one line of <= 300 characters:
    the line after its header."""
    lines = str(exc).splitlines()
    return (lines[1] if len(lines) > 1 else lines[0]).strip()[:300]
