"""Emu3-Gen through transformers (teachers/pretrained/emu3.py), proved without the weights on a tiny random Emu3 saved
with `save_pretrained` (tests/fakes.py `TinyEmu3`): its sampling distributions equal transformers' `generate` with the
official script's logits processors, SJD on it is exact, and it runs from the CLI into MLflow and a report."""
import pytest
import torch

from core.config import build_config
from core.registry import METHODS
from teachers.families import ar_token
from teachers.pretrained.emu3 import NEGATIVE_PROMPT, POSITIVE_SUFFIX, structure
from tests.fakes import refused_by_the_cli, EMU3_PROMPTS, ar_methods_through_the_cli, tiny_emu3_teacher
from tests.test_sjd import POOL, chi_square_p

CFG, TOP_K = 3.0, 5


@pytest.fixture(scope="module")
def teacher():
    return tiny_emu3_teacher()


def test_the_structure_of_a_720px_image_is_the_papers_8193_tokens():
    ids = {"eol": -2, "eof": -3, "eoi": -4, "eos": -5, "pad": -6}
    rule = structure(90, 90, 90 * 91 + 4, ids)
    assert len(rule) - 1 == 8193  # SJD paper, Fig. 10: 8193 AR steps
    assert [i for i, t in enumerate(rule[:90 * 91]) if t == -2] == [91 * r + 90 for r in range(90)]
    assert rule[90 * 91 :] == [-3, -4, -5, -6] and rule.count(-1) == 90 * 90


def official_prefix_rule(teacher, wrapper_id):
    """The allowed tokens of baaivision/Emu3 `Emu3PrefixConstrainedLogitsHelper` (docs/checkpoints.md, 'Emu3'), for
    transformers' `PrefixConstrainedLogitsProcessor`: the offset counts from the image-wrapper token."""
    tok, H, W = teacher.processor.tokenizer, teacher.height, teacher.width
    visual = teacher.model.vocabulary_mapping.image_tokens
    eol = teacher.model.vocabulary_mapping.eol_token_id
    eof, eoi = tok.convert_tokens_to_ids("<|extra_201|>"), tok.convert_tokens_to_ids("<|image end|>")

    def allowed(batch_id, input_ids):
        offset = input_ids.shape[0] - int(torch.nonzero(input_ids == wrapper_id)[0, 0])
        if offset % (W + 1) == 0:
            return [eol]
        return {(W + 1) * H + 1: [eof], (W + 1) * H + 2: [eoi], (W + 1) * H + 3: [tok.eos_token_id]}.get(
            offset, [tok.pad_token_id] if offset > (W + 1) * H + 3 else visual)
    return allowed


def test_sampling_distributions_equal_transformers_generate_with_the_official_processors(teacher):
    """The official pipeline per prompt (CFG against the negative prompt with its own cache, the prefix constraint,
    top-k, in that order) vs our batched, left-padded rows: the same distribution at every output position."""
    from transformers import LogitsProcessorList, PrefixConstrainedLogitsProcessor
    from transformers.generation import UnbatchedClassifierFreeGuidanceLogitsProcessor

    proc, model = teacher.processor, teacher.model
    kwargs = dict(return_for_image_generation=True, ratio=teacher.ratio, image_area=teacher.image_area,
                  return_tensors="pt")
    negative = proc(text=NEGATIVE_PROMPT, **kwargs).input_ids
    wrapper = proc.tokenizer.convert_tokens_to_ids("<|image token|>")
    picks = [0, 2]  # prompts of different lengths: our rows are left-padded
    hf_tokens, hf_probs = [], []
    for i in picks:
        ids = proc(text=EMU3_PROMPTS[i] + POSITIVE_SUFFIX, **kwargs).input_ids
        assert ids[0].tolist() == teacher.prompt_ids[i]
        out = model.generate(ids, do_sample=True, top_k=TOP_K, max_new_tokens=teacher.seq_len,
                             output_scores=True, return_dict_in_generate=True,
                             logits_processor=LogitsProcessorList([
                                 UnbatchedClassifierFreeGuidanceLogitsProcessor(CFG, model, unconditional_ids=negative),
                                 PrefixConstrainedLogitsProcessor(official_prefix_rule(teacher, wrapper), 1)]))
        hf_tokens.append(out.sequences[0, ids.shape[1] :])
        hf_probs.append(torch.softmax(torch.stack(out.scores, 1)[0].float(), -1))  # (N, V)
    assert len(set(map(len, (teacher.prompt_ids[i] for i in picks)))) == 2
    tokens = torch.stack(hf_tokens)  # (2, N): generate stopped at EOS, the last forced token
    assert tokens.shape[1] == teacher.seq_len and (tokens[:, -1] == proc.tokenizer.eos_token_id).all()
    state, first = teacher.start(torch.tensor([[i] for i in picks]), cfg=CFG)
    logits = torch.cat([first[:, None], teacher.extend(state, tokens[:, :-1])], 1)  # (2, N, V)
    ours = ar_token.process(logits, ar_token.SamplingConfig(top_k=TOP_K, cfg=CFG))
    torch.testing.assert_close(ours, torch.stack(hf_probs), atol=1e-5, rtol=0)


def test_rollback_equals_a_fresh_decode(teacher):
    """Windows appended and cut back (both CFG branches, the mask with them) give the logits of one pass over the
    committed tokens."""
    cond, g = torch.tensor([[1]]), torch.Generator().manual_seed(0)
    state, _ = teacher.start(cond, cfg=CFG)
    committed = []
    while len(committed) < teacher.seq_len - 3:
        window = torch.randint(teacher.image_tokens.nonzero().min().item(), teacher.vocab_size, (1, 3), generator=g)
        teacher.extend(state, window)
        committed += window[0, : torch.randint(1, 4, (1,), generator=g).item()].tolist()
        teacher.rollback(state, len(committed))
        assert state.length == len(committed) and state.mask.shape[1] == state.prompt_len + len(committed)
    probe = torch.tensor([[committed[-1]]])
    cached = teacher.extend(state, probe)
    fresh_state, _ = teacher.start(cond, cfg=CFG)
    fresh = teacher.extend(fresh_state, torch.tensor([committed + probe[0].tolist()]))[:, -1:]
    torch.testing.assert_close(cached, fresh, atol=1e-4, rtol=1e-4)


def support_law(teacher, cond: torch.Tensor, s: ar_token.SamplingConfig) -> dict[tuple, float]:
    """The exact law of a teacher whose processed distributions have small supports, position by position: every
    prefix of positive probability extended by every token its distribution allows (teacher-forced, no rollback)."""
    seqs, probs = torch.zeros(1, 0, dtype=torch.long), torch.ones(1, dtype=torch.float64)
    for i in range(teacher.seq_len):
        state, first = teacher.start(cond.expand(len(seqs), -1), cfg=s.cfg)
        logits = first if i == 0 else teacher.extend(state, seqs)[:, -1]
        p = ar_token.process(logits, s).double()  # (M, V)
        row, tok = p.nonzero(as_tuple=True)
        seqs, probs = torch.cat([seqs[row], tok[:, None]], 1), probs[row] * p[row, tok]
    return {tuple(q.tolist()): v for q, v in zip(seqs, probs.tolist())}


def sjd_p(teacher, n=400, seed=0, method: str = "sjd", **knobs) -> float:
    """Chi-square p-value of n SJD decodes against the exact law: top-k 2 over 6 visual tokens, 64 sequences (some 6
    draws each at n = 400, rare ones pooled). At n = 400 the exact decoder passes at p = 0.75, and the chi-square
    rejects resampling from p instead of the residual at p = 6e-29; the stale rollback below draws a sequence of
    probability 0 at its first decode."""
    cls = METHODS.get(method)  # or SJD's descendants: `knobs` their own
    m = cls(teacher, build_config(cls.Config, {"window": 4, "init": "repeat-above", "top_k": 2, "cfg": CFG, **knobs},
                                  owner=method))
    config = m.config
    cond, g = torch.tensor([[3]]), torch.Generator().manual_seed(seed)
    law = support_law(teacher, cond, config.sampling)
    assert len(law) == 64
    return chi_square_p(law, lambda: tuple(m.sample(cond, generator=g).data[0].tolist()), n, POOL)


def test_sjd_on_emu3_matches_its_exact_distribution(teacher):
    assert sjd_p(teacher) > 1e-3


def test_scd_exact_on_emu3_matches_its_exact_distribution(teacher):
    assert sjd_p(teacher, method="scd", mode="exact") > 1e-3


def test_sjd_pac_exact_on_emu3_matches_its_exact_distribution(teacher):
    """Its tree's paths as rows of the DynamicCache (`batch_select_indices`), each with its CFG twin."""
    assert sjd_p(teacher, method="sjd-pac", init="random", tree_width=2, tree_depth=2, mode="exact") > 1e-3


def test_sjd_on_emu3_whose_rollback_keeps_stale_positions_is_detected(teacher, monkeypatch):
    monkeypatch.setattr(teacher, "rollback", lambda state, length: None)
    assert sjd_p(teacher) < 1e-3


@pytest.mark.usefixtures("fresh_store")  # a copy of the migrated store at tmp_path/mlflow.db
def test_the_emu3_loader_runs_every_method_of_its_family_from_the_cli(plugin, tmp_path, capsys):
    """`tiny-emu3` (tests/plugins.py) through `ar`, `jacobi` and `sjd` by the CLI into MLflow, then a report; the
    methods that read a codebook are refused in one line, and so are metrics that need real images."""
    import cli

    runs, common = ar_methods_through_the_cli("tiny-emu3", tmp_path, [f"cfg={CFG}", f"top_k={TOP_K}"])
    assert all(r.info.status == "FINISHED" and r.data.metrics["ref/nfe_per_sample"] == 11 for r in runs)
    capsys.readouterr()
    assert cli.main(["run", "--method", "ar", "--metric", "fid", *common]) == 2
    assert "image metrics are @inception against val2017, e.g. fid@inception" in capsys.readouterr().err
    assert cli.main(["run", "--method", "ar", "--metric", "is", *common]) == 2
    assert "use is@inception" in capsys.readouterr().err


def test_dd_on_emu3_is_refused_in_one_line(teacher):
    from core.errors import UserError
    from methods.dd import DD, DDConfig

    with pytest.raises(UserError, match="reads the teacher's network and codebook"):
        DD(teacher, DDConfig())


def test_missing_emu3_files_are_one_line(tmp_path, capsys):
    args = ["run", "--teacher", "emu3-gen", "--method", "sjd", "--checkpoints", str(tmp_path),
            "--tracking-uri", f"sqlite:///{tmp_path}/mlflow.db"]
    err = refused_by_the_cli(capsys, *args)
    assert f"missing {tmp_path}/Emu3-Gen-hf/config.json" in err and "--checkpoints" in err
    (tmp_path / "Emu3-Gen-hf").mkdir()
    for name in ("config.json", "tokenizer_config.json", "processor_config.json", "model.safetensors"):
        (tmp_path / "Emu3-Gen-hf" / name).touch()
    err = refused_by_the_cli(capsys, *args)
    assert f"missing {tmp_path}/captions_val2017.json" in err and "--teacher-param prompts=FILE" in err


def test_prompt_files_in_each_format(tmp_path):
    import json

    from core.errors import UserError
    from teachers.data.prompts import read_prompts

    coco = {"annotations": [{"image_id": 9, "id": 1, "caption": "a dog. "},
                            {"image_id": 2, "id": 2, "caption": "a cat"},
                            {"image_id": 9, "id": 3, "caption": "a brown dog"}]}
    (tmp_path / "c.json").write_text(json.dumps(coco))
    assert read_prompts(tmp_path / "c.json") == ["a cat", "a dog."]  # one per image (its first), by image id
    (tmp_path / "p.tsv").write_text("Prompt\tCategory\nbread\tFood\na tree\tOutdoor\n")
    assert read_prompts(tmp_path / "p.tsv") == ["bread", "a tree"]
    (tmp_path / "p.txt").write_text("one\n\n two \n")
    assert read_prompts(tmp_path / "p.txt") == ["one", "two"]
    (tmp_path / "empty.txt").write_text("\n")
    with pytest.raises(UserError, match="no prompts"):
        read_prompts(tmp_path / "empty.txt")
