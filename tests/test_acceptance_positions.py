"""Acceptance by draft position (`core.acceptance`) in SJD and CSpD: under truncation the tokens a round decides
average 1 + the sum of the marginal rates, in exact integer counts; conditional rates are rates, `reached` falls with
the position; a count off by one position is detected."""
import math
from collections import Counter
from fractions import Fraction

import pytest
import torch

import methods.cspd_verify as cspd_verify
import methods.sjd as sjd
from core.acceptance import NO_BONUS, ROUNDS, count_prefix, position_key, rates
from methods.cspd import CSpD
from methods.sjd import SJDConfig, exact_match_rule, jacobi_decode, speculative_rule
from reports.plots import acceptance_by_position, position_rates
from reports.tables import TrialRun
from tests.fakes import LinearGaussianAR, LinearGaussianMasked, make_config, tiny_gpt_teacher, tiny_mar_teacher

CONDS = torch.tensor([[3, 3], [6, 6], [9, 9], [12, 12]])  # four rows, each at its own pace (a ragged batch)


def _positions(c: Counter) -> list[tuple[int, int]]:
    """(reached_k, accepted_k) for k = 1, 2, ... while position k was ever reached."""
    out, k = [], 1
    while c[position_key(k, "reached")]:
        out.append((c[position_key(k, "reached")], c[position_key(k, "accepted")]))
        k += 1
    return out


def _one_plus_marginals(c: Counter) -> Fraction:
    return 1 + sum(Fraction(a, c[ROUNDS]) for _, a in _positions(c))


def _check_truncation(c: Counter, decided: int, rounds: int) -> None:
    """`decided`: the tokens the rounds decided, `rounds`: the rounds, both from the method's other counters."""
    assert c[ROUNDS] == rounds > 0
    assert Fraction(decided + c[NO_BONUS], rounds) == _one_plus_marginals(c)
    pos = _positions(c)
    assert sum(r for r, _ in pos) == c["drafts_verified"] and sum(a for _, a in pos) == c["drafts_accepted"]
    assert all(0 <= a <= r for r, a in pos) and all(r1 >= r2 for (r1, _), (r2, _) in zip(pos, pos[1:]))
    # k + 1 is reached only where k was accepted (and the window had k + 1 drafts)
    assert all(r <= a for (_, a), (r, _) in zip(pos, pos[1:]))
    assert list(rates(c)) == list(range(1, len(pos) + 1))


def _sjd(rule=speculative_rule, seed=0, **knobs):
    config = make_config(SJDConfig, **{"window": 4, "init": "random", **knobs})
    teacher = tiny_gpt_teacher()
    _, c = jacobi_decode(teacher, CONDS, config, torch.Generator().manual_seed(seed), rule)
    return c, len(CONDS), teacher.seq_len


@pytest.mark.parametrize("rule", [speculative_rule, exact_match_rule], ids=["sjd", "jacobi"])
@pytest.mark.parametrize("knobs", [{}, {"window": 6, "ar_head": 2, "ar_tail": 1, "init": "repeat-left"}])
def test_sjd_rounds_decide_one_plus_the_sum_of_the_marginals(rule, knobs):
    c, B, N = _sjd(rule, **knobs)
    # the first pass decides one token per row; every later pass is a round, whose bonus always fits
    _check_truncation(c, decided=c["tokens"] - B, rounds=c["nfe"] - B)
    assert c[NO_BONUS] == 0 and 0 < c["drafts_accepted"] < c["drafts_verified"]


def _cspd(teacher, **knobs):
    B = 5
    cond = teacher.conditions(B, torch.Generator().manual_seed(0))
    method = CSpD(teacher, make_config(CSpD.config_class(teacher.family), **knobs))
    c = method.sample(cond, generator=torch.Generator().manual_seed(1)).counters
    n_pre = math.floor(teacher.seq_len * knobs.get("prefill", 0.05)) + 1  # one token per step in exact and paper
    return c, B * n_pre


@pytest.mark.parametrize("mode", ["exact", "paper"])
@pytest.mark.parametrize("make, accepts", [(lambda: LinearGaussianAR(seq_len=13), True),
                                           (tiny_mar_teacher, False),  # untrained: its draft is never accepted
                                           (lambda: LinearGaussianMasked(seq_len=13), True)],
                         ids=["linear", "tiny-mar", "masked"])
def test_cspd_truncation_rounds_decide_one_plus_the_sum_of_the_marginals(mode, make, accepts):
    c, prefilled = _cspd(make(), mode=mode, gamma=3, steps=4)
    # every target pass after the pre-fill is a round
    _check_truncation(c, decided=c["tokens"] - prefilled, rounds=c["nfe"] - prefilled)
    assert (c["drafts_accepted"] > 0) == accepts and c["drafts_accepted"] < c["drafts_verified"]


def test_a_round_that_takes_every_draft_at_the_end_has_no_bonus():
    c, prefilled = _cspd(LinearGaussianAR(seq_len=12, same=True), mode="exact", gamma=3, steps=4)
    # a draft equal to the target is always accepted: 11 tokens in rounds of 4, the last round 3 drafts, no bonus
    assert c[NO_BONUS] == 5 and _one_plus_marginals(c) == 4
    _check_truncation(c, decided=c["tokens"] - prefilled, rounds=c["nfe"] - prefilled)


@pytest.mark.parametrize("make", [lambda: LinearGaussianAR(seq_len=13), lambda: LinearGaussianMasked(seq_len=13)],
                         ids=["causal", "masked"])
def test_the_released_rule_reaches_every_draft(make):
    c, _ = _cspd(make(), mode="released", gamma=3, steps=4)
    pos = _positions(c)
    assert len(pos) == 3 and sum(r for r, _ in pos) == c["drafts_verified"] == c["drafts"]
    assert sum(a for _, a in pos) == c["drafts_accepted"] and all(0 <= a <= r for r, a in pos)


def _off_by_one(c, accepted, drafted):
    """The broken count: the token after the accepted prefix (the residual sample) counted as an accepted draft."""
    count_prefix(c, torch.minimum(accepted + 1, drafted), drafted)


@pytest.mark.parametrize("module", [sjd, cspd_verify], ids=["sjd", "cspd"])
def test_counting_the_resampled_token_as_accepted_breaks_the_identity(monkeypatch, module):
    monkeypatch.setattr(module, "count_prefix", _off_by_one)
    if module is sjd:
        c, B, _ = _sjd()
        decided = c["tokens"] - B
    else:
        c, prefilled = _cspd(LinearGaussianAR(seq_len=13), mode="exact", gamma=3, steps=4)
        decided = c["tokens"] - prefilled
    assert Fraction(decided + c[NO_BONUS], c[ROUNDS]) < _one_plus_marginals(c)


def test_rates_read_logged_metrics_as_they_read_counters():
    c, _, _ = _sjd()
    logged = {f"{k}_per_sample": v / 8 for k, v in c.items()}  # as the runner logs every counter
    got, want = rates(logged, "_per_sample"), rates(c)
    assert list(got) == list(want) == [1, 2, 3] and rates(logged) == {}
    assert all(got[k] == pytest.approx(want[k]) for k in want)


def test_the_plot_has_a_line_per_run_group_averaged_over_seeds_and_nothing_without_counts(tmp_path):
    def run(seed, window, counts):
        knobs = {"window": str(window), "init": "random"}
        metrics = {f"{k}_per_sample": v / 4 for k, v in counts.items()}  # as the runner logs them
        return TrialRun("digits-ar-t2i", "sjd", seed, 4, knobs, {"cfg": "1.0"}, "ar", metrics, {},
                        key_knobs=("window", "init"))

    w4, w4b, w6 = _sjd()[0], _sjd(seed=1)[0], _sjd(window=6)[0]
    runs = [run(0, 4, w4), run(1, 4, w4b), run(0, 6, w6)]
    got = position_rates(runs)
    four, six = got.values()  # the seeds of window 4 share a line
    assert list(got) == ["sjd window=4, init=random", "sjd window=6, init=random"]
    assert list(six) == list(rates(w6)) and all(six[k] == pytest.approx(v) for k, v in rates(w6).items())
    assert list(four) == [1, 2, 3] and rates(w4)[1] != rates(w4b)[1]
    assert four[1] == pytest.approx(tuple((a + b) / 2 for a, b in zip(rates(w4)[1], rates(w4b)[1])))
    path = acceptance_by_position(runs, "digits-ar-t2i", tmp_path)
    assert path == tmp_path / "acceptance_by_position_digits-ar-t2i.png" and path.stat().st_size > 0
    assert acceptance_by_position([run(0, 4, {"nfe": 4})], "t", tmp_path) is None
