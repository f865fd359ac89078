"""Text metrics: parity with the libraries they wrap (nltk BLEU, transformers NLL, mauve-text), sanity on real and
unrelated text, and clear errors."""
from __future__ import annotations

import math
import random
from types import SimpleNamespace

import pytest
import torch
from nltk.translate.bleu_score import SmoothingFunction, sentence_bleu

from core.errors import UserError
from core.registry import METRICS, TEACHERS
from metrics.gen_ppl import GenPPL
from metrics.mauve_text import MAUVE
from metrics.self_bleu import SelfBLEU
from metrics.text_entropy import TokenEntropy
from teachers import load_teacher
from teachers.pretrained import smollm2
from teachers.data.text import load_documents
from tests.fakes import NO_CHECKPOINTS, CharTokenizer

CPU = torch.device("cpu")
GLOSSES = load_documents("wordnet")


def _teacher(reference=GLOSSES[:300]):
    return SimpleNamespace(encode=CharTokenizer(27).encode, reference_texts=lambda: list(reference),
                           companion_lm="fake-lm")


def _score(metric, texts, seed=0):
    metric.reset()
    metric.update(texts, None)
    return metric.compute(seed=seed)


def test_entropy_matches_a_hand_computed_value(cache):
    m = TokenEntropy(_teacher(), cache=cache, device=CPU, checkpoints=NO_CHECKPOINTS)
    # "aab": p = (2/3, 1/3); "abcd": uniform over 4
    expected = (-(2 / 3) * math.log(2 / 3) - (1 / 3) * math.log(1 / 3) + math.log(4)) / 2
    assert _score(m, ["aab", "abcd"]) == {"entropy.tokens": pytest.approx(expected, rel=1e-9)}


def test_self_bleu_parity_and_extremes(cache):
    m = SelfBLEU(_teacher(), cache=cache, device=CPU, checkpoints=NO_CHECKPOINTS)
    texts = ["the cat sat on the mat today", "the cat sat on a mat", "a dog ran in the park today"]
    words = [t.split() for t in texts]
    direct = sum(sentence_bleu(words[:i] + words[i + 1:], w, smoothing_function=SmoothingFunction().method1)
                 for i, w in enumerate(words)) / 3
    assert _score(m, texts) == {"self_bleu.bleu4-n3": pytest.approx(direct, rel=1e-12)}
    assert _score(m, ["same words in a row"] * 4)["self_bleu.bleu4-n4"] == pytest.approx(1.0)
    disjoint = [" ".join(f"w{i}x{j}" for j in range(8)) for i in range(4)]
    assert _score(m, disjoint)["self_bleu.bleu4-n4"] < 0.01
    assert "self_bleu.bleu4-n200" in _score(m, GLOSSES[:250])  # capped at max_samples


def test_mauve_of_a_distribution_with_itself_and_with_unrelated_text(cache):
    mixed = random.Random(0).sample(GLOSSES, 600)  # the file is ordered by synset, i.e. by topic
    m = MAUVE(_teacher(mixed[:300]), cache=cache, device=CPU, checkpoints=NO_CHECKPOINTS)
    same = _score(m, mixed[300:])
    assert same["mauve.minilm-l6"] > 0.9 and same["mauve.minilm-l6.std"] >= 0
    rng = random.Random(0)
    letters = "abcdefghijklmnopqrstuvwxyz"
    noise = [" ".join("".join(rng.choice(letters) for _ in range(rng.randint(2, 9))) for _ in range(12))
             for _ in range(300)]
    assert _score(m, noise)["mauve.minilm-l6"] < 0.2
    assert _score(m, mixed[300:], seed=1) != same  # other k-means seeds


@pytest.fixture(scope="module")
def smol(cache):
    if smollm2.unavailable():
        pytest.skip(smollm2.unavailable())
    lm = load_teacher("smollm2-135m-instruct", cache=cache, device=CPU, checkpoints=NO_CHECKPOINTS)
    return lm.network, lm.tokenizer


def test_gen_ppl_matches_transformers_loss_per_sentence_and_ignores_padding(cache, smol):
    model, tok = smol
    texts = ["The cat sat on the mat.", "Paris is the capital of France and its largest city.", "Hello there"]
    per_sample = []
    for t in texts:  # one at a time: no padding; transformers' own shifted mean NLL
        ids = tok(t, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            per_sample.append(model(input_ids=ids, labels=ids).loss.item())
    metric = GenPPL(_teacher(), cache=cache, device=CPU, checkpoints=NO_CHECKPOINTS)
    batched = _score(metric, texts)["gen_ppl.smollm2-135m-instruct-q4"]
    # transformers' loss runs without an attention mask (another attention kernel): NLLs agree to ~3e-5 relative
    assert math.log(batched) == pytest.approx(sum(per_sample) / 3, rel=1e-4)
    padded = metric.evaluator.scores(texts)  # (3, 2): summed NLL, scored tokens
    alone = torch.cat([metric.evaluator.scores([t]) for t in texts])
    assert torch.allclose(padded, alone, rtol=1e-5)  # padding changes nothing (measured 9e-6 absolute)


def test_gen_ppl_prefers_real_text_to_shuffled_words(cache, smol):
    metric = GenPPL(_teacher(), cache=cache, device=CPU, checkpoints=NO_CHECKPOINTS)
    real = GLOSSES[:40]
    rng = random.Random(0)
    shuffled = [" ".join(rng.sample(t.split(), len(t.split()))) for t in real]
    key = "gen_ppl.smollm2-135m-instruct-q4"
    assert 2 * _score(metric, real)[key] < _score(metric, shuffled)[key]


def test_gen_ppl_with_the_tiny_evaluator_is_exact(cache, monkeypatch):
    class FakeLM:  # NLL of token id k is k / 10, whatever the context
        tokenizer, seq_len = CharTokenizer(27), 16

        @classmethod
        def key(cls):
            return "fake-lm-v1"

        @classmethod
        def load(cls, name, *, cache, device):
            return cls()

        def token_nll(self, ids):
            return ids.float() / 10

    monkeypatch.setitem(TEACHERS._entries, "fake-lm", FakeLM)
    metric = GenPPL(_teacher(), cache=cache, device=CPU, checkpoints=NO_CHECKPOINTS, extractor="tiny")
    # "ab" -> ids 0, 1: mean 0.05; "c\nb" -> 2, EOS (26), 1: mean 2.9 / 3
    value = _score(metric, ["ab", "c\nb"])["gen_ppl.fake-lm"]
    assert value == pytest.approx(math.exp((0.05 + 2.9 / 3) / 2), rel=1e-6)


def test_missing_weights_and_unknown_choices_are_clear(monkeypatch, tmp_path):
    monkeypatch.setenv(smollm2.GGUF_ENV, str(tmp_path / "nope.gguf"))
    reason = GenPPL.check(None, NO_CHECKPOINTS)
    assert reason.startswith("gen_ppl: no SmolLM2 weights") and "nope.gguf" in reason and smollm2.GGUF_ENV in reason
    with pytest.raises(UserError, match=smollm2.GGUF_ENV):
        smollm2.SmolLM2Instruct.load("smollm2-135m-instruct", cache=SimpleNamespace(root=tmp_path), device=CPU)
    with pytest.raises(UserError, match="unknown evaluator 'gpt9'; valid: smollm2, tiny"):
        GenPPL.check("gpt9", NO_CHECKPOINTS)
    with pytest.raises(UserError, match="unknown featuriser 'bert'; valid: minilm-l6, smollm2"):
        MAUVE.check("bert", NO_CHECKPOINTS)


@pytest.mark.parametrize("name", ["entropy", "self_bleu", "gen_ppl", "mauve"])
def test_text_metrics_refuse_compute_before_update(name, cache, smol):
    metric = METRICS.get(name)(_teacher(), cache=cache, device=CPU, checkpoints=NO_CHECKPOINTS)
    with pytest.raises(ValueError):
        metric.compute()

