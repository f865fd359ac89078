"""SDTT's conditional protocol (`mdlm-owt-prompted`, suites/papers/sdtt-fig5.yaml) on the tiny files of
`tests.fakes.write_sdtt_checkpoints`, every arm of an `sdtt` trial as the runner scores it (the arm's teacher decodes
its samples; each metric reads the texts and their prompts): gen-PPL of the continuation only, each token given its
prompt and the continuation before it (SDTT App. A, Fig. 18, "prompt excluded"), against a hand computation with
transformers' GPT2LMHeadModel (the peaked tiny GPT-2 of tests/test_gen_ppl.py); MAUVE's features of prompt +
continuation, as the release featurises its samples (jdeschena/sdtt run_eval.py:52-60); self-BLEU and the entropy of
the continuations. Each against the broken variants that must not match: the prompt's tokens scored, the continuation
read without its prompt."""
from __future__ import annotations

import copy
import math
from collections import Counter
from types import SimpleNamespace

import pytest
import torch

from core.cache import Cache
from core.errors import UserError
from core.samples import Texts
from methods.base import TeacherSampler
from methods.sdtt import SDTT, SDTTConfig
from metrics.gen_ppl import GenPPL
from metrics.mauve_text import MAUVE
from metrics.self_bleu import SelfBLEU, _self_bleu
from metrics.text_entropy import TokenEntropy
from tests.fakes import NO_CHECKPOINTS, TinyMDLMOWT, TinyMDLMOWTPrompted, make_config
from tests import test_gen_ppl
from tests.test_gen_ppl import _cleanup_438, _nll

CPU = torch.device("cpu")
P = TinyMDLMOWTPrompted.prompt_tokens  # 50 prompt tokens, then 50 new ones
NEW = TinyMDLMOWTPrompted.length - P
ARMS = ("ref", "method", "same_steps", "ar")
# (folder, the teacher `hf:<folder>`, GPT2LMHeadModel): the peaked tiny GPT-2 evaluator of tests/test_gen_ppl.py
lm = test_gen_ppl.gpt2


@pytest.fixture(scope="module")
def teacher():
    return TinyMDLMOWTPrompted.load("p", cache=None, device=CPU)


@pytest.fixture(scope="module")
def drawn(teacher, tmp_path_factory):
    """Each arm's (texts as its teacher decodes them, conditions, continuations (10, 50)) for 2 prompts x 5: the
    reference (the teacher at 4 steps), a student (the teacher's network, its weights moved) and the same-step teacher
    at 2 steps, GPT-2's `ar` (the tiny folder's GPT-2, nucleus 0.95), built as the runner builds them."""
    cfg = make_config(SDTTConfig, steps=4, rounds=1, ar_top_p=0.95)
    method = SDTT(teacher, cfg)
    method.stand_in()
    with torch.no_grad():
        for p in method.student.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    arms = {"method": method, "ref": TeacherSampler(teacher, SDTT.sampling_of(cfg)),
            **method.extra_arms(cache=Cache(tmp_path_factory.mktemp("arms")), device=CPU, checkpoints=NO_CHECKPOINTS)}
    cond = teacher.conditions(10, torch.Generator().manual_seed(0))
    out = {}
    for name in ARMS:
        s = arms[name].sample(cond, generator=torch.Generator().manual_seed(1))
        out[name] = arms[name].teacher.decode(s.data), s.cond, s.data[:, -NEW:]
    return out


def _value(metric, texts, cond) -> tuple[str, float]:
    metric.reset()
    metric.update(texts, cond)
    ((key, value),) = ((k, v) for k, v in metric.compute().items() if not k.endswith(".std"))
    return key, value


def _gen_ppl(lm, teacher, cache):
    folder, _, _ = lm
    return GenPPL(teacher, cache=cache, device=CPU, checkpoints=NO_CHECKPOINTS, extractor=f"hf:{folder}")


def _mean(values) -> float:
    return torch.stack(list(values)).double().mean().item()


@pytest.mark.parametrize("arm", ARMS)
def test_gen_ppl_of_every_arm_is_of_its_continuation_given_its_prompt(arm, lm, teacher, drawn, cache):
    """exp of the mean over samples of each continuation's mean NLL, every continuation token given the prompt and the
    continuation before it; broken: the prompt's 49 predictions scored too (the MDLM arms before), the continuation
    read alone (GPT-2's arm before)."""
    _, _, model = lm
    texts, cond, new = drawn[arm]
    key, value = _value(_gen_ppl(lm, teacher, cache), texts, cond)
    assert key == "gen_ppl.gpt2.sdtt.webtext-prompted"
    nll = _nll(model, torch.cat([cond, new], 1))  # (10, 99): tokens 1..99, each given all before it
    ours = math.log(value)
    assert ours == pytest.approx(_mean(nll[:, P - 1 :].mean(1)), abs=1e-5)
    assert abs(ours - _mean(nll.mean(1))) > 1e-3  # broken: the prompt scored
    assert abs(ours - _mean(_nll(model, new).mean(1))) > 1e-3  # broken: the context dropped


def test_an_evaluator_of_another_tokenizer_reads_the_prompt_and_the_continuation_tokenised_apart(lm, drawn, cache):
    """SDTT's text path (run_eval.py:148-161) with the prompt as context: the prompt's text (cleaned as 4.38 decoded
    it, end-of-text removed, left-stripped) tokenised with the evaluator's specials, the continuation's (right-stripped)
    without, the continuation's tokens alone scored after the prompt's."""
    _, evaluator, model = lm
    tok = evaluator.tokenizer
    other = copy.deepcopy(tok)
    other.add_tokens(["zzzz"])  # another vocabulary, the same decode
    sampler = SimpleNamespace(name="p", protocol=TinyMDLMOWTPrompted.protocol, tokenizer=other, seq_len=P + NEW)
    texts, cond, new = drawn["ref"]
    _, value = _value(_gen_ppl(lm, sampler, cache), texts, cond)

    def text(ids) -> str:
        return _cleanup_438(tok.decode(ids, clean_up_tokenization_spaces=False)).replace(tok.eos_token, "")

    def windowed(ids: list[int]) -> torch.Tensor:
        """-log p of each token given those before it in its window of the evaluator's 128 positions (NaN: a window's
        first token), as the metric reads a row longer than the context (its random ids re-tokenise longer)."""
        nll = torch.full((len(ids),), math.nan)
        for s in range(0, len(ids), 128):
            nll[s + 1 : s + 128] = _nll(model, torch.tensor([ids[s : s + 128]]))[0]
        return nll

    def mean(nll: torch.Tensor) -> torch.Tensor:
        return nll[~nll.isnan()].mean()

    given, whole, alone = [], [], []
    for prompt, continuation in zip(cond, new):
        head = tok(text(prompt).lstrip())["input_ids"]
        tail = tok(text(continuation).rstrip(), add_special_tokens=False)["input_ids"]
        nll = windowed(head + tail)
        given.append(mean(nll[len(head) :]))
        whole.append(mean(nll))
        alone.append(mean(windowed(tail)))
    ours = math.log(value)
    assert ours == pytest.approx(_mean(given), abs=1e-5)
    assert abs(ours - _mean(whole)) > 1e-3 and abs(ours - _mean(alone)) > 1e-3  # broken: prompt scored, no context


def test_no_conditional_metric_scores_a_prompt_token_or_a_continuation_without_its_prompt(lm, teacher, drawn,
                                                                                           cache, monkeypatch):
    """gen-PPL is blind to the evaluator's NLL of the prompt's own tokens and moves with the prompt before a
    continuation; gen-PPL, MAUVE and entropy refuse a continuation that comes without its prompt (GPT-2's samples as
    its arm returned them before)."""
    texts, cond, new = drawn["ref"]
    metric = _gen_ppl(lm, teacher, cache)
    _, value = _value(metric, texts, cond)
    window_nll = metric.evaluator.lm.window_nll
    monkeypatch.setattr(metric.evaluator.lm, "window_nll",  # the prompt's tokens made 100 nats less likely
                        lambda ids, mask=None: window_nll(ids, mask) + 100.0 * (torch.arange(ids.shape[1]) < P))
    assert _value(metric, texts, cond)[1] == pytest.approx(value, rel=1e-6)
    monkeypatch.undo()
    other = cond.flip(0)  # each continuation after the other prompt
    ids = torch.cat([other, new], 1)
    assert abs(math.log(_value(metric, Texts(teacher.decode(ids), ids), other)[1]) - math.log(value)) > 1e-3
    bare = Texts(teacher.decode(new), new)
    for scorer in (metric, TokenEntropy(teacher, cache=cache, device=CPU, checkpoints=NO_CHECKPOINTS),
                   MAUVE(teacher, cache=cache, device=CPU, checkpoints=NO_CHECKPOINTS, extractor=f"hf:{lm[0]}")):
        with pytest.raises(ValueError, match="do not begin with their prompts"):
            scorer.update(bare, cond)


def test_mauve_reads_every_arms_prompt_and_continuation_self_bleu_and_entropy_the_continuation(lm, teacher, drawn,
                                                                                               cache):
    """MAUVE featurises each arm's 100 tokens, prompt included, as its references; self-BLEU (per prompt) and the
    entropy read the 50 new tokens; broken: GPT-2's continuations featurised alone, the prompt in self-BLEU's
    groups or the entropy's counts."""
    mauve = MAUVE(teacher, cache=cache, device=CPU, checkpoints=NO_CHECKPOINTS, extractor=f"hf:{lm[0]}")
    featurised, featurize = [], mauve._featurize

    def recorded(texts, *args):
        featurised.append(list(texts))
        return featurize(texts, *args)

    mauve._featurize = recorded
    bleu = SelfBLEU(teacher, cache=cache, device=CPU, checkpoints=NO_CHECKPOINTS)
    entropy = TokenEntropy(teacher, cache=cache, device=CPU, checkpoints=NO_CHECKPOINTS)
    for arm in ARMS:
        texts, cond, new = drawn[arm]
        whole = teacher.decode(torch.cat([cond, new], 1))
        key, _ = _value(mauve, texts, cond)
        assert key == "mauve.gpt2.webtext-prompted" and featurised[-1] == whole
        assert featurised[-1] != teacher.decode(new)  # broken: the continuation alone
        words = [t.split() for t in teacher.decode(new)]
        by_hand = (_self_bleu(words[:5]) + _self_bleu(words[5:])) / 2
        key, value = _value(bleu, texts, cond)
        assert key == "self_bleu.bleu4-per-prompt-n2.webtext-prompted" and value == pytest.approx(by_hand)
        with_prompt = [t.split() for t in whole]
        assert abs(value - (_self_bleu(with_prompt[:5]) + _self_bleu(with_prompt[5:])) / 2) > 1e-3  # broken
        key, value = _value(entropy, texts, cond)
        assert key == "entropy.tokens.webtext-prompted" and value == pytest.approx(_entropy(teacher, new))
        assert abs(value - _entropy(teacher, torch.cat([cond, new], 1))) > 1e-3  # broken: the prompt counted


def _entropy(teacher, ids) -> float:
    """Mean over rows of the unigram entropy (nats) of the teacher's re-encoding of each decoded row."""
    values = []
    for row in teacher.encode(teacher.decode(ids)):
        p = torch.tensor(list(Counter(row).values()), dtype=torch.float64) / len(row)
        values.append(-(p * p.log()).sum().item())
    return sum(values) / len(values)


def test_mdlms_protocol_is_refused_on_a_prompted_teacher():
    """MDLM's protocol has no prompt: refused before any work, with the choice that scores the continuations."""
    with pytest.raises(UserError, match="prompted protocol .webtext-prompted. scores each continuation after its "
                                        "prompt, under SDTT's: gen_ppl@hf:gpt2$"):
        GenPPL.check_teacher("mdlm-owt-prompted", TinyMDLMOWTPrompted, "hf:gpt2:mdlm", NO_CHECKPOINTS)
    GenPPL.check_teacher("mdlm-owt-prompted", TinyMDLMOWTPrompted, "hf:gpt2", NO_CHECKPOINTS)
    GenPPL.check_teacher("mdlm-owt", TinyMDLMOWT, "hf:gpt2:mdlm", NO_CHECKPOINTS)
