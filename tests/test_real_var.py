"""VAR's transformer and multi-scale VQ-VAE (teachers/networks/var.py, msvq.py) in the official names, proved without
the weights: golden parity fixtures made with FoundationVision/VAR (tests/fixtures/var/MAKING.md), the full-size key
sets, the family's sampler, and the loader on tiny files from the CLI."""
import json
from pathlib import Path

import pytest
import torch

from teachers.families import multiscale_vq
from teachers.networks.msvq import MSVQConfig, MultiScaleVQ, load_decoder_state
from teachers.networks.var import VAR, VARConfig

FIXTURES = Path(__file__).parent / "fixtures" / "var"


@pytest.fixture(scope="module")
def fixture():
    return torch.load(FIXTURES / "var_tiny_parity.pt", weights_only=True)


@pytest.fixture(scope="module")
def models(fixture):
    from tests.fakes import TinyVAR

    with torch.device("meta"):
        vq = MultiScaleVQ(TinyVAR.vq_config())
    load_decoder_state(vq, fixture["vae_state_dict"])
    return VAR.from_state_dict(TinyVAR.config(), fixture["var_state_dict"]).eval(), vq.eval()


def test_teacher_forced_logits_and_decoded_images_are_the_official_ones(fixture, models):
    var, vq = models
    with torch.no_grad():
        assert (vq.var_input(fixture["idx"]) - fixture["var_input"]).abs().max() <= 1e-5  # Phi, bicubic, area
        assert (var(fixture["labels"], fixture["var_input"]) - fixture["logits"]).abs().max() <= 1e-5
        assert (vq.decode_codes(fixture["idx"]) - fixture["image"]).abs().max() <= 1e-5


def test_scale_by_scale_through_the_kv_cache_gives_the_same_logits(fixture):
    """The inference path (no mask, keys and values of the earlier scales cached; `VARC2I.start`/`next_scale`) gives
    the block-causal teacher-forced logits of the official forward."""
    from tests.fakes import tiny_var_teacher

    teacher = tiny_var_teacher()
    state, logits = teacher.start(fixture["labels"][:, None], cfg=False)
    out = [logits]
    for codes in fixture["idx"][:-1]:
        out.append(teacher.next_scale(state, codes))
    assert (torch.cat(out, 1) - fixture["logits"]).abs().max() <= 1e-5


def test_vars_top_k_and_top_p_keep_what_the_official_filter_keeps(fixture):
    s = multiscale_vq.SamplingConfig(cfg=0, top_k=fixture["filter_top_k"], top_p=fixture["filter_top_p"])
    kept = multiscale_vq.process(fixture["filter_in"], s) > 0
    assert torch.equal(kept, fixture["filter_out"] > float("-inf"))
    assert kept[0, 0].sum() == 8  # ties at the k-th value are kept


def test_the_cfg_ramp():
    c, u = torch.full((1, 1, 2), 2.0), torch.zeros(1, 1, 2)
    both = torch.cat([c, u])
    assert torch.equal(multiscale_vq.guide(both, 1, 1.5, 0, 10), c)  # no guidance at the first scale
    assert torch.allclose(multiscale_vq.guide(both, 1, 1.5, 9, 10), 2.5 * c)  # 1 + cfg at the last


def test_the_phi_of_each_of_the_ten_scales_breaks_the_ties_as_the_official_code():
    with torch.device("meta"):
        vq = MultiScaleVQ(MSVQConfig())
    assert vq.quantize.quant_resi.index == [0, 0, 1, 1, 1, 2, 2, 3, 3, 3]  # docs/checkpoints.md, 'VAR'


@pytest.mark.parametrize("depth", [16, 20, 24, 30])
def test_full_size_key_sets_equal_the_official_ones(depth):
    official = json.loads((FIXTURES / "var_keys.json").read_text())
    with torch.device("meta"):
        ours = {k: list(v.shape) for k, v in VAR(VARConfig(depth=depth)).state_dict().items()}
        vq = {k: list(v.shape) for k, v in MultiScaleVQ(MSVQConfig()).state_dict().items()}
    assert ours == official[f"var_d{depth}"]
    assert vq == {k: s for k, s in official["vae_ch160v4096z32"].items()
                  if not k.startswith(("encoder.", "quant_conv."))}


@pytest.mark.usefixtures("fresh_store")  # a copy of the migrated store at tmp_path/mlflow.db
def test_the_var_loader_runs_its_sampler_from_the_cli(plugin, tmp_path, capsys):
    """`tiny-var` (tests/plugins.py) by `ar` (the next-scale sampler, CFG ramp), `skip-scales`, `dd` (2 steps) and
    `onestep*` into MLflow and a report; the missing files of `var-d30` are one line."""
    from mlflow.tracking import MlflowClient

    import cli

    store = f"sqlite:///{tmp_path}/mlflow.db"
    args = ["run", "--teacher", "tiny-var", "--method", "ar", "--n-samples", "4", "--batch-size", "2", "--tracking-uri",
            store, "--cache-dir", str(tmp_path / "cache"), "--experiment", "var", "--warmup", "0", "--no-progress",
            "--param", "cfg=1.5", "--param", "top_k=20"]
    assert cli.main(args) == 0
    assert cli.main([*args[:4], "skip-scales", *args[5:], "--param", "skip=1"]) == 0
    fast = ["--param", "n_pairs=64", "--param", "train_steps=5", "--param", "batch=8", "--param", "solver_steps=2"]
    assert cli.main([*args[:4], "dd", *args[5:], *fast, "--param", "steps=2"]) == 0
    assert cli.main([*args[:4], "onestep*", *args[5:], "--param", "n_pairs=64"]) == 0
    client = MlflowClient(store)
    runs = {r.data.params["method"]: r
            for r in client.search_runs([client.get_experiment_by_name("var").experiment_id])}
    assert runs["ar"].data.metrics["nfe_per_sample"] == 4 and runs["ar"].data.tags["family"] == "multiscale-vq"
    assert runs["skip-scales"].data.metrics["nfe_per_sample"] == 3
    assert runs["dd"].data.metrics["nfe_per_sample"] == 2 and runs["onestep*"].data.metrics["nfe_per_sample"] == 1
    assert cli.main(["report", "--tracking-uri", store, "--experiment", "var", "--out", str(tmp_path / "r")]) == 0
    assert "## tiny-var" in (tmp_path / "r" / "REPORT.md").read_text()
    capsys.readouterr()
    assert cli.main(["run", "--teacher", "var-d30", "--method", "ar", "--checkpoints", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and f"missing {tmp_path}/var_d30.pth and {tmp_path}/vae_ch160v4096z32.pth" in err


def test_skip_scales_is_the_teachers_sampler_stopped_early():
    """skip = 0 is `ar` draw for draw; skip = n draws K - n scales (nfe) and decodes their partial residual sum."""
    from methods.skip_scales import SkipScales, SkipScalesConfig
    from tests.fakes import tiny_var_teacher

    teacher = tiny_var_teacher()
    cond = teacher.conditions(3, torch.Generator().manual_seed(0))
    s = multiscale_vq.SamplingConfig(cfg=1.5, top_k=20)
    ar = multiscale_vq.sample_scales(teacher, cond, s, generator=torch.Generator().manual_seed(1))
    same = SkipScales(teacher, SkipScalesConfig(s, skip=0)).sample(cond, generator=torch.Generator().manual_seed(1))
    assert torch.equal(same.data, ar.data)
    out = SkipScales(teacher, SkipScalesConfig(s, skip=2)).sample(cond, generator=torch.Generator().manual_seed(1))
    assert torch.equal(out.data[:, :5], ar.data[:, :5]) and (out.data[:, 5:] == multiscale_vq.SKIPPED).all()
    assert out.counters["nfe"] == 3 * 2
    codes = list(out.data[:, :5].split([1, 4], dim=1))
    torch.testing.assert_close(teacher.decode(out.data), (teacher.vq.decode_codes(codes) + 1) / 2)
    from core.errors import UserError

    with pytest.raises(UserError, match="skip must be < the teacher's 4 scales"):
        SkipScales(teacher, SkipScalesConfig(s, skip=4))
