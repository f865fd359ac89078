"""SJD's training-free descendants (`methods.scd`, `methods.gsd`, `methods.lantern`): each "lossless" claim checked
as SJD's is (chi-square of sequences from an enumerable teacher against its exact law, at batch 1 and 4, with CFG,
top-k and temperature), each released departure from it refuted with the same test, and the lossy rules' groups and
relaxed targets computed by hand."""
import os

import pytest
import torch

from core.acceptance import PREFIX, ROUNDS
from core.config import build_config
from core.errors import UserError
from core.registry import METHODS
from methods import scd as scd_module
from methods.gsd import GSDConfig, grouped_rule
from methods.lantern import neighbour_table, relaxed_rule
from tests.fakes import TableAR, tiny_gpt_teacher
from tests.test_sjd import (ALPHA, BATCH_CONDS, COND, POOL, TEXT_TEACHERS, batch_teacher, chi_square_p, exact_law,
                            rows_p)


def method(name: str, teacher, **knobs):
    cls = METHODS.get(name)
    return cls(teacher, build_config(cls.Config, knobs, owner=name))


def table_p(name: str, teacher=None, n: int = 1000, seed: int = 0, **knobs) -> float:
    """p-value of n sequences of method `name` on the table model (3 tokens, 4 positions: 81 sequences) against its
    exact law (`tests.test_sjd.chi_square_p`, rare sequences pooled)."""
    teacher = teacher or TableAR(vocab=3, seq_len=4)
    m, g = method(name, teacher, **knobs), torch.Generator().manual_seed(seed)
    return chi_square_p(teacher.exact_distribution(m.config.sampling),
                        lambda: tuple(m.sample(COND, generator=g).data[0].tolist()), n, pool_below=POOL)


# ---- SCD: lossless in `mode: exact`, each coupling; the release's departures refuted -------------------------------

@pytest.mark.parametrize("coupling", ["gumbel", "maximal"])
@pytest.mark.parametrize("knobs", [
    {"window": 3},
    {"window": 4, "init": "repeat-left", "ar_head": 2},
    {"window": 3, "init": "sample-left", "top_k": 2, "temperature": 0.8, "cfg": 2.0, "ar_tail": 2},
])
def test_scd_exact_matches_the_exact_distribution(coupling, knobs):
    assert table_p("scd", coupling=coupling, mode="exact", **knobs) > ALPHA


@pytest.mark.parametrize("coupling", ["gumbel", "maximal"])
def test_scd_exact_at_batch_four_matches_each_rows_exact_distribution(coupling):
    teacher = batch_teacher()
    m = method("scd", teacher, window=4, init="repeat-left", cfg=1.5, coupling=coupling, mode="exact")
    assert rows_p(teacher, BATCH_CONDS, m.config, None, decode=lambda g: m.sample(BATCH_CONDS, generator=g).data) \
        > ALPHA


def test_scd_gumbel_as_released_is_not_lossless():
    """A pass of one position does not move the release's noise table (GS:1193): two positions decoded one per pass
    share their Gumbel noise (here `ar_tail`: the release's last dozen image tokens)."""
    assert table_p("scd", window=3, ar_tail=2, mode="released") < ALPHA


def test_scd_maximal_coupling_as_released_is_not_lossless():
    """A kept draft carries its old q into the next verification (MC:290-293)."""
    assert table_p("scd", window=4, init="repeat-left", coupling="maximal", mode="released") < ALPHA


def test_gumbel_noise_kept_past_its_position_is_detected(monkeypatch):
    """The broken variant: the table never moves (each window row keeps one noise slot for good), so a position reuses
    the noise of the one decided before it."""
    monkeypatch.setattr(scd_module.GumbelDraws, "decided", lambda self, m, L_row: None)
    assert table_p("scd", window=3, mode="exact") < ALPHA


def test_gumbel_draws_are_exact_draws_and_keep_their_noise_until_decided():
    g = torch.Generator().manual_seed(0)
    draws = scd_module.GumbelDraws(1, 3, 4, g, shift_alone=True)
    P = torch.tensor([[[0.1, 0.2, 0.3, 0.4]] * 3])  # (1, 3, 4)
    first = draws.window(P, torch.zeros(1, dtype=torch.long), torch.tensor([3]))
    assert torch.equal(draws.window(P, torch.zeros(1, dtype=torch.long), torch.tensor([3])), first)  # same noise
    draws.decided(torch.tensor([1]), torch.tensor([3]))  # row 0's position decided: rows 1, 2 keep theirs
    assert torch.equal(draws.window(P, torch.zeros(1, dtype=torch.long), torch.tensor([3]))[0, :2], first[0, 1:])
    counts = torch.bincount(scd_module.gumbel_argmax(P[0, :1].expand(40000, 4), torch.rand(40000, 4, generator=g)))
    torch.testing.assert_close(counts / 40000, P[0, 0], atol=0.01, rtol=0)


TEACHERS = {"image-cfg": lambda: tiny_gpt_teacher(vocab=4, grid=(2, 2)), **TEXT_TEACHERS}


@pytest.mark.parametrize("teacher_name", TEACHERS)
def test_scd_exact_through_each_teachers_cache_matches_its_exact_distribution(teacher_name):
    """Where SJD runs, SCD does: our GPT's KV cache with both CFG branches (the image teachers, LlamaGen), its text
    path, and transformers' DynamicCache (Chameleon, Emu3, the Hugging Face LMs), each rolled back after a pass."""
    teacher = TEACHERS[teacher_name]()
    cond = torch.tensor([[7, 7]]) if teacher_name == "image-cfg" else teacher.conditions(1, torch.Generator())
    m, g = method("scd", teacher, window=3, cfg=1.5 if teacher.supports_cfg else 1.0, mode="exact"), \
        torch.Generator().manual_seed(0)
    assert chi_square_p(exact_law(teacher, cond, m.config.sampling),
                        lambda: tuple(m.sample(cond, generator=g).data[0].tolist()), pool_below=POOL) > ALPHA


@pytest.mark.parametrize("teacher_name", TEACHERS)
@pytest.mark.parametrize("name, knobs", [("gsd", {}), ("sjd", {"verify": "lantern"})])
def test_the_lossy_rules_run_on_each_teachers_path_and_log_acceptance_by_position(teacher_name, name, knobs):
    """GSD's input embedding and LANTERN's codebook (or, without one per id, the input embedding) on each path, at
    batch 2 where the cache is ragged; the counters SJD logs (acceptance by window position) come out."""
    teacher = TEACHERS[teacher_name]()
    cond = (torch.tensor([[7, 7], [3, 3]]) if teacher_name == "image-cfg"
            else teacher.conditions(2, torch.Generator().manual_seed(0)))
    batch = len(cond) if getattr(teacher, "ragged_cache", False) else 1
    out = method(name, teacher, window=3, **knobs).sample(cond[:batch], generator=torch.Generator().manual_seed(0))
    assert out.data.shape == (batch, teacher.seq_len)
    assert out.counters["drafts_verified"] >= out.counters["drafts_accepted"] and out.counters["drafts_verified"] > 0
    positions = [k for k in out.counters if k.startswith(PREFIX) and k != ROUNDS]
    assert out.counters[ROUNDS] > 0 and positions, sorted(out.counters)


# ---- GSD and LANTERN: lossy; off, each is SJD draw for draw ---------------------------------------------------------

@pytest.mark.parametrize("name, knobs", [("gsd", {"distance": 0.0}), ("sjd", {"verify": "lantern",
                                                                             "lantern_delta": 0.0})])
def test_a_relaxation_of_zero_is_sjd_draw_for_draw(name, knobs):
    teacher = TableAR(vocab=5, seq_len=5)
    for seed in range(20):
        relaxed = method(name, teacher, window=3, cfg=1.5, **knobs).sample(COND, generator=torch.Generator()
                                                                            .manual_seed(seed)).data
        sjd = method("sjd", teacher, window=3, cfg=1.5).sample(COND, generator=torch.Generator().manual_seed(seed))
        assert torch.equal(relaxed, sjd.data)


@pytest.mark.parametrize("name, knobs", [
    ("gsd", {"below": 2, "above": 2, "p_gap": 1.0, "distance": 4.0}),
    ("sjd", {"verify": "lantern", "lantern_k": 2, "lantern_lambda": 3.0}),
])
def test_a_wide_relaxation_is_measured_lossy(name, knobs):
    assert table_p(name, window=3, **knobs) < ALPHA


def test_gsd_groups_and_ratio_by_hand():
    """One draft, V = 6: ranks by p ascending [t5 t4 t3 t0 t2 t1]; the draft t0 has rank 3, its group the ranks 1..4
    (below 2, above 1): t4 t3 t0 t2; t4 fails the gap (0.20 - 0.03 >= 0.15), t3 the distance (25 >= 0.5), so
    p(G) = p(t0) + p(t2) = 0.5."""
    P = torch.tensor([[[0.20, 0.40, 0.30, 0.06, 0.03, 0.01], [1 / 6] * 6]])  # (1, 2, 6): row 1 the bonus row
    vectors = torch.tensor([[0.0], [0.0], [0.1], [5.0], [0.0], [0.0]])  # (6, 1)
    rule = grouped_rule(vectors, GSDConfig(below=2, above=1, p_gap=0.15, distance=0.5))
    drafts, qs = torch.tensor([[0]]), torch.nn.functional.one_hot(torch.tensor([[0]]), 6).float()
    accepted = sum(int(rule(P, drafts, qs, None, torch.tensor([1]), torch.Generator().manual_seed(s))[0])
                   for s in range(4000))
    assert accepted / 4000 == pytest.approx(0.5, abs=0.025)  # against SJD's p(t0) = 0.20: 38 sigma away


def test_lantern_relaxed_target_by_hand():
    """Draft t0; its neighbours by codebook distance t1, t2, t3; delta 0.25 takes the longest prefix of mass <= 0.25:
    t1 (0.10) and t2 (0.10), not t3 (0.30 more). p~(t0) = 0.2 + 0.2 = 0.4; the residual is the rest of p~."""
    teacher = TableAR(vocab=4, seq_len=2)
    teacher.codebook = torch.tensor([[0.0], [1.0], [2.0], [3.0]])
    assert neighbour_table(teacher.codebook, 3)[0].tolist() == [1, 2, 3]
    rule = relaxed_rule(teacher, k=3, delta=0.25, lam=0.0)
    P = torch.tensor([[[0.2, 0.1, 0.1, 0.6], [0.25] * 4]])
    drafts, qs = torch.tensor([[0]]), torch.nn.functional.one_hot(torch.tensor([[0]]), 4).float()
    outcomes = [rule(P, drafts, qs, None, torch.tensor([1]), torch.Generator().manual_seed(s)) for s in range(4000)]
    assert sum(int(n) for n, _ in outcomes) / 4000 == pytest.approx(0.4, abs=0.025)
    assert {int(r) for n, r in outcomes if n == 0} == {3}  # p~ - q is 0 but at t3: the moved mass is not redrawn


def test_lantern_plus_plus_budget_caps_the_relaxed_mass_at_lambda_p():
    teacher = TableAR(vocab=4, seq_len=2)
    teacher.codebook = torch.tensor([[0.0], [1.0], [2.0], [3.0]])
    rule = relaxed_rule(teacher, k=3, delta=0.0, lam=2.0)  # budget (2 - 1) p(t0) = 0.2: t1 (0.1), not t2 (0.25 in all)
    P = torch.tensor([[[0.2, 0.1, 0.15, 0.55], [0.25] * 4]])
    drafts, qs = torch.tensor([[0]]), torch.nn.functional.one_hot(torch.tensor([[0]]), 4).float()
    accepted = sum(int(rule(P, drafts, qs, None, torch.tensor([1]), torch.Generator().manual_seed(s))[0])
                   for s in range(4000))
    assert accepted / 4000 == pytest.approx(0.3, abs=0.025)


def test_knob_errors_are_one_line():
    with pytest.raises(UserError, match="verify must be one of exact here"):
        method("jacobi", TableAR(), verify="lantern")
    with pytest.raises(UserError, match="coupling"):
        method("scd", TableAR(), coupling="nearest")


def test_the_lossless_audit_runs_and_certifies_or_refutes_each_row():
    """`python benchmarks/lossless_audit.py` (docs/guide/lossless.md), at 150 draws a row instead of 20,000: a row for
    every setting, the released SCD-Gumbel refuted even at this size (p = 0: it draws with correlated noise)."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    done = subprocess.run([sys.executable, str(root / "benchmarks" / "lossless_audit.py"), "--draws", "150"],
                          capture_output=True, text=True, timeout=300, cwd=root)
    assert done.returncode == 0, done.stderr[-2000:]
    tables = ("| 3^4", "| 6^3", "| 2^6", "| 2^(3x2)")
    rows = [line.split(" | ") for line in done.stdout.splitlines() if line.startswith(tables)]
    assert len(rows) == 27
    released = next(r for r in rows if r[1] == "scd gumbel released")
    assert float(released[2]) < ALPHA


def test_the_side_by_side_benchmark_runs_on_a_tiny_teacher():
    """`python benchmarks/sjd_descendants.py` (docs/guide/lossless.md) on the zoo's digits teacher, one sample: a row
    per method, each with a step compression above 1 (the trained teacher accepts drafts)."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    done = subprocess.run([sys.executable, str(root / "benchmarks" / "sjd_descendants.py"), "--teacher",
                           "digits-ar-t2i", "--seeds", "0", "--n-samples", "1", "--threads", "1", "--cfg", "1.0"],
                          capture_output=True, text=True, timeout=300, cwd=root,
                          env={**os.environ, "ACCELBENCH_ZOO": ""})  # the project's zoo: its trained teacher
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [line.split(" | ") for line in done.stdout.splitlines() if line.startswith("| ") and "x |" in line]
    assert [r[0].strip("| ") for r in rows] == ["sjd", "scd gumbel exact", "scd maximal exact", "gsd",
                                                "sjd verify=lantern", "sjd-pac K=3 D=3 released",
                                                "sjd-pac K=3 D=3 exact"]
    assert all(float(r[2].rstrip("x")) > 1 for r in rows)
