"""The run environment recorded with every result: code version, library versions, hardware, threads."""
from __future__ import annotations

import functools
import platform
import subprocess
from importlib import metadata
from pathlib import Path

import torch

from core import files
from core.errors import UserError

PROJECT_ROOT = Path(__file__).resolve().parent.parent
LIBRARIES = ("torch", "mlflow", "optuna", "torchmetrics", "numpy")


@functools.cache
def git_sha() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    if out.returncode:
        return "unknown"
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=PROJECT_ROOT,
                           capture_output=True, text=True, timeout=5).stdout.strip()
    return out.stdout.strip() + ("-dirty" if dirty else "")


@functools.cache
def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def resolve_device(name: str) -> torch.device:
    """The device a trial runs on; `UserError` for a string that names no device this machine has (in a dry run's
    audit, `core.files`, any CUDA device: a plan for a cluster is made anywhere)."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise UserError(f"unknown device {name!r}; use auto, cpu, cuda or cuda:N") from None
    if device.type == "cuda":
        if files.auditing():
            return device
        if not torch.cuda.is_available():
            raise UserError(f"device {name!r}: this machine has no CUDA device (torch.cuda.is_available() is False); "
                            f"use cpu or auto")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise UserError(f"device {name!r}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    elif device.type != "cpu":
        raise UserError(f"device {name!r}: AccelBench runs on auto, cpu, cuda or cuda:N")
    return device


def environment_tags(device: torch.device) -> dict[str, str]:
    tags = {
        "git_sha": git_sha(),
        "python": platform.python_version(),
        "cpu": cpu_model(),
        "torch_threads": str(torch.get_num_threads()),
        "device": str(device),
    }
    for lib in LIBRARIES:
        tags[f"{lib}_version"] = metadata.version(lib)
    if device.type == "cuda":
        tags["gpu"] = torch.cuda.get_device_name(device)
    return tags
