"""Chameleon's VQGAN decoder (teachers/networks/chameleon_vqgan.py) in the official names, proved without the weights:
a golden parity fixture made with the official code on a tiny config, in the official file formats
(tests/fixtures/chameleon_vqgan/MAKING.md), and the full-size key set."""
import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import yaml

from teachers.networks.chameleon_vqgan import (UNUSED_PREFIXES, ChameleonVQConfig, ChameleonVQGAN,
                                               load_vqgan_state)
from core.checkpoints import read_state_dict

FIXTURES = Path(__file__).parent / "fixtures" / "chameleon_vqgan"


def load(state_dict: dict[str, torch.Tensor] | None = None) -> ChameleonVQGAN:
    """The Chameleon teacher's path: the config from vqgan.yaml, the module on meta, the file's "state_dict"."""
    cfg = ChameleonVQConfig.from_yaml(FIXTURES / "vqgan.yaml")
    with torch.device("meta"):
        vq = ChameleonVQGAN(cfg)
    official = read_state_dict(FIXTURES / "vqgan.ckpt", ("state_dict",)) if state_dict is None else state_dict
    return load_vqgan_state(vq, official).float().eval()  # the fixture's weights are stored in float16


@pytest.fixture(scope="module")
def parity():
    return torch.load(FIXTURES / "parity.pt", weights_only=True)


def test_official_decoding_is_reproduced_from_the_official_files(parity):
    official = read_state_dict(FIXTURES / "vqgan.ckpt", ("state_dict",))
    assert {k.split(".")[0] for k in official} == {"encoder", "quant_conv", "quantize", "post_quant_conv", "decoder"}
    assert any(".attn." in k for k in official if k.startswith("decoder.up."))  # a level with attention
    with torch.no_grad():
        image = load()(parity["codes"], parity["grid"])
    assert image.shape == parity["image"].shape == (2, 3, 6, 10)  # a 3 x 5 grid, one upsampling
    assert (parity["image"].abs() == 1).any()  # the clamp is exercised
    # 0.0 on 2 threads (as the fixture was made) and 2.4e-6 on 1 thread where it was made: the CPU sums float32
    # convolutions in an order that depends on the threads; the broken variants below are off by > 0.1
    assert (image - parity["image"]).abs().max() <= 5e-5


@pytest.mark.parametrize("broken", ["l2-normalised codebook", "transposed grid"])
def test_a_broken_variant_would_not_match(parity, broken):
    """LlamaGen's VQ-16 normalises its code vectors, Chameleon's lookup does not; codes are in raster order (rows)."""
    vq, codes, (h, w) = load(), parity["codes"], parity["grid"]
    with torch.no_grad():
        if broken == "l2-normalised codebook":
            vq.quantize.embedding.weight.copy_(F.normalize(vq.codebook, dim=-1))
            image = vq(codes, (h, w))
        else:
            image = vq(codes.reshape(-1, w, h).transpose(1, 2).reshape(-1, h * w), (h, w))
    assert (image - parity["image"]).abs().max() > 0.1


def test_full_size_key_set_is_the_official_one_less_what_decoding_never_reads(tmp_path):
    official = json.loads((FIXTURES / "ChameleonVQ.keys.json").read_text())
    kept = {k: v for k, v in official["keys"].items() if not k.startswith(UNUSED_PREFIXES)}
    assert {k.split(".")[0] for k in official["keys"] if k not in kept} == {"encoder", "quant_conv"}
    with torch.device("meta"):
        vq = ChameleonVQGAN(ChameleonVQConfig())
    assert {k: list(v.shape) for k, v in vq.state_dict().items()} == kept
    assert vq.codebook.shape == (8192, 256)
    # the config the key set was made with, read back as a vqgan.yaml, is the default one
    (tmp_path / "vqgan.yaml").write_text(yaml.safe_dump({"model": {"params": official["config"]}}))
    assert ChameleonVQConfig.from_yaml(tmp_path / "vqgan.yaml") == ChameleonVQConfig()


def test_only_the_named_keys_are_dropped():
    official = read_state_dict(FIXTURES / "vqgan.ckpt", ("state_dict",))
    load({**official, "loss.discriminator.main.0.weight": torch.zeros(1)})  # taming's training loss: dropped
    missing = {k: v for k, v in official.items() if k != "decoder.up.0.attn.1.q.bias"}
    with pytest.raises(RuntimeError, match="Missing key.*decoder.up.0.attn.1.q.bias"):
        load(missing)
    for extra in ("decoder.extra", "discriminator.main.0.weight"):
        with pytest.raises(RuntimeError, match=f"Unexpected key.*{extra}"):
            load({**official, extra: torch.zeros(1)})


@pytest.mark.parametrize("edit, message", [
    (("ch", 48), "ch=48: must be a multiple of 32"),
    (("attn_resolutions", [3]), r"attn_resolutions=\[3\]: each must be one of the level sizes \[4, 8\]"),
    (("tanh_out", True), "tanh_out=True: only False is supported"),
    (("ch_mult", None), "not a taming VQGAN config .*KeyError.*ch_mult"),  # None: the entry removed
])
def test_a_bad_vqgan_yaml_is_one_line(tmp_path, edit, message):
    config = yaml.safe_load((FIXTURES / "vqgan.yaml").read_text())
    ddconfig = config["model"]["params"]["ddconfig"]
    if edit[1] is None:
        del ddconfig[edit[0]]
    else:
        ddconfig[edit[0]] = edit[1]
    path = tmp_path / "vqgan.yaml"
    path.write_text(yaml.safe_dump(config))
    with pytest.raises(ValueError, match=message) as error:
        ChameleonVQConfig.from_yaml(path)
    assert "\n" not in str(error.value) and str(error.value).startswith(str(path))
