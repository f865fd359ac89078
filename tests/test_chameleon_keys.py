"""The Lumina-mGPT / Anole loader (`read_chameleon`, teachers/pretrained/chameleon.py) against the key set of the
module that wrote Lumina-mGPT's released folders, at full size and without the weights.

The fixtures (tests/fixtures/chameleon/MAKING.md) hold every state-dict key and shape of Lumina-mGPT's own Chameleon
module (its transformers-4.43-era copy, `ChameleonXLLMXForConditionalGeneration`) built on the meta device:
- 7B (the registered teachers): 548 tensors, 7,042,582,528 values, of which the VQ-VAE encoder `model.vqmodel.*` is
  129 tensors, 29,423,616 values; the QK LayerNorms (`q_norm`, `k_norm`, weight and bias) are (1, 128), one row per
  model-parallel shard. After the loader's drop and the norms repeated over the heads: 419 tensors,
  7,013,666,816 values, transformers' `ChameleonForConditionalGeneration` with `vqmodel = None` exactly.
- 34B (GQA, Swin norm, 4 shards; no teacher registers it): 756 tensors, 34,322,946,048 values; q_norm (4, 128) to
  (64, 128), k_norm (4, 128) to (8, 128); after the drop 627 tensors, 34,294,308,864 values.
The two modules have the same keys: neither stores the rotary `inv_freq` (not persistent in both), both have
`lm_head.weight` untied and the same 129 `model.vqmodel.*` keys; only the QK-norm shapes differ.
"""
import json
from pathlib import Path

import pytest
import torch

from teachers.pretrained.chameleon import DROPPED, QK_NORMS, read_chameleon

FIXTURES = Path(__file__).parent / "fixtures" / "chameleon"
VOCABULARY = {"<image>": 8711}  # the released map holds every token; no key or shape depends on it
TOTALS = {  # (official tensors, values), (loaded tensors, values)
    "7B": ((548, 7_042_582_528), (419, 7_013_666_816)),
    "34B": ((756, 34_322_946_048), (627, 34_294_308_864)),
}


def official(name: str) -> dict:
    return json.loads((FIXTURES / f"Lumina-mGPT-{name}.keys.json").read_text())


def transformers_config(fixture: dict):
    from transformers import ChameleonConfig

    return ChameleonConfig(**fixture["config"], vocabulary_map=VOCABULARY)


def as_loaded(fixture: dict) -> dict[str, list[int]]:
    """The official keys and shapes as the loader turns them: `DROPPED` left out, a QK norm's (shards, head_dim)
    made (heads, head_dim)."""
    config = fixture["config"]
    heads = {QK_NORMS[0]: config["num_attention_heads"], QK_NORMS[1]: config["num_key_value_heads"]}
    out = {}
    for key, shape in fixture["keys"].items():
        if key.startswith(DROPPED):
            continue
        norm = next((n for n in QK_NORMS if n in key), None)
        out[key] = [heads[norm], shape[1]] if norm else shape
    return out


def count(keys: dict[str, list[int]]) -> tuple[int, int]:
    return len(keys), sum(torch.Size(shape).numel() for shape in keys.values())


@pytest.mark.parametrize("name", list(TOTALS))
def test_the_official_key_set_less_the_loaders_drops_is_transformers_key_for_key(name):
    from transformers import ChameleonForConditionalGeneration

    fixture = official(name)
    with torch.device("meta"):
        model = ChameleonForConditionalGeneration(transformers_config(fixture))
    full = {key: list(value.shape) for key, value in model.state_dict().items()}
    assert set(full) == set(fixture["keys"])  # the same names, the VQ-VAE encoder included
    model.model.vqmodel = None  # as the loader does
    ours = {key: list(value.shape) for key, value in model.state_dict().items()}
    expected = as_loaded(fixture)
    assert ours == expected
    assert (count(fixture["keys"]), count(expected)) == TOTALS[name]
    assert fixture["n_params"] == TOTALS[name][0][1]
    shards = fixture["config"]["model_parallel_size"]
    norms = {key: shape for key, shape in fixture["keys"].items() if any(n in key for n in QK_NORMS)}
    assert len(norms) == 4 * fixture["config"]["num_hidden_layers"]  # q and k, weight and bias, per layer
    assert {tuple(shape) for shape in norms.values()} == {(shards, 128)}


@pytest.mark.parametrize("name", list(TOTALS))
def test_read_chameleon_loads_the_official_tensors_strictly(name, tmp_path, monkeypatch):
    """The loader itself, on a folder whose one shard holds every official key and shape (meta tensors but for the
    QK norms, whose rows are numbered by shard): strict loading passes, and head h of a norm is shard
    h // (heads / shards)'s row, as the official forward repeats it."""
    import safetensors.torch

    fixture = official(name)
    config = fixture["config"]
    transformers_config(fixture).save_pretrained(tmp_path)
    (tmp_path / "model.safetensors").touch()
    shards = config["model_parallel_size"]

    def tensor(key: str, shape: list[int]) -> torch.Tensor:
        if any(n in key for n in QK_NORMS):  # row s holds s, with a per-column offset to tell columns apart
            return torch.arange(shards, dtype=torch.float32)[:, None] + torch.linspace(0, 0.5, shape[1])
        return torch.empty(shape, device="meta")

    def load_file(path, device="cpu"):
        assert Path(path) == tmp_path / "model.safetensors" and device == "cpu"
        return {key: tensor(key, shape) for key, shape in fixture["keys"].items()}

    monkeypatch.setattr(safetensors.torch, "load_file", load_file)
    model = read_chameleon(tmp_path, torch.device("cpu"), torch.float32)
    assert model.model.vqmodel is None
    assert {key: list(value.shape) for key, value in model.state_dict().items()} == as_loaded(fixture)
    attention = model.model.layers[config["num_hidden_layers"] - 1].self_attn
    for module, heads in ((attention.q_norm, config["num_attention_heads"]),
                          (attention.k_norm, config["num_key_value_heads"])):
        shard = torch.arange(heads) // (heads // shards)
        for weight in (module.weight, module.bias):
            assert torch.equal(weight, shard[:, None].float() + torch.linspace(0, 0.5, weight.shape[1]))
