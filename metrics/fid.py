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
"fid.inception-v3-tf1.<tag>" ("fid.inception-v3-tf1.coco2017-val"). `fid@inception` resizes the 8-bit images with
the TF 1.x bilinear resize of torch-fidelity and ADM's evaluator (`metrics.inception`); pytorch-fid resizes the [0, 1]
floats with torch's (half-pixel centres; pytorch-fid inception.py:147), so SJD's own protocol is `fid@pytorch-fid`
below.

`fid@pytorch-fid` (key "fid.pytorch-fid[.<tag>]"): FID as the SJD and DD releases computed it, pytorch-fid's network
with its own preprocessing (`metrics.inception_pytorch_fid`), its statistics (np.mean, np.cov) and its
`calculate_frechet_distance`, against the teacher's `reference_images` (SJD: "fid.pytorch-fid.coco2017-val"), the real
split of a tiny teacher, or a file named after it, `fid@pytorch-fid:<tag>` (`metrics.features.NAMED_REFERENCES`; DD's
ImageNet-256 statistic: "fid.pytorch-fid.dd-in256"). A named file's statistics were computed under one protocol and
are compared in that one only; ADM's `reference_statistics` (TF 1.x resize) are not compared in pytorch-fid's.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torchmetrics.image.fid import FrechetInceptionDistance

from core import files
from core.cache import CHECKPOINTS_ENV, Cache
from core.errors import UserError
from metrics import inception_pytorch_fid
from metrics.base import TORCHMETRICS_LOCAL, ImageFeatureMetric
from metrics.features import NAMED_REFERENCES, Features, reference_statistics, split_option


class FID(ImageFeatureMetric):
    """Frechet distance to the real test split in an extractor's features (torchmetrics; @cnn default, @inception), or
    as pytorch-fid computes it (@pytorch-fid); a named reference file after ':'."""

    name = "fid"
    higher_is_better = False
    min_samples = 2  # a covariance (torchmetrics: "More than one sample is required")
    compares_with = "statistics"  # a real checkpoint's teacher: a file's or a folder's; else the real split's

    @classmethod
    def _parse(cls, extractor: str | None) -> tuple[str | None, str | None]:
        """(extractor choice, named reference) of "pytorch-fid:dd-in256", each checked."""
        choice, named = split_option(cls.name, extractor)
        if named is None:
            return choice, None
        if named not in NAMED_REFERENCES:
            raise UserError(f"metric 'fid@{extractor}': unknown reference {named!r}; valid: "
                            f"{', '.join(NAMED_REFERENCES)}")
        if choice != NAMED_REFERENCES[named].extractor:
            raise UserError(f"metric 'fid@{extractor}': the statistics {named} were computed by "
                            f"{NAMED_REFERENCES[named].extractor}, and compare only in its features: "
                            f"fid@{NAMED_REFERENCES[named].extractor}:{named}")
        return choice, named

    @classmethod
    def check(cls, extractor: str | None, checkpoints: Path) -> str | None:
        return super().check(cls._parse(extractor)[0], checkpoints)

    @classmethod
    def check_teacher(cls, teacher: str, teacher_cls: Any, extractor: str | None, checkpoints: Path) -> None:
        choice, named = cls._parse(extractor)
        if named is not None:
            ref = NAMED_REFERENCES[named]
            path = checkpoints / ref.file
            files.require(path, f"missing {path}: fid@{extractor} compares with {ref.source}; place {ref.file} in "
                                f"{checkpoints}, or name the folder that holds it with --checkpoints or "
                                f"{CHECKPOINTS_ENV}")
            return
        stats = getattr(teacher_cls, "reference_statistics", None)
        if choice == inception_pytorch_fid.NAME and stats is not None:
            raise UserError(f"metric fid@{extractor} on teacher {teacher!r}: its reference statistics {stats[0]} are "
                            f"ADM's evaluator's (TF 1.x resize, fid@inception); name statistics pytorch-fid computed: "
                            f"{', '.join(f'fid@{r.extractor}:{n}' for n, r in NAMED_REFERENCES.items())}")
        super().check_teacher(teacher, teacher_cls, choice, checkpoints)

    def __init__(self, teacher, *, cache: Cache, device: torch.device, checkpoints: Path,
                 extractor: str | None = None):
        choice, named = self._parse(extractor)
        super().__init__(teacher, cache=cache, device=device, checkpoints=checkpoints, extractor=choice)
        self._pytorch_fid = self.model.name == inception_pytorch_fid.NAME
        if named is not None:  # the key names the file compared with: ".dd-in256"
            self.extractor = f"{self.model.name}.{named}"
        # A named file, or `reference_statistics` or `reference_images` (checked by `check_teacher`); None: the real
        # split's features
        self._stats = reference_statistics(self.model, teacher, cache=cache, device=device, checkpoints=checkpoints,
                                           named=named)
        if self._stats is None and self._pytorch_fid:
            self._stats = self._statistics(self.reference)
        if self._stats is not None:
            return
        # reset_real_features=False: `reset` before each compute drops the generated side, keeps the reference.
        self._fid = FrechetInceptionDistance(feature=Features(self.model.num_features), reset_real_features=False,
                                             **TORCHMETRICS_LOCAL)
        self._fid.update(self.reference, real=True)

    @staticmethod
    def _statistics(features: torch.Tensor) -> dict:
        """np.mean and np.cov of the float64 features (torch-fidelity's function; pytorch-fid's fid_score.py:229-230
        computes the same)."""
        from torch_fidelity.metric_fid import fid_features_to_statistics

        return fid_features_to_statistics(features.double())

    def compute(self, seed: int = 0) -> dict[str, float]:
        if self._pytorch_fid:
            return {self.key(): inception_pytorch_fid.frechet_distance(self._stats, self._statistics(self.generated()))}
        if self._stats is not None:
            from torch_fidelity.metric_fid import fid_statistics_to_metric

            generated = self._statistics(self.generated())
            return {self.key(): fid_statistics_to_metric(self._stats, generated, False)["frechet_inception_distance"]}
        self._fid.reset()
        self._fid.update(self.generated(), real=False)
        return {self.key(): float(self._fid.compute())}
