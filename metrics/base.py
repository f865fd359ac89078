"""The Metric contract every file in `metrics/` implements (see ARCHITECTURE.md, "Where a new piece goes").

torchmetrics-style: a metric is built once per trial (its reference side, e.g. real-image statistics, is computed in
`__init__`), fed generated images with `update`, and read with `compute`. `reset` forgets the generated images only,
so one metric object can score several arms against the same reference.

`ImageFeatureMetric` is the shared plumbing of the image metrics (FID, KID, IS, precision, recall): an extractor from
`metrics.features`, the cached features of the real test split as reference, a buffer of generated images' features.
"""
from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, ClassVar

import torch

from core import files
from core.cache import CHECKPOINTS_ENV, Cache
from core.errors import UserError
from metrics.features import (INCEPTIONS, REFERENCE_BATCH, check_choice, embed, image_files, load_extractor,
                              npz_members, reference_features)


# Keyword arguments of every torchmetrics metric we wrap: it computes on the samples this process holds. In a
# data-parallel trial rank 0 alone scores, holding every sample (`core.distributed`); torchmetrics' default would
# wait for the other ranks' states at `compute`.
TORCHMETRICS_LOCAL = {"sync_on_compute": False}


class Metric:
    name: ClassVar[str]  # registry name, e.g. "fid"
    higher_is_better: ClassVar[bool]
    # What `update` receives: "image" = (B, C, H, W) floats in [0, 1]; "text" = a list of B decoded strings. A metric
    # only pairs with teachers of its modality (the runner checks before any work).
    modality: ClassVar[str] = "image"
    # True when `compute` draws random numbers (subsets, splits, k-means): the runner then repeats it over seeds
    # 0..repeats-1 and logs the mean under the key and the spread under "<key>.seed_std".
    stochastic: ClassVar[bool] = False
    # Samples per arm below which `compute` cannot give a number (a covariance, an MMD): refused before any work.
    min_samples: ClassVar[int] = 1
    extractor: str  # the feature extractor's name; part of every key `compute` returns

    @classmethod
    def check(cls, extractor: str | None, checkpoints: Path) -> str | None:
        """Validate a requested extractor (the part after "@" in "fid@inception") before any work is done; the files
        it names are looked up in `checkpoints` (`--checkpoints`).

        Raises `UserError` for a choice that can never work (unknown name, a weights file the user asked for that is
        missing). Returns a one-line reason when the metric cannot be computed on this machine but the trial should
        still run (the runner then tags the run "unavailable.<name>" instead of logging a number); None otherwise.
        """
        if extractor is not None:
            raise UserError(f"metric {cls.name!r} takes no extractor choice, got {cls.name}@{extractor}")
        return None

    @classmethod
    def check_teacher(cls, teacher: str, teacher_cls: Any, extractor: str | None, checkpoints: Path) -> None:
        """Refuse, before any work, a teacher this metric cannot score (`plan` calls it); nothing by default."""

    @staticmethod
    def has_dataset(teacher_cls: Any) -> bool:
        """Whether the teacher was trained here from a dataset (a tiny teacher's `recipe`), whose real images and
        trained extractors (the `cnn` classifier, the small CLIP) the metrics can use; a real checkpoint has none."""
        return hasattr(teacher_cls, "recipe")

    def __init__(self, teacher: Any, *, cache: Cache, device: torch.device, checkpoints: Path,
                 extractor: str | None = None):
        """`teacher` gives `dataset_name`, `image_size` (and `captions` for text-image metrics); trained extractors
        and reference statistics are cached in `cache`; the files the user provides are in `checkpoints`."""
        self.teacher, self.cache, self.device, self.checkpoints = teacher, cache, device, checkpoints

    def update(self, images: torch.Tensor, cond: torch.Tensor) -> None:
        """Add generated samples with the conditions they were sampled for: images (B, C, H, W), float in [0, 1], or,
        for a text metric, B strings."""
        raise NotImplementedError

    def compute(self, seed: int = 0) -> dict[str, float]:
        """Metric key -> value. Keys are valid MLflow metric names naming the extractor, e.g. "fid.digits-cnn".

        `seed` drives any randomness (only `stochastic` metrics have some); the global RNG is left as it was.
        """
        raise NotImplementedError

    def reset(self) -> None:
        """Forget the generated images; keep the reference side."""
        raise NotImplementedError


def prompt_length(metric: str, teacher: Any, texts: Any, cond: torch.Tensor) -> int:
    """The P prompt tokens every sample of `texts` begins with, on a teacher of a prompted protocol (`protocol`:
    SDTT's `mdlm-owt-prompted`, docs/methods/sdtt.md "Evaluation protocol"); 0 on any other teacher.

    Under such a protocol every arm's sample is its prompt followed by its continuation, as SDTT's release keeps them
    (jdeschena/sdtt 9172b86: the MDLM samplers write the prefix back after every step,
    core/distill/multi_round_sdtt.py:652-656; the AR sampler starts from it and appends each new token,
    core/ar.py:100-104, 136), so that a metric reads the prompt as context (gen-PPL, MAUVE's features) or leaves it
    out (self-BLEU, entropy) the same way in every arm. A sample whose ids (`texts.tokens`) do not begin with its
    prompt (`cond`, (B, P)) is refused in one line: scored alone, a continuation would lose its context."""
    if getattr(teacher, "protocol", None) is None:
        return 0
    tokens, P = getattr(texts, "tokens", None), cond.shape[1]
    if tokens is None or tokens.shape[1] <= P or not torch.equal(tokens[:, :P].cpu(), cond.cpu()):
        raise ValueError(f"{metric}: teacher {teacher.name!r}'s prompted protocol ({teacher.protocol}) scores each "
                         f"sample as its {P}-token prompt followed by its continuation; these samples do not begin "
                         f"with their prompts (an arm must return prompt + continuation)")
    return P


class ImageFeatureMetric(Metric):
    """An image metric in the features (or logits) of a `metrics.features` extractor, chosen with "name@extractor".

    Keeps the generated images' features until `reset`; the real side is `reference`, cached on disk.
    """

    uses_logits: ClassVar[bool] = False  # the inception score reads class logits rather than features
    # What the metric compares with: real "images" (their features), or "statistics" (FID: the mean and covariance
    # of a reference-statistics file, on a teacher of a real checkpoint), or None (the inception score).
    compares_with: ClassVar[str | None] = "images"

    @classmethod
    def check(cls, extractor: str | None, checkpoints: Path) -> str | None:
        check_choice(cls.name, extractor, logits=cls.uses_logits, checkpoints=checkpoints)
        return None

    @classmethod
    def check_teacher(cls, teacher: str, teacher_cls: Any, extractor: str | None, checkpoints: Path) -> None:
        """A teacher of a real checkpoint has no dataset here, only `reference_statistics` (file name, tag) or
        `reference_images` (folder name, tag): its image metrics are @inception, against that file (FID: `mu`,
        `sigma`; KID, precision and recall: the reference batch `arr_0` of ADM's files), FID against the images of
        that folder, or against nothing (the inception score)."""
        stats = getattr(teacher_cls, "reference_statistics", None)
        folder = getattr(teacher_cls, "reference_images", None)
        spec = f"{cls.name}@{extractor or 'cnn'}"
        if stats is None and (folder is None or cls.compares_with != "statistics"):  # a folder is FID's alone
            if cls.has_dataset(teacher_cls):
                return
            if cls.compares_with is not None:
                also = f"fid@inception against its real images {folder[0]}/, " if folder else ""
                raise UserError(f"metric {spec} compares with real images; teacher {teacher!r} has no dataset here "
                                f"and no reference statistics ({also}text-image metrics: clip@<arch>, hpsv2)")
            if extractor not in INCEPTIONS:
                raise UserError(f"metric {spec} reads the classifier trained on the teacher's dataset; teacher "
                                f"{teacher!r} has none here: use {cls.name}@inception")
            return
        if extractor not in INCEPTIONS:
            raise UserError(f"metric {spec} needs real images of teacher {teacher!r}'s data, which are not at hand; "
                            f"on it, image metrics are @inception against {(stats or folder)[0]}, e.g. fid@inception")
        if cls.compares_with is None:
            return
        if stats is None:
            path = checkpoints / folder[0]
            why = (f"{spec} on teacher {teacher!r} compares with the real images of {folder[0]}/ (reference "
                   f"{folder[1]}); place them in {path}, or name the folder that holds {folder[0]}/ with --checkpoints "
                   f"or {CHECKPOINTS_ENV}")
            if files.require(path, f"missing {path}: {why}") and not image_files(path):
                raise UserError(f"{path} holds no images: {why}")
            return
        path = checkpoints / stats[0]
        present = files.require(path, f"missing {path}: {spec} on teacher {teacher!r} compares with the reference "
                                      f"statistics {stats[0]} (ADM's evaluation suite, openai/guided-diffusion); place "
                                      f"it there or name its folder with --checkpoints or {CHECKPOINTS_ENV}")
        if present and REFERENCE_BATCH not in npz_members(path) and cls.compares_with == "images":
            raise UserError(f"metric {spec} compares with reference images; {path} holds statistics only (no "
                            f"arr_0): fid@inception is the metric it supports")

    def __init__(self, teacher: Any, *, cache: Cache, device: torch.device, checkpoints: Path,
                 extractor: str | None = None):
        super().__init__(teacher, cache=cache, device=device, checkpoints=checkpoints)
        self.model = load_extractor(extractor, teacher, cache=cache, device=device, logits=self.uses_logits,
                                    checkpoints=checkpoints)
        self.extractor = self.model.name
        named = getattr(teacher, "reference_statistics", None) or getattr(teacher, "reference_images", None)
        if named is not None and self.compares_with is not None:  # the key names the reference: ".adm-in256"
            self.extractor = f"{self.model.name}.{named[1]}"
        self._generated: list[torch.Tensor] = []

    @functools.cached_property
    def reference(self) -> torch.Tensor:
        """Features (n, D) of the real reference split."""
        # Lazy: the inception score has no reference side and should not pay for one.
        return reference_features(self.model, self.teacher, cache=self.cache, device=self.device,
                                  checkpoints=self.checkpoints)

    def key(self, name: str | None = None) -> str:
        """The metric key "<name>.<extractor>", e.g. "fid.digits-cnn"."""
        return f"{name or self.name}.{self.extractor}"

    def update(self, images: torch.Tensor, cond: torch.Tensor) -> None:
        self._generated.append(embed(self.model, images.detach(), device=self.device, logits=self.uses_logits))

    def generated(self) -> torch.Tensor:
        """Features (or logits) of everything added since the last `reset`, concatenated: (N, D)."""
        if not self._generated:
            raise ValueError(f"{self.name}: compute() before any update()")
        return torch.cat(self._generated)

    def reset(self) -> None:
        self._generated.clear()

