"""`make gpu-bench` (benchmarks/gpu_bench.py) as a bare GPU box runs it: in an interpreter that can import torch (and
what torch itself imports), PyYAML and the project's own packages, and nothing else (no numpy, no tqdm, no metric
library, not even the gpu wheels: `make gpu-bench` does not put them on the path), on the CPU at a reduced size."""
import os
import re
import runpy
import subprocess
import sys
from pathlib import Path

import torch
import yaml

from bench.dryrun import costs, device_kind, device_machine
from core.cache import Cache
from teachers import load_teacher

ROOT = Path(__file__).resolve().parent.parent
MACHINE = device_machine(torch.device("cpu"))  # the files are named by it (bench.dryrun.device_machine)

# A sitecustomize.py: every finder but the interpreter's built-in and frozen ones answers "no such module" for a
# top-level module outside the allowed set, as on a box where it is not installed (importlib.util.find_spec gives
# None, an import raises ModuleNotFoundError). torch's own optional imports (numpy, dill, ...) are refused too: torch
# runs without them.
BLOCKER = '''
import sys

ALLOWED = {"torch", "torchgen", "typing_extensions", "sympy", "mpmath", "networkx", "jinja2", "markupsafe", "fsspec",
           "filelock", "triton", "nvidia", "cuda",  # torch and what it imports
           "yaml", "_yaml",
           "bench", "core", "methods", "teachers", "metrics", "reports", "cli", "sweeps", "benchmarks", "tests",
           "broken_teacher"}


class Bare:
    def __init__(self, finder):
        self.finder = finder

    def find_spec(self, name, path=None, target=None):
        top = name.partition(".")[0]
        if top in sys.stdlib_module_names or top in ALLOWED or top.startswith("_sysconfigdata"):
            return self.finder.find_spec(name, path, target)
        return None

    def __getattr__(self, name):
        return getattr(self.finder, name)


sys.meta_path[:] = [f if getattr(f, "__name__", "") in ("BuiltinImporter", "FrozenImporter") else Bare(f)
                    for f in sys.meta_path]
'''

# A teacher whose build raises: its row is listed with the error, the rows after it are timed
BROKEN = '''
from core.registry import TEACHERS
from teachers.tiny.registered import DigitsDiTClass


class BrokenDiT(DigitsDiTClass):
    @classmethod
    def load(cls, name, *, cache, device):
        raise RuntimeError("broken on purpose\\nnot this line")


TEACHERS.register("broken-dit", BrokenDiT)
'''


def test_gpu_bench_runs_on_a_bare_interpreter_at_a_reduced_size(tiny_recipe, tmp_path, monkeypatch, capsys):
    """Every row timed under the protocol but the broken one, listed with its one-line error; ARD's reference arm
    (DDIM at 8 steps) timed once for its two rows and a `ddim` row's method arm read from its reference arm's timing;
    each ARD row's training iteration timed; the per-pass and training costs recorded for the dry run; the table
    beside the paper's numbers. With no budget left, every row is listed as not reached."""
    cache = tmp_path / "cache"
    load_teacher("digits-dit-c2i", cache=Cache(cache), device=torch.device("cpu"), checkpoints=tmp_path)  # trained
    suite = tmp_path / "tiny.yaml"
    trials = [{"method": "ddim", "params": {"steps": 4}, "paper": {"latency": 0.5, "gflops": 1.0, "source": "T1"}},
              {"teacher": "broken-dit", "method": "ddim", "params": {"steps": 4}},
              {"method": "ard", "params": {"steps": 8, "student_steps": 2, "batch": 16}},
              {"method": "ard", "params": {"steps": 8, "student_steps": 4, "batch": 16}}]
    suite.write_text(yaml.safe_dump({"experiment": "tiny", "trials": trials, "defaults": {
        "teacher": "digits-dit-c2i", "latency_batch": 2, "metrics": ["fid"]}}))  # planned without its metrics
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "sitecustomize.py").write_text(BLOCKER)
    (tmp_path / "broken_teacher.py").write_text(BROKEN)
    argv = ["--suites", str(suite), "--out", str(tmp_path / "out"), "--costs", str(tmp_path / "costs"),
            "--cache-dir", str(cache), "--warmup", "1", "--min-count", "2", "--min-seconds", "0"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(map(str, (bare, tmp_path, ROOT))), "OMP_NUM_THREADS": "1",
           "ACCELBENCH_PLUGINS": "tests.tiny_recipes_plugin,broken_teacher"}
    ran = subprocess.run([sys.executable, "benchmarks/gpu_bench.py", *argv], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=300)
    assert ran.returncode == 0, ran.stderr[-3000:]
    text = (tmp_path / "out" / f"{MACHINE}.md").read_text()
    lines = {line.split(" | ")[1]: line for line in text.splitlines() if line.startswith("| tiny |")}
    ard = "ard[student_steps={},history_layers=1,mask=M4] digits-dit-c2i s0"
    assert list(lines) == ["ddim[steps=4] digits-dit-c2i s0", "ddim[steps=4] broken-dit s0", ard.format(2),
                           ard.format(4)], text
    assert "| 2 | failed: RuntimeError: broken on purpose | — |" in lines["ddim[steps=4] broken-dit s0"]
    ddim = lines["ddim[steps=4] digits-dit-c2i s0"].split(" | ")
    assert ddim[3].startswith(ddim[4] + " ° (") and ddim[5] == "1.00×" and ddim[7:] == ["500", "—", "1 |"]  # = ref
    first, second = (lines[ard.format(s)].split(" | ") for s in (2, 4))
    assert "°" not in first[4] and second[4] == first[4] + " °"  # DDIM-8 timed once, for the first ard row
    assert all(re.fullmatch(r"training iteration [\d.e+-]+", row[6]) for row in (first, second))  # each its own kind
    assert "Not reached" not in text
    kind = device_kind(MACHINE, "fp32")  # this machine, the rows' float32
    assert set(costs(tmp_path / "costs")[kind]["digits-dit-c2i"].batches[2].seconds) == {"step", "student_step"}
    assert set(costs(tmp_path / "costs")[kind]["digits-dit-c2i"].training[16].seconds) == {"train ard S=2 N=1",
                                                                                          "train ard S=4 N=1"}

    monkeypatch.setattr("sys.argv", ["gpu_bench.py", *argv, "--budget", "0", "--suites", str(_without_broken(suite))])
    runpy.run_path(str(ROOT / "benchmarks" / "gpu_bench.py"), run_name="__main__")  # spent before the first row
    text = (tmp_path / "out" / f"{MACHINE}.md").read_text()
    assert "Not reached within the budget (3 rows): tiny: ddim[steps=4] digits-dit-c2i s0; " in text
    assert "| tiny |" not in text


def _without_broken(suite: Path) -> Path:
    """The suite without its broken-dit row (registered in the subprocess only)."""
    data = yaml.safe_load(suite.read_text())
    data["trials"] = [t for t in data["trials"] if t.get("teacher") != "broken-dit"]
    out = suite.parent / "good" / suite.name
    out.parent.mkdir()
    out.write_text(yaml.safe_dump(data))
    return out
