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


def test_missing_mdlm_owt_files_are_one_line(tmp_path, capsys):
    from bench import cli

    args = ["run", "--teacher", "mdlm-owt", "--method", "mdlm", "--checkpoints", str(tmp_path),
            "--tracking-uri", f"sqlite:///{tmp_path}/mlflow.db"]
    assert cli.main(args) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and f"missing {tmp_path}/mdlm-owt/config.json" in err and "kuleshov-group/mdlm-owt" in err
    assert cli.main(["run", "--teacher", "hf:gpt2-large", "--method", "ar", "--checkpoints", str(tmp_path)]) == 2
    assert f"missing {tmp_path}/gpt2-large/config.json" in capsys.readouterr().err
    assert cli.main(["run", "--teacher", "wordnet-gpt", "--method", "ar", "--metric", "gen_ppl@hf:gpt2-large",
                     "--checkpoints", str(tmp_path)]) == 2
    assert f"missing {tmp_path}/gpt2-large/config.json" in capsys.readouterr().err


def test_the_sdtt_papers_setting_runs_from_the_cli_on_tiny_files_in_the_official_formats(tmp_path):
    """The registered `mdlm-owt` and `hf:gpt2` teachers on tiny random files in the release formats
    (tests/fakes.py `write_sdtt_checkpoints`): `mdlm`, `sdtt` (one short round, GPT-2's AR arm), GPT-2 by `ar` and
    `sjd`, with gen-PPL and MAUVE under GPT-2, into MLflow and a report."""
    from mlflow.tracking import MlflowClient

    from bench import cli
    from tests.fakes import write_sdtt_checkpoints

    ckpt = tmp_path / "checkpoints"
    ckpt.mkdir()
    write_sdtt_checkpoints(ckpt)
    store = f"sqlite:///{tmp_path}/mlflow.db"
    common = ["--n-samples", "8", "--batch-size", "4", "--tracking-uri", store, "--cache-dir", str(tmp_path / "cache"),
              "--experiment", "sdtt", "--warmup", "0", "--no-progress", "--checkpoints", str(ckpt),
              "--metric", "gen_ppl@hf:gpt2", "--metric", "mauve@hf:gpt2", "--metric", "entropy"]
    runs = {"mdlm": ["--teacher", "mdlm-owt", "--method", "mdlm", "--param", "steps=8"],
            "sdtt": ["--teacher", "mdlm-owt", "--method", "sdtt", "--param", "steps=8", "--param", "rounds=1",
                     "--param", "iters_per_round=2", "--param", "batch=4"],
            "ar": ["--teacher", "hf:gpt2", "--method", "ar", "--param", "top_p=0.95"]}
    for args in runs.values():
        assert cli.main(["run", *args, *common]) == 0, args
    sjd = ["run", "--teacher", "hf:gpt2", "--method", "sjd", "--param", "window=4", *common[4:], "--n-samples", "2",
           "--batch-size", "1"]
    assert cli.main(sjd) == 0
    client = MlflowClient(store)
    found = client.search_runs([client.get_experiment_by_name("sdtt").experiment_id])
    assert sorted(r.data.params["method"] for r in found) == ["ar", "mdlm", "sdtt", "sjd"]
    for r in found:
        assert r.info.status == "FINISHED" and {"gen_ppl.gpt2", "mauve.gpt2"} <= set(r.data.metrics), r.data.params
    (sdtt,) = [r for r in found if r.data.params["method"] == "sdtt"]
    assert "ar/sec_per_sample_median" in sdtt.data.metrics  # GPT-2's AR arm (the teacher `hf:<ckpt>/gpt2`)
    assert cli.main(["report", "--tracking-uri", store, "--experiment", "sdtt", "--out", str(tmp_path / "r")]) == 0
    assert "## mdlm-owt" in (tmp_path / "r" / "REPORT.md").read_text()
