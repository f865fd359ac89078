"""MAR's encoder-decoder, DiffLoss head and KL-16 decoder (teachers/networks/mar.py, kl16.py) in the official names,
MAR's sampler and the released CSpD runner's verification, proved without the weights: golden parity fixtures made
with LTH14/mar and MarkXCloud/CSpD (tests/fixtures/mar/MAKING.md), the full-size key sets, and the loader on tiny files
from the CLI."""
import json
import math
from pathlib import Path

import pytest
import torch

from methods.cspd import CSpD, MaskedCSpDConfig
from methods.cspd_verify import acceptance_log_ratio, residual_keep
from teachers.families import masked_ar
from teachers.families.continuous_ar import TokenNoise
from teachers.networks.diffusion_head import HeadOutput, Schedule
from teachers.networks.kl16 import KL16Config, KL16Decoder, load_decoder_state
from teachers.networks.mar import MAR, official_to_ours
from tests.fakes import TinyOfficialMAR, tiny_official_mar_teacher

FIXTURES = Path(__file__).parent / "fixtures" / "mar"


@pytest.fixture(scope="module")
def fixture():
    return torch.load(FIXTURES / "mar_tiny_parity.pt", weights_only=True)


@pytest.fixture(scope="module")
def target(fixture):
    net = MAR(TinyOfficialMAR.config("mar_huge", 32, 2))
    net.load_state_dict(official_to_ours(fixture["target_state"]), strict=True)
    return masked_ar.NetworkModel(net)


def _noise(record) -> TokenNoise:
    """The official per-step noise is indexed by the respaced step, the noisiest (K-1) first; ours by the step taken."""
    return TokenNoise(record["noise"], record["inter_noise"].flip(2))


def _close(ours, theirs, rel=2e-2):
    """Relative closeness. The fixture's random heads make tokens of ~1e4 (x_0 at t = 999 amplifies eps by 2e4); a
    z that agrees with float64 to 1e-7 gives tokens up to 7e-3 apart, relative (measured: 5e-4 on an AMD EPYC, 7.0e-3
    on an Intel Xeon, whose BLAS rounds float32 otherwise), while a wrong known set, order or noise index moves them
    by O(1) relative."""
    return bool(((ours - theirs).abs() <= rel * (1 + theirs.abs())).all())


def test_encoder_decoder_and_head_are_the_official_ones(fixture, target):
    e, h = fixture["enc_dec"], fixture["head"]
    known, cond = e["mask"] == 0, e["labels"][:, None]
    z = target.condition(e["tokens"], known, cond, guided=True)  # (3, 16, 2, 32): MAR's CFG batch, halves stacked
    assert (z.transpose(1, 2).flatten(0, 1) - e["z"].unflatten(0, (2, 3)).transpose(0, 1).flatten(0, 1)).abs().max() \
        <= 1e-5
    assert (target.condition(e["tokens"], known, cond, guided=False)[:, :, 0] - e["z_uncfg"]).abs().max() <= 1e-5
    with torch.no_grad():
        eps, v = target.network.head(h["x"], h["t"], h["c"])
    # 1.8e-5 on values up to 6 on an Intel Xeon's BLAS (float32 rounding of the head's MLP), 1e-5 on an AMD EPYC
    assert (torch.cat([eps, v], -1) - h["out"]).abs().max() <= 5e-5


def test_rows_with_different_known_sets_in_one_batch_are_each_the_official_computation(fixture, target):
    """The encoder pads rows to the longest known set (CSpD's batched verification): each row as if alone."""
    e = fixture["enc_dec"]
    known = e["mask"] == 0
    known[1, :4] = True  # rows now know 6, 9 and 6 tokens
    cond = e["labels"][:, None]
    together = target.condition(e["tokens"], known, cond, guided=True)
    for b in range(3):
        alone = target.condition(e["tokens"][b : b + 1], known[b : b + 1], cond[b : b + 1], guided=True)
        assert (together[b] - alone[0]).abs().max() <= 1e-5


@pytest.mark.parametrize("steps", ["10", "100"])
def test_the_respaced_cosine_schedule_is_the_official_one(fixture, steps):
    official, ours = fixture["schedule"][steps], Schedule(int(steps))
    assert ours.timesteps.tolist() == list(official["timestep_map"])
    assert torch.allclose(ours.alpha_bar.double(), official["alphas_cumprod"], rtol=1e-6)
    assert torch.allclose(ours.log_post_var.double(), official["posterior_log_variance_clipped"], rtol=1e-5)


def test_the_sampler_is_mars_sample_tokens(fixture, target):
    """Five steps of 16 tokens (mask lengths 15, 12, 9, 4, 1), CFG 2 on the linear schedule, temperature 0.9, no noise
    on the last step: the tokens of the official loop on the same orders and noise."""
    f = fixture["sample"]
    order = masked_ar.GenerationOrder.of(f["orders"], f["num_iter"])
    assert order.mask_len == [s["mask_len"] for s in f["steps"]] == [15, 12, 9, 4, 1]
    s = masked_ar.SamplingConfig(num_iter=f["num_iter"], steps=10, cfg=f["cfg"], temperature=f["temperature"],
                                 final_noise=False)
    assert math.isclose(float(order.cfg_scales(s)[0]), f["cfg_iter_step0"])
    assert torch.equal(order.step == 0, f["index_to_pred_step0"])
    tokens = masked_ar.generate(target, f["labels"][:, None], s, _noise(f), order)
    assert _close(tokens, f["tokens"])


def test_released_cspd_verifies_the_windows_of_the_released_runner(fixture):
    """The released `SpecDecodeRunner` (16 steps, gamma 4, pre-fill 0.1, CFG 2 linear) verifies after steps 4, 8, 12
    and 15, each time conditioning the target on the 2, 5, 9, 13 tokens verified before the window, the drafts masked,
    at the window's last step's CFG scale. Ours, on the loader of the same files, does exactly that, and given the
    runner's tokens and noise its target gives the runner's target distributions (last-step mean and std, and the
    sum of the earlier steps' log stds that Sigma reads)."""
    spec = fixture["spec"]
    teacher = tiny_official_mar_teacher()
    calls = []

    class Recording:
        def __init__(self, model):
            self.model = model

        def condition(self, tokens, known, cond, *, guided):
            calls.append({"known": known.clone()})
            return self.model.condition(tokens, known, cond, guided=guided)

        def denoise(self, z, x_T, eps, sampling, cfg):
            calls[-1]["cfg"] = cfg
            return self.model.denoise(z, x_T, eps, sampling, cfg)

    model, teacher.target = teacher.target, None
    teacher.target = Recording(model)
    s = masked_ar.SamplingConfig(steps=10, cfg=spec["cfg"], final_noise=False)
    config = MaskedCSpDConfig(sampling=s, gamma=spec["num_draft"], prefill=spec["ratio"], mode="released")
    out = CSpD(teacher, config).sample(spec["labels"][:, None], generator=torch.Generator().manual_seed(0))
    assert out.data.isfinite().all()
    prefill, verify = calls[: len(spec["prefill_steps"])], calls[len(spec["prefill_steps"]):]
    assert [int(c["known"].sum(1)[0]) for c in prefill] == [0, 1]
    assert [int(c["known"].sum(1)[0]) for c in verify] == [int((v["mask_target"][0] == 0).sum())
                                                          for v in spec["verify"]]
    assert [c["cfg"] for c in verify] == pytest.approx([v["cfg_iter"] for v in spec["verify"]])
    assert out.counters["drafts"] == 3 * (16 - 2)

    noise = _noise(spec)
    for v in spec["verify"]:
        z = model.condition(v["tokens_in"], v["mask_target"] == 0, spec["labels"][:, None], guided=True)
        rows, pos = v["index_to_pred"].nonzero(as_tuple=True)
        p = model.denoise(z[rows, pos], *noise.at(rows, pos), s, v["cfg_iter"])
        assert _close(p.mean, v["target_mean"])
        assert _close(p.log_std.exp(), v["target_variance"])  # the runner's "variance" holds the last step's std
        assert _close(p.log_std_sum, v["target_log_var"].sum(-1))  # its "log_var" the earlier steps' log stds


def test_the_acceptance_and_residual_tests_are_the_released_codes(fixture):
    """`DistributionProcessor.judge_accept` (Sigma inverted, the exponent over inner_temperature^2) and the residual
    sampler's acceptance ratio on the same Gaussians (x1 the draft's, x2 the target's)."""
    f = fixture["processor"]
    q = HeadOutput(f["x"], f["x1_mean"], f["x1_std"].log(), f["x1_log_var"].sum(-1))
    p = HeadOutput(f["x"], f["x2_mean"], f["x2_std"].log(), f["x2_log_var"].sum(-1))
    for section in ("T42", "T1"):
        t = f[section]
        log_r = acceptance_log_ratio(f["x"], p, q, "released", t["temperature"])
        assert _close(log_r.exp(), t["judge_accept"], rel=1e-4)
        from methods.cspd_verify import log_density, log_sigma

        keep = residual_keep(log_density(f["x"], p.mean, p.log_std), log_density(f["x"], q.mean, q.log_std),
                             log_sigma(p, q, "released"))
        assert _close(keep, t["residual_ratio"], rel=1e-4)


def test_the_kl16_decoder_is_the_official_one():
    f = torch.load(FIXTURES / "kl16_tiny_parity.pt", weights_only=True)
    vae = load_decoder_state(KL16Decoder(KL16Config(embed_dim=4, ch=32, ch_mult=(1, 2))), f["state"])
    with torch.no_grad():
        assert (vae.decode(f["z"]) - f["out"]).abs().max() <= 1e-5


@pytest.mark.parametrize("model", ["mar_base", "mar_large", "mar_huge"])
def test_full_size_key_sets_equal_the_official_ones(model):
    from teachers.pretrained.mar import MARH

    official = json.loads((FIXTURES / "mar_keys.json").read_text())
    kw = official[model]["kwargs"]
    with torch.device("meta"):
        ours = {k: list(v.shape) for k, v in MAR(MARH.config(model, kw["diffloss_w"], kw["diffloss_d"])).state_dict()
                .items()}
        vae = {k: list(v.shape) for k, v in KL16Decoder(KL16Config()).state_dict().items()}
    theirs = {k: list(v) for k, v in official_to_ours(official[model]["keys"]).items()}
    assert ours == theirs and sum(math.prod(s) for s in ours.values()) == official[model]["num_values"]
    assert vae == {k: s for k, s in official["kl16_vae"]["keys"].items()
                   if not k.startswith(("encoder.", "quant_conv."))}


@pytest.mark.usefixtures("fresh_store")  # a copy of the migrated store at tmp_path/mlflow.db
def test_the_mar_loader_runs_mar_and_cspd_from_the_cli(plugin, tmp_path, capsys):
    """`tiny-mar-official` (tests/plugins.py: the loader on tiny files in the official format) by `mar` and by `cspd` in
    its three modes into MLflow and a report; the missing files of `mar-h` are one line."""
    from mlflow.tracking import MlflowClient

    import cli

    store = f"sqlite:///{tmp_path}/mlflow.db"
    args = ["run", "--teacher", "tiny-mar-official", "--method", "mar", "--n-samples", "2", "--batch-size", "2",
            "--tracking-uri", store, "--cache-dir", str(tmp_path / "cache"), "--experiment", "mar", "--warmup", "0",
            "--no-progress", "--param", "cfg=2.0", "--param", "steps=4"]
    assert cli.main(args) == 0
    for mode in ("exact", "paper", "released"):
        assert cli.main([*args[:4], "cspd", *args[5:], "--param", f"mode={mode}", "--param", "gamma=3"]) == 0
    client = MlflowClient(store)
    runs = client.search_runs([client.get_experiment_by_name("mar").experiment_id])
    assert {r.data.tags["family"] for r in runs} == {"masked-ar"} and len(runs) == 4
    assert {r.data.params.get("mode", "-") for r in runs} == {"-", "exact", "paper", "released"}
    assert cli.main(["report", "--tracking-uri", store, "--experiment", "mar", "--out", str(tmp_path / "r")]) == 0
    assert "## tiny-mar-official" in (tmp_path / "r" / "REPORT.md").read_text()
    capsys.readouterr()
    assert cli.main(["run", "--teacher", "mar-h", "--method", "mar", "--checkpoints", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and f"missing {tmp_path}/mar/mar_huge/checkpoint-last.pth and" in err
