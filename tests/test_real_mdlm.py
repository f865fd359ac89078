"""MDLM's released backbone (teachers/networks/mdlm_dit.py) in the official names, proved without the weights: a
golden parity fixture made with kuleshov-group/mdlm's `models/dit.py` (tests/fixtures/mdlm/MAKING.md) and the
MDLM-OWT key set."""
import json
from pathlib import Path

import pytest
import torch

from teachers.networks.mdlm_dit import MDLMDiT, MDLMDiTConfig

FIXTURES = Path(__file__).parent / "fixtures" / "mdlm"


@pytest.fixture(scope="module")
def fixture():
    return torch.load(FIXTURES / "mdlm_tiny_parity.pt", weights_only=True)


def tiny(fixture) -> MDLMDiT:
    m = fixture["config"]["model"]
    cfg = MDLMDiTConfig(vocab_size=fixture["vocab_size"], hidden_size=m["hidden_size"], cond_dim=m["cond_dim"],
                        length=m["length"], n_blocks=m["n_blocks"], n_heads=m["n_heads"], dropout=m["dropout"])
    return MDLMDiT.from_state_dict(cfg, fixture["state_dict"]).eval()


def test_official_logits_are_reproduced(fixture):
    net = tiny(fixture)
    with torch.no_grad():
        assert (net(fixture["indices"]) - fixture["logits_sigma0"]).abs().max() <= 1e-5  # no time conditioning
        assert (net(fixture["indices"], fixture["sigma"]) - fixture["logits_sigma"]).abs().max() <= 1e-5


def test_interleaved_rotary_does_not_reproduce_them(fixture):
    """The broken variant: RoPE on (2k, 2k+1) pairs, as LlamaGen does, instead of flash-attn's half split."""
    import teachers.networks.mdlm_dit as mdlm_dit
    from teachers.networks.mdlm import rotate as pairwise

    net = tiny(fixture)
    with pytest.MonkeyPatch.context() as mp, torch.no_grad():
        mp.setattr(mdlm_dit, "rotate", pairwise)
        assert (net(fixture["indices"]) - fixture["logits_sigma0"]).abs().max() > 1e-2


def test_the_mdlm_owt_key_set_equals_the_official_one():
    official = json.loads((FIXTURES / "mdlm_owt_keys.json").read_text())
    with torch.device("meta"):
        ours = {k: list(v.shape) for k, v in MDLMDiT(MDLMDiTConfig()).state_dict().items()}
    assert ours == official and len(ours) == 131
    assert sum(torch.Size(s).numel() for s in ours.values()) == 169_627_250


def test_a_file_without_the_rotary_buffer_loads(fixture):
    state = {k: v for k, v in fixture["state_dict"].items() if k != "rotary_emb.inv_freq"}
    m = fixture["config"]["model"]
    cfg = MDLMDiTConfig(vocab_size=51, hidden_size=m["hidden_size"], cond_dim=m["cond_dim"], length=m["length"],
                        n_blocks=m["n_blocks"], n_heads=m["n_heads"])
    torch.testing.assert_close(MDLMDiT.from_state_dict(cfg, state).rotary_emb.inv_freq,
                               fixture["state_dict"]["rotary_emb.inv_freq"])
