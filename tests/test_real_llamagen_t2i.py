"""LlamaGen's text-to-image GPT (teachers/networks/llamagen.py with `caption_dim`) and its teachers
(teachers/pretrained/llamagen_t2i.py), proved without the weights: a golden parity fixture made with the official
`generate` (tests/fixtures/llamagen_t2i/MAKING.md: left-padded captions, the embedding mask in both CFG branches), the
full-size key set, and the loader on tiny files (tests/fakes_llamagen_t2i.py: a random T5 saved by transformers)
through the CLI and SJD's exactness test."""
import json
from pathlib import Path

import pytest
import torch

from core.config import build_config
from core.trial import Trial
from methods.sjd import SJDConfig, jacobi_decode, speculative_rule
from teachers.networks.llamagen import LlamaGenConfig, LlamaGenGPT, t2i_config
from tests.fakes import refused_by_the_cli, ar_methods_through_the_cli
from tests.fakes_llamagen_t2i import TinyLlamaGenT2I, TinyLlamaGenT2I4, tiny_llamagen_t2i_teacher
from tests.test_real_emu3 import support_law
from tests.test_sjd import chi_square_p

FIXTURES = Path(__file__).parent / "fixtures" / "llamagen_t2i"


@pytest.fixture(scope="module")
def fixture():
    return torch.load(FIXTURES / "llamagen_t2i_tiny_parity.pt", weights_only=True)


def tiny(fixture) -> LlamaGenGPT:
    a = fixture["args"]
    hidden = -(-int(2 * 4 * a["dim"] / 3) // a["multiple_of"]) * a["multiple_of"]  # gpt.py's find_multiple
    cfg = LlamaGenConfig(vocab_size=a["vocab_size"], seq_len=a["block_size"], n_layer=a["n_layer"], n_head=a["n_head"],
                         n_embd=a["dim"], ffn_hidden=hidden, cond_len=a["cls_token_num"], caption_dim=a["caption_dim"])
    return LlamaGenGPT.from_state_dict(cfg, fixture["state_dict"]).eval()


def cached_logits(model, fixture, cfg, ragged=False, padding=True):
    """The official inference path through our cache: prefill the 120 caption positions (with the unconditional
    caption's rows when cfg != 1), then tokens 1..15 in one cached call; guided as `generate` does."""
    B = len(fixture["tokens"])
    with torch.no_grad():
        state, first = model.start(fixture["caption"], cfg=cfg, null_id=0, ragged=ragged,
                                   padding=~fixture["mask"] if padding else None)
        logits = torch.cat([first[:, None], model.extend_guided(state, fixture["tokens"][:, :15])], 1)
    return logits if cfg == 1.0 else logits[B:] + cfg * (logits[:B] - logits[B:])


@pytest.mark.parametrize("ragged", [False, True])
def test_official_t2i_logits_are_reproduced_through_the_kv_cache(fixture, ragged):
    """Captions of 4, 17 and 120 valid tokens, left-padded: 5.1e-6 at most on this project's machine (2 threads),
    4.3e-6 on an H200 (CUDA, TF32 off), with CFG 4 and without."""
    model = tiny(fixture)
    assert (cached_logits(model, fixture, fixture["cfg"], ragged) - fixture["logits_cfg"]).abs().max() <= 2e-5
    assert (cached_logits(model, fixture, 1.0, ragged) - fixture["logits_cond"]).abs().max() <= 2e-5


def test_without_the_padding_mask_the_logits_would_not_match(fixture):
    """The broken variant: padded caption positions read as real ones (off by 12.8 with CFG, 2.0 without)."""
    model = tiny(fixture)
    assert (cached_logits(model, fixture, fixture["cfg"], padding=False) - fixture["logits_cfg"]).abs().max() > 1.0
    assert (cached_logits(model, fixture, 1.0, padding=False) - fixture["logits_cond"]).abs().max() > 0.1


@pytest.mark.parametrize("image_tokens", [256, 1024])
def test_full_size_key_set_equals_the_official_t2i_gpt_xl(image_tokens):
    official = json.loads((FIXTURES / "GPT-XL-t2i.keys.json").read_text())
    with torch.device("meta"):
        model = LlamaGenGPT(t2i_config("GPT-XL", image_tokens))
    assert {k: list(v.shape) for k, v in model.state_dict().items()} == official["keys"]
    assert sum(v.numel() for v in model.state_dict().values()) == official["n_params"]


@pytest.fixture(scope="module")
def teacher():
    return tiny_llamagen_t2i_teacher()


def test_captions_are_t5_states_left_padded_as_sample_t2i_does(teacher):
    """The teacher's condition equals sample_t2i.py's recipe applied to T5Embedder's output: states of the cleaned
    prompts at 120 right-padded tokens, the valid rows moved to the end, the rest zeroed; padding is their mask."""
    from teachers.pretrained.llamagen_t2i import clean_caption

    cond = teacher.conditions(4, torch.Generator().manual_seed(0))
    enc = teacher.tokenizer([clean_caption(p) for p in teacher.captions(cond)], max_length=120, padding="max_length",
                            truncation=True, return_tensors="pt")
    with torch.no_grad():
        states = teacher.t5(**enc).last_hidden_state * enc["attention_mask"][..., None]
    valid = enc["attention_mask"].sum(1).tolist()
    expected = torch.stack([torch.cat([s[v:], s[:v]]) for s, v in zip(states, valid)])
    emb, padding = teacher.caption_embeddings(cond)
    torch.testing.assert_close(emb, expected, atol=1e-5, rtol=1e-5)
    assert padding.tolist() == (enc["attention_mask"].flip(-1) == 0).tolist()
    assert len(set(valid)) == 4 and teacher.captions(cond)[0] in teacher.prompts
    assert clean_caption(' "Two Dogs  playing,in the SNOW..." ') == "two dogs playing, in the snow"


def sjd_config(**knobs) -> SJDConfig:
    return build_config(SJDConfig, {"window": 3, "init": "random", "top_k": 2, "cfg": 7.5, **knobs}, owner="sjd")


def rows_p(teacher, conds, n, seed=1) -> list[float]:
    """Per row of `conds`, decoded together by SJD (a ragged cache at batch > 1), the chi-square p-value of n draws
    against the row's exact law (top-k 2 over 2 x 2 tokens: 16 sequences)."""
    config, g = sjd_config(), torch.Generator().manual_seed(seed)
    batches = [jacobi_decode(teacher, conds, config, g, speculative_rule)[0].tolist() for _ in range(n)]
    out = []
    for r, cond in enumerate(conds):
        draws = iter(tuple(batch[r]) for batch in batches)
        out.append(chi_square_p(support_law(teacher, cond[None], config.sampling), lambda: next(draws), n))
    return out


CONDS = torch.tensor([[0], [3]])  # captions of 16 and 61 T5 tokens: 104 and 59 padded positions


def test_sjd_on_a_batch_of_two_captions_matches_each_rows_exact_distribution():
    assert min(rows_p(tiny_llamagen_t2i_teacher(TinyLlamaGenT2I4), CONDS, n=400)) > 1e-3


def test_sjd_whose_ragged_cache_forgets_the_caption_padding_is_detected(monkeypatch):
    """The broken variant: the ragged cache (SJD above batch 1) lets every position read the padded caption slots;
    the exact laws come from the intact uniform cache."""
    from teachers.networks.gpt import RaggedKVCache

    monkeypatch.setattr(RaggedKVCache, "hide", lambda self, padding: None)
    assert max(rows_p(tiny_llamagen_t2i_teacher(TinyLlamaGenT2I4), CONDS, n=150)) < 1e-3


@pytest.mark.usefixtures("fresh_store")  # a copy of the migrated store at tmp_path/mlflow.db
def test_the_t2i_loader_runs_ar_jacobi_and_sjd_from_the_cli(plugin, tmp_path):
    """`tiny-llamagen-t2i` (tests/plugins.py) through `ar`, `jacobi` and `sjd` at batch 2 by the CLI into MLflow,
    then a report."""
    runs, _ = ar_methods_through_the_cli("tiny-llamagen-t2i", tmp_path, ["cfg=7.5", "top_k=8"], n_samples=4,
                                         batch_size=2, init="random")
    assert all(r.info.status == "FINISHED" and r.data.metrics["ref/nfe_per_sample"] == 16 for r in runs)


def test_sjds_minmax_images_are_its_scripts_bytes_and_differ_from_the_value_range_ones(teacher, tmp_path):
    """`decode: minmax` gives, after the metrics' rounding to 8 bits, the bytes SJD's test_llamagen.py:188-191 writes:
    clamp, stretch by the image's own min and max, truncating uint8 cast (by hand in numpy below); the default
    `value-range` ((x + 1) / 2) gives other images."""
    from core.errors import UserError
    from metrics.inception import to_uint8

    stretched = TinyLlamaGenT2I.at(tmp_path, {"decode": "minmax"}).load("t", cache=None, device=torch.device("cpu"))
    tokens = torch.randint(32, (3, 16), generator=torch.Generator().manual_seed(0))
    samples = teacher.vq(tokens, teacher.grid)  # the VQ's output, about [-1, 1]
    for b in range(len(tokens)):
        images = samples[b : b + 1].clamp(min=-1, max=1)
        images = (images - images.min()) / (images.max() - images.min()) * 255
        by_hand = torch.from_numpy(images[0].permute(1, 2, 0).numpy().astype("uint8")).permute(2, 0, 1)
        assert torch.equal(to_uint8(stretched.decode(tokens[b : b + 1]))[0], by_hand)
    assert torch.equal(teacher.decode(tokens), ((samples + 1) / 2).clamp(0, 1))
    assert not torch.equal(to_uint8(stretched.decode(tokens)), to_uint8(teacher.decode(tokens)))
    with pytest.raises(UserError, match="decode must be one of value-range, minmax, got 'stretch'"):
        TinyLlamaGenT2I.at(tmp_path, {"decode": "stretch"})
    with pytest.raises(UserError, match="unknown teacher param 'decoder'; valid: decode, prompts"):
        TinyLlamaGenT2I.at(tmp_path, {"decoder": "minmax"})


def test_dd_on_the_t2i_teacher_is_refused_in_one_line(teacher):
    from core.errors import UserError
    from methods.dd import DD, DDConfig

    with pytest.raises(UserError, match="DD reads the teacher's network, which"):
        DD(teacher, DDConfig())


def test_missing_t2i_files_are_one_line(tmp_path, capsys):
    args = ["run", "--teacher", "llamagen-t2i-xl-512", "--method", "sjd", "--checkpoints", str(tmp_path),
            "--tracking-uri", f"sqlite:///{tmp_path}/mlflow.db"]
    err = refused_by_the_cli(capsys, *args)
    assert "--checkpoints" in err and "google/flan-t5-xl" in err
    assert f"missing {tmp_path}/t2i_XL_stage2_512.pt and {tmp_path}/vq_ds16_t2i.pt and " in err  # every file missing
    assert f" and {tmp_path}/flan-t5-xl/model.safetensors:" in err
    (tmp_path / "flan-t5-xl").mkdir()
    for name in ("t2i_XL_stage2_512.pt", "vq_ds16_t2i.pt", "config.json", "tokenizer_config.json"):
        (tmp_path / ("flan-t5-xl/" if name.endswith(".json") else "") / name).touch()
    err = refused_by_the_cli(capsys, *args)
    assert f"missing {tmp_path}/flan-t5-xl/model.safetensors:" in err
    (tmp_path / "flan-t5-xl" / "model.safetensors").touch()
    err = refused_by_the_cli(capsys, *args)
    assert f"missing {tmp_path}/captions_val2017.json" in err
    assert not (tmp_path / "mlflow.db").exists()


def test_a_trial_names_its_prompt_file_refused_in_one_line_and_listed_by_a_dry_run(tmp_path, capsys):
    """The teacher param `prompts` (a suite's `teacher_params`), relative to --checkpoints: a missing file is one
    line naming it, a dry run lists it, and an unknown teacher param or a teacher that takes none is refused."""
    import cli

    for name in ("t2i_XL_stage1_256.pt", "vq_ds16_t2i.pt", "flan-t5-xl/config.json", "flan-t5-xl/tokenizer_config.json",
                 "flan-t5-xl/model.safetensors", "captions_val2017.json"):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).touch()
    args = ["run", "--teacher", "llamagen-t2i-xl-256", "--method", "sjd", "--checkpoints", str(tmp_path),
            "--tracking-uri", f"sqlite:///{tmp_path}/mlflow.db", "--teacher-param", "prompts=PartiPrompts.tsv"]
    err = refused_by_the_cli(capsys, *args)
    assert f"missing {tmp_path}/PartiPrompts.tsv: place PartiPrompts.tsv in {tmp_path}," in err
    assert cli.main([*args, "--dry-run"]) == 0
    assert f"{tmp_path}/PartiPrompts.tsv" in capsys.readouterr().out
    assert "unknown teacher param 'prompt'; valid: decode, prompts" in refused_by_the_cli(
        capsys, *args[:-1], "prompt=PartiPrompts.tsv")
    assert "teacher 'digits-ar-t2i' takes no teacher_params, got prompts" in refused_by_the_cli(
        capsys, *args[:2], "digits-ar-t2i", *args[3:])
    assert not (tmp_path / "mlflow.db").exists()
    plain = Trial(teacher="llamagen-t2i-xl-256", method="sjd")
    named = Trial(teacher="llamagen-t2i-xl-256", method="sjd", teacher_params={"prompts": "PartiPrompts.tsv"})
    assert "teacher_params" not in plain.to_dict() and named.key() != plain.key()  # keys of trials without: as before


def test_a_checkpoint_of_another_size_is_one_clear_error():
    import dataclasses

    from core.errors import UserError

    class Wrong(TinyLlamaGenT2I):
        @classmethod
        def config(cls):
            return dataclasses.replace(super().config(), caption_dim=32)

    with pytest.raises(UserError, match="does not fit GPT-XL at"):
        Wrong.load("wrong", cache=None, device=torch.device("cpu"))
