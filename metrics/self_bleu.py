"""Self-BLEU (Zhu et al. 2018, Texygen), the diversity metric of SDTT (arXiv:2410.21035, Eq. 8): each sample is scored
by BLEU as the hypothesis against all the other samples as references, and the scores are averaged; 1 = every sample
the same, lower = more diverse.

BLEU is nltk's `sentence_bleu` (BLEU-4, uniform weights, smoothing method 1, our choices (docs/methods/sdtt.md) since
the paper states none) on whitespace-split words, on a 0-1 scale. It is O(n^2) in the number of samples: the first
`max_samples` are scored (deterministically), and the key states the n-gram order and the number used,
"self_bleu.bleu4-n<N>". On a teacher of a prompted protocol (`mdlm-owt-prompted`, SDTT's: 5 continuations per prompt)
it is the paper's Eq. 8 as its text states it: self-BLEU among the continuations of each prompt (the prompt's text
removed), averaged over prompts, key "self_bleu.bleu4-per-prompt-n<prompts>.<protocol>".
"""
from __future__ import annotations

from nltk.translate.bleu_score import SmoothingFunction, sentence_bleu

from metrics.base import Metric


class SelfBLEU(Metric):
    """Mean BLEU-4 of each sample against the others (nltk, smoothing 1), over the first 200 samples."""

    name = "self_bleu"
    higher_is_better = False
    modality = "text"
    max_samples = 200

    def __init__(self, teacher, *, cache, device, checkpoints, extractor=None):
        super().__init__(teacher, cache=cache, device=device, checkpoints=checkpoints)
        self._texts: list[str] = []
        self._groups: dict[tuple, list[str]] = {}  # prompt -> its continuations (a prompted teacher's samples)

    def update(self, texts: list[str], cond) -> None:
        if getattr(self.teacher, "protocol", None) is None:
            self._texts.extend(texts)
            return
        prompts = self.teacher.decode(cond)
        for text, prompt, row in zip(texts, prompts, cond.tolist()):
            self._groups.setdefault(tuple(row), []).append(text.removeprefix(prompt))

    def compute(self, seed: int = 0) -> dict[str, float]:
        if self._groups:  # SDTT's protocol: self-BLEU among each prompt's continuations, averaged over prompts
            groups = [g for g in self._groups.values() if len(g) > 1]
            if not groups:
                raise ValueError(f"{self.name}: needs 2 continuations of a prompt")
            score = sum(_self_bleu([t.split() for t in g]) for g in groups) / len(groups)
            return {f"{self.name}.bleu4-per-prompt-n{len(groups)}.{self.teacher.protocol}": score}
        words = [t.split() for t in self._texts[: self.max_samples]]
        if len(words) < 2:
            raise ValueError(f"{self.name}: needs at least 2 samples, got {len(words)}")
        return {f"{self.name}.bleu4-n{len(words)}": _self_bleu(words)}

    def reset(self) -> None:
        self._texts.clear()
        self._groups.clear()


def _self_bleu(words: list[list[str]]) -> float:
    """Mean over samples of BLEU-4 (smoothing 1) of the sample against the others."""
    smooth = SmoothingFunction().method1
    scores = [sentence_bleu(words[:i] + words[i + 1:], hyp, smoothing_function=smooth) for i, hyp in enumerate(words)]
    return sum(scores) / len(scores)
