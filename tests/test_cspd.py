"""CSpD (arXiv:2411.11925) on the continuous-AR and masked (MAR) fakes: losslessness of `exact`, the biases of `paper`
and `released`, counting, and the ragged KV cache the batched verifier relies on."""
import math

import pytest
import torch
from scipy import stats

from core.config import build_config
from core.errors import UserError
from methods.cspd import CSpD, CSpDConfig, MaskedCSpDConfig
from teachers.families import continuous_ar
from tests.fakes import LinearGaussianAR, LinearGaussianMasked, make_config, tiny_mar_teacher, tiny_masked_mar_teacher


def _run(teacher, n, seed=0, **knobs):
    """CSpD on either family (its config for the teacher's family)."""
    cond = teacher.conditions(n, torch.Generator().manual_seed(seed))
    method = CSpD(teacher, make_config(CSpD.config_class(teacher.family), **knobs))
    return method.sample(cond, generator=torch.Generator().manual_seed(seed + 1))


def _ar(teacher, n, seed=0, **sampling):
    """The family's own sampler: the target alone (`ar`, or MAR's on the masked family)."""
    cond = teacher.conditions(n, torch.Generator().manual_seed(seed))
    family = teacher.family
    return family.sample(teacher, cond, family.SamplingConfig(**sampling),
                         generator=torch.Generator().manual_seed(seed + 1))


@pytest.mark.parametrize("mode", ["exact", "paper", "released"])
@pytest.mark.parametrize("make", [lambda: LinearGaussianAR(seq_len=12, same=True),
                                  lambda: tiny_mar_teacher(same=True)], ids=["linear", "tiny-mar"])
@pytest.mark.parametrize("gamma", [1, 3])
def test_a_draft_equal_to_the_target_is_always_accepted_and_reproduces_ar(mode, make, gamma):
    teacher = make()
    knobs = dict(steps=4, cfg=2.0, final_noise=mode == "exact")
    out = _run(teacher, 6, gamma=gamma, mode=mode, **knobs)
    ref = _ar(teacher, 6, **knobs)
    # Same generator, noise drawn first: when every draft is accepted the output IS the target-alone sample (up to
    # float rounding: a multi-token pass sums in another order than one token at a time, the head's chain amplifies).
    assert torch.allclose(out.data, ref.data, atol=1e-3)
    c, N, B = out.counters, teacher.seq_len, 6
    assert c["drafts_accepted"] == c["drafts_verified"] > 0 and c["resampled"] == 0
    n_pre = math.floor(N * 0.05) + 1
    per_round = gamma if mode == "released" else gamma + 1  # + the bonus token
    assert c["nfe"] == B * (n_pre + math.ceil((N - n_pre) / per_round))
    assert c["tokens"] == B * N and ref.counters["nfe"] == B * N


def _lag1_corr(x):
    return float(torch.corrcoef(x[:, :2, 0].T)[0, 1])


def test_exact_mode_samples_the_target_law_and_the_other_modes_do_not():
    teacher = LinearGaussianAR(seq_len=3, draft_shift=0.25, draft_sigma=1.4)
    n = 20000
    ref = _ar(teacher, n, steps=6).data
    exact = _run(teacher, n, gamma=2, steps=6, mode="exact", seed=1)
    assert 0.2 < exact.counters["drafts_accepted"] / exact.counters["drafts_verified"] < 0.9  # a real test
    for pos in range(3):
        assert stats.ks_2samp(exact.data[:, pos, 0], ref[:, pos, 0]).pvalue > 1e-3
    assert abs(_lag1_corr(exact.data) - _lag1_corr(ref)) < 0.03  # the joint law too, not just marginals
    # The paper's Sigma with unequal step stds, and the released code's scheme, move the law (docs/methods/cspd.md).
    for mode in ("paper", "released"):
        biased = _run(teacher, n, gamma=2, steps=6, mode=mode, final_noise=True, seed=2).data
        worst = min(stats.ks_2samp(biased[:, pos, 0], ref[:, pos, 0]).pvalue for pos in range(3))
        assert worst < 1e-6, mode


def test_paper_sigma_is_exact_when_the_step_stds_agree():
    teacher = LinearGaussianAR(seq_len=3, draft_shift=0.25, draft_sigma=1.0)
    ref = _ar(teacher, 20000, steps=6).data
    out = _run(teacher, 20000, gamma=2, steps=6, mode="paper", seed=1).data
    assert min(stats.ks_2samp(out[:, p, 0], ref[:, p, 0]).pvalue for p in range(3)) > 1e-3


def test_prefill_tokens_come_from_the_target_and_are_not_counted_as_drafts():
    teacher = LinearGaussianAR(seq_len=12)
    out = _run(teacher, 5, prefill=0.5, gamma=2)  # floor(12 * 0.5) + 1 = 7 pre-filled tokens
    ref = _ar(teacher, 5)
    assert torch.allclose(out.data[:, :7], ref.data[:, :7])  # same noise, the target alone
    assert out.counters["drafts_verified"] <= 5 * 5
    everything = _run(teacher, 5, prefill=1.0)
    assert torch.allclose(everything.data, ref.data) and everything.counters["drafts"] == 0


def test_exhausted_residual_tries_are_counted_and_never_zero():
    # The released Sigma (prod sigma_p / sigma_q) of a much wider draft is tiny: alpha_s = 1 - q / (Sigma p) ~ 0.
    teacher = LinearGaussianAR(seq_len=6, draft_shift=0.0, draft_sigma=3.0)
    out = _run(teacher, 200, mode="released", max_tries=2, steps=4)
    assert out.counters["resample_exhausted"] > 0
    assert out.counters["resample_tries"] >= out.counters["resample_exhausted"]
    assert (out.data != 0).all()  # the released code would leave zero tokens here


def test_exact_mode_refuses_a_deterministic_last_step():
    with pytest.raises(UserError, match="final_noise"):
        build_config(CSpDConfig, {"mode": "exact", "final_noise": False}, owner="cspd")
    with pytest.raises(UserError, match="mode"):
        build_config(CSpDConfig, {"mode": "leviathan"}, owner="cspd")


def test_ragged_kv_cache_matches_teacher_forcing():
    teacher = tiny_mar_teacher()
    gpt = teacher.target.gpt
    B, N, D = 3, teacher.seq_len, teacher.token_dim
    cond = teacher.conditions(B, torch.Generator().manual_seed(0))
    tokens = torch.randn(B, N, D, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full = gpt(cond, tokens)  # (B, N, d): z of every position, teacher-forced
        cache = gpt.new_cache(B, ragged=True)
        gpt.prefill(cond, cache)
        gpt.extend(tokens[:, :2], cache)
        gpt.extend(tokens[:, 2:4] + 5.0, cache)  # wrong tokens: rolled back, yet left in the buffer
        cache.truncate(torch.tensor([1, 2, 1]))  # cond + 0, 1, 0 image tokens
        z = gpt.extend(torch.stack([tokens[0, :2], tokens[1, 1:3], tokens[2, :2]]), cache)  # ragged positions
    assert torch.allclose(z[0], full[0, 1:3], atol=1e-5)
    assert torch.allclose(z[1], full[1, 2:4], atol=1e-5)
    assert torch.allclose(z[2], full[2, 1:3], atol=1e-5)
    assert cache.length.tolist() == [3, 4, 3]


def test_the_released_modes_remaining_difference_is_named_for_the_run():
    teacher = LinearGaussianAR()
    assert CSpD(teacher, make_config(CSpDConfig, mode="exact")).caveats() == {}
    caveats = CSpD(teacher, make_config(CSpDConfig, mode="released")).caveats()
    assert "verified prefix only" in caveats["cspd_released_conditioning"]


# ---- the masked family (MAR: random order, bidirectional) -------------------------------------------------------
@pytest.mark.parametrize("mode", ["exact", "paper"])
@pytest.mark.parametrize("make", [lambda: LinearGaussianMasked(seq_len=12, same=True),
                                  lambda: tiny_masked_mar_teacher(same=True)], ids=["linear", "tiny-mar"])
@pytest.mark.parametrize("gamma", [1, 3])
def test_on_the_masked_family_a_draft_equal_to_the_target_is_always_accepted_and_reproduces_mar(mode, make, gamma):
    teacher = make()
    knobs = dict(steps=4, cfg=2.0)
    out = _run(teacher, 6, gamma=gamma, mode=mode, **knobs)
    ref = _ar(teacher, 6, **knobs)
    # The same order and noise: every draft accepted, the output IS MAR's (up to the rounding of a batched pass).
    assert torch.allclose(out.data, ref.data, atol=1e-3)
    c, N, B = out.counters, teacher.seq_len, 6
    assert c["drafts_accepted"] == c["drafts_verified"] > 0 and c["resampled"] == 0
    n_pre = math.floor(N * 0.05) + 1
    assert c["nfe"] == B * (n_pre + math.ceil((N - n_pre) / (gamma + 1)))
    sets, left = 0, N - n_pre  # a round's target pass: gamma + 1 known sets (the last also when no bonus fits)
    while left:
        g = min(gamma, left)
        sets, left = sets + g + 1, left - min(left, g + 1)
    assert c["target_rows"] == B * sets


def test_on_the_masked_family_exact_samples_mars_law_and_paper_and_released_do_not():
    """The target-alone sampler's law in a random order (marginals and the correlation between positions, which the
    mean-of-known conditioning makes exchangeable) is what `exact` draws; the paper's Sigma with unequal step stds and
    the released runner (prefix-only target, Sigma inverted, /42, no truncation) draw another."""
    teacher = LinearGaussianMasked(seq_len=3, draft_shift=0.25, draft_sigma=1.4)
    n = 20000
    ref = _ar(teacher, n, steps=6).data
    exact = _run(teacher, n, gamma=2, steps=6, mode="exact", seed=1)
    assert 0.2 < exact.counters["drafts_accepted"] / exact.counters["drafts_verified"] < 0.9  # a real test
    for pos in range(3):
        assert stats.ks_2samp(exact.data[:, pos, 0], ref[:, pos, 0]).pvalue > 1e-3
    assert abs(_lag1_corr(exact.data) - _lag1_corr(ref)) < 0.03
    for mode in ("paper", "released"):
        biased = _run(teacher, n, gamma=2, steps=6, mode=mode, seed=2).data
        worst = min(stats.ks_2samp(biased[:, pos, 0], ref[:, pos, 0]).pvalue for pos in range(3))
        assert worst < 1e-6, mode


def test_released_on_the_masked_family_advances_every_window_and_names_no_caveat():
    teacher = LinearGaussianMasked(seq_len=12)
    out = _run(teacher, 4, gamma=4, mode="released", prefill=0.1)  # pre-fill steps 0, 1; windows end 4, 8, 11
    assert out.counters["nfe"] == 4 * (2 + 3) and out.counters["drafts"] == out.counters["drafts_verified"] == 4 * 10
    assert CSpD(teacher, make_config(MaskedCSpDConfig, mode="released")).caveats() == {}


def test_exact_and_paper_on_the_masked_family_need_one_token_per_step():
    with pytest.raises(UserError, match="one token per step"):
        build_config(MaskedCSpDConfig, {"mode": "exact", "num_iter": 4}, owner="cspd")
    build_config(MaskedCSpDConfig, {"mode": "released", "num_iter": 4}, owner="cspd")  # MAR's multi-token steps
    out = _run(LinearGaussianMasked(seq_len=8), 3, mode="released", num_iter=4, gamma=2)
    assert out.data.shape == (3, 8, 1) and out.counters["drafts"] == 3 * (8 - 1)  # step 0 (one token) pre-filled


# ---- Table 4 (trajectory alignment) and Table 5 (pre-fill ratio) --------------------------------------------------
FAMILIES = {"causal": LinearGaussianAR, "masked": LinearGaussianMasked}


@pytest.mark.parametrize("family", FAMILIES)
def test_the_distance_counter_is_zero_aligned_and_twice_the_token_variance_without_alignment(family):
    """A draft equal to the target: aligned, its tokens are the target's (distance 0, all accepted); on its own noise
    x^q and x^p are i.i.d. given the same context, so E||x^q - x^p||^2 = 2 Var(x_0 | z), the head chain's variance."""
    teacher = FAMILIES[family](seq_len=12, same=True)
    knobs = dict(steps=4, gamma=3, mode="exact")
    aligned = _run(teacher, 2000, **knobs).counters
    assert aligned["drafts_accepted"] == aligned["drafts_verified"] > 0
    assert aligned["draft_target_sqdist"] < 1e-6 * aligned["drafts"]
    free = _run(teacher, 2000, align=False, **knobs).counters
    chain = teacher.target if family == "causal" else teacher.target.chain
    n, g = 50000, torch.Generator().manual_seed(7)
    x0 = chain.denoise(torch.zeros(n, 1, 1), torch.randn(n, 1, generator=g), torch.randn(n, 4, 1, generator=g),
                       continuous_ar.SamplingConfig(steps=4)).x0
    assert free["draft_target_sqdist"] / free["drafts"] == pytest.approx(2 * float(x0.var()), rel=0.05)
    assert free["drafts_accepted"] < 0.9 * free["drafts_verified"]


@pytest.mark.parametrize("family", FAMILIES)
def test_exact_mode_without_alignment_still_samples_the_target_law_and_accepts_less(family):
    """Sec. 3.2 / Table 4: alignment only raises acceptance; `exact` is lossless on independent noise too, the target
    keeping the reference arm's noise. The released scheme on the same runs must fail (the test has power)."""
    teacher = FAMILIES[family](seq_len=3, draft_shift=0.25, draft_sigma=1.4)
    n = 20000
    ref = _ar(teacher, n, steps=6).data
    aligned = _run(teacher, n, gamma=2, steps=6, mode="exact", seed=1).counters
    free = _run(teacher, n, gamma=2, steps=6, mode="exact", align=False, seed=1)
    for pos in range(3):
        assert stats.ks_2samp(free.data[:, pos, 0], ref[:, pos, 0]).pvalue > 1e-3
    assert abs(_lag1_corr(free.data) - _lag1_corr(ref)) < 0.03

    def alpha(c):
        return c["drafts_accepted"] / c["drafts_verified"]

    assert alpha(free.counters) < alpha(aligned)  # (a draft equal to the target: 1 against < 0.9, above)
    assert free.counters["draft_target_sqdist"] / free.counters["drafts"] > \
        1.2 * aligned["draft_target_sqdist"] / aligned["drafts"]
    biased = _run(teacher, n, gamma=2, steps=6, mode="released", align=False, seed=2).data
    assert min(stats.ks_2samp(biased[:, pos, 0], ref[:, pos, 0]).pvalue for pos in range(3)) < 1e-6


@pytest.mark.parametrize("family", FAMILIES)
def test_without_alignment_the_target_keeps_the_reference_arms_order_and_noise(family):
    """The draft's own noise is drawn after the target's noise (and MAR's order): an all-target run is the reference
    sample, aligned or not."""
    teacher = FAMILIES[family](seq_len=12)
    ref = _ar(teacher, 5).data
    for mode in ("exact", "released"):
        assert torch.allclose(_run(teacher, 5, prefill=1.0, align=False, mode=mode).data, ref)


@pytest.mark.parametrize("prefill", [0.0, 0.05, 0.15])
def test_table5_prefill_ratios_take_the_released_runners_target_steps(prefill):
    """Table 5's 0 / 5 / 15 %: the released runner generates step k with the target while `k <= num_iter * ratio`
    (spec_decode/spec_decode_runner.py:114,119), so even 0 % pre-fills step 0."""
    K, B = 40, 2
    out = _run(LinearGaussianMasked(seq_len=K), B, mode="released", prefill=prefill, gamma=4)
    n_pre = sum(k <= K * prefill for k in range(K))
    assert n_pre == {0.0: 1, 0.05: 3, 0.15: 7}[prefill]
    assert out.counters["drafts"] == out.counters["drafts_verified"] == B * (K - n_pre)
