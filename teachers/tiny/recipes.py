"""What every tiny embedded teacher shares: it is trained from a frozen recipe on first use and cached under the
recipe's hash, and its first training is reported (`core.training.report_training`: an MLflow run of the trial's
tracker)."""
from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from core.cache import Cache, config_key
from core.rng import seeded
from core.training import report_training


class RecipeTeacher:
    recipe: ClassVar[Any]  # a frozen dataclass: everything that determines the trained weights
    recipe_version: ClassVar[int] = 1  # bump when training code changes what a recipe produces

    @classmethod
    def key(cls) -> str:
        return config_key(dataclasses.asdict(cls.recipe), cls.recipe_version)

    @classmethod
    def evaluation_data(cls) -> tuple[str, dict]:
        """(name, source) of the data a trial's metrics compare samples with: the dataset's test split at the
        teacher's size (the MLflow dataset input of every run)."""
        r = cls.recipe
        return f"{r.dataset}-test-{r.image_size}px", {"dataset": r.dataset, "split": "test", "image_size": r.image_size}

    @classmethod
    def _fit(cls, name: str, cache: Cache) -> dict:
        """Train from the recipe: {..., "info": {figures to log}}. `cache` holds what training builds on (e.g. a text
        corpus' tokenizer), not the result."""
        raise NotImplementedError

    @classmethod
    def _train(cls, name: str, cache: Cache) -> dict:
        with seeded(cls.recipe.seed):  # parameter init and dropout draw from the global generator
            return cls._fit(name, cache)

    @classmethod
    def cached_blob(cls, name: str, cache: Cache) -> dict:
        """The trained blob of this recipe: from the cache, or trained now (and reported)."""
        blob, cached = cache.get_or_build("teachers", cls.key(), lambda: cls._train(name, cache))
        if not cached:
            report_training(name, cls.key(), dataclasses.asdict(cls.recipe), blob["info"])
        return blob
