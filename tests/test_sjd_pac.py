"""SJD-PAC (`methods.sjd_pac`): its lossless claim checked as SJD's is (chi-square of sequences from an enumerable
teacher against its exact law, at batch 1 and 4, with CFG, top-k and temperature), for each component alone and both;
a broken variant that must fail; the release's verifier refuted by the same test."""
import pytest
import torch

from core.errors import UserError
from methods import sjd_pac
from tests.fakes import TableAR
from tests.test_sjd import ALPHA, BATCH_CONDS, COND, POOL, batch_teacher, chi_square_p, exact_law, rows_p
from tests.test_sjd_descendants import TEACHERS, method, table_p

# Proactive drafting alone, adaptive continuation alone, both. The tree needs a window of K^D - 1 / (K - 1) + 1 to
# leave a main path that continuation can act on: six binary tokens (64 sequences) at window 5.
COMPONENTS = {
    "drafting": {"tree_width": 2, "tree_depth": 2, "continuation": False},
    "continuation": {"tree_width": 1, "tree_depth": 1, "continuation": True},
    "both": {"tree_width": 2, "tree_depth": 2, "continuation": True},
}


def long_table():
    return TableAR(vocab=2, seq_len=6, grid=(2, 3))


@pytest.mark.parametrize("component", COMPONENTS)
@pytest.mark.parametrize("teacher, knobs", [
    (TableAR, {"window": 4}),
    (long_table, {"window": 5}),
    (TableAR, {"window": 4, "top_k": 2, "temperature": 0.8, "cfg": 2.0}),
], ids=["3^4", "2^6", "3^4-cfg-top_k-temperature"])
def test_exact_matches_the_exact_distribution(component, teacher, knobs):
    assert table_p("sjd-pac", teacher(), mode="exact", **COMPONENTS[component], **knobs) > ALPHA


def test_a_three_way_tree_two_levels_deep_matches_the_exact_distribution():
    """K = 2, D = 3: four paths of three levels (7 nodes) and a main path, on eight binary tokens (256 sequences)."""
    teacher = TableAR(vocab=2, seq_len=8, grid=(2, 4))
    assert table_p("sjd-pac", teacher, n=2000, window=7, tree_width=2, tree_depth=3, mode="exact") > ALPHA


@pytest.mark.parametrize("component", ["drafting", "both"])
def test_exact_at_batch_four_matches_each_rows_exact_distribution(component):
    teacher = batch_teacher()
    m = method("sjd-pac", teacher, window=4, cfg=1.5, mode="exact", **COMPONENTS[component])
    assert rows_p(teacher, BATCH_CONDS, m.config, None, n=300,
                  decode=lambda g: m.sample(BATCH_CONDS, generator=g).data) > ALPHA


@pytest.mark.parametrize("teacher_name", TEACHERS)
def test_exact_through_each_teachers_cache_matches_its_exact_distribution(teacher_name):
    """The paths as rows of one pass through our GPT's ragged cache with both CFG branches, its text path, and
    transformers' DynamicCache (rows repeated by `batch_select_indices`)."""
    teacher = TEACHERS[teacher_name]()
    cond = torch.tensor([[7, 7]]) if teacher_name == "image-cfg" else teacher.conditions(1, torch.Generator())
    m = method("sjd-pac", teacher, window=4, tree_width=2, tree_depth=2,
               cfg=1.5 if teacher.supports_cfg else 1.0, mode="exact")
    g = torch.Generator().manual_seed(0)
    assert chi_square_p(exact_law(teacher, cond, m.config.sampling),
                        lambda: tuple(m.sample(cond, generator=g).data[0].tolist()), pool_below=POOL) > ALPHA


class MainRowTable(TableAR):
    """The broken variant: after a pass, the cache keeps each sequence's main-path row whichever path was accepted
    (the release copies the accepted path's keys and values into place, PAC:269-278); two paths per sequence."""

    def select(self, state, rows):
        super().select(state, rows - rows % 2 if len(rows) < len(state.rows) else rows)


def test_a_cache_that_keeps_the_main_path_after_a_side_path_is_accepted_is_detected():
    assert table_p("sjd-pac", MainRowTable(), window=4, mode="exact", **COMPONENTS["drafting"]) < ALPHA


@pytest.mark.parametrize("component", ["continuation", "both"])
def test_the_released_verifier_is_not_lossless(component):
    """With continuation alone only departure 4 acts (a full accept's next token drawn from the residual against a
    stale q); with the tree, departures 1-3 too."""
    assert table_p("sjd-pac", long_table(), window=5, mode="released", **COMPONENTS[component]) < ALPHA


def test_the_tree_is_verified_in_one_pass_per_window_and_logs_acceptance():
    teacher = long_table()
    m = method("sjd-pac", teacher, window=5, tree_width=2, tree_depth=2, mode="exact")
    out = m.sample(COND, generator=torch.Generator().manual_seed(0))
    assert out.counters["nfe"] == out.counters["batch_forwards"] < teacher.seq_len
    assert out.counters["drafts_verified"] >= out.counters["drafts_accepted"] > 0


def test_layout_shortens_the_main_path_by_the_trees_other_nodes():
    """The release's layout (PAC:362-376): L = 64, K = 4, D = 3 is a root, 4 + 16 tree nodes, and a main path of
    64 - 18 = 46 tokens; near the end of a sequence the tree gets shallower until it fits."""
    c = method("sjd-pac", TableAR()).config
    w = sjd_pac.layout(c, 64)
    assert (w.T, w.R, w.main) == (2, 16, 46)
    assert [(sjd_pac.layout(c, L).T, sjd_pac.layout(c, L).main) for L in (21, 20, 5, 4, 1)] == \
        [(2, 3), (1, 17), (1, 2), (0, 4), (0, 1)]


def test_knob_errors_are_one_line():
    with pytest.raises(UserError, match="more than the window of 16"):
        method("sjd-pac", TableAR(), window=16)
    with pytest.raises(UserError, match="init must be random"):
        method("sjd-pac", TableAR(), init="repeat-left")
