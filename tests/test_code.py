"""CoDe (collaborative decoding, methods/code.py): the release's own sampler on its own files, the teacher refining
itself (its sampler draw for draw), the hand-over read as the refiner would read it scale by scale, the released
fine-tuned files loaded strictly, and their full-size key sets."""
import json
import shutil

import pytest
import torch
from mlflow.tracking import MlflowClient

from core.config import build_config
from core.errors import UserError
from methods.code import CoDe, CoDeConfig, tempered
from teachers.families import multiscale_vq
from teachers.families.ar_token import draw
from teachers.networks.var import VAR, VARConfig
from tests.fakes import FIXTURES, TinyCoDeDrafter, TinyCoDeRefiner
from tests.test_cli import run_cli

CPU = torch.device("cpu")
FIXTURE = FIXTURES / "code"
PARITY = torch.load(FIXTURE / "code_tiny_parity.pt", weights_only=True)


@pytest.fixture(scope="module")
def drafter():
    return TinyCoDeDrafter.load("tiny-code-drafter", cache=None, device=CPU)


@pytest.fixture(scope="module")
def refiner():
    return TinyCoDeRefiner.load("tiny-code-refiner", cache=None, device=CPU)


def code(teacher, cache, checkpoints=FIXTURE, **knobs) -> CoDe:
    method = CoDe(teacher, build_config(CoDeConfig, knobs, owner="code"))
    method.fit(cache=cache, checkpoints=checkpoints)
    return method


@pytest.mark.parametrize("n", [1, 2, 3])
def test_code_draws_what_the_release_draws(plugin, cache, drafter, n):
    """CoDe's own draft and refine functions (autoregressive_infer_cfg_draft / _refine) on its files, greedy under
    CFG 1.5 (tests/fixtures/code/MAKING.md): the same 30 tokens of 3 images, for every hand-over scale."""
    method = code(drafter, cache, draft_steps=n, refiner="tiny-code-refiner", cfg=PARITY["cfg"], top_k=1, top_p=0.0)
    out = method.sample(PARITY["labels"][:, None], generator=torch.Generator().manual_seed(0))
    assert torch.equal(out.data, PARITY["tokens"][n])
    assert out.counters["nfe"] == 3 * 4 and out.counters["refiner_nfe"] == 3 * (4 - n)


def test_the_teacher_refining_itself_is_its_own_sampler(cache, drafter):
    """Certified lossless at refiner = teacher: every draw equals the family sampler's, seed for seed."""
    s = multiscale_vq.SamplingConfig(cfg=1.5, top_k=20, top_p=0.9)
    cond = torch.tensor([[1], [4], [9], [0]])
    for n in (1, 2, 3):
        method = code(drafter, cache, draft_steps=n, cfg=1.5, top_k=20, top_p=0.9)
        got = method.sample(cond, generator=torch.Generator().manual_seed(3))
        want = multiscale_vq.sample_scales(drafter, cond, s, generator=torch.Generator().manual_seed(3))
        assert torch.equal(got.data, want.data)
    assert CoDe.lossless({"refiner": "", "released": "False", "sampler": "teacher"}).startswith("certified")
    assert CoDe.lossless({"refiner": "var-d16", "released": "False", "sampler": "teacher"}).startswith("lossy")


def handover(drafter, refiner, cond, n, s, generator, *, drafter_draws_n=False):
    """CoDe written out scale by scale: the drafter's first n scales, then the refiner reading each drafted scale
    through its KV cache (one pass per scale) before it draws the rest. `drafter_draws_n`: the broken variant whose
    drafter also draws scale n (an off-by-one hand-over)."""
    B, K = len(cond), len(drafter.patch_nums)
    mine, sizes = (n + 1 if drafter_draws_n else n), [p * p for p in drafter.patch_nums]
    drawn = multiscale_vq.sample_scales(drafter, cond, s, generator=generator, scales=mine).data
    tokens = list(drawn[:, :sum(sizes[:mine])].split(sizes[:mine], 1))
    state, logits = refiner.start(cond, cfg=True)
    for t in tokens:
        logits = refiner.next_scale(state, t)
    for si in range(mine, K):
        tokens.append(draw(multiscale_vq.process(multiscale_vq.guide(logits, B, s.cfg, si, K), s), generator))
        if si < K - 1:
            logits = refiner.next_scale(state, tokens[-1])
    return torch.cat(tokens, 1)


def test_the_refiner_reads_the_drafts_as_if_it_had_drawn_them(plugin, cache, drafter, refiner):
    """The one masked pass over the drafted scales is the refiner's own scale-by-scale reading of them: CoDe equals
    the hand-over written out, draw for draw; an off-by-one hand-over (the drafter also drawing scale n) does not."""
    s = multiscale_vq.SamplingConfig(cfg=1.5, top_k=0, top_p=0.0)
    cond = torch.tensor([[2], [5], [5], [8]])
    for n in (1, 2):
        method = code(drafter, cache, draft_steps=n, refiner="tiny-code-refiner", cfg=1.5, top_k=0, top_p=0.0)
        got = method.sample(cond, generator=torch.Generator().manual_seed(7)).data
        assert torch.equal(got, handover(drafter, refiner, cond, n, s, torch.Generator().manual_seed(7)))
        broken = handover(drafter, refiner, cond, n, s, torch.Generator().manual_seed(7), drafter_draws_n=True)
        assert not torch.equal(got, broken)


def test_released_files_are_read_strictly_into_both_models(plugin, cache, drafter, tmp_path):
    """`released`: drafter_N.pth and refiner_N.pth (VAR state dicts as the model zoo ships them) replace both
    transformers; here the teacher holds other weights, and the files bring back the release's draws."""
    shutil.copy(FIXTURE / "var_tiny.pth", tmp_path / "drafter_2.pth")
    shutil.copy(FIXTURE / "var_tiny_small.pth", tmp_path / "refiner_2.pth")
    for f in ("var_tiny.pth", "var_tiny_small.pth", "vae_tiny.pth"):
        shutil.copy(FIXTURE / f, tmp_path / f)
    other = TinyCoDeDrafter.random("other", CPU)
    other.vq = drafter.vq  # the same tokenizer, another transformer
    knobs = dict(draft_steps=2, refiner="tiny-code-refiner", released=True, cfg=PARITY["cfg"], top_k=1, top_p=0.0)
    assert set(CoDe.required_files(build_config(CoDeConfig, knobs, owner="code"), tmp_path)) == {
        tmp_path / "drafter_2.pth", tmp_path / "refiner_2.pth",  # the pair, and the refiner teacher's own files
        FIXTURE / "var_tiny_small.pth", FIXTURE / "vae_tiny.pth"}
    method = code(other, cache, tmp_path, **knobs)
    out = method.sample(PARITY["labels"][:, None], generator=torch.Generator().manual_seed(0))
    assert torch.equal(out.data, PARITY["tokens"][2])
    assert method.teacher.network is other.network  # the reference arm keeps the teacher's own weights
    shutil.copy(FIXTURE / "var_tiny.pth", tmp_path / "refiner_2.pth")  # the drafter's file where the refiner's goes
    with pytest.raises(UserError, match=r"refiner_2.pth: does not fit .*depth 1") as err:
        code(other, cache, tmp_path, **knobs)
    assert "\n" not in str(err.value)


def test_full_size_key_sets_are_the_released_ones():
    """CoDe's VAR class at d30 (drafter) and d16 (refiner), as build_vae_var_ctf builds them: the key sets and shapes
    of ours, built on the meta device, so drafter_N.pth and refiner_N.pth load strictly."""
    released = json.loads((FIXTURE / "code_keys.json").read_text())
    for depth in (16, 30):
        with torch.device("meta"):
            ours = {k: list(v.shape) for k, v in VAR(VARConfig(depth=depth)).state_dict().items()}
        assert ours == released[f"d{depth}"]


def test_settings_are_checked_in_one_line(drafter):
    with pytest.raises(UserError, match="draft_steps must be < the teacher's 4 scales, got 4"):
        CoDe(drafter, CoDeConfig(draft_steps=4))
    with pytest.raises(ValueError, match="sampler must be one of teacher, released"):
        CoDeConfig(sampler="fast")
    method, stranger = CoDe(drafter, CoDeConfig(draft_steps=2)), TinyCoDeRefiner.random("stranger", CPU)
    with pytest.raises(UserError, match="has another VQ codebook than the teacher"):
        method._checked(stranger)


def test_the_released_sampler_tempers_after_filtering():
    """sample_CoDe.py's temperature, written out as the release computes it (helpers.py:10-23: top-k, top-p, then
    logits / temp, softmax), against ours on the filtered probabilities; 7 of 10 scales hot, 3 of 4 here."""
    logits = torch.randn(2, 5, 40, generator=torch.Generator().manual_seed(0))
    s = multiscale_vq.SamplingConfig(cfg=0, top_k=12, top_p=0.8)
    kth = logits.topk(12, dim=-1)[0].amin(dim=-1, keepdim=True)
    ref = logits.masked_fill(logits < kth, -torch.inf)
    sorted_logits, sorted_idx = ref.sort(dim=-1, descending=False)
    remove = sorted_logits.softmax(dim=-1).cumsum(dim=-1) <= 1 - 0.8
    remove[..., -1:] = False
    ref = ref.masked_fill(remove.scatter(sorted_idx.ndim - 1, sorted_idx, remove), -torch.inf)
    want = (ref / 1.1).softmax(-1)
    torch.testing.assert_close(tempered(multiscale_vq.process(logits, s), 1.1), want)
    method = CoDe(TinyCoDeDrafter.random("t", CPU), CoDeConfig(draft_steps=1, sampler="released"))
    assert method.temperatures == [1.1, 1.1, 1.1, 1.0] and method.sampling.top_k == 600


def test_code_on_the_tiny_var_pair_from_the_cli(tiny_recipe, fresh_store, new_cache):
    """The field suite's setting: digits-var-c2i drafts, its small sibling (the same k-means codes) refines; one
    trial through the CLI logs CoDe's arms and counters beside the teacher's."""
    store = fresh_store
    assert run_cli(store, new_cache, "--teacher", "digits-var-c2i", "--method", "code", "--param", "draft_steps=2",
                   "--param", "refiner=digits-var-c2i-small", "--param", "top_k=0", "--param", "top_p=0",
                   "--metric", "fid", "--n-samples", "6", "--batch-size", "3") == 0
    client = MlflowClient(store)
    (run,) = client.search_runs([client.get_experiment_by_name("accelbench").experiment_id])
    m = run.data.metrics
    assert run.info.status == "FINISHED" and run.data.params["refiner"] == "digits-var-c2i-small"
    assert m["nfe_per_sample"] == m["ref/nfe_per_sample"] == 4 and m["refiner_nfe_per_sample"] == 2
    assert "fid.digits-cnn" in m and "ref/fid.digits-cnn" in m
