"""Gen-PPL under SDTT's and MDLM's released protocols (`metrics.gen_ppl`), against hand computations with
transformers' GPT2LMHeadModel on the tiny GPT-2 folder of `tests.fakes.write_sdtt_checkpoints` (128 positions, so a
300-token sample spans three windows), each with a deliberately broken variant that must not match."""
from __future__ import annotations

import copy
import math
from types import SimpleNamespace

import pytest
import torch

from core.errors import UserError
from core.samples import Texts
from metrics.gen_ppl import GenPPL, parse
from tests.fakes import NO_CHECKPOINTS, _files, write_sdtt_checkpoints

CPU = torch.device("cpu")
N = 300  # tokens per sample: more than the evaluator's 128 positions


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    """(folder, the teacher `hf:<folder>`, GPT2LMHeadModel) of a 2-layer GPT-2 of 128 positions with the tokenizer of
    `write_sdtt_checkpoints`, initialised with std 0.5 so that its next-token laws are far from uniform (the fakes'
    std 0.02 predicts every token at ~log V, which would hide a wrong protocol)."""
    from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel

    from teachers.pretrained.hf_folder import teacher_class

    folder = tmp_path_factory.mktemp("gen-ppl") / "gpt2"
    tok = AutoTokenizer.from_pretrained(_files("tiny-sdtt", write_sdtt_checkpoints) / "gpt2")
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = GPT2LMHeadModel(GPT2Config(vocab_size=len(tok), n_positions=128, n_embd=32, n_layer=2, n_head=2,
                                           initializer_range=0.5, bos_token_id=tok.eos_token_id,
                                           eos_token_id=tok.eos_token_id))
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    name = f"hf:{folder}"
    return folder, teacher_class(name).at(NO_CHECKPOINTS).load(name, cache=None, device=CPU), model.eval()


@pytest.fixture(scope="module")
def samples(gpt2):
    """(3, 300) ids: end-of-text tokens first, in runs and alone (row 0), none (row 1), last (row 2)."""
    _, teacher, _ = gpt2
    eos = teacher.tokenizer.eos_token_id
    ids = torch.randint(len(teacher.tokenizer) - 1, (3, N), generator=torch.Generator().manual_seed(0))
    ids += ids >= eos  # any id but the EOS
    ids[0, [0, 60, 61, 200]] = eos
    ids[0, 100:180] = eos  # many: MDLM counts one per window, so this row weighs less in its pooled mean
    ids[2, -1] = eos
    return ids


def _metric(gpt2, cache, protocol=None, teacher=None):
    folder, own, _ = gpt2
    extractor = f"hf:{folder}" + (f":{protocol}" if protocol else "")
    return GenPPL(teacher or own, cache=cache, device=CPU, checkpoints=NO_CHECKPOINTS, extractor=extractor)


def _log_ppl(metric, texts) -> float:
    metric.reset()
    metric.update(texts, None)
    ((key, value),) = metric.compute().items()
    return key, math.log(value)


@torch.no_grad()
def _nll(model, ids: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """-log p of ids[1:] given what precedes them, one row (T,) or a batch (B, T): logits -> log_softmax -> gather."""
    logp = model(ids, attention_mask=mask).logits.log_softmax(-1)[..., :-1, :]
    return -torch.gather(logp, -1, ids[..., 1:, None])[..., 0]


def _sdtt_by_hand(model, rows, window: int | None = 128) -> float:
    """SDTT's run_eval.py:227-238 on each row, read in windows of `window` tokens (None: the row cut to 128)."""
    means = []
    for row in rows:
        row = row if window else row[:128]
        nll = torch.cat([_nll(model, row[s : s + (window or 128)][None])[0] for s in range(0, len(row), window or 128)])
        means.append(nll.mean())
    return torch.stack(means).double().mean().item()


def test_sdtt_scores_the_sampled_ids_in_windows_of_the_context(gpt2, samples, cache):
    _, teacher, model = gpt2
    key, ours = _log_ppl(_metric(gpt2, cache), teacher.decode(samples))
    assert key.endswith(".sdtt") and key.startswith("gen_ppl.gpt2")
    assert ours == pytest.approx(_sdtt_by_hand(model, samples), abs=1e-5)
    eos = teacher.tokenizer.eos_token_id
    without_eos = [row[row != eos] for row in samples]  # broken: the end-of-text tokens dropped
    assert abs(ours - _sdtt_by_hand(model, without_eos)) > 1e-3
    assert abs(ours - _sdtt_by_hand(model, samples, window=None)) > 1e-3  # broken: not read past the context
    retokenised = [teacher.tokenizer(t, return_tensors="pt")["input_ids"][0] for t in teacher.decode(samples)]
    assert abs(ours - _sdtt_by_hand(model, retokenised)) > 1e-3  # broken: the old protocol (text re-tokenised)


def test_sdtt_needs_the_ids_when_the_tokenizer_is_shared(gpt2, samples, cache):
    _, teacher, _ = gpt2
    with pytest.raises(ValueError, match="token ids"):
        _log_ppl(_metric(gpt2, cache), list(teacher.decode(samples)))


def test_sdtt_reads_other_tokenizers_texts_stripped_with_the_evaluators_special_tokens(gpt2, cache):
    """SDTT's Llama-3 path (run_eval.py:148-161) on a teacher of another tokenizer: the stripped text, tokenised by the
    evaluator; a text of one token has no prediction and is left out."""
    folder, teacher, model = gpt2
    texts = ["  the cat sat on the mat today\n", "x", " ".join(["a dog ran in the park"] * 40)]
    key, ours = _log_ppl(_metric(gpt2, cache, teacher=SimpleNamespace(seq_len=N)), texts)
    means = []
    for text in (texts[0], texts[2]):
        ids = teacher.tokenizer(text.strip(), return_tensors="pt")["input_ids"][0]
        assert len(ids) > 128 or text is texts[0]
        means.append(torch.cat([_nll(model, ids[s : s + 128][None])[0] for s in range(0, len(ids), 128)]).mean())
    assert ours == pytest.approx(torch.stack(means).double().mean().item(), abs=1e-5)
    unstripped = teacher.tokenizer(texts[0], return_tensors="pt")["input_ids"]  # broken: not stripped
    assert abs(_nll(model, unstripped).mean().item() - means[0].item()) > 1e-3


def _cleanup_438(text: str) -> str:
    """transformers 4.38.2's `clean_up_tokenization` (tokenization_utils_base.py:3829-3851), written out: what MDLM's
    and SDTT's `batch_decode` did to every decoded text."""
    for before, after in ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"),
                          (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re")):
        text = text.replace(before, after)
    return text


@torch.no_grad()
def _mdlm_by_hand(model, tok, ids, max_length: int, *, pooled=True, all_eos=False, cleanup=True) -> float:
    """MDLM's diffusion.py:426, 496-508, 545-573 as written there: decode with the EOS kept (under transformers 4.38:
    cleaned up), re-tokenise padded with the EOS, windows of 128, a target counted unless it is an EOS after the first
    of its window, pooled."""
    if tok.pad_token is None:  # diffusion.py:131-135
        tok.pad_token = tok.eos_token
    texts = [_cleanup_438(t) if cleanup else t for t in tok.batch_decode(ids)]
    enc = tok(texts, return_tensors="pt", padding=True, truncation=True, max_length=max_length)
    samples, attn = enc["input_ids"], enc["attention_mask"]
    total, count, per_sample = 0.0, 0.0, torch.zeros(len(samples), 2, dtype=torch.float64)
    for chunk, mask in zip(torch.split(samples, 128, dim=-1), torch.split(attn, 128, dim=-1)):
        nll = _nll(model, chunk, mask)
        first_eos = (chunk == tok.eos_token_id).cumsum(-1) == 1
        token_mask = chunk != tok.eos_token_id
        weight = (token_mask[..., 1:] if all_eos else first_eos[..., 1:] + token_mask[..., 1:]).double()
        total, count = total + (nll * weight).sum().item(), count + weight.sum().item()
        per_sample += torch.stack([(nll * weight).sum(-1), weight.sum(-1)], 1)
    return total / count if pooled else (per_sample[:, 0] / per_sample[:, 1]).mean().item()


def test_mdlm_re_tokenises_and_pools_over_tokens(gpt2, samples, cache):
    _, teacher, model = gpt2
    tok = teacher.tokenizer
    lm = copy.copy(teacher)
    lm.seq_len = N  # MDLM's max_length: the sampler's length, longer than the evaluator's context
    key, ours = _log_ppl(_metric(gpt2, cache, "mdlm", teacher=lm), lm.decode(samples))
    assert key.endswith(".mdlm")
    lengths = torch.tensor([len(ids) for ids in tok(tok.batch_decode(samples))["input_ids"]])
    assert lengths.max() > 256 and lengths.min() < lengths.max()  # three windows; padding where MDLM scores an EOS
    assert ours == pytest.approx(_mdlm_by_hand(model, tok, samples, N), abs=1e-5)
    assert abs(ours - _mdlm_by_hand(model, tok, samples, N, pooled=False)) > 1e-3  # broken: a mean of samples' means
    assert abs(ours - _mdlm_by_hand(model, tok, samples, N, all_eos=True)) > 1e-3  # broken: no EOS scored
    assert abs(ours - _mdlm_by_hand(model, tok, samples, 128)) > 1e-3  # broken: cut to the context, not windowed
    sdtt = _log_ppl(_metric(gpt2, cache, teacher=lm), lm.decode(samples))[1]
    assert abs(ours - sdtt) > 1e-3  # the two protocols differ on the same samples


PUNCTUATED = ("Hello , world . It 's fine ! Is n't it ? We 're here , you 've seen ' em ' and I 'm out . "
             "Why ? Because ! A dog , a cat . They 're , as you 've heard , fine ? ")


@pytest.fixture(scope="module")
def punctuated(gpt2):
    """(4, 64) ids of space-before-punctuation text, the EOS after a space and before a full stop in row 0 (where the
    cleanup must come before the EOS is removed, as SDTT's run_eval.py:148-151 does)."""
    _, teacher, _ = gpt2
    tok = teacher.tokenizer
    ids = tok(PUNCTUATED * 12, add_special_tokens=False)["input_ids"]
    rows = torch.tensor(ids[: 4 * 64]).view(4, 64)
    rows[0, 10:13] = torch.tensor([*tok("x a ", add_special_tokens=False)["input_ids"][-1:], tok.eos_token_id,
                                   *tok(".", add_special_tokens=False)["input_ids"]])
    assert "a <|endoftext|>." in tok.decode(rows[0]) or " <|endoftext|>." in tok.decode(rows[0])
    return rows


def _sdtt_texts_by_hand(model, tok, ids, *, cleanup=True, eos_first=False) -> float:
    """SDTT's run_eval.py:148-161: `batch_decode` (cleaned up under 4.38), `<|endoftext|>` removed, stripped,
    re-tokenised, each text's mean NLL; `eos_first`: broken, the EOS dropped before the cleanup."""
    means = []
    for row in ids:
        text = tok.decode(row, skip_special_tokens=eos_first)
        text = (_cleanup_438(text) if cleanup else text).replace("<|endoftext|>", "").strip()
        means.append(_nll(model, tok(text, return_tensors="pt")["input_ids"]).mean())
    return torch.stack(means).double().mean().item()


def test_re_tokenised_texts_are_cleaned_up_as_transformers_4_38_decoded_them(gpt2, punctuated, cache):
    """Both protocols where they re-tokenise: MDLM's always, SDTT's under an evaluator of another tokenizer (here the
    teacher's tokenizer with one token added), from the ids and from a tiny teacher's bare texts, against the hand
    computation with 4.38's list; broken: no cleanup, and (SDTT) the EOS removed before the cleanup."""
    folder, teacher, model = gpt2
    tok = teacher.tokenizer
    assert tok.decode(punctuated[1]) != _cleanup_438(tok.decode(punctuated[1]))  # there is something to clean
    lm = copy.copy(teacher)
    lm.seq_len = 64
    key, mdlm = _log_ppl(_metric(gpt2, cache, "mdlm", teacher=lm), lm.decode(punctuated))
    assert key.endswith(".mdlm") and mdlm == pytest.approx(_mdlm_by_hand(model, tok, punctuated, 64), abs=1e-5)
    assert abs(mdlm - _mdlm_by_hand(model, tok, punctuated, 64, cleanup=False)) > 1e-3  # broken: transformers 5's
    other = copy.deepcopy(tok)
    other.add_tokens(["zzzz"])  # another vocabulary, the same decode
    sampler = SimpleNamespace(seq_len=64, tokenizer=other)
    _, sdtt = _log_ppl(_metric(gpt2, cache, teacher=sampler), Texts(teacher.decode(punctuated), punctuated))
    assert sdtt == pytest.approx(_sdtt_texts_by_hand(model, tok, punctuated), abs=1e-5)
    assert abs(sdtt - _sdtt_texts_by_hand(model, tok, punctuated, cleanup=False)) > 1e-3  # broken: not cleaned
    with_eos = [punctuated[:1]]
    _, first = _log_ppl(_metric(gpt2, cache, teacher=sampler), Texts(teacher.decode(with_eos[0]), with_eos[0]))
    assert first == pytest.approx(_sdtt_texts_by_hand(model, tok, with_eos[0]), abs=1e-5)
    assert abs(first - _sdtt_texts_by_hand(model, tok, with_eos[0], eos_first=True)) > 1e-4  # broken: order
    bare = [tok.decode(row) for row in punctuated[1:]]  # a tiny teacher's texts: no ids, no special tokens
    _, tiny = _log_ppl(_metric(gpt2, cache, teacher=SimpleNamespace(seq_len=64)), bare)
    assert tiny == pytest.approx(_sdtt_texts_by_hand(model, tok, punctuated[1:]), abs=1e-5)


def test_protocols_are_named_in_the_spec_and_the_key(gpt2, cache):
    folder, _, _ = gpt2
    assert parse(None) == ("smollm2", None) and parse("tiny") == ("tiny", None)
    assert parse(f"hf:{folder}:mdlm") == (f"hf:{folder}", "mdlm") and parse("smollm2:mdlm") == ("smollm2", "mdlm")
    assert parse("hf:mdlm") == ("hf:mdlm", None)  # a folder named like a protocol
    assert GenPPL.check(f"hf:{folder}:mdlm", NO_CHECKPOINTS) is None and GenPPL.check(f"hf:{folder}:sdtt",
                                                                                      NO_CHECKPOINTS) is None
    with pytest.raises(UserError, match="gen_ppl@tiny' takes no protocol"):
        GenPPL.check("tiny:mdlm", NO_CHECKPOINTS)
    with pytest.raises(UserError, match="unknown evaluator 'gpt2:ppl'; valid: smollm2, tiny, hf:<folder>"):
        GenPPL.check("gpt2:ppl", NO_CHECKPOINTS)
    assert _metric(gpt2, cache, "sdtt").extractor == _metric(gpt2, cache).extractor == "gpt2.sdtt"


def test_texts_keep_their_ids(gpt2, samples):
    _, teacher, _ = gpt2
    texts = teacher.decode(samples)
    assert isinstance(texts, Texts) and torch.equal(texts.tokens, samples) and texts == list(texts)
    assert "<|endoftext|>" not in "".join(texts)
