"""SDTT (arXiv:2410.21035): the divergences against hand-computed values, Algorithm 1's targets, and a round of
distillation on a fake teacher that must bring the student's one step closer to the teacher's two."""
from __future__ import annotations

import copy
import dataclasses
import math

import pytest
import torch

from core.cache import Cache
from core.errors import UserError
from methods.base import TeacherSampler
from methods.sdtt import SDTT, SDTTConfig, divergence, teacher_targets
from teachers.families import masked_diffusion as md
from tests.fakes import NO_CHECKPOINTS, make_config, tiny_mdlm_teacher

P = torch.tensor([[0.5, 0.5, 0.0], [0.9, 0.1, 0.0]])  # student, 2 tokens over {a, b, MASK}
Q = torch.tensor([[0.25, 0.75, 0.0], [0.5, 0.5, 0.0]])  # target


def _log(p):
    return p.clamp(min=1e-30).log().clamp(min=md.NEG)  # MASK column at NEG on both sides, as SUBS gives


def test_divergences_match_hand_computed_values():
    kl_rev = [0.5 * math.log(0.5 / 0.25) + 0.5 * math.log(0.5 / 0.75),
              0.9 * math.log(0.9 / 0.5) + 0.1 * math.log(0.1 / 0.5)]
    kl_fwd = [0.25 * math.log(0.25 / 0.5) + 0.75 * math.log(0.75 / 0.5),
              0.5 * math.log(0.5 / 0.9) + 0.5 * math.log(0.5 / 0.1)]
    d_log = [[math.log(0.5 / 0.25), math.log(0.5 / 0.75)], [math.log(0.9 / 0.5), math.log(0.1 / 0.5)]]
    s, q = _log(P), _log(Q)
    assert divergence(s, q, "kld").item() == pytest.approx(sum(kl_rev) / 2, rel=1e-5)
    assert divergence(s, q, "kld-fwd").item() == pytest.approx(sum(kl_fwd) / 2, rel=1e-5)
    assert divergence(s, q, "tvd").item() == pytest.approx((0.5 * (0.25 + 0.25) + 0.5 * (0.4 + 0.4)) / 2, rel=1e-5)
    assert divergence(s, q, "tvd-log").item() == pytest.approx(sum(abs(v) for r in d_log for v in r) / 2, rel=1e-5)
    assert divergence(s, q, "mse").item() == pytest.approx(sum(v * v for r in d_log for v in r) / 6, rel=1e-5)
    for kind in ("kld", "kld-fwd", "mse", "tvd", "tvd-log"):
        assert divergence(s, s, kind).item() == pytest.approx(0.0, abs=1e-6)


def test_targets_are_the_log_probs_that_produced_each_token():
    teacher = tiny_mdlm_teacher(train_steps=100)
    z = torch.full((64, 8), 8)
    t = torch.full((64,), 0.5)
    calls = []

    def denoise(v):
        calls.append(v.clone())
        return teacher.denoise(v)

    target = teacher_targets(denoise, z, t, 0.2, 2, 8, torch.Generator().manual_seed(0))
    assert len(calls) == 2
    first, second = (teacher.denoise(c) for c in calls)
    unmasked_first = calls[1] != 8  # unmasked by step 1
    assert torch.equal(target[unmasked_first], first[unmasked_first])
    rest = ~unmasked_first
    assert torch.equal(target[rest], second[rest])  # unmasked by step 2, or still masked: the last step's
    assert 0 < unmasked_first.float().mean() < 1


def _objective(student_denoise, teacher, cfg, seed=123, draws=8):
    """The SDTT objective (Algorithm 2's loss) on a fixed evaluation set: 512 sequences, `draws` target draws each."""
    g = torch.Generator().manual_seed(seed)
    x = teacher.training_chunks(None)[:512].repeat(draws, 1)
    t = md.antithetic_times(len(x), g)
    z = md.corrupt(x, t, teacher.mask_id, g)
    target = teacher_targets(teacher.denoise, z, t, 1 / cfg.sampling.steps, 2, teacher.mask_id, g)
    masked = z == teacher.mask_id
    return divergence(student_denoise(z)[masked], target[masked], cfg.divergence).item()


@pytest.fixture(scope="module")
def trained_teacher():
    return tiny_mdlm_teacher(train_steps=1000)  # ~7 s: the chain's context must matter for 2 steps to beat 1


# Measured (this fake, 300 iterations): MSE 1.03 -> 0.86, reverse KL 0.221 -> 0.210. As in a CPU prototype of the
# paper's setting at toy scale, log-space MSE moves the student visibly within a short round; the KL's reducible part
# is small.
@pytest.mark.parametrize("kind, factor", [("mse", 0.9), ("kld", 1.0)])
def test_a_round_brings_the_students_step_closer_to_two_teacher_steps(kind, factor, trained_teacher, tmp_path):
    cfg = make_config(SDTTConfig, steps=4, rounds=1, divergence=kind, iters_per_round=300, batch=64, lr=5e-4,
                      lr_warmup=10, ema=0.0, ar_arm=False)
    before = _objective(trained_teacher.denoise, trained_teacher, cfg)
    method = SDTT(trained_teacher, cfg)
    method.fit(cache=Cache(tmp_path), checkpoints=NO_CHECKPOINTS)
    after = _objective(method.denoise, trained_teacher, cfg)
    assert after < factor * before, (before, after)


def test_a_wrong_sign_divergence_moves_the_student_away(trained_teacher, tmp_path, monkeypatch):
    """The broken variant: ascending the divergence must make the objective worse, so the test above can fail."""
    import methods.sdtt as sdtt

    real = sdtt.divergence
    monkeypatch.setattr(sdtt, "divergence", lambda s, t, kind: -real(s, t, kind))
    cfg = make_config(SDTTConfig, steps=4, rounds=1, divergence="mse", iters_per_round=100, batch=64, lr=5e-4,
                      lr_warmup=10, ema=0.0, ar_arm=False)
    before = _objective(trained_teacher.denoise, trained_teacher, cfg)
    method = SDTT(trained_teacher, cfg)
    method.fit(cache=Cache(tmp_path), checkpoints=NO_CHECKPOINTS)
    monkeypatch.setattr(sdtt, "divergence", real)
    assert _objective(method.denoise, trained_teacher, cfg) > before


def test_rounds_are_cached_and_a_longer_run_reuses_them(tmp_path, monkeypatch):
    teacher = tiny_mdlm_teacher()
    cache = Cache(tmp_path)
    type(teacher).key = classmethod(lambda cls: "tiny-mdlm-key")
    fast = dict(steps=8, iters_per_round=3, batch=8, ar_arm=False)
    trained = []
    real = SDTT._round
    monkeypatch.setattr(SDTT, "_round", lambda self, r, *a: trained.append(r) or real(self, r, *a))
    one = SDTT(teacher, make_config(SDTTConfig, rounds=1, **fast))
    assert one.fit(cache=cache, checkpoints=NO_CHECKPOINTS)["student_cached"] == 0.0 and trained == [1]
    two = SDTT(teacher, make_config(SDTTConfig, rounds=2, **fast)).fit(cache=cache, checkpoints=NO_CHECKPOINTS)
    assert two["student_cached"] == 0.0 and trained == [1, 2]  # round 1's full state reused: only round 2 trained
    assert two["round2_teacher_steps"] == 4.0
    out = SDTT(teacher, make_config(SDTTConfig, rounds=2, **fast))
    # the EMA entry: nothing trained
    assert out.fit(cache=cache, checkpoints=NO_CHECKPOINTS)["student_cached"] == 1.0 and trained == [1, 2]
    assert {p.parent.name for p in tmp_path.rglob("*.pt")} == {"sdtt-students", "sdtt-ema"}
    s = out.sample(torch.zeros(4, 0, dtype=torch.long), generator=torch.Generator().manual_seed(0))
    assert s.counters["nfe"] in (4 * 2, 4 * 3)  # 8 / 2^2 steps (+ noise removal)


@pytest.mark.parametrize("draw", ["exact", "released-fp32"])
def test_every_arm_draws_as_the_trial_says(draw, tmp_path):
    """The reference arm (the runner's `TeacherSampler` on `SDTT.sampling_of`), the student and the same-step arm
    draw the same way: with the student equal to the teacher and one generator seed, they give the same tokens; a
    student drawing the other way (the comparison this setting prevents) does not."""
    teacher = tiny_mdlm_teacher(train_steps=100)
    cfg = make_config(SDTTConfig, steps=8, rounds=1, ar_arm=False, draw=draw)
    assert SDTT.sampling_of(cfg).draw == cfg.student_sampling.draw == draw and cfg.student_sampling.steps == 4

    def student(config):
        method = SDTT(teacher, config)
        method.student = copy.deepcopy(teacher.network)  # the teacher's weights: only a draw can tell them apart
        return method

    same_steps = student(cfg).extra_arms(cache=Cache(tmp_path), device=torch.device("cpu"),
                                         checkpoints=NO_CHECKPOINTS)["same_steps"]
    reference = TeacherSampler(teacher, dataclasses.replace(SDTT.sampling_of(cfg), steps=4))
    cond = torch.zeros(32, 0, dtype=torch.long)
    runs = [arm.sample(cond, generator=torch.Generator().manual_seed(5)).data
            for arm in (student(cfg), same_steps, reference)]
    assert torch.equal(runs[0], runs[1]) and torch.equal(runs[0], runs[2])
    other = make_config(SDTTConfig, steps=8, rounds=1, ar_arm=False,
                        draw="exact" if draw == "released-fp32" else "released-fp32")
    assert not torch.equal(student(other).sample(cond, generator=torch.Generator().manual_seed(5)).data, runs[1])


def test_config_checks_divisibility():
    with pytest.raises(UserError, match="divisible"):
        make_config(SDTTConfig, steps=12, rounds=3)
