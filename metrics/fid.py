"""Frechet distance (FID, Heusel et al. 2017) between generated images and the real test split.

The distance is torchmetrics' `FrechetInceptionDistance`, fed features of a `metrics.features` extractor: the dataset's
classifier by default (`fid`, key "fid.<dataset>-cnn"), or the standard Inception-v3 under the papers' preprocessing
(`fid@inception`, key "fid.inception-v3-tf1": 8-bit images, TF 1.x bilinear resize, as ADM's evaluator and
torch-fidelity; `metrics.inception`); only the extractor differs from the standard FID, and the metric key names it.

A teacher of a real checkpoint (DiT, LlamaGen) has no real images here but names `reference_statistics`, a file of
Inception statistics (`mu`, `sigma`: ADM's `VIRTUAL_imagenet256_labeled.npz`, computed by ADM's evaluator under the same
preprocessing) in the checkpoints folder, and a tag: its FID is torch-fidelity's Frechet distance between those and the
generated images' statistics, under the key "fid.inception-v3-tf1.<tag>" (e.g. "fid.inception-v3-tf1.adm-in256"), the
number the papers' tables report.

A text-to-image teacher (`PromptedImageTeacher`: Emu3, Lumina-mGPT, Anole) names `reference_images` instead, a
folder of real images in the checkpoints folder and a tag: the SJD paper's protocol (arXiv:2410.01699,
Table 1: 5,000 COCO 2017 val captions, FID against the 5,000 images of `val2017/`; its evaluation_metrics.py:185-191
calls pytorch-fid 0.3.0's `calculate_fid_given_paths(..., dims=2048)` on the two folders). The reference side is the
Inception statistics of every image of that folder (`metrics.features.folder_statistics`, cached), the key
"fid.inception-v3-tf1.<tag>" ("fid.inception-v3-tf1.coco2017-val"). One protocol difference: pytorch-fid resizes the
[0, 1] floats with torch's bilinear interpolation (half-pixel centres; pytorch-fid inception.py:147), ours the 8-bit
images with the TF 1.x bilinear resize of torch-fidelity and ADM's evaluator (`metrics.inception`); same network and
weights, so the numbers are close but not identical.
"""
from __future__ import annotations

from pathlib import Path

import torch
from torchmetrics.image.fid import FrechetInceptionDistance

from core.cache import Cache
from metrics.base import TORCHMETRICS_LOCAL, ImageFeatureMetric
from metrics.features import Features, reference_statistics


class FID(ImageFeatureMetric):
    """Frechet distance to the real test split in an extractor's features (torchmetrics; @cnn default, @inception)."""

    name = "fid"
    higher_is_better = False
    compares_with = "statistics"  # a real checkpoint's teacher: a file's or a folder's; else the real split's

    def __init__(self, teacher, *, cache: Cache, device: torch.device, checkpoints: Path,
                 extractor: str | None = None):
        super().__init__(teacher, cache=cache, device=device, checkpoints=checkpoints, extractor=extractor)
        # `reference_statistics` or `reference_images` (checked by `check_teacher`); None: the real split's features
        self._stats = reference_statistics(self.model, teacher, cache=cache, device=device, checkpoints=checkpoints)
        if self._stats is not None:
            return
        # reset_real_features=False: `reset` before each compute drops the generated side, keeps the reference.
        self._fid = FrechetInceptionDistance(feature=Features(self.model.num_features), reset_real_features=False,
                                             **TORCHMETRICS_LOCAL)
        self._fid.update(self.reference, real=True)

    def compute(self, seed: int = 0) -> dict[str, float]:
        if self._stats is not None:
            from torch_fidelity.metric_fid import fid_features_to_statistics, fid_statistics_to_metric

            generated = fid_features_to_statistics(self.generated().double())
            return {self.key(): fid_statistics_to_metric(self._stats, generated, False)["frechet_inception_distance"]}
        self._fid.reset()
        self._fid.update(self.generated(), real=False)
        return {self.key(): float(self._fid.compute())}
