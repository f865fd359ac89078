"""The Metric contract every file in `metrics/` implements (see DESIGN.md, "Core contracts").

torchmetrics-style: a metric is built once per trial (its reference side, e.g. real-image statistics, is computed in
`__init__`), fed generated images with `update`, and read with `compute`. `reset` forgets the generated images only,
so one metric object can score several arms against the same reference.
"""
from __future__ import annotations

from typing import Any, ClassVar

import torch

from bench.cache import Cache


class Metric:
    name: ClassVar[str]  # registry name, e.g. "fid"
    higher_is_better: ClassVar[bool]
    extractor: str  # the feature extractor's name; part of every key `compute` returns

    def __init__(self, teacher: Any, *, cache: Cache, device: torch.device):
        """`teacher` gives `dataset_name` and `image_size`; trained extractors are cached in `cache`."""
        self.teacher, self.cache, self.device = teacher, cache, device

    def update(self, images: torch.Tensor, cond: torch.Tensor) -> None:
        """Add generated images (B, C, H, W), float in [0, 1], with the conditions they were sampled for."""
        raise NotImplementedError

    def compute(self) -> dict[str, float]:
        """Metric key -> value. Keys are valid MLflow metric names naming the extractor, e.g. "fid.digits-cnn"."""
        raise NotImplementedError

    def reset(self) -> None:
        """Forget the generated images; keep the reference side."""
        raise NotImplementedError
