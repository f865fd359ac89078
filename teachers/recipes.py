"""What every registered tiny teacher shares: it is trained from a frozen recipe on first use and cached under the
recipe's hash, and its first training is logged (as an MLflow run, by the runner's `on_trained`)."""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, ClassVar

import torch

from bench.cache import Cache, config_key


class RecipeTeacher:
    recipe: ClassVar[Any]  # a frozen dataclass: everything that determines the trained weights
    recipe_version: ClassVar[int] = 1  # bump when training code changes what a recipe produces

    @classmethod
    def key(cls) -> str:
        return config_key(dataclasses.asdict(cls.recipe), cls.recipe_version)

    @classmethod
    def _fit(cls, name: str, cache: Cache) -> dict:
        """Train from the recipe: {..., "info": {figures to log}}. `cache` holds what training builds on (e.g. a text
        corpus' tokenizer), not the result."""
        raise NotImplementedError

    @classmethod
    def _train(cls, name: str, cache: Cache) -> dict:
        with torch.random.fork_rng():  # parameter init and dropout draw from the global generator; leave it as it was
            torch.manual_seed(cls.recipe.seed)
            return cls._fit(name, cache)

    @classmethod
    def cached_blob(cls, name: str, cache: Cache, on_trained: Callable | None) -> dict:
        """The trained blob of this recipe: from the cache, or trained now (and reported to `on_trained`)."""
        blob, cached = cache.get_or_build("teachers", cls.key(), lambda: cls._train(name, cache))
        if not cached and on_trained is not None:
            on_trained(name, cls.key(), dataclasses.asdict(cls.recipe), blob["info"])
        return blob
