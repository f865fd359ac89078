"""DD pair generation (Alg. 1) and the paper's Table 1 baselines onestep* and skip-n (arXiv:2412.17153)."""
from collections import Counter

import pytest
import torch
from scipy.stats import chisquare

import methods.dd_pairs as dd_pairs
from core.cache import Cache
from core.errors import UserError
from methods.dd_pairs import PairConfig, generate_pairs, map_noise
from methods.onestep import OneStep, OneStepConfig
from methods.skip import Skip, SkipConfig
from methods.dd_token_flow import FlowConfig
from teachers.families import ar_token
from tests.fakes import NO_CHECKPOINTS, TableAR, make_config, tiny_gpt_teacher

SAMPLING = dict(top_k=6, cfg=2.0)  # a truncated, guided target exercises process() and both CFG branches
S = ar_token.SamplingConfig(**SAMPLING)


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    """tiny_gpt_teacher with onestep* fitted on 512 pairs, and the cache holding them."""
    cache = Cache(tmp_path_factory.mktemp("pairs"))
    teacher = tiny_gpt_teacher()
    method = OneStep(teacher, make_config(OneStepConfig, n_pairs=512, **SAMPLING))
    info = method.fit(cache=cache, checkpoints=NO_CHECKPOINTS)
    return teacher, method, cache, info


def test_pairs_follow_the_teacher_distribution(tmp_path):
    """Alg. 1 on the enumerable table model: the flow-mapped sequences are distributed as the teacher's samples."""
    teacher = TableAR(vocab=3, seq_len=4)
    s = ar_token.SamplingConfig(top_k=2, temperature=0.8, cfg=1.5)
    pairs = generate_pairs(teacher, s, PairConfig(n_pairs=4000, batch=1000), cache=Cache(tmp_path))
    exact = teacher.exact_distribution(s)
    counts = Counter(map(tuple, pairs.tokens.tolist()))
    assert sum(counts[k] for k, v in exact.items() if v == 0) == 0  # top-k cut codes never appear
    keys = [k for k, v in exact.items() if v > 0]
    z = sum(exact.values())
    assert chisquare([counts[k] for k in keys], [exact[k] / z * 4000 for k in keys]).pvalue > 1e-3


def test_pairs_are_a_function_of_the_noise(fitted):
    teacher, method, cache, _ = fitted
    assert generate_pairs(teacher, method.config.sampling, method.config.pairs, cache=cache).noise is None
    pairs = generate_pairs(teacher, method.config.sampling, method.config.pairs, cache=cache, noise=True)  # drawn again
    noise = pairs.noise.read("noise", torch.arange(512))
    assert pairs.info["cached"] and noise.shape == (512, teacher.seq_len, 4) and noise.dtype == torch.float32
    assert pairs.tokens.shape == (512, teacher.seq_len) and pairs.tokens.dtype == torch.long
    assert pairs.cond.shape == (512, 2) and pairs.info["n_pairs"] == 512
    batch = PairConfig().batch  # the first generation batch, remapped exactly as it was generated
    again = map_noise(teacher, noise[:batch], pairs.cond[:batch], S, FlowConfig())
    assert torch.equal(again, pairs.tokens[:batch])


def test_second_fit_reuses_the_cached_pairs(fitted, monkeypatch):
    teacher, method, cache, info = fitted
    assert info["pairs_cached"] == 0.0
    monkeypatch.setattr(dd_pairs, "_generate", lambda *a: pytest.fail("pairs regenerated"))
    again = OneStep(teacher, make_config(OneStepConfig, n_pairs=512, **SAMPLING))
    again = again.fit(cache=cache, checkpoints=NO_CHECKPOINTS)
    assert again["pairs_cached"] == 1.0
    skip = Skip(teacher, make_config(SkipConfig, n_pairs=512, skip=3, **SAMPLING))  # other knobs, same pairs
    assert skip.fit(cache=cache, checkpoints=NO_CHECKPOINTS)["pairs_cached"] == 1.0


def test_onestep_marginals_are_the_empirical_frequencies(fitted):
    teacher, method, cache, _ = fitted
    pairs = generate_pairs(teacher, method.config.sampling, method.config.pairs, cache=cache)
    cond = pairs.cond[:1]
    rows = (pairs.cond == cond).all(-1)
    freq = torch.nn.functional.one_hot(pairs.tokens[rows], teacher.vocab_size).double().mean(0)  # (n, V)
    torch.testing.assert_close(method.marginals.probs(cond)[0], freq)
    pooled = torch.nn.functional.one_hot(pairs.tokens, teacher.vocab_size).double().mean(0)
    torch.testing.assert_close(method.marginals.probs(torch.tensor([[99, 99]]))[0], pooled)  # an unseen condition

    out = method.sample(cond.expand(4000, -1), generator=torch.Generator().manual_seed(0))
    assert out.counters == Counter(nfe=4000, tokens=4000 * teacher.seq_len)
    seen = torch.nn.functional.one_hot(out.data, teacher.vocab_size).sum(0)  # (n, V)
    assert seen[freq == 0].sum() == 0
    pos = int((freq > 0).sum(-1).argmax())  # the most spread-out position (this fake is peaked)
    support = freq[pos] > 0
    assert support.sum() >= 3
    assert chisquare(seen[pos][support].tolist(), (4000 * freq[pos][support]).tolist()).pvalue > 1e-3


def test_skip_zero_is_the_teacher_sampler(fitted):
    teacher, _, cache, _ = fitted
    method = Skip(teacher, make_config(SkipConfig, n_pairs=512, skip=0, **SAMPLING))
    method.fit(cache=cache, checkpoints=NO_CHECKPOINTS)
    cond = teacher.conditions(8, torch.Generator().manual_seed(1))
    ar = ar_token.sample_ar(teacher, cond, S, generator=torch.Generator().manual_seed(2))
    out = method.sample(cond, generator=torch.Generator().manual_seed(2))
    assert torch.equal(out.data, ar.data) and out.counters == ar.counters


def test_skip_n_fills_the_tail_with_the_per_condition_modes(fitted):
    teacher, _, cache, _ = fitted
    N, n = teacher.seq_len, 5
    method = Skip(teacher, make_config(SkipConfig, n_pairs=512, skip=n, **SAMPLING))
    method.fit(cache=cache, checkpoints=NO_CHECKPOINTS)
    cond = teacher.conditions(8, torch.Generator().manual_seed(1))
    ar = ar_token.sample_ar(teacher, cond, S, generator=torch.Generator().manual_seed(2))
    out = method.sample(cond, generator=torch.Generator().manual_seed(2))
    assert torch.equal(out.data[:, : N - n], ar.data[:, : N - n])
    assert torch.equal(out.data[:, N - n :], method.marginals.probs(cond)[:, N - n :].argmax(-1))
    assert out.counters == Counter(nfe=8 * (N - n), tokens=8 * N)


def test_knob_validation():
    with pytest.raises(UserError, match="skip"):
        make_config(SkipConfig, skip=-1)
    with pytest.raises(UserError, match="n_pairs"):
        make_config(OneStepConfig, n_pairs=0)
    with pytest.raises(UserError, match="solver"):
        make_config(OneStepConfig, solver="rk4")
    with pytest.raises(UserError, match="top_k"):
        make_config(OneStepConfig, top_k=-1)  # the SamplingConfig checks still run
    with pytest.raises(UserError, match="greedy must be false"):
        make_config(OneStepConfig, greedy=True)
    with pytest.raises(UserError, match="skip"):
        Skip(TableAR(seq_len=4), make_config(SkipConfig, skip=4))
    with pytest.raises(RuntimeError, match="fit"):
        OneStep(TableAR(), OneStepConfig()).sample(torch.zeros(1, 1, dtype=torch.long), generator=None)
