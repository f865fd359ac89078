"""Human Preference Score v2 (Wu et al. 2023, arXiv:2306.09341) of generated images against their prompts.

HPS v2 is an open_clip ViT-H-14 fine-tuned on human preference pairs; an image's score is the cosine between its
normalised image and prompt features, with no logit scale (the diagonal of `image_features @ text_features.T`, as the
`hpsv2` package's `img_score.score` computes it); the metric is the mean over images. The `hpsv2` package itself is not
used: its pins break the project's environment, its wheel misses a file, and it downloads its weights. The weights are
the HPS v2 / v2.1 checkpoint (`HPS_v2_compressed.pt` / `HPS_v2.1_compressed.pt`, a dict with a "state_dict") from
the local file named by `ACCELBENCH_HPSV2_CHECKPOINT`; without one the metric reports itself unavailable. The key is
"hpsv2.<checkpoint file stem>"; `hpsv2@<arch>` swaps the architecture (for tests with a tiny model).
"""
from __future__ import annotations

import re
from pathlib import Path

import torch

from core.cache import Cache
from core.checkpoints import check_whole
from core.errors import UserError
from metrics.base import Metric
from metrics.clip_models import check_arch, checkpoint_file, load_open_clip

CHECKPOINT_ENV = "ACCELBENCH_HPSV2_CHECKPOINT"
CHECKPOINT_EXAMPLE = "HPS_v2.1_compressed.pt"
ARCH = "ViT-H-14"  # what both HPS checkpoints were fine-tuned from


class HPSv2(Metric):
    """Human Preference Score v2: HPS-fine-tuned open_clip ViT-H-14 cosine of image and prompt, from a local file."""

    name = "hpsv2"
    higher_is_better = True

    @classmethod
    def check(cls, extractor: str | None, checkpoints: Path) -> str | None:
        check_arch(cls.name, extractor or ARCH)  # a wrong name can never work
        try:
            path = cls._checkpoint(extractor or ARCH)
        except UserError as exc:
            return str(exc)  # no weights on this machine: the trial runs and the metric is tagged unavailable
        if path is not None:  # None: a dry run, which lists it missing
            check_whole(path)  # a file that is there but damaged is refused, not skipped
        return None

    @classmethod
    def _checkpoint(cls, arch: str) -> Path | None:
        return checkpoint_file(cls.name, CHECKPOINT_ENV, arch, CHECKPOINT_EXAMPLE)

    def __init__(self, teacher, *, cache: Cache, device: torch.device, checkpoints: Path,
                 extractor: str | None = None):
        super().__init__(teacher, cache=cache, device=device, checkpoints=checkpoints)
        arch = extractor or ARCH
        check_arch(self.name, arch)
        path = self._checkpoint(arch)
        self.clip = load_open_clip(arch, path, device=device)
        # MLflow metric names allow letters, digits and "_-./ "; anything else in a file name becomes "_".
        self.extractor = re.sub(r"[^A-Za-z0-9_\-./ ]", "_", path.stem)
        self._scores: list[torch.Tensor] = []

    def update(self, images: torch.Tensor, cond: torch.Tensor) -> None:
        image = self.clip.image_features(images)  # (B, D) unit norm
        text = self.clip.text_features(self.teacher.captions(cond))  # (B, D) unit norm
        self._scores.append((image * text).sum(-1).cpu())  # (B,) the diagonal of image @ text.T

    def compute(self, seed: int = 0) -> dict[str, float]:
        if not self._scores:
            raise ValueError(f"{self.name}: compute() before any update()")
        return {f"{self.name}.{self.extractor}": torch.cat(self._scores).mean().item()}

    def reset(self) -> None:
        self._scores.clear()
