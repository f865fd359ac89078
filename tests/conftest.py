"""Shared fixtures: an isolated cache and MLflow store per test session, offline hub settings."""
import dataclasses
import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TQDM_DISABLE", "1")


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("cache")


@pytest.fixture()
def tiny_recipe(monkeypatch):
    """The registered teachers with a seconds-long training recipe (the cache key changes with the recipe)."""
    from teachers import DigitsARClass, DigitsARText

    for cls in (DigitsARText, DigitsARClass):
        recipe = dataclasses.replace(cls.recipe, steps=30, n_layer=1, n_embd=32, codebook_size=32)
        monkeypatch.setattr(cls, "recipe", recipe)
