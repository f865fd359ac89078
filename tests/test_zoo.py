"""The model zoo: `accelbench zoo build` writes entries the cache takes, and the shipped zoo holds everything the demo
would otherwise train; a recipe changed without rebuilding the zoo fails here."""
import dataclasses
import json

import pytest
import yaml

import torch

from core.cache import PROJECT_ZOO, Cache, ModelZoo, config_key
from bench.suite import load_suite
from tests.fakes import NO_CHECKPOINTS
from bench.zoo_build import ZOO_EXTRACTORS, ZOO_KINDS, ZOO_SUITES, build, distinct, prepare
from metrics.extractors import EXTRACTOR_VERSION, classifier_recipe, load_classifier

CPU = torch.device("cpu")

ZOO_LIMIT_MB = 60


class ZooOnly(Cache):
    """A cache in which every entry of the zoo's kinds must come from the zoo: building one is a stale zoo."""

    def get_or_build(self, kind, key, build):
        if kind in ZOO_KINDS and key is not None and self.load(kind, key) is None:
            pytest.fail(f"the demo needs {kind}/{key}, which the zoo does not hold: a recipe (or what keys it) changed "
                        f"since the zoo was built; rebuild it with `make zoo` (accelbench zoo build)")
        return super().get_or_build(kind, key, build)


def test_a_built_zoo_is_taken_by_the_cache_and_a_changed_recipe_is_caught(tiny_recipe, tmp_path, monkeypatch):
    suite = tmp_path / "suite.yaml"
    suite.write_text(yaml.safe_dump({"experiment": "z", "trials": [
        {"teacher": "digits-ar-t2i", "method": "sjd"},
        {"teacher": "digits-ar-c2i", "method": "dd",
         "params": {"n_pairs": 32, "train_steps": 2, "batch": 8, "solver_steps": 2}},
        {"teacher": "digits-ar-c2i", "method": "onestep*", "params": {"n_pairs": 32, "solver_steps": 2}}]}))
    manifest = build([load_suite(str(suite), checkpoints=NO_CHECKPOINTS)], tmp_path / "zoo", progress=False,
                     extractors=(("digits", 16),))  # the shipped zoo's is Fashion-MNIST's: a minute, and its dataset
    kinds = sorted({e["kind"] for e in manifest["entries"]})
    assert kinds == ["dd-pairs", "dd-students", "extractors", "teachers"] and len(manifest["entries"]) == 5
    (classifier,) = [e for e in manifest["entries"] if e["kind"] == "extractors"]
    assert classifier["for"] == ["the digits classifier at 16 px"]
    (pairs,) = [e for e in manifest["entries"] if e["kind"] == "dd-pairs"]
    assert pairs["what"] == "DD pair tokens (Alg. 1)" and pairs["for"] == [
        "dd[steps=1,t2=0,ts=0] digits-ar-c2i", "onestep*[n_pairs=32] digits-ar-c2i"]
    assert json.loads((tmp_path / "zoo" / "manifest.json").read_text()) == manifest
    plans = distinct(load_suite(str(suite), checkpoints=NO_CHECKPOINTS).plans)
    cache = ZooOnly(tmp_path / "cache", zoo=ModelZoo(tmp_path / "zoo"))
    for p in plans:
        prepare(p, cache)  # nothing of the zoo's kinds is built: all these entries came from it
    assert load_classifier("digits", 16, cache=cache, device=CPU).info["cached"]
    from teachers.tiny.registered import DigitsARText

    monkeypatch.setattr(DigitsARText, "recipe", dataclasses.replace(DigitsARText.recipe, steps=31))
    with pytest.raises(pytest.fail.Exception, match="the zoo does not hold"):
        prepare(plans[0], ZooOnly(tmp_path / "fresh", zoo=ModelZoo(tmp_path / "zoo")))


@pytest.mark.parametrize("suite", ZOO_SUITES, ids=lambda p: p.stem)
def test_the_shipped_zoo_holds_what_the_suites_need(suite, tmp_path):
    manifest = json.loads((PROJECT_ZOO / "manifest.json").read_text())
    assert manifest["total_xz_bytes"] <= ZOO_LIMIT_MB * 2**20
    assert sum((PROJECT_ZOO / e["file"]).stat().st_size for e in manifest["entries"]) == manifest["total_xz_bytes"]
    cache = ZooOnly(tmp_path, zoo=ModelZoo(PROJECT_ZOO))
    for p in distinct(load_suite(str(suite), checkpoints=NO_CHECKPOINTS).plans):
        prepare(p, cache)
    # the classifiers it holds besides, at their recipes' current keys (no dataset needed to key them)
    held = {(e["kind"], e["key"]) for e in manifest["entries"]}
    for dataset, size in ZOO_EXTRACTORS:
        key = config_key(dataclasses.asdict(classifier_recipe(dataset, size)), EXTRACTOR_VERSION)
        assert ("extractors", key) in held, (f"the zoo does not hold the {dataset} classifier of the current recipe "
                                             f"(extractors/{key}); rebuild it with `make zoo`")
