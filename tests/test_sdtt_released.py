"""SDTT's released students as `sdtt`'s student (`student=<folder>`, methods/sdtt_released.py), proved without the
weights: a golden fixture made with jdeschena/sdtt's own classes (tests/fixtures/sdtt/MAKING.md: a tiny
`MultiRoundSDTT` saved as push_to_hub saves it, loaded by its `from_pretrained`, its logits, SUBS log-probs and
samples), the full-size key set of the released small students, and tiny student folders through the CLI."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from core.errors import UserError
from methods import sdtt_released as released
from methods.sdtt import SDTT, SDTTConfig
from teachers.families import masked_diffusion as md
from teachers.networks.mdlm_dit import MDLMDiT, MDLMDiTConfig
from tests.fakes import make_config

FIXTURES = Path(__file__).parent / "fixtures" / "sdtt"
REVISION = "baselines_kld_step_70000"
MASK = 50  # the fixture's stand-in tokenizer has 50 tokens


def student_config(checkpoints: Path, **knobs) -> SDTTConfig:
    """An `SDTTConfig` of these knobs completed by its released student's files in `checkpoints`, as `plan` does."""
    return SDTT.with_files(make_config(SDTTConfig, **knobs), checkpoints)


@pytest.fixture(scope="module")
def fx():
    return torch.load(FIXTURES / "sdtt_student_parity.pt", weights_only=True)


def _network() -> MDLMDiT:
    release = released.read(FIXTURES / REVISION)
    return release.network(release.network_config())


def _sample(net, draw, seed):
    return md.sample_ancestral(lambda z: md.subs(net(z), z, MASK), torch.zeros(4, 0, dtype=torch.long), 12, MASK,
                               md.SamplingConfig(steps=6, draw=draw), generator=torch.Generator().manual_seed(seed))


def test_the_released_folder_is_read_as_its_revision_says():
    release = released.read(FIXTURES / REVISION)
    assert (release.divergence, release.round, release.distill_steps, release.first_steps) == ("kld", 7, 2, 1024)
    cfg = student_config(FIXTURES, student=REVISION)
    # the round-7 reverse-KL student, distilled for 1024 / 2^7 steps; the reference arm keeps the teacher's steps
    assert (cfg.divergence, cfg.rounds, cfg.student_sampling.steps, cfg.sampling.steps) == ("kld", 7, 8, 64)
    assert student_config(FIXTURES, student=REVISION, student_steps=16).student_sampling.steps == 16
    with pytest.raises(ValueError, match=r"has rounds=7 \(its release\); got rounds=5"):
        student_config(FIXTURES, student=REVISION, rounds=5)


def test_a_student_of_another_teacher_is_tagged(tmp_path, monkeypatch):
    """The scaling students' round-1 teacher was a local checkpoint, not MDLM-OWT: a caveat tag says so."""
    folder = tmp_path / "scaling_400k_sm_step_50000"
    folder.mkdir()
    config = json.loads((FIXTURES / REVISION / "config.json").read_text())
    config["parameterization"]["checkpoint_path"] = "outputs/openwebtext/mdlm_sm/checkpoints/0-400000.ckpt"
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "model.safetensors").write_bytes((FIXTURES / REVISION / "model.safetensors").read_bytes())
    method = SDTT(object(), student_config(tmp_path, student=folder.name))
    assert method.config.rounds == 5 and "sdtt_released_teacher" not in method.caveats()
    method.release = released.read(folder)
    assert method.caveats()["sdtt_released_teacher"].endswith("0-400000.ckpt, not MDLM-OWT")


def test_the_official_logits_and_log_probs_are_reproduced(fx):
    """Measured: logits 0.0 (the same float32 operations), SUBS log-probs of the real tokens 9.5e-7."""
    net = _network()
    with torch.no_grad():
        assert (net(fx["indices"]) - fx["logits_sigma0"]).abs().max() <= 1e-5
        assert (net(fx["indices"], fx["sigma"]) - fx["logits_sigma"]).abs().max() <= 1e-5
        logp = md.subs(net(fx["indices"]), fx["indices"], MASK)
    # MASK's column is "impossible" on both sides (the released SUBS adds -1e6 to its logit, ours sets it)
    assert (logp[..., :MASK] - fx["subs_logp"][..., :MASK]).abs().max() <= 1e-5
    assert logp[..., MASK].max() <= -1e5 and fx["subs_logp"][..., MASK].max() <= -1e5


def test_the_official_samples_are_reproduced_token_for_token_by_the_released_draw(fx):
    """`MultiRoundSDTT.sample` after torch.manual_seed(7) against the family's sampler with `draw=released-fp32` and
    a generator seeded 7 (the same uniforms, in the same order); the exact float64 draw, another law of the same
    distribution, gives other tokens."""
    net = _network()
    same = _sample(net, "released-fp32", fx["sample_seed"])
    assert torch.equal(same.data, fx["samples"]) and same.counters["nfe"] == 4 * fx["sample_steps"]
    assert not torch.equal(_sample(net, "exact", fx["sample_seed"]).data, fx["samples"])


def test_broken_variants_do_not_reproduce_them(fx):
    """Interleaved rotary pairs instead of flash-attn's half split, and a wrong key mapping (blocks swapped)."""
    import teachers.networks.mdlm_dit as mdlm_dit
    from teachers.networks.mdlm import rotate as pairwise

    net = _network()
    with pytest.MonkeyPatch.context() as mp, torch.no_grad():
        mp.setattr(mdlm_dit, "rotate", pairwise)
        assert (net(fx["indices"]) - fx["logits_sigma0"]).abs().max() > 1e-2
    net.blocks = torch.nn.ModuleList([net.blocks[1], net.blocks[0]])
    with torch.no_grad():
        assert (net(fx["indices"]) - fx["logits_sigma0"]).abs().max() > 1e-2


def test_the_released_small_students_key_set_is_ours_under_backbone():
    official = json.loads((FIXTURES / "sdtt_small_student_keys.json").read_text())
    with torch.device("meta"):
        ours = {released.PREFIX + k: list(v.shape) for k, v in MDLMDiT(MDLMDiTConfig()).state_dict().items()}
    assert ours == official and len(ours) == 131
    assert sum(torch.Size(s).numel() for s in ours.values()) == 169_627_250


@pytest.mark.parametrize("rename, says", [
    (lambda k: k.replace("backbone.blocks", "blocks"), "has keys outside 'backbone.', e.g. blocks.0"),
    (lambda k: "backbone." + k, "has no backbone.vocab_embed.embedding"),  # the teacher revision's nesting
    (lambda k: k.replace("attn_qkv", "attn.qkv"), "does not fit config.json: Missing key(s)"),
])
def test_a_file_with_other_keys_is_one_line(rename, says, tmp_path, monkeypatch):
    from safetensors.torch import load_file, save_file

    folder = tmp_path / REVISION
    folder.mkdir()
    (folder / "config.json").write_text((FIXTURES / REVISION / "config.json").read_text())
    state = load_file(FIXTURES / REVISION / "model.safetensors")
    save_file({rename(k): v for k, v in state.items()}, folder / "model.safetensors")
    release = released.read(folder)
    with pytest.raises(UserError) as err:
        release.network(release.network_config())
    assert "\n" not in str(err.value) and says in str(err.value), err.value


def test_a_mismatched_or_missing_student_is_one_line(tmp_path, monkeypatch):
    from tests.fakes import tiny_mdlm_owt_teacher, write_sdtt_checkpoints, write_sdtt_student

    write_sdtt_checkpoints(tmp_path)
    write_sdtt_student(tmp_path, "baselines_mse_step_20000", distill_mode="mse", hidden_size=16)
    cfg = student_config(tmp_path, student="baselines_mse_step_20000", ar_arm=False)
    assert (cfg.divergence, cfg.rounds, cfg.student_sampling.steps) == ("mse", 2, 256)
    with pytest.raises(UserError) as err:
        SDTT(tiny_mdlm_owt_teacher(), cfg).fit(cache=None, checkpoints=tmp_path)
    assert "\n" not in str(err.value)
    assert f"sdtt student {tmp_path / 'baselines_mse_step_20000'}: its hidden_size is 16" in str(err.value)
    # without its files, a student is what its folder's name says (a dry run lists the files; plan refuses them)
    cfg = student_config(tmp_path, student="baselines_kld_step_70000")
    assert (cfg.rounds, cfg.student_sampling.steps, SDTT.trains(cfg)) == (7, 8, False)
    lines = list(SDTT.required_files(cfg, tmp_path).values())
    assert [line.split(":")[0] for line in lines] == [f"missing {tmp_path}/baselines_kld_step_70000/{f}"
                                                       for f in ("config.json", "model.safetensors")]
    assert all("--checkpoints" in line and "\n" not in line for line in lines)
    with pytest.raises(UserError) as err:
        SDTT(tiny_mdlm_owt_teacher(), cfg).fit(cache=None, checkpoints=tmp_path)
    assert str(err.value) == lines[0]


@pytest.mark.usefixtures("fresh_store")  # a copy of the migrated store at tmp_path/mlflow.db
def test_released_students_run_from_the_cli_without_training(tmp_path, capsys):
    """Tiny files in the official formats (`write_sdtt_checkpoints`, `write_sdtt_student`): the round-2 tvd student and
    the round-1 kld student in the released draw (every arm's: the run's `draw` and `ref.draw`), into MLflow and a
    report; a missing student stops at plan time."""
    from mlflow.tracking import MlflowClient

    import cli
    from tests.fakes import write_sdtt_checkpoints, write_sdtt_student

    ckpt = tmp_path / "checkpoints"
    ckpt.mkdir()
    write_sdtt_checkpoints(ckpt)
    write_sdtt_student(ckpt, "baselines_tvd_step_20000", distill_mode="tvd")
    write_sdtt_student(ckpt, "baselines_kld_step_10000", seed=2)
    store = f"sqlite:///{tmp_path}/mlflow.db"
    common = ["--teacher", "mdlm-owt", "--method", "sdtt", "--param", "steps=8", "--param", "ar_arm=false",
              "--n-samples", "4", "--batch-size", "4", "--tracking-uri", store, "--cache-dir", str(tmp_path / "c"),
              "--experiment", "released", "--warmup", "0", "--no-progress", "--checkpoints", str(ckpt),
              "--metric", "entropy"]
    runs = [["--param", "student=baselines_tvd_step_20000", "--param", "student_steps=4"],
            ["--param", "student=baselines_kld_step_10000", "--param", "student_steps=2",
             "--param", "draw=released-fp32"]]
    for args in runs:
        assert cli.main(["run", *common, *args]) == 0, args
    assert not (tmp_path / "c" / "sdtt-ema").exists()  # nothing trained
    client = MlflowClient(store)
    found = {r.data.params["student"]: r for r in client.search_runs(
        [client.get_experiment_by_name("released").experiment_id])}
    tvd, kld = found["baselines_tvd_step_20000"], found["baselines_kld_step_10000"]
    assert (tvd.data.params["divergence"], tvd.data.params["rounds"]) == ("tvd-log", "2")
    assert (kld.data.params["divergence"], kld.data.params["rounds"]) == ("kld", "1")
    assert tvd.data.metrics["fit/student_sampling_steps"] == 4 and tvd.data.metrics["nfe_per_sample"] in (4, 5)
    assert kld.data.metrics["nfe_per_sample"] in (2, 3) and "same_steps/nfe_per_sample" in kld.data.metrics
    assert "caveat.sdtt_released_weights" in tvd.data.tags and "caveat.sdtt_draw" not in kld.data.tags
    assert "caveat.sdtt_draw" in tvd.data.tags
    assert [(r.data.params["draw"], r.data.params["ref.draw"]) for r in (tvd, kld)] == [("exact", "exact"),
                                                                                        ("released-fp32",) * 2]
    assert cli.main(["report", "--tracking-uri", store, "--experiment", "released", "--out", str(tmp_path / "r")]) == 0
    assert "## mdlm-owt" in (tmp_path / "r" / "REPORT.md").read_text()
    missing = ["run", *common, "--param", "student=baselines_kld_step_70000"]
    assert cli.main(missing) == 2
    assert len(client.search_runs([client.get_experiment_by_name("released").experiment_id])) == 2
    capsys.readouterr()
    assert cli.main([*missing, "--dry-run"]) == 0  # listed, and planned from the folder's name: round 7, 8 steps
    out = capsys.readouterr().out
    assert f"MISSING  {ckpt}/baselines_kld_step_70000/model.safetensors" in out and "fit: trains" not in out
    assert "method     9 step" in out and "same_steps 9 step" in out


def test_the_prompted_teachers_webtext_file_is_listed_and_required(tmp_path, capsys, monkeypatch):
    """`mdlm-owt-prompted` reads its prompts from webtext.test.jsonl at load: sdtt-fig5's dry run lists it (missing
    against an empty folder, there beside the tiny files), a run without it stops at plan time in one line, and the
    teacher's key is the one it had before the file was listed."""
    import cli
    from tests.fakes import TinyMDLMOWTPrompted, write_sdtt_checkpoints

    monkeypatch.chdir(tmp_path)
    empty, ckpt = tmp_path / "empty", tmp_path / "checkpoints"
    empty.mkdir()
    ckpt.mkdir()
    write_sdtt_checkpoints(ckpt)
    fig5 = Path(__file__).parents[1] / "suites" / "papers" / "sdtt-fig5.yaml"
    assert cli.main(["suite", str(fig5), "--dry-run", "--checkpoints", str(empty)]) == 0
    assert f"MISSING  {empty}/webtext.test.jsonl" in capsys.readouterr().out
    run = ["run", "--teacher", "mdlm-owt-prompted", "--method", "mdlm", "--checkpoints", str(ckpt), "--n-samples",
           "5", "--tracking-uri", f"sqlite:///{tmp_path}/m.db", "--cache-dir", str(tmp_path / "cache")]
    assert cli.main([*run, "--dry-run"]) == 0
    assert f"ok       {ckpt}/webtext.test.jsonl" in capsys.readouterr().out
    assert [p.name for p in TinyMDLMOWTPrompted.key_files()] == [
        "config.json", "model.safetensors", "tokenizer_config.json", "tokenizer.json", "vocab.json",
        "webtext.test.jsonl"]
    (ckpt / "webtext.test.jsonl").unlink()
    assert cli.main(run) == 2
    err = capsys.readouterr().err.strip()
    assert f"missing {ckpt}/webtext.test.jsonl: place " in err and "WebText's test file" in err and "\n" not in err
    assert not (tmp_path / "cache").exists()  # refused before any work


def test_list_names_the_student_knob(capsys):
    import cli

    from tests.fakes import listed_entries

    assert cli.main(["list"]) == 0
    assert "released SDTT student (`student=<folder>`)" in listed_entries(capsys.readouterr().out)["sdtt"]
