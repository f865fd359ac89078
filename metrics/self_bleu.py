"""Self-BLEU (Zhu et al. 2018, Texygen), the diversity metric of SDTT (arXiv:2410.21035, Eq. 8): each sample is scored
by BLEU as the hypothesis against all the other samples as references, and the scores are averaged; 1 = every sample
the same, lower = more diverse.

BLEU is nltk's `sentence_bleu` (BLEU-4, uniform weights, smoothing method 1, the choices the SDTT note recommends since
the paper states none) on whitespace-split words, on a 0-1 scale. It is O(n^2) in the number of samples: the first
`max_samples` are scored (deterministically), and the key states the n-gram order and the number used,
"self_bleu.bleu4-n<N>".
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

    def __init__(self, teacher, *, cache, device, extractor=None):
        super().__init__(teacher, cache=cache, device=device)
        self._texts: list[str] = []

    def update(self, texts: list[str], cond) -> None:
        self._texts.extend(texts)

    def compute(self, seed: int = 0) -> dict[str, float]:
        words = [t.split() for t in self._texts[: self.max_samples]]
        if len(words) < 2:
            raise ValueError(f"{self.name}: needs at least 2 samples, got {len(words)}")
        smooth = SmoothingFunction().method1
        scores = [sentence_bleu(words[:i] + words[i + 1:], hyp, smoothing_function=smooth)
                  for i, hyp in enumerate(words)]
        return {f"{self.name}.bleu4-n{len(words)}": sum(scores) / len(scores)}

    def reset(self) -> None:
        self._texts.clear()
