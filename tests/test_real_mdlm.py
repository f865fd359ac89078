"""MDLM's released backbone (teachers/networks/mdlm_dit.py) in the official names, proved without the weights: a
golden parity fixture made with kuleshov-group/mdlm's `models/dit.py` (tests/fixtures/mdlm/MAKING.md) and the
MDLM-OWT key set."""
import json
from pathlib import Path

import pytest
import torch

from teachers.networks.mdlm_dit import MDLMDiT, MDLMDiTConfig
from tests.fakes import NO_CHECKPOINTS

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
    import cli

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


@pytest.mark.usefixtures("fresh_store")  # a copy of the migrated store at tmp_path/mlflow.db
def test_the_sdtt_papers_setting_runs_from_the_cli_on_tiny_files_in_the_official_formats(tmp_path):
    """The registered `mdlm-owt` and `hf:gpt2` teachers on tiny random files in the release formats
    (tests/fakes.py `write_sdtt_checkpoints`): `mdlm`, `sdtt` (one short round, GPT-2's AR arm), GPT-2 by `ar` and
    `sjd`, with gen-PPL and MAUVE under GPT-2, into MLflow and a report."""
    from mlflow.tracking import MlflowClient

    import cli
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
    sjd = ["run", "--teacher", f"hf:{ckpt / 'gpt2'}", "--method", "sjd", "--param", "window=4", *common[4:],
           "--n-samples", "2", "--batch-size", "1"]  # a teacher named by a path: the report's file names are safe
    assert cli.main(sjd) == 0
    client = MlflowClient(store)
    found = client.search_runs([client.get_experiment_by_name("sdtt").experiment_id])
    assert sorted(r.data.params["method"] for r in found) == ["ar", "mdlm", "sdtt", "sjd"]
    for r in found:
        assert r.info.status == "FINISHED" and {"gen_ppl.gpt2.sdtt", "mauve.gpt2"} <= set(r.data.metrics), r.data.params
    (sdtt,) = [r for r in found if r.data.params["method"] == "sdtt"]
    assert "ar/sec_per_sample_median" in sdtt.data.metrics  # GPT-2's AR arm (the teacher `hf:<ckpt>/gpt2`)
    assert cli.main(["report", "--tracking-uri", store, "--experiment", "sdtt", "--out", str(tmp_path / "r")]) == 0
    assert "## mdlm-owt" in (tmp_path / "r" / "REPORT.md").read_text()


def test_sdtts_prompted_protocol_in_paints_the_prompts_and_scores_per_prompt(tmp_path):
    """`mdlm-owt-prompted`: 5 continuations of each 50-token prompt, the prompt kept through every step; self-BLEU
    per prompt equals nltk's among each prompt's continuations; MAUVE's references are the prompts' documents."""
    from nltk.translate.bleu_score import SmoothingFunction, sentence_bleu

    from core.cache import Cache
    from metrics.self_bleu import SelfBLEU
    from teachers.families import masked_diffusion as md
    from tests.fakes import TinyMDLMOWTPrompted

    teacher = TinyMDLMOWTPrompted.load("p", cache=Cache(tmp_path), device=torch.device("cpu"))
    cond = teacher.conditions(10, torch.Generator().manual_seed(0))  # (10, 50): 2 prompts, 5 times each
    assert cond.shape == (10, 50) and len({tuple(r) for r in cond.tolist()}) == 2
    assert torch.equal(cond[:5], cond[:1].expand(5, -1)) and len(teacher.reference_texts()) == len(teacher.prefixes)
    out = md.sample_teacher(teacher, cond, md.SamplingConfig(steps=4), generator=torch.Generator().manual_seed(1))
    assert out.data.shape == (10, 100) and torch.equal(out.data[:, :50], cond) and out.counters["tokens"] == 500
    texts = teacher.decode(out.data)
    metric = SelfBLEU(teacher, cache=None, device=torch.device("cpu"), checkpoints=NO_CHECKPOINTS)
    metric.update(texts, cond)
    ((key, value),) = metric.compute().items()
    smooth, expected = SmoothingFunction().method1, []
    for g in (range(5), range(5, 10)):
        words = [texts[i].removeprefix(teacher.decode(cond[i : i + 1])[0]).split() for i in g]
        expected.append(sum(sentence_bleu(words[:i] + words[i + 1 :], w, smoothing_function=smooth)
                            for i, w in enumerate(words)) / 5)
    assert key == "self_bleu.bleu4-per-prompt-n2.webtext-prompted" and value == pytest.approx(sum(expected) / 2)


@pytest.mark.usefixtures("fresh_store")  # a copy of the migrated store at tmp_path/mlflow.db
def test_the_prompted_protocol_runs_from_the_cli(tmp_path):
    from mlflow.tracking import MlflowClient

    import cli
    from tests.fakes import write_sdtt_checkpoints

    ckpt = tmp_path / "checkpoints"
    ckpt.mkdir()
    write_sdtt_checkpoints(ckpt)
    store = f"sqlite:///{tmp_path}/mlflow.db"
    args = ["run", "--teacher", "mdlm-owt-prompted", "--method", "sdtt", "--param", "steps=8", "--param", "rounds=1",
            "--param", "iters_per_round=2", "--param", "batch=4", "--n-samples", "10", "--batch-size", "5",
            "--tracking-uri", store, "--cache-dir", str(tmp_path / "cache"), "--warmup", "0", "--no-progress",
            "--checkpoints", str(ckpt), "--metric", "mauve@hf:gpt2", "--metric", "self_bleu"]
    assert cli.main(args) == 0
    client = MlflowClient(store)
    (run,) = client.search_runs([client.get_experiment_by_name("accelbench").experiment_id])
    m = run.data.metrics
    assert {"mauve.gpt2.webtext-prompted", "self_bleu.bleu4-per-prompt-n2.webtext-prompted",
            "ar/mauve.gpt2.webtext-prompted", "ar/sec_per_sample_median"} <= set(m)
