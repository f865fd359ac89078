"""The LAMBADA-style task through lm-eval: our MDLM and causal-LM wrappers, exact values on a known model, and the
same task on SmolLM2 through lm-eval's own Hugging Face backend."""
from __future__ import annotations

import json
import math

import pytest
import torch

from metrics.lambada import CausalHarnessLM, MDLMHarnessLM, evaluate, hf_lm, write_task
from teachers import load_teacher
from teachers.pretrained import smollm2
from teachers.data.text import load_documents
from tests.fakes import NO_CHECKPOINTS, CharTokenizer, tiny_mdlm_teacher

DOCS = ["the quick brown fox jumps over the lazy dog", "too short here", "a b c d e f g h",
        "one two three four five six"]


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    return write_task(DOCS, tmp_path_factory.mktemp("lambada"), n=10)


def test_task_keeps_long_enough_passages(task):
    rows = [json.loads(line)["text"] for line in (task / "accelbench_lambada.jsonl").read_text().splitlines()]
    assert rows == [DOCS[0], DOCS[2], DOCS[3]]


class UniformLM:
    """A causal LM whose next-token distribution is uniform over 27 ids: every target token has log-prob -log 27."""

    tokenizer, seq_len, V = CharTokenizer(27), 64, 27

    def start(self, cond, *, cfg):
        return None, torch.zeros(len(cond), self.V)

    def extend(self, state, tokens):
        return torch.zeros(*tokens.shape, self.V)


def test_causal_wrapper_through_lm_eval_gives_the_exact_perplexity(task):
    out = evaluate(CausalHarnessLM(UniformLM(), torch.device("cpu")), task)
    letters = [len(d.split()[-1]) for d in (DOCS[0], DOCS[2], DOCS[3])]  # CharTokenizer: one token per letter
    assert out["perplexity"] == pytest.approx(math.exp(math.log(27) * sum(letters) / 3), rel=1e-6)
    assert out["acc"] == 0.0  # the argmax of a uniform row is id 0 = "a": no last word is all a's


def test_mdlm_wrapper_runs_single_pass_accuracy_and_the_elbo(task):
    teacher = tiny_mdlm_teacher(vocab=27, seq_len=64)
    lm = MDLMHarnessLM(teacher.denoise, teacher.tokenizer, teacher.seq_len, teacher.mask_id, torch.device("cpu"))
    out = evaluate(lm, task)
    assert 0 <= out["acc"] <= 1 and out["perplexity"] > 1

    def oracle(z):  # knows the passage "one two three four five six": the single pass decodes it exactly
        x = torch.tensor(teacher.tokenizer.encode(["onetwothreefourfivesix"])[0])[None].expand(len(z), -1)
        logits = torch.full((*z.shape, 28), -20.0).scatter(-1, x[..., None], 20.0)
        return torch.log_softmax(logits, -1)

    oracle_lm = MDLMHarnessLM(oracle, teacher.tokenizer, 64, 27, torch.device("cpu"))
    ll, greedy = oracle_lm._score(*oracle_lm._pair("one two three four five", " six"))
    assert greedy and ll > -1e-3


def test_smollm2_runs_the_same_task_through_lm_eval_hf_backend(tmp_path, cache):
    if smollm2.unavailable():
        pytest.skip(smollm2.unavailable())
    task = write_task(load_documents("wordnet")[:2000:20], tmp_path, n=40)
    lm = load_teacher("smollm2-135m-instruct", cache=cache, device=torch.device("cpu"), checkpoints=NO_CHECKPOINTS)
    out = evaluate(hf_lm(lm.network, lm.tokenizer), task)
    assert 0 < out["acc"] <= 1 and 1 < out["perplexity"] < 1e4
