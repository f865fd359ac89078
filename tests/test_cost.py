"""The cost mode (`bench.cost`, `accelbench ... --cost`): FLOPs equal a hand count, parameters are those read, real
architectures counted at full size on the meta device, and the CLI end to end (a cost run in MLflow, COST.md)."""
from pathlib import Path

import pytest
import yaml
import torch
from mlflow.tracking import MlflowClient

import cli
from bench import cost
from bench.plan import plan
from core import files
from core.trial import Trial
from teachers.networks.dit import DiT, DiTConfig
from teachers.networks.gpt import GPT, GPTConfig


def test_flops_of_a_tiny_dit_equal_a_hand_count():
    c = DiTConfig(image_size=8, channels=2, patch=2, hidden=32, depth=2, heads=4, n_classes=5)
    net, B = DiT(c).eval(), 3
    x, t, y = torch.randn(B, 2, 8, 8), torch.randint(1000, (B,)), torch.randint(5, (B,))
    flops, read, _ = cost.counted(lambda: net(x, t, y))
    L, d, pc = c.tokens, c.hidden, c.patch * c.patch
    macs = (L * pc * c.channels * d  # patch embedding
            + 256 * d + d * d  # timestep MLP (the label embedding is a lookup)
            + c.depth * (d * 6 * d + L * d * 3 * d + 2 * L * L * d + L * d * d + 2 * L * d * 4 * d)  # blocks
            + d * 2 * d + L * d * pc * c.out_channels)  # final adaLN and linear
    assert flops == 2 * B * macs  # the counter counts a multiply-add as 2 FLOPs
    assert {id(p) for p in net.parameters()} <= read


def test_flops_of_a_tiny_gpt_equal_a_hand_count():
    c = GPTConfig(vocab_size=17, cond_vocab=4, cond_len=2, seq_len=6, n_layer=3, n_head=2, n_embd=16)
    net, B = GPT(c).eval(), 2
    cond, tokens = torch.randint(4, (B, 2)), torch.randint(17, (B, 6))
    flops, _, _ = cost.counted(lambda: net(cond, tokens))
    T, d = c.cond_len + c.seq_len - 1, c.n_embd  # the last token is never read
    macs = c.n_layer * (12 * T * d * d + 2 * T * T * d) + T * d * c.vocab_size
    assert flops == 2 * B * macs


def _planned(teacher, method, params):
    with files.audit():  # no file needed: the cost mode builds the teacher at random
        return plan(Trial(teacher=teacher, method=method, params=params, device="cpu"),
                    checkpoints=Path("/nonexistent"))


def test_dit_xl2_counted_at_full_size_on_the_meta_device():
    """ARD Table 1: 118.6 GFLOPs a DiT-XL/2 forward, twice with CFG; DiT-XL/2 675 M parameters."""
    arms = cost.count(_planned("dit-xl-2-256", "ddim", {"steps": 1, "cfg": 1.5}), cache=None)
    a = arms["method"]
    assert a.nfe == 1 and a.macs / 1e9 == pytest.approx(237.2, rel=1e-3)
    assert a.params == {"DiT": 674_834_720} and "meta" in a.how


def test_var_d16_and_its_released_dd_student_counted_on_the_meta_device():
    """DD Table 1's #Para: VAR-d16 310M; VAR-d16-DD 327M in the paper, 328.2M in the released architecture (its
    depth + 1 = 17 data/noise projections of 1024 x 1024 over VAR-d16's 310.3M; 16 of them would give 327.1M)."""
    arms = cost.count(_planned("var-d16", "dd", {"student": "VAR-DD/var-d16.pth", "steps": 1}), cache=None)
    assert arms["ref"].nfe == 10 and arms["method"].nfe == 1
    assert round(arms["ref"].params["VAR"], -6) == 310e6
    assert arms["method"].params == {"ReleasedVARDD": 328_165_664}
    assert arms["method"].macs < arms["ref"].macs


def test_an_arm_that_cannot_run_on_meta_says_why():
    p = _planned("llamagen-b-256", "sjd", {})
    teacher, arms = cost.build(p, torch.device("meta"), cache=None)
    sjd = cost.count_arms(p, teacher, {"method": arms["method"]}, torch.device("meta"), "")["method"]
    assert sjd.flops is None and sjd.how.startswith("not counted: its passes depend on what it draws")


def test_cost_mode_end_to_end(tiny_recipe, tmp_path, fresh_store, capsys):
    common = ["--tracking-uri", fresh_store, "--cache-dir", str(tmp_path / "cache"), "--no-progress", "--out",
              str(tmp_path / "out"), "--teacher", "digits-dit-c2i", "--cost", "--latency", "--latency-warmup", "2",
              "--latency-min-count", "3", "--latency-min-seconds", "0"]
    assert cli.main(["run", *common, "--method", "ard", "--param", "steps=8"]) == 0
    assert cli.main(["run", *common, "--method", "ddim", "--param", "steps=4"]) == 0
    client = MlflowClient(fresh_store)
    runs = client.search_runs([client.get_experiment_by_name("accelbench").experiment_id],
                              "tags.`accelbench.kind` = 'cost'")
    by_method = {r.data.params["method"]: r for r in runs}
    ard, ddim = by_method["ard"].data.metrics, by_method["ddim"].data.metrics
    assert ard["nfe_per_sample"] == 4 and ard["ref/nfe_per_sample"] == 8 and ddim["nfe_per_sample"] == 4
    # the reference arm's 8 DDIM steps cost exactly twice the 4-step DDIM's
    assert ard["ref/gflops_per_sample"] == pytest.approx(2 * ddim["gflops_per_sample"], rel=1e-12)
    assert ard["gmacs_per_sample"] == ard["gflops_per_sample"] / 2
    assert ard["params"] > 0 and ard["latency_count"] >= 3 and ard["ref/latency_count"] >= 3
    assert "ard" in (tmp_path / "out" / "COST.md").read_text()
    assert "| digits-dit-c2i | ddim |" in capsys.readouterr().out


def test_recorded_costs_price_a_dry_run_in_the_measured_ratio(tiny_recipe, tmp_path, fresh_store, capsys):
    """`--cost --record` writes each timed arm's per-pass cost at its batch, and the training's iteration per sample
    at its batch under the machine's float32 kind (`fit` trains in float32 whatever the trial's dtype); the dry run
    then prices the teacher and the method arms in exactly the ratio the cost mode measured, and the training as its
    iterations x batch x that cost."""
    from bench.dryrun import costs, device_kind, device_machine, estimate

    folder, store = tmp_path / "costs", fresh_store
    trial = ["--teacher", "digits-dit-c2i", "--method", "ard", "--param", "steps=8", "--param", "batch=16",
             "--dtype", "bf16"]
    assert cli.main(["run", *trial, "--cost", "--record", "--costs", str(folder), "--latency-batch", "2",
                     "--latency-warmup", "1", "--latency-min-count", "3", "--latency-min-seconds", "0",
                     "--tracking-uri", store, "--cache-dir", str(tmp_path / "cache"), "--out", str(tmp_path / "out"),
                     "--no-progress"]) == 0
    client = MlflowClient(store)
    (run,) = client.search_runs([client.get_experiment_by_name("accelbench").experiment_id])
    m = run.data.metrics
    machine = device_machine(torch.device("cpu"))  # the kind: this machine, bfloat16 (the trial's dtype)
    entry = costs(folder)[device_kind(machine, "bf16")]["digits-dit-c2i"].batches[2]
    trained = costs(folder)[device_kind(machine, "fp32")]["digits-dit-c2i"].training[16]
    assert trained.seconds == {"train ard S=4 N=1": pytest.approx(m["train/latency_per_sample_median"], rel=1e-9)}
    assert device_kind(machine, "fp32") not in costs(folder) or not costs(folder)[device_kind(machine, "fp32")][
        "digits-dit-c2i"].batches  # the sampling arms' float32 costs are not guessed from bfloat16 ones
    assert entry.seconds["step"] == pytest.approx(m["ref/latency_per_sample_median"] / 8, rel=1e-9)
    assert entry.seconds["student_step"] == pytest.approx(m["latency_per_sample_median"] / 4, rel=1e-9)
    assert "--record" in entry.command and run.data.tags["cost.recorded"] == (
        "train: train ard S=4 N=1 at batch 16, ref: step at batch 2, method: student_step at batch 2")
    assert "fp32, no tf32" in trained.device
    capsys.readouterr()
    dry = ["run", *trial, "--n-samples", "10", "--batch-size", "2", "--warmup", "0", "--dry-run", "--device-kind",
           machine, "--costs", str(folder)]
    assert cli.main(dry) == 0
    out = capsys.readouterr().out
    assert "estimated:" in out and "an upper bound)" not in out
    hours = 2000 * 16 * trained.seconds["train ard S=4 N=1"] / 3600
    assert f"  fit: trains 2000 iterations of batch 16: {hours:.3g} device-hours (train ard S=4 N=1 at batch 16's" \
        in out
    with files.audit():
        p = plan(Trial(teacher="digits-dit-c2i", method="ard", params={"steps": 8, "batch": 16}, n_samples=10,
                       batch_size=2, dtype="bf16"), checkpoints=Path("/nonexistent"))
    arms = {a.arm: a.seconds for a in estimate(p, 0, machine, folder=folder).arms}
    assert arms["ref"] / arms["method"] == pytest.approx(
        m["ref/latency_per_sample_median"] / m["latency_per_sample_median"], rel=1e-9)


@pytest.fixture(scope="module")
def ard_table1():
    """The plans of the rows of ARD Table 1's suite that carry the paper's GFLOPs, but the 250-step teacher's (250
    forward passes of shapes, ten times the 25-step row's; measured by `accelbench suite
    suites/papers/ard-table1.yaml --cost`: 59,310.7 against 59,300)."""
    from bench.suite import load_suite

    root = Path(__file__).resolve().parent.parent
    with files.audit():
        plans = load_suite(str(root / "suites" / "papers" / "ard-table1.yaml"), checkpoints=Path("/nonexistent")).plans
    return [p for p in plans if "gflops" in p.paper and p.paper["nfe"] != 250]


# Two tests of about equal cost: the 25-step teacher's 25 forward passes, the nine students' 27. A student's reference
# arm is that teacher, counted once per process (`bench.cost`).
@pytest.mark.parametrize("rows, n", [("teacher", 1), ("students", 9)])
def test_ard_table1_gflops_rows_are_reproduced_on_the_meta_device(ard_table1, rows, n):
    """ARD Table 1's GFLOPs (a DiT-XL/2 forward is 118.6 GMACs, twice with CFG; ARD's history attention adds the
    rest, 0.4 % of a student's count and more: ARD N = 6 M1 2 steps 238.1 against Step Distill.'s 237.2, so a count
    without it fails the test's 0.1 %), every row of the suite within 0.1 %
    (measured: -0.07 % to +0.02 %) and its NFE equal to the Steps column; DiT-XL/2 675M parameters."""
    checked = 0
    for p in ard_table1:
        if (p.trial.method == "ddim") != (rows == "teacher"):
            continue
        a = cost.count(p, cache=None)["method"]
        assert a.macs / 1e9 == pytest.approx(p.paper["gflops"], rel=0.001), p.paper["source"]
        assert a.nfe == p.paper["nfe"]
        checked += 1
        if p.trial.method == "ddim":
            assert round(sum(a.params.values()), -6) == 675e6
    assert checked == n


def test_the_training_cost_script_prints_each_kind_of_iteration_once(tiny_recipe, tmp_path, monkeypatch, capsys):
    """`benchmarks/train_step_cost.py SUITE --batch N`: the cost-table line of every distinct (teacher, kind) of
    training in the suite, timed by the cost mode's own `time_training` at at most N samples; rows that train nothing
    (a teacher's own sampler) or repeat a kind (two seeds, a knob that leaves the iteration alone) print nothing."""
    import runpy

    suite = tmp_path / "s.yaml"
    suite.write_text(yaml.safe_dump({"experiment": "t", "seeds": [0, 1], "defaults": {"teacher": "digits-dit-c2i"},
                                     "trials": [{"method": "ddim"}, {"method": "kd"},
                                                {"method": "ard", "params": {"student_steps": 2}},
                                                {"method": "ard", "params": {"student_steps": 2, "mask": "M3"}}]}))
    monkeypatch.setattr("sys.argv", ["train_step_cost.py", str(suite), "--batch", "2", "--repeats", "1", "--threads",
                                     "1", "--cache-dir", str(tmp_path / "cache")])
    runpy.run_path(str(Path(__file__).resolve().parent.parent / "benchmarks" / "train_step_cost.py"),
                   run_name="__main__")
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(": ")[:4] for line in lines] == [
        ["digits-dit-c2i", "training", "2", "'train ard S=1'"],
        ["digits-dit-c2i", "training", "2", "'train ard S=2 N=1'"]]
    assert all(float(line.split(": ")[4].split()[0]) > 0 for line in lines)


def test_mars_sampler_counts_the_same_on_the_meta_device_as_on_the_cpu():
    """MAR's sampler (the masked-AR family's) with static shapes: each step's known count and predicted positions are
    the schedule's, so the meta device (no values) runs it and its FLOPs are those of the same draw on the CPU (the
    encoder reads the buffer and the known tokens alone: a count that padded to every position would be larger)."""
    from teachers.families import masked_ar
    from tests.fakes import TinyOfficialMAR

    s = masked_ar.SamplingConfig(num_iter=4, steps=5, cfg=2.0)
    out = {}
    for device in ("cpu", "meta"):
        t = TinyOfficialMAR.random("tiny-mar-official", torch.device(device))  # the tiny configs, random weights
        cond = t.conditions(2, torch.Generator().manual_seed(0)).to(device)
        flops, _, samples = cost.counted(lambda: masked_ar.sample_mar(
            t, cond, s, generator=torch.Generator().manual_seed(1)), reads=False)
        out[device] = (flops, samples.counters)
    assert out["cpu"] == out["meta"] and out["cpu"][0] > 0 and out["cpu"][1]["nfe"] == 2 * 4
