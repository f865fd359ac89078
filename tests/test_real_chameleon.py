"""Lumina-mGPT and Anole through transformers' Chameleon (teachers/pretrained/chameleon.py), proved without the
weights on a tiny random Chameleon saved with `save_pretrained` (tests/fakes_chameleon.py): the sampling distributions
equal an uncached reference written from the official processors, the per-shard QK norms of Lumina-mGPT's files load
as transformers' per-head ones, SJD through the transformers cache is exact, and the teachers run from the CLI into
MLflow and a report."""
from types import SimpleNamespace

import pytest
import torch

from core.config import build_config
from core.registry import METHODS
from teachers.families import ar_token
from teachers.pretrained.chameleon import (END, NEWLINE, SEPARATOR, START, Anole7B, LuminaMGPT768, chameleon_levels,
                                           postprocess_levels, size_token)
from tests.fakes import ar_methods_through_the_cli, listed_entries, refused_by_the_cli
from tests.fakes_chameleon import CHAMELEON_PROMPTS, TinyAnole, TinyLumina, TinyLuminaHF, tiny_chameleon_teacher
from tests.test_real_emu3 import support_law
from tests.test_sjd import POOL, chi_square_p

CFG, TOP_K = 3.0, 3


@pytest.fixture(scope="module")
def lumina():
    return tiny_chameleon_teacher(TinyLumina)


@pytest.fixture(scope="module")
def anole():
    return tiny_chameleon_teacher(TinyAnole)


@pytest.fixture(scope="module")
def lumina_separator(tmp_path_factory):
    """Lumina-mGPT guided as SJD's release guides it (`uncond: separator`)."""
    return tiny_chameleon_teacher(TinyLumina.at(tmp_path_factory.mktemp("unused"), {"uncond": "separator"}))


@pytest.mark.parametrize("size, n", [(512, 1061), (768, 2357), (1024, 4165)])
def test_lumina_outputs_are_the_papers_token_counts(size, n):
    """768 px: 2357 AR steps (SJD paper, App. C and Fig. 15); 1024 px: 4165 (App. C)."""
    stub = SimpleNamespace(image_size=size, side=size // 16, _id=lambda token: token)
    layout = LuminaMGPT768.layout(stub)
    assert len(layout) == n and layout[:3] == [START, size_token(size // 32), size_token(size // 32)]
    assert layout[-2:] == [END, SEPARATOR] and layout.count(NEWLINE) == size // 16
    assert [i for i, t in enumerate(layout) if t == NEWLINE][:2] == [3 + size // 16, 4 + 2 * (size // 16)]


def test_anole_outputs_are_its_1026_tokens():
    """Anole: 32 x 32 image tokens between the image start and end (SJD's model_loader.py, max_new_tokens 1026)."""
    layout = Anole7B.layout(SimpleNamespace(image_size=512, side=32, _id=lambda token: token))
    assert len(layout) == 1026 and layout[0] == START and layout[-1] == END and layout.count(-1) == 1024


def official_allowed(kind: str, t: int, side: int, ids: dict) -> int | None:
    """The token the official processors force at output t, or None where only image tokens may come: Lumina-mGPT's
    `MultiModalLogitsProcessor`, counting the tokens after <racm3:break> and the two size tokens; Anole's image-only
    window of side^2 tokens. The start, size and final tokens, which the models sample, are forced to the sizes the
    prompt asks for."""
    if kind == "anole":
        return ids["start"] if t == 0 else ids["end"] if t == side * side + 1 else None
    if t < 3:
        return [ids["start"], ids["size"], ids["size"]][t]
    n = t - 3  # image tokens and newlines generated so far
    if (n + 1) % (side + 1) == 0:
        return ids["newline"]
    if n + 1 == (side + 1) * side + 1:
        return ids["end"]
    return ids["sep"] if n + 1 > (side + 1) * side + 1 else None


def reference_probs(teacher, kind: str, prompt: str, tokens: torch.Tensor, separator: bool) -> torch.Tensor:
    """(N, V) sampling distributions of one sequence without a cache or padding, from transformers' own
    `ChameleonForConditionalGeneration.from_pretrained` of the per-head folder: the conditional pass over BOS + the
    template + separator + outputs; the unconditional pass over the outputs alone from the image-start token
    (Lumina-mGPT's `get_unconditional_logits`) or, with `separator` (Anole; Lumina-mGPT's `uncond: separator`),
    over the separator and the outputs (SJD's masked prompt), guided s (c - u) + u once the size tokens are out
    (Lumina; from the start token on for Anole), the structure, top-k, softmax."""
    from transformers import AutoTokenizer, ChameleonForConditionalGeneration

    folder = TinyLuminaHF.path()
    model, tok = ChameleonForConditionalGeneration.from_pretrained(folder).eval(), AutoTokenizer.from_pretrained(folder)
    text = (f"Generate an image of 32x32 according to the following prompt:\n{prompt}" if kind == "lumina"
            else f"Generate an image of {prompt}")
    ids = [tok.bos_token_id, *tok.encode(text + SEPARATOR, add_special_tokens=False)]
    head = lambda x: model.lm_head(model.model(input_ids=torch.tensor([x])).last_hidden_state)[0]  # noqa: E731
    with torch.no_grad():
        cond = head(ids + tokens[:-1].tolist())[len(ids) - 1 :]  # (N, V)
        if separator:
            uncond = head([ids[-1], *tokens[:-1].tolist()])  # the separator at position 0, then the outputs
        else:
            uncond = torch.cat([cond[:1], head(tokens[:-1].tolist())])  # output 0 has no unconditional pass
    guided_from = 3 if kind == "lumina" else 0
    logits = torch.cat([cond[:guided_from], CFG * (cond - uncond)[guided_from:] + uncond[guided_from:]])
    names = {"start": START, "end": END, "newline": NEWLINE, "sep": SEPARATOR, "size": size_token(1)}
    ids_ = {k: tok.convert_tokens_to_ids(v) for k, v in names.items()}
    image = torch.tensor([n.startswith("IMGIMG") for n in tok.convert_ids_to_tokens(range(len(tok)))])
    for t in range(len(tokens)):
        forced = official_allowed(kind, t, teacher.side, ids_)
        if forced is None:
            logits[t] = logits[t].masked_fill(~image, float("-inf"))
        else:
            logits[t] = torch.full_like(logits[t], float("-inf")).index_fill(0, torch.tensor([forced]), 0.0)
    return ar_token.process(logits, ar_token.SamplingConfig(top_k=TOP_K))


def valid_sequence(teacher, g: torch.Generator) -> torch.Tensor:
    """(N,) a sequence of the teacher's layout, its image tokens random."""
    image = teacher.image_tokens.nonzero()[:, 0]
    seq = teacher.forced[: teacher.seq_len].clone()
    free = seq < 0
    seq[free] = image[torch.randint(len(image), (int(free.sum()),), generator=g)]
    return seq


@pytest.mark.parametrize("kind, separator", [("lumina", False), ("lumina", True), ("anole", True)])
def test_sampling_distributions_equal_an_uncached_reference_of_the_official_processors(kind, separator, lumina,
                                                                                       lumina_separator, anole):
    """Our batched rows (prompts of different lengths left-padded, the unconditional rows' prompts masked, one
    cache) give the reference's distribution at every output position; the Lumina teacher reads the per-shard QK
    norms, the reference the per-head folder."""
    teacher = anole if kind == "anole" else lumina_separator if separator else lumina
    picks, g = [0, 2], torch.Generator().manual_seed(0)
    assert len({len(teacher.prompt_ids[i]) for i in picks}) == 2
    tokens = torch.stack([valid_sequence(teacher, g) for _ in picks])  # (2, N)
    state, first = teacher.start(torch.tensor([[i] for i in picks]), cfg=CFG)
    logits = torch.cat([first[:, None], teacher.extend(state, tokens[:, :-1])], 1)  # (2, N, V)
    ours = ar_token.process(logits, ar_token.SamplingConfig(top_k=TOP_K, cfg=CFG))
    expected = torch.stack([reference_probs(teacher, kind, CHAMELEON_PROMPTS[i], tokens[r], separator)
                            for r, i in enumerate(picks)])
    torch.testing.assert_close(ours, expected, atol=1e-5, rtol=0)


def test_per_shard_qk_norms_load_as_transformers_per_head_ones(lumina):
    """Lumina-mGPT's files store each QK norm (1, head_dim) (repeated over heads by its forward); read through the
    loader they give the logits of the same weights stored (heads, head_dim), bit for bit."""
    per_head = tiny_chameleon_teacher(TinyLuminaHF)
    cond = torch.tensor([[1]])
    assert torch.equal(lumina.start(cond, cfg=CFG)[1], per_head.start(cond, cfg=CFG)[1])
    norm = lumina.model.model.layers[0].self_attn.q_norm.weight
    assert norm.shape == (2, 16) and torch.equal(norm[0], norm[1])


def test_rollback_equals_a_fresh_decode(lumina):
    """Windows appended and cut back (both CFG branches, the mask with them) give the logits of one pass over the
    committed tokens."""
    cond, g = torch.tensor([[3]]), torch.Generator().manual_seed(1)
    seq = valid_sequence(lumina, g)
    state, _ = lumina.start(cond, cfg=CFG)
    committed = 0
    while committed < lumina.seq_len - 4:
        window = seq[committed : committed + 3].clone()
        window[1:] = lumina.image_tokens.nonzero()[torch.randint(6, (2,), generator=g), 0]  # drafts, some wrong
        lumina.extend(state, window[None])
        committed += 1
        lumina.rollback(state, committed)
        assert state.length == committed and state.mask.shape[1] == state.prompt_len + committed
    cached = lumina.extend(state, seq[None, committed : committed + 1])
    fresh_state, _ = lumina.start(cond, cfg=CFG)
    fresh = lumina.extend(fresh_state, seq[None, : committed + 1])[:, -1:]
    torch.testing.assert_close(cached, fresh, atol=1e-5, rtol=1e-5)


def sjd_p(teacher, n=200, seed=0, method: str = "sjd", **knobs) -> float:
    """Chi-square p-value of n SJD decodes against the exact law: top-k 2 over 6 image tokens at 4 image positions,
    16 sequences (some 12 draws each at n = 200, rare ones pooled). At n = 200 the exact decoder passes at p = 0.73,
    and the chi-square rejects resampling from p instead of the residual at p = 1e-29; the stale rollback below draws
    a sequence of probability 0 at its first decode."""
    cls = METHODS.get(method)  # or SJD's descendants: `knobs` their own
    m = cls(teacher, build_config(cls.Config, {"window": 4, "init": "repeat-above", "top_k": 2, "cfg": CFG, **knobs},
                                  owner=method))
    config = m.config
    cond, g = torch.tensor([[1]]), torch.Generator().manual_seed(seed)
    law = support_law(teacher, cond, config.sampling)
    assert len(law) == 16
    return chi_square_p(law, lambda: tuple(m.sample(cond, generator=g).data[0].tolist()), n, POOL)


def test_sjd_through_the_transformers_cache_matches_its_exact_distribution(lumina):
    assert sjd_p(lumina) > 1e-3


@pytest.mark.parametrize("coupling", ["gumbel", "maximal"])
def test_scd_exact_through_the_transformers_cache_matches_its_exact_distribution(lumina, coupling):
    assert sjd_p(lumina, method="scd", coupling=coupling, mode="exact") > 1e-3


def test_sjd_pac_exact_through_the_transformers_cache_matches_its_exact_distribution(lumina):
    assert sjd_p(lumina, method="sjd-pac", init="random", tree_width=2, tree_depth=2, mode="exact") > 1e-3


@pytest.mark.parametrize("method, knobs", [("gsd", {}), ("sjd", {"verify": "lantern"})])
def test_the_relaxed_verifiers_run_on_lumina_with_its_input_embedding(lumina, method, knobs):
    """Chameleon's ids map to VQ codes through a table: GSD and LANTERN relate them by the input embedding."""
    cls = METHODS.get(method)
    m = cls(lumina, build_config(cls.Config, {"window": 4, "top_k": 2, "cfg": CFG, **knobs}, owner=method))
    seq = m.sample(torch.tensor([[1]]), generator=torch.Generator().manual_seed(0)).data[0]
    assert len(seq) == lumina.seq_len and lumina.image_tokens[seq].sum() == 4  # the 2 x 2 image's codes


def test_sjd_whose_rollback_keeps_stale_positions_is_detected(lumina, monkeypatch):
    monkeypatch.setattr(lumina, "rollback", lambda state, length: None)
    assert sjd_p(lumina) < 1e-3


def test_anole_is_guided_by_sjds_masked_prompt_and_drafts_image_tokens(lumina, lumina_separator, anole, tmp_path):
    """Anole's unconditional prompt is its prompt's last token, the separator (SJD's release masks the rest), and
    Lumina-mGPT's under `uncond: separator`; both teachers draw random drafts from the image tokens."""
    from core.errors import UserError

    assert anole.unconditional_prompt == [anole.prompt_ids[0][-1]] == [anole._id(SEPARATOR)]
    assert lumina_separator.unconditional_prompt == [lumina.prompt_ids[0][-1]] and lumina.unconditional_prompt == []
    with pytest.raises(UserError, match="unknown teacher param 'uncond'; valid: decode, prompts"):
        TinyAnole.at(tmp_path, {"uncond": "image-start"})
    for teacher in (lumina, anole):
        assert torch.equal(teacher.draft_tokens, teacher.image_tokens.nonzero().squeeze(1))
        assert len(teacher.draft_tokens) == 6 < teacher.vocab_size


def test_zipars_unconditional_branch_is_bos_then_padding_all_read(lumina, tmp_path):
    """`uncond: pad-prompt` (ZipAR's release): each prompt's unconditional row is its BOS then a padding token per
    other prompt token, every one read; its logits differ from Lumina-mGPT's own branch (the output alone)."""
    padded = tiny_chameleon_teacher(TinyLumina.at(tmp_path, {"uncond": "pad-prompt"}))
    prompt = padded.prompt_ids[1]
    assert padded.unconditional_row(prompt) == [prompt[0]] + [padded.pad_id] * (len(prompt) - 1)
    assert padded.unconditional_prompt is None and lumina.unconditional_row(prompt) == []
    cond = torch.tensor([[1]])
    state, _ = padded.start(cond, cfg=CFG)
    assert state.mask[1].sum() == len(prompt)  # all read, none masked as padding
    prefix = torch.tensor([padded.structure[:3]])  # the image start and size tokens: the next is an image token
    ours, own = (t.extend(t.start(cond, cfg=CFG)[0], prefix)[:, -1] for t in (padded, lumina))
    assert torch.isfinite(ours).sum() == 6 and not torch.allclose(ours, own)


def test_decoded_images_are_the_vqgans_of_the_image_codes(lumina, anole):
    """The newline tokens leave the rows, BPE ids become VQGAN codes (IMGIMG names), and the decoder's [-1, 1] becomes
    each release's 8-bit image in [0, 1] (tests/test_release_pixels.py checks those bytes)."""
    g = torch.Generator().manual_seed(2)
    for teacher, levels in ((lumina, chameleon_levels), (anole, postprocess_levels)):
        seq = valid_sequence(teacher, g)[None]
        codes = teacher.codes[seq[teacher.image_tokens[seq]]][None]  # (1, 4) in raster order
        assert torch.equal(teacher.decode(seq), levels(teacher.vq(codes, (2, 2))))
        assert teacher.decode(seq).shape == (1, 3, 4, 4)


@pytest.mark.parametrize("teacher", ["tiny-lumina", "tiny-anole"])
@pytest.mark.usefixtures("fresh_store")  # a copy of the migrated store at tmp_path/mlflow.db
def test_the_chameleon_loaders_run_ar_jacobi_and_sjd_from_the_cli(teacher, plugin, tmp_path):
    """The tiny Lumina-mGPT and Anole (tests/plugins.py) through `ar`, `jacobi` and `sjd` by the CLI into MLflow,
    then a report."""
    runs, _ = ar_methods_through_the_cli(teacher, tmp_path, [f"cfg={CFG}", f"top_k={TOP_K}"])
    n = {"tiny-lumina": 11, "tiny-anole": 6}[teacher]
    assert all(r.info.status == "FINISHED" and r.data.metrics["ref/nfe_per_sample"] == n for r in runs)


def test_missing_files_are_one_line_and_listed(tmp_path, capsys, monkeypatch):
    import cli

    args = ["run", "--teacher", "lumina-mgpt-7b-768", "--method", "sjd", "--checkpoints", str(tmp_path),
            "--tracking-uri", f"sqlite:///{tmp_path}/mlflow.db"]
    err = refused_by_the_cli(capsys, *args)
    assert f"missing {tmp_path}/Lumina-mGPT-7B-768/config.json" in err and "--checkpoints" in err
    folder = tmp_path / "Lumina-mGPT-7B-768"
    folder.mkdir()
    for name in ("config.json", "tokenizer_config.json", "model.safetensors"):
        (folder / name).touch()
    err = refused_by_the_cli(capsys, *args)
    assert f"missing {tmp_path}/chameleon/tokenizer/vqgan.ckpt" in err
    monkeypatch.setenv("ACCELBENCH_CHECKPOINTS", str(tmp_path))
    assert cli.main(["list"]) == 0
    listing = capsys.readouterr().out
    entries = listed_entries(listing)
    for name in ("lumina-mgpt-7b-512", "lumina-mgpt-7b-1024", "anole-7b"):
        assert "unavailable: missing" in entries[name]
