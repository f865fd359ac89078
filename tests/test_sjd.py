"""SJD / Jacobi correctness (SJD, arXiv:2410.01699): exactness against enumerable models, on image tokens and on
text (our GPT's KV cache and a Hugging Face Llama's `DynamicCache`, both rolled back), equivalences, KV rollback; and
batches of four (per-row exactness, a row-mixing rule detected, greedy rows and counters as at batch size 1, the
ragged cache)."""
import itertools
import math
from collections import Counter

import pytest
import torch
from scipy.stats import chisquare

import methods.sjd as sjd
import methods.verify
from core.config import build_config
from methods.jacobi import JacobiConfig
from methods.sjd import SJDConfig, exact_match_rule, jacobi_decode, speculative_rule
from teachers.families import ar_token
from tests.fakes import TableAR, tiny_gpt_teacher, tiny_hf_lm_teacher, tiny_text_gpt_teacher

ALPHA = 1e-3  # significance of every chi-square test below
# Draws per chi-square test at batch size 1. With rare sequences pooled (`POOL`), 1000 draws still reject deliberate
# bugs by far (measured): resampling from p instead of the residual at p = 2e-43 on the table model, 2e-17 through the
# image GPT's KV cache, 7e-64 through the text GPT's, 4e-35 through the Llama's DynamicCache; a uniform draft law with
# a subset vocabulary at p = 2e-64; the Llama's stale rollback draws a sequence of probability 0 at its first decode.
# The exact samplers pass at p >= 0.09.
N_DRAWS = 1000
POOL = 5  # sequences expected fewer times than this share one chi-square cell (`pooled`)
COND = torch.zeros(1, 1, dtype=torch.long)


def sjd_config(**knobs) -> SJDConfig:
    return build_config(SJDConfig, knobs, owner="sjd")


def pooled(law: dict, counts: Counter, n: int, below: float = POOL) -> tuple[list[int], list[float]]:
    """Observed and expected counts of n draws over the sequences of positive probability in `law` (sequence ->
    probability, normalised here), those expected fewer than `below` times pooled into one cell with the next rarest
    until it is expected `below` times, so that the chi-square approximation holds at a few draws per sequence:
    unpooled, a rare sequence drawn once dominates the statistic (1000 draws of the table model's exact Jacobi
    decoding gave p = 1e-6; pooled, 0.26)."""
    z, observed, expected, pool_o, pool_e = sum(law.values()), [], [], 0, 0.0
    for e, o in sorted((p / z * n, counts[k]) for k, p in law.items() if p > 0):
        if e < below or pool_e < below:
            pool_o, pool_e = pool_o + o, pool_e + e
        else:
            observed.append(o)
            expected.append(e)
    if pool_e:
        observed.append(pool_o)
        expected.append(pool_e)
    return observed, expected


def chi_square_p(exact: dict, draw_one, n=N_DRAWS, pool_below: float = 0) -> float:
    """p-value of n draws of `draw_one()` (a token tuple) against the exact law `exact` (tuple -> probability), the
    sequences expected fewer than `pool_below` times pooled (`pooled`; 0, none, is the statistic that
    tests/test_real_llamagen_t2i.py was sized with); 0 as soon as a sequence of probability 0 (cut by top-k or top-p,
    or absent from `exact`) is drawn."""
    counts = Counter()
    for _ in range(n):
        seq = draw_one()
        if exact.get(seq, 0.0) == 0.0:
            return 0.0
        counts[seq] += 1
    return chisquare(*pooled(exact, counts, n, pool_below)).pvalue


def table_p(config, rule, teacher=None, seed=0):
    teacher = teacher or TableAR(vocab=3, seq_len=4)
    g = torch.Generator().manual_seed(seed)
    return chi_square_p(teacher.exact_distribution(config.sampling),
                        lambda: tuple(jacobi_decode(teacher, COND, config, g, rule)[0][0].tolist()), pool_below=POOL)


@pytest.mark.parametrize("knobs", [
    {"window": 3, "init": "random"},
    {"window": 4, "init": "repeat-left"},
    {"window": 2, "init": "sample-above"},
    {"window": 3, "init": "repeat-above", "top_k": 2, "temperature": 0.8, "cfg": 2.0},
    {"window": 4, "init": "sample-left", "refine": False},
    {"window": 3, "init": "repeat-left", "top_p": 0.7},
    {"window": 4, "init": "top1-left"},
    {"window": 3, "init": "top1-above", "top_k": 2},
])
def test_sjd_matches_the_exact_distribution(knobs):
    assert table_p(sjd_config(**knobs), speculative_rule) > ALPHA


def subset_teacher(vocab=3, draft=(0, 2)):
    """A table model whose random drafts come from a strict subset of its vocabulary (`draft_tokens`), as an image
    model's from its image tokens."""
    teacher = TableAR(vocab=vocab, seq_len=4)
    teacher.draft_tokens = torch.tensor(draft)
    return teacher


@pytest.mark.parametrize("knobs", [{"window": 3}, {"window": 4, "top_k": 2, "cfg": 2.0}])
def test_sjd_with_a_strict_subset_draft_vocabulary_matches_the_exact_distribution(knobs):
    assert table_p(sjd_config(init="random", **knobs), speculative_rule, subset_teacher()) > ALPHA


def test_a_draft_distribution_uniform_over_the_vocabulary_is_detected_with_a_subset(monkeypatch):
    """The broken variant for a draft vocabulary: fresh drafts verified against the uniform law over every id (the
    law of whole-vocabulary draws) instead of their one-hot. That law is the true proposal of whole-vocabulary drafts,
    so they stay exact; drawn from a strict subset they do not, and the same test must fail."""
    fill = sjd._Drafter.fill

    def uniform_q(self, start, stop, seq, dists):
        fill(self, start, stop, seq, dists)
        for m in range(len(seq)):
            dists[m, int(start[m]) : int(stop[m])] = 1 / self.vocab

    monkeypatch.setattr(sjd._Drafter, "fill", uniform_q)
    assert table_p(sjd_config(window=3, init="random"), speculative_rule) > ALPHA
    assert table_p(sjd_config(window=3, init="random"), speculative_rule, subset_teacher()) < ALPHA


def test_random_drafts_come_from_the_declared_tokens_only(monkeypatch):
    teacher = subset_teacher(vocab=5, draft=(1, 3))
    seen = Counter()
    fill = sjd._Drafter.fill

    def spy(self, start, stop, seq, dists):
        fill(self, start, stop, seq, dists)
        for m in range(len(seq)):
            seen.update(seq[m, int(start[m]) : int(stop[m])].tolist())

    monkeypatch.setattr(sjd._Drafter, "fill", spy)
    g = torch.Generator().manual_seed(0)
    for _ in range(50):
        jacobi_decode(teacher, COND, sjd_config(window=4, init="random"), g, speculative_rule)
    assert set(seen) == {1, 3}
    for bad in ((), (0, 5)):
        with pytest.raises(ValueError, match="non-empty 1-D set of ids in"):
            ar_token.draft_vocabulary(subset_teacher(vocab=5, draft=bad))


def test_sampling_jacobi_matches_the_exact_distribution():
    assert table_p(sjd_config(window=3), exact_match_rule) > ALPHA


def test_resampling_from_p_instead_of_the_residual_is_detected(monkeypatch):
    # With uniform random drafts, resampling from p happens to be exact too (the draft is independent of p);
    # drafts that depend on the context (repeat-left) expose the bug.
    monkeypatch.setattr(methods.verify, "residual", lambda p, q: p)
    assert table_p(sjd_config(window=3, init="repeat-left"), speculative_rule) < ALPHA


def test_acceptance_probability_and_residual_reconstruct_p():
    g = torch.Generator().manual_seed(1)
    for _ in range(20):
        p, q = torch.rand(7, generator=g).softmax(0), torch.rand(7, generator=g).softmax(0)
        accept = torch.minimum(p, q)  # q(x) * min(1, p(x)/q(x))
        r = methods.verify.residual(p, q)
        rebuilt = accept + (1 - accept.sum()) * r / r.sum()
        torch.testing.assert_close(rebuilt, p, atol=1e-6, rtol=0)


def test_window_one_is_autoregressive_decoding():
    for teacher in (TableAR(vocab=5, seq_len=6), tiny_gpt_teacher()):
        s = ar_token.SamplingConfig(top_k=3, cfg=1.5)
        cond = torch.full((1, teacher.cond_table.shape[-1] if hasattr(teacher, "cond_table") else 1), 3)
        ar = ar_token.sample_ar(teacher, cond, s, generator=torch.Generator().manual_seed(7))
        tokens, counts = jacobi_decode(teacher, cond, SJDConfig(s, window=1), torch.Generator().manual_seed(7),
                                       speculative_rule)
        assert tokens.tolist() == ar.data.tolist()
        assert counts["nfe"] == teacher.seq_len


def test_greedy_jacobi_is_greedy_ar_token_for_token():
    teacher = tiny_gpt_teacher()
    cond = torch.full((1, 2), 4)
    s = ar_token.SamplingConfig(cfg=2.0, greedy=True)
    greedy = ar_token.sample_ar(teacher, cond, s, generator=None).data[0]
    for window in (2, 5, 12):
        tokens, counts = jacobi_decode(teacher, cond, JacobiConfig(s, window=window),
                                       torch.Generator().manual_seed(0), exact_match_rule)
        assert tokens[0].tolist() == greedy.tolist()
        assert counts["nfe"] <= teacher.seq_len


def test_sjd_refuses_greedy_and_one_dimensional_above_init():
    from core.errors import UserError
    from methods.sjd import SJD

    with pytest.raises(UserError, match="greedy must be false"):
        sjd_config(greedy=True)
    with pytest.raises(UserError, match="1-D grid"):
        SJD(tiny_text_gpt_teacher(), sjd_config(init="repeat-above"))


@pytest.mark.parametrize("window", [2, 4, 8])
def test_steps_are_bounded_by_the_window(window):
    teacher = TableAR(vocab=4, seq_len=9, grid=(3, 3))
    g = torch.Generator().manual_seed(3)
    for _ in range(50):
        _, counts = jacobi_decode(teacher, COND, sjd_config(window=window), g, speculative_rule)
        assert 1 + math.ceil((teacher.seq_len - 1) / window) <= counts["nfe"] <= teacher.seq_len
        assert counts["drafts_accepted"] <= counts["drafts_verified"]


def test_kv_cache_rollback_equals_full_recompute():
    teacher = tiny_gpt_teacher()
    model, cfg_scale = teacher.network, 2.5
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
    runs = [jacobi_decode(teacher, cond, sjd_config(window=5, init="sample-left"), torch.Generator().manual_seed(11),
                          speculative_rule) for _ in range(2)]
    assert runs[0][0].tolist() == runs[1][0].tolist()
    assert runs[0][1] == runs[1][1]


def exact_law(teacher, cond: torch.Tensor, s: ar_token.SamplingConfig) -> dict[tuple, float]:
    """The probability of every sequence under the teacher, computed in one teacher-forced pass per sequence batch
    (`start` + a single `extend` of the whole sequence: no window, no rollback)."""
    seqs = torch.tensor(list(itertools.product(range(teacher.vocab_size), repeat=teacher.seq_len)))  # (M, N)
    state, first = teacher.start(cond.expand(len(seqs), -1), cfg=s.cfg)
    logits = torch.cat([first[:, None], teacher.extend(state, seqs[:, :-1])], 1)  # (M, N, V)
    probs = ar_token.process(logits, s).gather(2, seqs[..., None]).squeeze(2).double().prod(1)
    return {tuple(q.tolist()): p for q, p in zip(seqs, probs.tolist())}


def model_p(teacher, cond, config, rule=speculative_rule, seed=0) -> float:
    g = torch.Generator().manual_seed(seed)
    return chi_square_p(exact_law(teacher, cond, config.sampling),
                        lambda: tuple(jacobi_decode(teacher, cond, config, g, rule)[0][0].tolist()), pool_below=POOL)


def test_sjd_through_the_transformer_kv_cache_matches_its_exact_distribution():
    """The chi-square test through the real image-model path: KV cache, rollback and both CFG branches."""
    teacher = tiny_gpt_teacher(vocab=4, grid=(2, 2))
    assert model_p(teacher, torch.tensor([[7, 7]]), sjd_config(window=3, init="repeat-left", cfg=1.5,
                                                               temperature=1.2)) > ALPHA


TEXT_TEACHERS = {"gpt-bos": lambda: tiny_text_gpt_teacher(vocab=4, seq_len=4),  # our GPT, BOS, empty condition
                 "hf-llama": lambda: tiny_hf_lm_teacher(vocab=4, new_tokens=4)}  # transformers' DynamicCache


@pytest.mark.parametrize("name", TEXT_TEACHERS)
def test_sjd_on_text_teachers_matches_the_exact_distribution(name):
    teacher = TEXT_TEACHERS[name]()
    cond = teacher.conditions(1, torch.Generator().manual_seed(0))  # (1, 0) for the LM, a prompt for the Llama
    assert model_p(teacher, cond, sjd_config(window=3, init="repeat-left", top_p=0.9)) > ALPHA


def test_a_text_teacher_whose_rollback_keeps_stale_positions_is_detected():
    """The broken variant on the text path: after a rejection the cache keeps the rejected window, so later tokens
    are predicted from a wrong prefix; the same test must fail."""
    teacher = tiny_hf_lm_teacher(vocab=4, new_tokens=4)
    teacher.rollback = lambda state, length: None
    cond = teacher.conditions(1, torch.Generator().manual_seed(0))
    assert model_p(teacher, cond, sjd_config(window=3, init="repeat-left", top_p=0.9)) < ALPHA


def test_hf_cache_rollback_equals_full_recompute():
    teacher = tiny_hf_lm_teacher(vocab=5, new_tokens=10, prompt_len=3)
    cond = teacher.conditions(1, torch.Generator().manual_seed(1))
    g = torch.Generator().manual_seed(0)
    state, _ = teacher.start(cond, cfg=1.0)
    committed = []
    while len(committed) < teacher.seq_len - 1:
        window = min(torch.randint(1, 5, (1,), generator=g).item(), teacher.seq_len - len(committed))
        tokens = torch.randint(teacher.vocab_size, (1, window), generator=g)
        cached = teacher.extend(state, tokens)[0]  # (L, V)
        with torch.no_grad():
            ids = torch.cat([cond, torch.tensor([committed], dtype=torch.long), tokens], 1)
            full = teacher.network(input_ids=ids).logits[0]
        torch.testing.assert_close(cached, full[-window:].float(), atol=1e-4, rtol=1e-4)
        committed += tokens[0, : torch.randint(1, window + 1, (1,), generator=g).item()].tolist()
        teacher.rollback(state, len(committed))
        assert state.length == len(committed)


# ---- batches: every row its own window, acceptance and rollback (ragged KV cache), finished rows leave ---------------
BATCH_CONDS = torch.tensor([[3, 3], [6, 6], [9, 9], [12, 12]])  # four classes: four laws, four acceptance rates
# 500 batches: the row-mixing rule below is rejected at p = 0 (chi-square 76,000 on 24 degrees of freedom, below
# float64's range); the exact rules pass at p = 0.57 (SJD) and 0.037 (Jacobi).
N_BATCHES = 500


def rows_p(teacher, conds, config, rule, n=N_BATCHES, seed=0, decode=None) -> float:
    """p-value of n batches (one sequence per row of `conds`) against each row's exact law: one chi-square over every
    row's sequences (independent rows: their statistics add up, one degree of freedom lost per row), each row's rare
    sequences pooled (`pooled`); 0 as soon as a sequence of probability 0 is drawn. `decode(generator)` draws a batch
    of tokens (B, N) instead of `jacobi_decode` with `rule` (a method's own `sample`)."""
    laws = [exact_law(teacher, cond[None], config.sampling) for cond in conds]
    g = torch.Generator().manual_seed(seed)
    counts = [Counter() for _ in conds]
    decode = decode or (lambda g: jacobi_decode(teacher, conds, config, g, rule)[0])
    for _ in range(n):
        tokens = decode(g)
        for law, row, seq in zip(laws, counts, map(tuple, tokens.tolist())):
            if law.get(seq, 0.0) == 0.0:
                return 0.0
            row[seq] += 1
    observed, expected = [], []
    for law, row in zip(laws, counts):
        o, e = pooled(law, row, n)
        observed += o
        expected += e
    return chisquare(observed, expected, ddof=len(conds) - 1).pvalue


def batch_teacher():
    """Six tokens of three codes (729 sequences per class); window 4 leaves rows at different lengths, so a pass pads
    short windows past the context (the ragged cache's scratch slot) while other rows still decode."""
    return tiny_gpt_teacher(vocab=3, grid=(2, 3))


@pytest.mark.parametrize("rule", [speculative_rule, exact_match_rule], ids=["sjd", "jacobi"])
def test_batch_of_four_matches_each_rows_exact_distribution(rule):
    config = sjd_config(window=4, init="repeat-left", cfg=1.5)
    assert rows_p(batch_teacher(), BATCH_CONDS, config, rule) > ALPHA


def test_a_rule_that_mixes_up_rows_is_detected_at_batch_four():
    """The broken variant: each row's drafts are verified (and resampled) with the previous row's distributions."""
    def mixed_up(P, drafts, qs, S, n_valid, generator):
        return speculative_rule(P.roll(1, 0), drafts, qs, S, n_valid, generator)

    config = sjd_config(window=4, init="repeat-left", cfg=1.5)
    assert rows_p(batch_teacher(), BATCH_CONDS, config, mixed_up) < ALPHA


def test_batch_greedy_jacobi_is_greedy_ar_row_by_row_with_each_rows_batch_one_counts():
    teacher = tiny_gpt_teacher()
    s = ar_token.SamplingConfig(cfg=2.0, greedy=True)
    greedy = ar_token.sample_ar(teacher, BATCH_CONDS, s, generator=None).data  # (4, N), the batched AR sampler
    for window in (2, 5, 12):
        config = JacobiConfig(s, window=window, init="repeat-left")  # deterministic drafts: rows alone count the same
        tokens, counts = jacobi_decode(teacher, BATCH_CONDS, config, torch.Generator().manual_seed(0),
                                       exact_match_rule)
        assert tokens.tolist() == greedy.tolist()
        alone = [jacobi_decode(teacher, c[None], config, torch.Generator().manual_seed(0), exact_match_rule)[1]
                 for c in BATCH_CONDS]
        # nfe and the draft counters sum the rows' own (batch-1) counts; the batch runs as long as its slowest row
        for key in ("nfe", "tokens", "drafts_verified", "drafts_accepted"):
            assert counts[key] == sum(a[key] for a in alone), key
        assert counts["batch_forwards"] == max(a["nfe"] for a in alone) <= counts["nfe"]
    assert len({a["nfe"] for a in alone}) > 1  # rows finished at different passes and left the batch


def test_window_one_at_batch_four_is_the_batched_ar_sampler():
    teacher, s = TableAR(vocab=5, seq_len=6), ar_token.SamplingConfig(top_k=3, cfg=1.5)
    cond = torch.zeros(4, 1, dtype=torch.long)
    ar = ar_token.sample_ar(teacher, cond, s, generator=torch.Generator().manual_seed(7))
    tokens, counts = jacobi_decode(teacher, cond, SJDConfig(s, window=1), torch.Generator().manual_seed(7),
                                   speculative_rule)
    assert tokens.tolist() == ar.data.tolist()
    assert counts["nfe"] == 4 * teacher.seq_len and counts["batch_forwards"] == teacher.seq_len


def test_a_teacher_without_a_ragged_cache_is_refused_at_batch_size_above_one():
    from core.errors import UserError
    from methods.sjd import SJD

    teacher = tiny_hf_lm_teacher(vocab=4, new_tokens=4)
    method = SJD(teacher, sjd_config(window=3))
    cond = teacher.conditions(2, torch.Generator().manual_seed(0))
    with pytest.raises(UserError, match="batch_size 1"):
        method.sample(cond, generator=torch.Generator().manual_seed(0))
    assert method.sample(cond[:1], generator=torch.Generator().manual_seed(0)).data.shape == (1, 4)


@pytest.mark.parametrize("make", [tiny_gpt_teacher, tiny_text_gpt_teacher], ids=["image-cfg", "text"])
def test_ragged_rollback_and_select_equal_full_recompute(make):
    """The ragged state under SJD's use: per-row windows padded to one length (past the context near the end), per-row
    rollbacks and finished rows dropped; every real input's logits equal a full recompute of its row."""
    teacher = make()
    model, text = teacher.network, teacher.modality == "text"
    cfg = 1.0 if text else 2.5
    cond = teacher.conditions(4, torch.Generator().manual_seed(0)) if text else BATCH_CONDS
    prefix = torch.zeros(4, 1, dtype=torch.long) if text else cond  # the network's condition: the BOS for text
    g = torch.Generator().manual_seed(0)
    state, _ = teacher.start(cond, cfg=cfg, ragged=True)
    N, rows, committed = teacher.seq_len, torch.arange(4), [[] for _ in range(4)]
    while len(rows):
        L = int(torch.randint(1, 7, (1,), generator=g))
        tokens = torch.randint(teacher.vocab_size, (len(rows), L), generator=g)
        cached = teacher.extend(state, tokens)  # (M, L, V)
        for m, b in enumerate(rows.tolist()):
            n = len(committed[b])
            real = min(L, N - 1 - n)  # inputs whose next token is in the sequence; the rest pad the window
            full = torch.zeros(1, N, dtype=torch.long)
            full[0, : n + real] = torch.tensor(committed[b] + tokens[m, :real].tolist())
            with torch.no_grad():
                both = model(torch.cat([prefix[b : b + 1], torch.zeros_like(prefix[b : b + 1])]), full.expand(2, -1))
            recompute = both[:1] if cfg == 1.0 else both[1:] + cfg * (both[:1] - both[1:])
            torch.testing.assert_close(cached[m, :real], recompute[0, n + 1 : n + 1 + real], atol=1e-4, rtol=1e-4)
            committed[b] += tokens[m, : int(torch.randint(1, real + 1, (1,), generator=g))].tolist()
        lengths = torch.tensor([len(committed[b]) for b in rows.tolist()])
        teacher.rollback(state, lengths)
        assert state.length.tolist() == lengths.tolist()
        live = (lengths < N - 1).nonzero().squeeze(1)
        teacher.select(state, live)
        rows = rows[live]
