"""ZipAR (`methods.zipar`): its schedule by hand, AR decoding at a window of the row length (chi-square against the
exact law, at batch 1 and 4), its distance from the teacher's law measured where rows overlap, and a broken
variant (the new row's first input one slot off) that must fail. On rows closed by a newline (Lumina-mGPT, Emu3):
the schedule against a transcription of the Lumina-mGPT release's loop, the teacher's law at a window past the row,
and the release itself run on tiny weights (tests/fixtures/zipar_lumina), each with broken variants."""
import json
import shutil
from pathlib import Path

import pytest
import torch

from core.errors import UserError
from methods import zipar
from teachers.pretrained.chameleon import VQGAN, LuminaMGPT768
from tests.fakes import FIXTURES, TableAR, _files, tiny_gpt_teacher
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


# ---- rows closed by a newline: Lumina-mGPT's release, Emu3 ---------------------------------------------------------
def lumina_release_passes(tokens_per_row: int, window: int) -> list[list[int]]:
    """The output positions each pass feeds, the prefill's excepted, transcribing the release's Lumina-mGPT loop
    at batch 1 with its counters only (ThisisBillhe/ZipAR @ 2a5695c, Lumina-mGPT-ZipAR/lumina_mgpt/model/chameleon/
    modeling_chameleon.py, `_sample` :1830-2094 and `prepare_ZIPAR_inputs_for_generation` :1767-1825). Outputs: 0
    the image start, 1-2 the size tokens, then rows of tokens_per_row - 1 image tokens and a newline (the release's
    "prompt_len + 2" is output 2)."""
    ongoing, row_token_num, last_token_in_row = [], [0] * (tokens_per_row - 1), None  # :1589, :1901
    started, image_token_num, passes = False, 0, []  # the image start generated; the tokens after it (:1907-1912)
    while True:
        if image_token_num == 2:  # :1914-1916
            ongoing.append(0)
            row_token_num[0] += 1
        if image_token_num > 2:  # :1919-1920, prepare_ZIPAR_inputs_for_generation
            feeds = []
            if last_token_in_row is not None:  # :1785-1791
                feeds.append(2 + (ongoing[0] - 1) * tokens_per_row + row_token_num[ongoing[0] - 1] - 1)
            feeds += [2 + r * tokens_per_row + row_token_num[r] - 1 for r in ongoing]  # :1793-1798
        else:  # the last token (the prompt at the prefill: -1)
            feeds = [image_token_num if started else -1]
        passes.append(feeds)
        if not ongoing:  # :1950-1998, one token appended
            image_token_num += started
            started = True
            continue
        skip, last_token_in_row, remove = (1 if last_token_in_row is not None else 0), None, []  # :1999-2004
        for i in range(len(feeds) - skip):  # :2005-2070
            r = ongoing[i]
            row_token_num[r] += 1
            image_token_num += 1  # inserted at its place
            if row_token_num[r] == window and r < tokens_per_row - 2 and r + 1 not in ongoing:  # :2055-2061
                ongoing.append(r + 1)
                row_token_num[r + 1] += 1
                image_token_num += 1  # the newline
            elif r == tokens_per_row - 2 and row_token_num[r] == tokens_per_row:  # :2062-2066, the last row done
                return passes[1:]
            if row_token_num[r] == tokens_per_row:  # :2068-2070
                last_token_in_row = True
                remove.append(r)
        for r in remove:
            ongoing.remove(r)


def test_the_newline_schedule_is_the_lumina_releases():
    """Every pass's inputs, at their positions, as the release's loop feeds them, for rows of 2, 3 and 5 image
    tokens and every window it can run (2 to the row's tokens plus one); Lumina-mGPT 768 at its window 16: 756
    passes against AR's 2357 (3.1x fewer)."""
    for width in (2, 3, 5):
        for window in range(2, width + 2):
            ours = [[at for _, at, _ in feeds] for feeds in zipar.newline_schedule(width, width, window, 3)]
            assert ours == lumina_release_passes(width + 1, window), (width, window)
    assert 1 + len(zipar.newline_schedule(48, 48, 16, 3)) == 756
    # by hand, 2 rows of 2 at window 2: the size token, then row 0's first token and the newline after row 0 in one
    # pass (row 1 starts when row 0 holds 1 image token), then row 0's last token fed once more, its output unused
    assert zipar.newline_schedule(2, 2, 2, 3) == [[(0, 0, None)], [(1, 1, None)], [(2, 2, 3)],
                                                  [(3, 3, 4), (5, 5, 6)], [(4, 4, None), (6, 6, 7)]]


def recorded_laws(teacher, window: int, monkeypatch, cond=None):
    """Per image position in raster order, the distribution ZipAR drew it from on `teacher` (cfg 3, temperature 2) and
    the teacher's own distribution there given the same tokens before it (one teacher-forced pass)."""
    from teachers.families.ar_token import process

    cond = teacher.conditions(2, torch.Generator().manual_seed(0)) if cond is None else cond
    m = method("zipar", teacher, window=window, cfg=3.0, temperature=2.0)
    drawn = []
    monkeypatch.setattr(zipar, "draw", lambda probs, g: drawn.append(probs) or zipar_draw(probs, g))
    tokens = m.sample(cond, generator=torch.Generator().manual_seed(0)).data
    state, first = teacher.start(cond, cfg=3.0)
    forced = torch.cat([first[:, None], teacher.extend(state, tokens[:, :-1])], 1)  # (B, N, V)
    offset = zipar.newline_raster(teacher)
    rows, cols = teacher.grid
    order = [0] * (offset == 0) + [t for feeds in zipar.newline_schedule(rows, cols - 1, window, offset)
                                   for _, _, t in feeds if t is not None]  # the positions drawn, in draw order
    image = sorted(order)
    return torch.stack(drawn, 1)[:, [order.index(i) for i in image]], process(forced[:, image], m.config.sampling)


zipar_draw = zipar.draw


def _lumina(side: int):
    from teachers.pretrained.chameleon import LuminaMGPT768
    from tests.fakes_chameleon import _tiny, tiny_chameleon_teacher

    return tiny_chameleon_teacher(_tiny(LuminaMGPT768, "Lumina-tiny", side))


def test_past_the_row_zipar_draws_from_the_teachers_law_on_lumina_and_emu3(monkeypatch):
    """A window of the row's image tokens plus one: every row waits for the row above, and each token is drawn from
    the teacher's distribution given every token before it (Lumina-mGPT: 3 rows of 3; Emu3: 2 rows of 3, the
    first image token from the prefill)."""
    from tests.fakes import tiny_emu3_teacher

    for teacher in (_lumina(3), tiny_emu3_teacher()):
        width = teacher.grid[1] - 1
        ours, law = recorded_laws(teacher, width + 1, monkeypatch)
        assert ours.shape == law.shape and torch.allclose(ours, law, atol=1e-5)


def test_overlapping_rows_on_lumina_read_what_the_release_reads(monkeypatch):
    """Window 2 on 3 rows of 3: a row starts when the row above holds one image token. Row 0's tokens read every
    token before them, as in raster order: the teacher's law; a row's later first tokens read a context with holes.
    The broken variant, inputs appended after the whole cache with their positions ignored (row 0's later tokens
    then read row 1's), moves row 0's."""
    from teachers.pretrained.prompted import PromptedImageTeacher

    teacher = _lumina(3)
    ours, law = recorded_laws(teacher, 2, monkeypatch)
    assert torch.allclose(ours[:, :3], law[:, :3], atol=1e-5)  # row 0
    assert not torch.allclose(ours[:, 3], law[:, 3], atol=1e-3)  # row 1's first token, without row 0's last two
    monkeypatch.setattr(PromptedImageTeacher, "extend_at", lambda self, state, tokens, at: self.extend(state, tokens))
    ours, law = recorded_laws(teacher, 2, monkeypatch)
    assert not torch.allclose(ours[:, :3], law[:, :3], atol=1e-3)


def test_llamagens_copy_in_place_of_the_newline_is_detected(monkeypatch):
    """The broken variant: a new row's first input a copy of the row above's last decoded token (LlamaGen's rule)
    instead of the newline, at a window that waits for the whole row: its first token is no longer the teacher's."""
    schedule, teacher = zipar.newline_schedule, _lumina(3)

    def copied(rows, width, s, offset):
        return [[(src - 1 if tgt is not None and (tgt - offset) % (width + 1) == 0 and tgt > offset else src, at, tgt)
                 for src, at, tgt in feeds] for feeds in schedule(rows, width, s, offset)]

    monkeypatch.setattr(zipar, "newline_schedule", copied)
    ours, law = recorded_laws(teacher, 4, monkeypatch)
    assert not torch.allclose(ours, law, atol=1e-3)


def test_structures_zipar_cannot_decode_are_refused_in_one_line():
    from tests.fakes_chameleon import TinyAnole, tiny_chameleon_teacher

    with pytest.raises(UserError, match="rows closed by a forced newline token .* has neither"):
        method("zipar", tiny_chameleon_teacher(TinyAnole), window=2)
    with pytest.raises(UserError, match="window must be >= 2 on rows closed by a newline"):
        method("zipar", _lumina(2), window=1)


# ---- the release's Lumina-mGPT ZipAR, run on tiny random weights (tests/fixtures/zipar_lumina/MAKING.md) ----------
RELEASE = json.loads((FIXTURES / "zipar_lumina" / "release_draws.json").read_text())


def _write_release_lumina(folder) -> None:
    """The fixture's folder as the teacher reads it, beside Chameleon's VQGAN (the VQGAN parity fixture's) and the
    prompts."""
    for name in ("Lumina-ZipAR-tiny", "prompts.txt"):
        (folder / name).symlink_to(FIXTURES / "zipar_lumina" / name)
    for name in VQGAN:
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(FIXTURES / "chameleon_vqgan" / Path(name).name, folder / name)


class ReleaseLumina(LuminaMGPT768):
    """Lumina-mGPT on the release-made tiny folder: 4 x 4 image tokens (64 px), the release's token ids."""

    folder, image_size = "Lumina-ZipAR-tiny", 64

    @classmethod
    def root(cls):
        return _files("zipar-lumina", _write_release_lumina)

    @classmethod
    def prompt_path(cls):
        return cls.root() / "prompts.txt"


def release_lumina(folder, **settings):
    cls = ReleaseLumina.at(folder, {"uncond": "pad-prompt", "prefill": "bidirectional", **settings})
    return cls.load("release-lumina", cache=None, device=torch.device("cpu"))


def replayed(teacher, run, monkeypatch) -> tuple[list[int], list[torch.Tensor]]:
    """ZipAR on `teacher` at the run's window, CFG and top-k, each draw replaced by the release's token there (in
    the order of `newline_schedule`): the tokens, and the distribution of each draw."""
    side = RELEASE["side"]
    order = [t for feeds in zipar.newline_schedule(side, side, run["window"], 3) for _, _, t in feeds if t is not None]
    replay, drawn = iter(order), []

    def draw(probs, generator):
        drawn.append(probs[0])
        return torch.tensor([run["output"][next(replay)]])

    monkeypatch.setattr(zipar, "draw", draw)
    m = method("zipar", teacher, window=run["window"], cfg=RELEASE["cfg"], top_k=RELEASE["top_k"])
    return m.sample(torch.tensor([[run["prompt"]]]), generator=torch.Generator().manual_seed(0)).data[0].tolist(), drawn


def distance(drawn, run) -> float:
    """The largest difference of log-probabilities over the release's top-k of every draw. The k-th and the next are
    near ties on random weights, which float noise may swap (once in 96 draws): a token of ours outside the release's
    top-k then stands for its k-th, and the release's k-th is left out; any other difference of support is inf."""
    worst = 0.0
    for ours, ids, logp in zip(drawn, run["top_ids"], run["top_logprobs"]):
        ids, logp = list(ids), list(logp)
        support = ours.nonzero().flatten().tolist()
        extra = [i for i in support if i not in ids]
        if extra:
            if len(extra) > 1 or len(support) != len(ids) or ours[ids[-1]] > 0:
                return float("inf")
            ids[-1] = extra[0]  # the swapped k-th: compared with the release's k-th log-probability
        worst = max(worst, (ours[ids].log() - torch.tensor(logp)).abs().max().item())
    return worst


@pytest.mark.parametrize("run", RELEASE["runs"], ids=lambda r: f"prompt{r['prompt']}-window{r['window']}")
def test_zipar_on_lumina_draws_from_the_releases_distributions(run, tmp_path, monkeypatch):
    """The release's Lumina-mGPT ZipAR (its `_sample`, processors and batched CFG, transformers 4.44) on tiny random
    weights it saved, windows 2, 3 (rows overlapping) and 5 (waiting for the row): replaying its tokens, the
    sequences are equal, forced tokens included, and every image token is drawn in the release's order from the
    distribution the release drew it from: the top-50 log-probabilities within 5e-4 (float32 noise between its eager
    attention and ours, CFG 3 amplifying it: 2e-5 to 2e-4 measured)."""
    teacher = release_lumina(tmp_path)
    assert teacher.prompt_ids[run["prompt"]] == run["prompt_ids"]  # the prompt both were given
    tokens, drawn = replayed(teacher, run, monkeypatch)
    assert tokens == run["output"] and len(drawn) == len(run["top_ids"]) == RELEASE["side"] ** 2
    assert distance(drawn, run) < 5e-4


def test_the_release_is_told_from_a_causal_prompt_pass(tmp_path, monkeypatch):
    """The broken variant: the same replay through the model's causal prompt pass (`prefill: causal`) moves the
    distributions off the release's: their top-50 sets differ beyond a boundary swap, the log-probabilities by 7e-3
    to 2e-2 where they agree (measured), against the tolerance of 5e-4 above."""
    run = RELEASE["runs"][0]
    _, drawn = replayed(release_lumina(tmp_path, prefill="causal"), run, monkeypatch)
    assert distance(drawn, run) > 5e-3
