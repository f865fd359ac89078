"""Inception score (Salimans et al. 2016) of generated images, in the logits of the dataset's classifier (`is`) or of
Inception-v3 (`is@inception`, key "is.inception-v3-tf1": torch-fidelity's network and its unbiased logits, on the
8-bit images with the TF 1.x resize that fid@inception reads too: `metrics.inception`).

The score is exp of the mean KL divergence between p(y|x) and p(y), over splits of the generated images, averaged over
the splits. It has no reference side: it reads the generated images only, and is high when the classifier is confident
on each image and the predicted classes are diverse. How the images are split is a named mode, written after the
extractor and the last part of the key:
- default (key "is.<extractor>"): torchmetrics' `InceptionScore` fed the logits: `splits` random splits (the split
  assignment drawn from the seed of `compute`), the mean and the spread over them ("is.<extractor>.std");
- `adm-splits` (`is@inception:adm-splits`, key "is.inception-v3-tf1.adm-splits"): ADM's evaluator
  (openai/guided-diffusion `evaluations/evaluator.py`, commit 22e0df8, :179-192 `compute_inception_score`), which
  DiT, ARD and LlamaGen report with: contiguous splits of 5,000 in the order the images were generated, the last one
  shorter when the count is not a multiple, each split's softmax p(y|x) against its own mean, the mean of the splits'
  scores; no spread. Deterministic. In float64 from log-softmax, where the evaluator takes float32 logs of a float32
  softmax (the same score but for rounding, and but for a probability that underflows to 0, which makes its score NaN).
"""
from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import torch
from torchmetrics.image.inception import InceptionScore as TorchmetricsInceptionScore

from core.cache import Cache
from core.errors import UserError
from core.rng import seeded
from metrics.base import TORCHMETRICS_LOCAL, ImageFeatureMetric
from metrics.features import Features, split_option

ADM_SPLITS = "adm-splits"
ADM_SPLIT_SIZE = 5000  # evaluator.py:179 `split_size: int = 5000`
MODES = (ADM_SPLITS,)


def adm_inception_score(logits: torch.Tensor) -> float:
    """ADM's inception score of logits (N, K): contiguous splits of `ADM_SPLIT_SIZE` (evaluator.py:186-192)."""
    scores = []
    for log_p in torch.log_softmax(logits.double(), dim=1).split(ADM_SPLIT_SIZE):  # (n <= 5000, K) each
        p = log_p.exp()
        kl = (p * (log_p - p.mean(0).log())).sum(1).mean()
        scores.append(kl.exp())
    return float(torch.stack(scores).mean())


class InceptionScore(ImageFeatureMetric):
    """Inception score (confident and diverse class predictions) in a classifier's logits: torchmetrics' random splits,
    or ADM's contiguous ones (`:adm-splits`)."""

    name = "is"
    higher_is_better = True
    stochastic = True  # the random splits; an instance of `adm-splits` is not
    uses_logits = True
    compares_with = None
    splits = 10  # the standard number; `compute` uses fewer so that each split keeps at least `min_split` images
    min_split = 50  # smaller splits give a marginal p(y) from a handful of images and a meaningless score

    @classmethod
    def _parse(cls, extractor: str | None) -> tuple[str | None, str | None]:
        choice, mode = split_option(cls.name, extractor)
        if mode is not None and mode not in MODES:
            raise UserError(f"metric 'is@{extractor}': unknown mode {mode!r}; valid: {', '.join(MODES)} (or none: "
                            f"torchmetrics' random splits)")
        return choice, mode

    @classmethod
    def check(cls, extractor: str | None, checkpoints: Path) -> str | None:
        return super().check(cls._parse(extractor)[0], checkpoints)

    @classmethod
    def check_teacher(cls, teacher: str, teacher_cls: Any, extractor: str | None, checkpoints: Path) -> None:
        super().check_teacher(teacher, teacher_cls, cls._parse(extractor)[0], checkpoints)

    def __init__(self, teacher: Any, *, cache: Cache, device: torch.device, checkpoints: Path,
                 extractor: str | None = None):
        choice, self.mode = self._parse(extractor)
        super().__init__(teacher, cache=cache, device=device, checkpoints=checkpoints, extractor=choice)
        if self.mode is not None:
            self.extractor = f"{self.extractor}.{self.mode}"
            self.stochastic = False

    def compute(self, seed: int = 0) -> dict[str, float]:
        logits = self.generated()
        if self.mode == ADM_SPLITS:
            return {self.key(): adm_inception_score(logits)}
        splits = max(1, min(self.splits, len(logits) // self.min_split))
        # torchmetrics fixes `splits` at construction, so the metric is built here, once the image count is known.
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*will save all extracted features in buffer")  # we know
            score = TorchmetricsInceptionScore(feature=Features(self.model.num_classes), splits=splits,
                                               **TORCHMETRICS_LOCAL)
        score.update(logits)
        with seeded(seed), warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="std\\(\\): degrees of freedom")  # one split has no spread
            mean, std = score.compute()
        # The spread over splits is keyed under "is." too: every key a metric returns starts with its name.
        return {self.key(): float(mean)} | ({f"{self.key()}.std": float(std)} if splits > 1 else {})
