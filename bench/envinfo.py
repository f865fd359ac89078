"""The run environment recorded with every result: code version, library versions, hardware, threads."""
from __future__ import annotations

import functools
import platform
import subprocess
from importlib import metadata
from pathlib import Path

import torch

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
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


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
