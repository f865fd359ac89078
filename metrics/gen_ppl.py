"""Generative perplexity: how likely an evaluator LM finds the generated texts (MDLM / SDTT, arXiv:2410.21035 §3.1 of the
note), always reported with the evaluator in its key and next to the unigram entropy (`metrics.text_entropy`).

As SDTT's evaluation code: each sample is re-tokenised by the evaluator, its mean NLL over its next-token predictions
is taken, and gen-PPL = exp(mean over samples of those means). Evaluators:
- `gen_ppl` / `gen_ppl@smollm2` (key "gen_ppl.smollm2-135m-instruct-q4"): SmolLM2-135M-Instruct, Q4_1 dequantised
  to float32 (the registered teacher `smollm2-135m-instruct`, `teachers.pretrained.smollm2`), batched with right
  padding and an attention mask; like GPT-2 in SDTT's code it gets no BOS, so a sample's first token is context only
  and texts of fewer than 2 tokens are not scored;
- `gen_ppl@tiny` (key "gen_ppl.<teacher.companion_lm>"): the causal LM trained on the teacher's own corpus and tokenizer
  (seconds instead of minutes); it reads a BOS, so every token is scored; newlines are its EOS separators again;
- `gen_ppl@hf:<folder>` (key "gen_ppl.<folder's name>", e.g. "gen_ppl.gpt2-large", SDTT's evaluator): any Hugging Face
  causal LM in a local folder (the teacher `hf:<folder>`, `teachers.pretrained.hf_folder`), in float32, as SmolLM2.
"""
from __future__ import annotations

import math

import torch

from bench.errors import UserError
from metrics.base import Metric
from teachers import load_teacher
from teachers.pretrained import hf_folder, smollm2

SMOLLM2 = "smollm2-135m-instruct"  # the registered teacher the evaluator is


class CausalLMEvaluator:
    """A registered Hugging Face causal-LM teacher (`teachers.pretrained.hf_causal_lm`) as the evaluator."""

    def __init__(self, teacher_name: str, cache, device):
        self.lm = load_teacher(teacher_name, cache=cache, device=device)
        self.name = self.lm.evaluator_name

    def nll_per_sample(self, texts: list[str]) -> torch.Tensor:
        return self.lm.nll_per_sample(texts)


class CompanionEvaluator:
    def __init__(self, teacher, cache, device, batch: int = 64):
        self.name = teacher.companion_lm
        self.lm = load_teacher(self.name, cache=cache, device=device)
        self.device, self.batch = device, batch

    def _ids(self, text: str) -> list[int]:
        tok = self.lm.tokenizer
        pieces = tok.encode(text.split("\n"))
        ids = [t for k, p in enumerate(pieces) for t in ([tok.eos_id] if k else []) + p]
        return ids[: self.lm.seq_len]  # the model's context

    def nll_per_sample(self, texts: list[str]) -> torch.Tensor:
        out = []
        for i in range(0, len(texts), self.batch):
            rows = [self._ids(t) for t in texts[i : i + self.batch]]
            T = max(1, max(map(len, rows)))
            ids = torch.zeros(len(rows), T, dtype=torch.long)
            mask = torch.zeros(len(rows), T)
            for r, row in enumerate(rows):
                ids[r, : len(row)], mask[r, : len(row)] = torch.tensor(row, dtype=torch.long), 1.0
            nll = self.lm.token_nll(ids.to(self.device)).cpu()  # (B, T); causal: padding after a row changes nothing
            out.append((nll * mask).sum(1) / mask.sum(1))
        return torch.cat(out)


EVALUATORS = ("smollm2", "tiny", "hf:<folder>")


def evaluator(choice: str, teacher, cache, device):
    if choice == "tiny" and hf_folder.is_folder_name(teacher.companion_lm):  # a real teacher's: GPT-2 for MDLM-OWT
        return CausalLMEvaluator(teacher.companion_lm, cache, device)
    if choice == "tiny":
        return CompanionEvaluator(teacher, cache, device)
    return CausalLMEvaluator(SMOLLM2 if choice == "smollm2" else choice, cache, device)


class GenPPL(Metric):
    """exp(mean per-sample next-token NLL) of generated texts under an evaluator LM (SmolLM2-135M by default)."""

    name = "gen_ppl"
    higher_is_better = False
    modality = "text"

    @classmethod
    def check(cls, extractor: str | None) -> str | None:
        if extractor is not None and extractor not in EVALUATORS and not hf_folder.is_folder_name(extractor):
            raise UserError(f"metric 'gen_ppl': unknown evaluator {extractor!r}; valid: {', '.join(EVALUATORS)}")
        if extractor is not None and hf_folder.is_folder_name(extractor):
            hf_folder.check(extractor)
        if (extractor or "smollm2") == "smollm2":
            reason = smollm2.unavailable()
            return f"gen_ppl: {reason}" if reason else None
        return None

    def __init__(self, teacher, *, cache, device, extractor=None):
        super().__init__(teacher, cache=cache, device=device)
        self.evaluator = evaluator(extractor or "smollm2", teacher, cache, device)
        self.extractor = self.evaluator.name
        self._nll: list[torch.Tensor] = []

    def update(self, texts: list[str], cond) -> None:
        self._nll.append(self.evaluator.nll_per_sample(list(texts)))

    def compute(self, seed: int = 0) -> dict[str, float]:
        if not self._nll:
            raise ValueError(f"{self.name}: compute() before any update()")
        nll = torch.cat(self._nll)
        nll = nll[~nll.isnan()]
        if not len(nll):
            raise ValueError(f"{self.name}: no sample long enough to score")
        return {f"{self.name}.{self.extractor}": math.exp(nll.double().mean().item())}

    def reset(self) -> None:
        self._nll.clear()
