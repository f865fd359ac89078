"""Harness pieces: trial keys, knob validation, the atomic cache, the patch tokenizer."""
import pytest
import torch

from core.cache import Cache
from core.config import build_config, config_dict, knobs
from core.errors import UserError
from core.trial import Trial
from methods.sjd import SJDConfig
from teachers.data.patch_vq import PatchQuantizer


def test_trial_key_is_a_function_of_content_only():
    a = Trial("t", "m", params={"window": 16, "init": "random"}, metrics=("fid",), n_samples=8, seed=1)
    b = Trial("t", "m", params={"init": "random", "window": 16}, metrics=["fid"], n_samples=8, seed=1)
    assert a.key() == b.key()
    for change in ({"seed": 2}, {"n_samples": 9}, {"params": {"window": 8, "init": "random"}}, {"device": "cpu"},
                   {"metrics": ()}, {"batch_size": 2}, {"teacher": "u"}, {"method": "n"}):
        assert Trial(**{**a.to_dict(), **change}).key() != a.key(), change
    assert Trial.from_mapping(yaml_roundtrip(a)).key() == a.key()


def yaml_roundtrip(trial):
    import yaml

    return yaml.safe_load(trial.to_yaml())


@pytest.mark.parametrize("data, message", [
    ({"teacher": "t"}, "missing field 'method'"),
    ({"teacher": "t", "method": "m", "sede": 1}, "unknown field 'sede'"),
    ({"teacher": "t", "method": "m", "n_samples": -1}, "n_samples must be a positive integer"),
    ({"teacher": "t", "method": "m", "params": [1]}, "params must be a mapping"),
    ({"teacher": "t", "method": "m", "metrics": "fid"}, "metrics must be a list"),
    ([1, 2], "expected a mapping"),
])
def test_bad_trial_mappings(data, message):
    with pytest.raises(UserError, match=message):
        Trial.from_mapping(data)


def test_knobs_are_coerced_from_strings_and_checked():
    cfg = build_config(SJDConfig, {"window": "8", "refine": "false", "cfg": "2.5", "init": "repeat-above"}, owner="sjd")
    assert (cfg.window, cfg.refine, cfg.sampling.cfg, cfg.init) == (8, False, 2.5, "repeat-above")
    with pytest.raises(UserError, match="'refine' must be a boolean"):
        build_config(SJDConfig, {"refine": "maybe"}, owner="sjd")
    with pytest.raises(UserError, match="temperature must be > 0"):
        build_config(SJDConfig, {"temperature": 0}, owner="sjd")
    with pytest.raises(UserError, match="'window' must be an integer"):
        build_config(SJDConfig, {"window": 2.5}, owner="sjd")


def test_sampling_knobs_are_addressed_flat_and_may_not_be_redeclared():
    """A method config embeds its family's SamplingConfig: `cfg` sets `sampling.cfg`, the config's dict is flat (the
    trial's params, hence its key, as before the embedding), and a method knob named like a sampling setting is a
    programming error, not a silent second meaning."""
    from dataclasses import dataclass

    from teachers.families.ar_token import SamplingConfig

    cfg = build_config(SJDConfig, {"cfg": 2.0, "window": 4}, owner="sjd")
    assert cfg.sampling == SamplingConfig(cfg=2.0) and cfg.window == 4
    flat = config_dict(cfg)
    assert flat["cfg"] == 2.0 and flat["window"] == 4 and "sampling" not in flat

    @dataclass(frozen=True)
    class Clash:
        sampling: SamplingConfig = SamplingConfig()
        temperature: float = 1.0

    with pytest.raises(TypeError, match="knob 'temperature' is declared twice"):
        knobs(Clash)


def test_cache_write_is_atomic(tmp_path, monkeypatch):
    cache = Cache(tmp_path)

    def interrupted(obj, fh):
        fh.write(b"partial")
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, "save", interrupted)
    with pytest.raises(KeyboardInterrupt):
        cache.save("teachers", "k", {"x": 1})
    assert not any(p.is_file() for p in tmp_path.rglob("*"))  # neither the entry nor a temp file is left
    monkeypatch.undo()
    built = []
    obj, cached = cache.get_or_build("teachers", "k", lambda: built.append(1) or {"x": 1})
    assert obj == {"x": 1} and not cached
    obj, cached = cache.get_or_build("teachers", "k", lambda: built.append(1) or {"x": 2})
    assert obj == {"x": 1} and cached and built == [1]


def test_patch_quantizer_round_trips_its_codebook():
    images = torch.rand(20, 1, 8, 8)
    vq = PatchQuantizer.fit(images, patch=2, codebook_size=16, seed=0)
    tokens = vq.encode(images)
    assert tokens.shape == (20, 16) and vq.grid == (4, 4)
    assert torch.equal(vq.encode(vq.decode(tokens)), tokens)  # decoded codes are their own nearest codes
    assert (vq.decode(tokens) - images).pow(2).mean() < images.var()
