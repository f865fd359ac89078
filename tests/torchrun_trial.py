"""One trial under torchrun without MLflow, for `make gpu-check` (tests/test_gpu.py): SJD on the tiny GPT teacher on
the device named by ACCELBENCH_GPU_CHECK_DEVICE, every rank drawing its batches; rank 0 writes what the run would have
logged (metrics, params, tags) as JSON to the file named by the first argument.

    python -m torch.distributed.run --standalone --nproc-per-node 2 tests/torchrun_trial.py out.json
"""
import json
import os
import sys
from contextlib import contextmanager
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from core import distributed  # noqa: E402
from core.cache import Cache  # noqa: E402
from core.registry import TEACHERS  # noqa: E402
from bench.plan import plan  # noqa: E402
from bench.runner import RunOptions, run_trial  # noqa: E402
from bench.tracking import NullTracker  # noqa: E402
from core.trial import Trial  # noqa: E402
from tests.fakes import RegisteredTinyGPT  # noqa: E402


class Recording(NullTracker):
    """Keeps what rank 0 logs, in memory."""

    def __init__(self):
        self.logged = {"metrics": {}, "params": {}, "tags": {}}

    @contextmanager
    def run(self, name, tags, experiment=None):
        self.logged["tags"].update(tags)
        yield self

    def log(self, *, params=None, metrics=None, tags=None):
        for kind, values in (("params", params), ("metrics", metrics), ("tags", tags)):
            self.logged[kind].update({k: str(v) if kind != "metrics" else float(v) for k, v in (values or {}).items()})

    def log_dataset(self, name, source):
        pass

    def log_files(self, files):
        pass

    def end_orphans(self, where="", experiments=None):
        return []

    experiment_id = "0"
    run_id = ""


def main() -> None:
    device = os.environ.get("ACCELBENCH_GPU_CHECK_DEVICE", "cuda")
    TEACHERS.register("torchrun-check-gpt", RegisteredTinyGPT)
    p = plan(Trial("torchrun-check-gpt", "sjd", params={"window": 4, "cfg": 2.0}, n_samples=6, batch_size=2,
                   device=device), checkpoints=Path(sys.argv[1]).parent)  # a tiny fake: it reads no files
    world = distributed.init(p.trial.device)
    tracker = Recording() if world.main else NullTracker()
    cache = Cache(Path(sys.argv[1]).parent / "cache")
    run_trial(p, cache=cache, tracker=tracker, opts=RunOptions(warmup=1, progress=False))
    if world.main:
        Path(sys.argv[1]).write_text(json.dumps(tracker.logged))
        print(f"torchrun trial on {torch.device(device)}: {world.size} rank(s), "
              f"{tracker.logged['metrics']['samples_per_sec']:.1f} samples/s")


if __name__ == "__main__":
    main()
