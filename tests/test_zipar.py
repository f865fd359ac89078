"""ZipAR (`methods.zipar`): its schedule by hand, AR decoding at a window of the row length (chi-square against the
exact law, at batch 1 and 4), its distance from the teacher's law measured where rows overlap, and a broken
variant (the new row's first input one slot off) that must fail."""
import pytest
import torch

from core.errors import UserError
from methods import zipar
from tests.fakes import TableAR, tiny_gpt_teacher
from tests.test_sjd import ALPHA, BATCH_CONDS, POOL, batch_teacher, chi_square_p, exact_law, rows_p
from tests.test_sjd_descendants import method

COND = torch.tensor([[7, 7]])
# Three rows of two binary tokens (64 images), at temperature 4: the untrained GPT's laws are near one-hot, and a
# context with a hole would barely move them (measured at temperature 1: TV 0.01 at window 1, within the noise).
SAMPLING = {"temperature": 4.0, "cfg": 1.5}


def zipar_p(window: int, teacher=None, n: int = 1000) -> float:
    teacher = teacher or tiny_gpt_teacher(vocab=2, grid=(3, 2))
    m, g = method("zipar", teacher, window=window, **SAMPLING), torch.Generator().manual_seed(1)
    return chi_square_p(exact_law(teacher, COND, m.config.sampling),
                        lambda: tuple(m.sample(COND, generator=g).data[0].tolist()), n, pool_below=POOL)


def test_the_schedule_by_hand():
    """3 x 3, window 1: the first row token by token; row 1 from row 0's last token; row 2 as soon as row 1 holds
    one token, from a copy of it at row 1's end (slot 5); row 1's last token fed once more at its slot (no target)."""
    assert zipar.schedule(3, 3, 1) == [[(0, 0, 1)], [(1, 1, 2)], [(2, 2, 3)], [(3, 3, 4), (3, 5, 6)],
                                        [(4, 4, 5), (6, 6, 7)], [(5, 5, None), (7, 7, 8)]]
    # passes per image, the prefill included: a window of the row length is AR (64 for 8 x 8)
    assert [1 + len(zipar.schedule(8, 8, s)) for s in (8, 4, 1)] == [64, 40, 22]
    assert 1 + len(zipar.schedule(16, 16, 8)) == 144  # LlamaGen at 256 px and the release's window: 1.78x fewer


def test_a_window_of_the_row_length_is_ar_decoding():
    assert zipar_p(window=2) > ALPHA


def test_overlapping_rows_are_measured_lossy():
    """Window 1: a row's first token reads a copy of the token above in place of the row above's last (TV 0.066
    from the exact law at 4,000 draws, against 0.028 for window 2)."""
    assert zipar_p(window=1) < ALPHA


def test_a_first_input_one_slot_off_is_detected(monkeypatch):
    """The broken variant: a new row's first input fed at the row's own first slot instead of the end of the row
    above (where the release puts it, Z:158)."""
    schedule = zipar.schedule

    def shifted(rows, cols, s):
        return [[(src, at + (tgt is not None and tgt % cols == 0 and tgt > cols), tgt) for src, at, tgt in feeds]
                for feeds in schedule(rows, cols, s)]

    monkeypatch.setattr(zipar, "schedule", shifted)
    assert zipar_p(window=2) < ALPHA


def test_a_batch_of_four_keeps_each_rows_law():
    """Two rows of three codes: row 1 starts once row 0 is done, so ZipAR is AR here, four rows of a batch at once
    through the ragged cache's placed slots."""
    teacher = batch_teacher()
    m = method("zipar", teacher, window=1, cfg=1.5)
    assert rows_p(teacher, BATCH_CONDS, m.config, None, n=300,
                  decode=lambda g: m.sample(BATCH_CONDS, generator=g).data) > ALPHA


def test_passes_are_counted_and_planned():
    teacher = tiny_gpt_teacher(vocab=4, grid=(4, 4))
    out = method("zipar", teacher, window=2).sample(COND, generator=torch.Generator().manual_seed(0))
    assert out.counters["nfe"] == out.counters["batch_forwards"] == 1 + len(zipar.schedule(4, 4, 2)) < 16
    assert zipar.ZipAR.passes(zipar.ZipARConfig(window=2), None, 16)["method"].counts == {"window": 12}


def test_refusals_are_one_line():
    with pytest.raises(UserError, match="ZipAR reads the teacher's extend_at"):
        method("zipar", TableAR(), window=1)


def test_a_window_above_the_row_length_waits_for_the_whole_row():
    teacher = tiny_gpt_teacher(vocab=2, grid=(3, 2))
    one, two = (method("zipar", teacher, window=w).sample(COND, generator=torch.Generator().manual_seed(0))
                for w in (2, 5))
    assert torch.equal(one.data, two.data) and one.counters == two.counters
