"""Training data on disk (`core.shards`), and ARD's `fit` on trajectories ten times what its memory budget leaves."""
import pytest
import torch

from benchmarks.trajectory_memory import TRAJECTORIES, ard_run, bytes_on_disk, peak_rss_mb, tiny_env
from core.cache import Cache
from core.shards import Field, Shards
from tests.tiny_recipes import QuickDiT

FIELDS = {"a": Field((3, 2), torch.float16), "b": Field((1,), torch.int64)}


def records(start, stop):
    i = torch.arange(start, stop)
    return {"a": (i[:, None, None] * 10 + torch.arange(6).view(1, 3, 2)).half(), "b": i[:, None]}


def test_records_read_back_by_index_and_by_row(tmp_path):
    shards = Shards(tmp_path / "s", FIELDS, n=7, shard_size=3)
    assert shards.ranges() == [(0, 3), (3, 6), (6, 7)] and shards.missing() == [0, 1, 2]
    for j, (start, stop) in enumerate(shards.ranges()):
        shards.write(j, records(start, stop))
    full = records(0, 7)
    idx = torch.tensor([6, 0, 3, 3, 2])  # across shards, the short last one, a repeat
    assert torch.equal(shards.read("a", idx), full["a"][idx])
    assert torch.equal(shards.read("b", idx), full["b"][idx])
    assert torch.equal(shards.read("a", idx, rows=[2, 0]), full["a"][idx][:, [2, 0]])
    assert shards.read("a", torch.tensor([], dtype=torch.long)).shape == (0, 3, 2)
    assert shards.read("a", idx, rows=[]).shape == (5, 0, 2)  # kd: no knot between the noise and the sample
    with pytest.raises(IndexError, match="record 7 of 7"):
        shards.read("b", torch.tensor([7]))


def test_a_killed_generation_leaves_whole_shards_and_a_reopened_store_finds_what_is_missing(tmp_path):
    shards = Shards(tmp_path / "s", FIELDS, n=7, shard_size=3)
    shards.write(1, records(3, 6))
    (tmp_path / "s" / "0000000.bin").write_bytes(b"\0" * 5)  # a torn write cannot happen (renamed into place); a
    again = Shards(tmp_path / "s", FIELDS, n=7, shard_size=3)  # truncated file counts as missing all the same
    assert again.missing() == [0, 2]
    with pytest.raises(RuntimeError, match="another layout"):
        Shards(tmp_path / "s", FIELDS, n=8, shard_size=3)
    with pytest.raises(ValueError, match="field a is"):
        again.write(0, {"a": torch.zeros(3, 3, 2), "b": torch.zeros(3, 1, dtype=torch.int64)})  # float32


def test_ard_fits_on_trajectories_ten_times_what_its_memory_budget_leaves(tmp_path):
    """A run on 1,000 trajectories measures what a run needs besides them; a run on 46,000 (10x the headroom its
    `--memory-budget` leaves above that) finishes under the budget: its trajectories stream from disk. They are the
    same bytes as the benchmark's at a fifth of the cost: the teacher is `quick-dit` (tests/tiny_recipes.py) and their
    sampler runs without CFG (cfg=1: one teacher pass per step instead of two)."""
    # trained in this process: a run that trains its teacher peaks higher than the runs measured here
    QuickDiT.load("quick-dit", cache=Cache(tmp_path / "cache"), device=torch.device("cpu"))
    env = {**tiny_env(), "OMP_NUM_THREADS": "1"}  # fit on one thread: two spin on a busy machine, for tens of seconds

    def run(n_traj, seed, *extra):
        return ard_run(tmp_path, n_traj, seed, 8, "--param", "cfg=1", *extra, teacher="quick-dit")

    baseline = peak_rss_mb(run(1000, 1), env)  # everything but the trajectories: the run on other ones
    big = 46_000
    bytes_per_traj = (2 * 8 + 1) * 16 * 16 * 2 + 8  # K + 1 states and K predictions, float16, and the class
    headroom = big * bytes_per_traj / 2**20 / 10
    peak = peak_rss_mb(run(big, 2, "--memory-budget", f"{baseline + headroom:.0f}"), env)
    assert max(bytes_on_disk(d) for d in (tmp_path / "cache" / TRAJECTORIES).iterdir()) == big * bytes_per_traj
    assert peak < baseline + headroom, (peak, baseline, headroom)
