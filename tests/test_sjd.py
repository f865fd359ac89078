"""SJD / Jacobi correctness (SJD, arXiv:2410.01699): exactness against an enumerable model, equivalences, KV rollback."""
import math
from collections import Counter

import pytest
import torch
from scipy.stats import chisquare

import methods.sjd as sjd
from methods.sjd import SJDConfig, exact_match_rule, jacobi_decode, speculative_rule
from teachers import discrete_ar
from tests.fakes import TableAR, tiny_gpt_teacher

ALPHA = 1e-3  # significance of every chi-square test below
N_DRAWS = 4000
COND = torch.zeros(1, 1, dtype=torch.long)


def chi_square_p(teacher, config, rule, n=N_DRAWS, seed=0, greedy=False):
    exact = teacher.exact_distribution(config)
    g = torch.Generator().manual_seed(seed)
    counts = Counter(tuple(jacobi_decode(teacher, COND, config, g, rule, greedy)[0].tolist()) for _ in range(n))
    impossible = [k for k, v in exact.items() if v == 0.0]  # cut by top-k: must never be sampled
    assert sum(counts[k] for k in impossible) == 0
    keys = sorted(k for k, v in exact.items() if v > 0)
    z = sum(exact.values())
    expected = [exact[k] / z * n for k in keys]
    return chisquare([counts[k] for k in keys], expected).pvalue


@pytest.mark.parametrize("config", [
    SJDConfig(window=3, init="random"),
    SJDConfig(window=4, init="repeat-left"),
    SJDConfig(window=2, init="sample-above"),
    SJDConfig(window=3, init="repeat-above", top_k=2, temperature=0.8, cfg=2.0),
    SJDConfig(window=4, init="sample-left", refine=False),
])
def test_sjd_matches_the_exact_distribution(config):
    assert chi_square_p(TableAR(vocab=3, seq_len=4), config, speculative_rule) > ALPHA


def test_sampling_jacobi_matches_the_exact_distribution():
    assert chi_square_p(TableAR(vocab=3, seq_len=4), SJDConfig(window=3), exact_match_rule) > ALPHA


def test_resampling_from_p_instead_of_the_residual_is_detected(monkeypatch):
    # With uniform random drafts, resampling from p happens to be exact too (the draft is independent of p);
    # drafts that depend on the context (repeat-left) expose the bug.
    monkeypatch.setattr(sjd, "residual", lambda p, q: p)
    config = SJDConfig(window=3, init="repeat-left")
    assert chi_square_p(TableAR(vocab=3, seq_len=4), config, speculative_rule) < ALPHA


def test_acceptance_probability_and_residual_reconstruct_p():
    g = torch.Generator().manual_seed(1)
    for _ in range(20):
        p, q = torch.rand(7, generator=g).softmax(0), torch.rand(7, generator=g).softmax(0)
        accept = torch.minimum(p, q)  # q(x) * min(1, p(x)/q(x))
        r = sjd.residual(p, q)
        rebuilt = accept + (1 - accept.sum()) * r / r.sum()
        torch.testing.assert_close(rebuilt, p, atol=1e-6, rtol=0)


def test_window_one_is_autoregressive_decoding():
    for teacher in (TableAR(vocab=5, seq_len=6), tiny_gpt_teacher()):
        s = discrete_ar.SamplingConfig(top_k=3, cfg=1.5)
        cond = torch.full((1, teacher.cond_table.shape[-1] if hasattr(teacher, "cond_table") else 1), 3)
        ar = discrete_ar.sample_ar(teacher, cond, s, generator=torch.Generator().manual_seed(7))
        tokens, counts = jacobi_decode(teacher, cond, SJDConfig(window=1, top_k=3, cfg=1.5),
                                       torch.Generator().manual_seed(7), speculative_rule)
        assert tokens.tolist() == ar.data[0].tolist()
        assert counts["nfe"] == teacher.seq_len


def test_greedy_jacobi_is_greedy_ar_token_for_token():
    teacher = tiny_gpt_teacher()
    cond = torch.full((1, 2), 4)
    s = discrete_ar.SamplingConfig(cfg=2.0)
    greedy = discrete_ar.sample_ar(teacher, cond, s, generator=None, greedy=True).data[0]
    for window in (2, 5, 12):
        tokens, counts = jacobi_decode(teacher, cond, SJDConfig(window=window, cfg=2.0),
                                       torch.Generator().manual_seed(0), exact_match_rule, greedy=True)
        assert tokens.tolist() == greedy.tolist()
        assert counts["nfe"] <= teacher.seq_len


@pytest.mark.parametrize("window", [2, 4, 8])
def test_steps_are_bounded_by_the_window(window):
    teacher = TableAR(vocab=4, seq_len=9, grid=(3, 3))
    g = torch.Generator().manual_seed(3)
    for _ in range(50):
        _, counts = jacobi_decode(teacher, COND, SJDConfig(window=window), g, speculative_rule)
        assert 1 + math.ceil((teacher.seq_len - 1) / window) <= counts["nfe"] <= teacher.seq_len
        assert counts["drafts_accepted"] <= counts["drafts_verified"]


def test_kv_cache_rollback_equals_full_recompute():
    teacher = tiny_gpt_teacher()
    model, cfg_scale = teacher.model, 2.5
    cond = torch.tensor([[5, 5]])
    g = torch.Generator().manual_seed(0)
    state, _ = teacher.start(cond, cfg=cfg_scale)
    committed = []
    while len(committed) < teacher.seq_len - 1:
        window = torch.randint(1, 6, (1,), generator=g).item()
        window = min(window, teacher.seq_len - len(committed))
        tokens = torch.randint(teacher.vocab_size, (1, window), generator=g)
        cached = teacher.extend(state, tokens)  # (1, L, V)
        full_tokens = torch.tensor([committed + tokens[0].tolist() + [0]])
        with torch.no_grad():
            both = model(torch.cat([cond, torch.zeros_like(cond)]), full_tokens.expand(2, -1))
        recompute = both[1:] + cfg_scale * (both[:1] - both[1:])  # CFG-combined, as the teacher does
        torch.testing.assert_close(cached[0], recompute[0, len(committed) + 1 : len(committed) + 1 + window],
                                   atol=1e-4, rtol=1e-4)
        keep = torch.randint(1, window + 1, (1,), generator=g).item()  # accept a random prefix of the window
        committed += tokens[0, :keep].tolist()
        teacher.rollback(state, len(committed))
        assert state.length == len(committed)


def test_fixed_seed_is_deterministic():
    teacher = tiny_gpt_teacher()
    cond = torch.full((1, 2), 6)
    runs = [jacobi_decode(teacher, cond, SJDConfig(window=5, init="sample-left"), torch.Generator().manual_seed(11),
                          speculative_rule) for _ in range(2)]
    assert runs[0][0].tolist() == runs[1][0].tolist()
    assert runs[0][1] == runs[1][1]


def test_sjd_through_the_transformer_kv_cache_matches_its_exact_distribution():
    """The same chi-square test through the real model path: KV cache, rollback and both CFG branches."""
    import itertools

    teacher = tiny_gpt_teacher(vocab=4, grid=(2, 2))
    config = SJDConfig(window=3, init="repeat-left", cfg=1.5, temperature=1.2)
    cond = torch.tensor([[7, 7]])
    seqs = torch.tensor(list(itertools.product(range(4), repeat=4)))  # all 256 sequences
    with torch.no_grad():
        c = teacher.model(cond.expand(len(seqs), -1), seqs)
        u = teacher.model(torch.zeros_like(cond).expand(len(seqs), -1), seqs)
    probs = discrete_ar.process(u + config.cfg * (c - u), config)  # (256, 4, V)
    exact = probs.gather(2, seqs[..., None]).squeeze(2).double().prod(1)
    g = torch.Generator().manual_seed(0)
    counts = Counter(tuple(jacobi_decode(teacher, cond, config, g, speculative_rule)[0].tolist())
                     for _ in range(N_DRAWS))
    observed = [counts[tuple(s.tolist())] for s in seqs]
    expected = (exact / exact.sum() * N_DRAWS).tolist()
    assert chisquare(observed, expected).pvalue > ALPHA
