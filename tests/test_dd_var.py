"""Distilled Decoding on VAR (arXiv:2412.17153, the VAR-DD rows of Table 1): scale-by-scale pairs, the VAR student's
attention, the samplers' passes and the onestep* baseline, on the tiny random-weight VAR in the official format."""
from __future__ import annotations

import pytest
import torch
from scipy.stats import chisquare

from core.cache import Cache
from core.errors import UserError
from methods.dd import DD, VARDDConfig
from methods.dd_pairs import map_noise
from methods.dd_student import VARDDStudent
from methods.onestep import OneStep, VAROneStepConfig
from methods.dd_token_flow import FlowConfig
from teachers.families import multiscale_vq
from tests.fakes import NO_CHECKPOINTS, make_config, tiny_var_teacher
from tests.test_dd import counted

S = multiscale_vq.SamplingConfig(cfg=1.5, top_k=8, top_p=0.0)
FAST = dict(n_pairs=128, train_steps=20, batch=16, solver_steps=4, cfg=1.5, top_k=8, top_p=0.0)


@pytest.fixture(scope="module")
def teacher():
    return tiny_var_teacher()


def test_pairs_map_each_scale_by_the_teachers_law(teacher):
    """The first scale's token, mapped from noise, is distributed as VAR's processed distribution (top-k 8); the map is
    a function of the noise, whatever the batch."""
    n, cond = 3000, torch.full((3000, 1), 7)
    noise = torch.randn(n, teacher.seq_len, teacher.codebook.shape[1], generator=torch.Generator().manual_seed(0))
    tokens = map_noise(teacher, noise, cond, S, FlowConfig())
    _, logits = teacher.start(cond[:1], cfg=True)
    p = multiscale_vq.process(multiscale_vq.guide(logits, 1, S.cfg, 0, len(teacher.patch_nums)), S)[0, 0]
    counts = torch.bincount(tokens[:, 0], minlength=teacher.vocab_size)
    assert counts[p == 0].sum() == 0 and (p > 0).sum() == 8
    expected = p[p > 0].double() / p[p > 0].double().sum() * n
    assert chisquare(counts[p > 0].double().numpy(), expected.numpy()).pvalue > 1e-3
    assert torch.equal(map_noise(teacher, noise[:5], cond[:5], S, FlowConfig()), tokens[:5])


def test_the_var_student_sees_the_earlier_scales_and_itself_only(teacher):
    student = VARDDStudent(teacher.network, teacher.codebook).eval()
    cond = torch.tensor([[3]])
    x, is_data = torch.randn(1, teacher.seq_len, teacher.codebook.shape[1]), torch.zeros(1, teacher.seq_len).bool()
    base, _ = student(cond, x, is_data)
    moved = x.clone()
    moved[:, 6] += 1.0  # a token of the third scale (positions 5..13)
    out, _ = student(cond, moved, is_data)
    same = [i for i in range(14) if i != 6]
    torch.testing.assert_close(out[:, same], base[:, same])  # earlier scales and the rest of its own scale
    assert not torch.allclose(out[:, 6], base[:, 6]) and not torch.allclose(out[:, 14:], base[:, 14:])
    assert torch.equal(student.net.head.weight, teacher.network.head.weight)  # initialised from the teacher
    assert student.net.head.weight.data_ptr() != teacher.network.head.weight.data_ptr()


def test_the_samplers_count_their_passes_and_keep_the_known_scales(teacher, tmp_path):
    cache, cond = Cache(tmp_path), torch.tensor([[1], [4], [9]])
    outs = {}
    # scales (1, 2, 3, 4): t2 = 3 keeps 2 scales (5 tokens); pre-trained-2-3 lets the teacher redraw scale 2
    for knobs, passes in (({"steps": 1}, 1), ({"steps": 2}, 2), ({"steps": 2, "ts": 2}, 2 + 3 - 2),
                          ({"steps": 2, "ts": 1}, 3)):
        method = DD(teacher, make_config(VARDDConfig, **FAST, t2=3, **knobs))
        method.fit(cache=cache, checkpoints=NO_CHECKPOINTS)
        a, b = (method.sample(cond, generator=torch.Generator().manual_seed(9)) for _ in range(2))
        assert torch.equal(a.data, b.data) and a.counters["nfe"] == 3 * passes, knobs
        assert a.data.shape == (3, teacher.seq_len) and 0 <= a.data.min() and a.data.max() < teacher.vocab_size
        outs[tuple(knobs.items())] = a.data
    one, two = outs[(("steps", 1),)], outs[(("steps", 2),)]
    assert torch.equal(one[:, :5], two[:, :5])  # step 2 keeps the first t2 - 1 scales of step 1 (same noise)
    redrawn = outs[(("steps", 2), ("ts", 2))]
    assert torch.equal(redrawn[:, :1], one[:, :1])  # pre-trained-2-3 keeps scale 1 of the DD step
    default = DD(teacher, make_config(VARDDConfig, **FAST))
    assert default.t2 == 2  # 1 of 30 tokens known is the nearest to the paper's 55 of 680
    with pytest.raises(UserError, match="t2 must be in \\[2, 4\\] for a teacher of 4 scales"):
        DD(teacher, make_config(VARDDConfig, **FAST, t2=5))


def test_onestep_star_on_var_draws_every_scale_from_the_pairs_of_its_class(teacher, tmp_path):
    """No dense table: the pairs' tokens grouped by class (what VAR-d16's 1000 classes x 680 x 4096 need), and every
    drawn token is one a pair of the same class has at that position."""
    method = OneStep(teacher, make_config(VAROneStepConfig, n_pairs=200, cfg=1.5, top_k=8, top_p=0.0))
    method.fit(cache=Cache(tmp_path), checkpoints=NO_CHECKPOINTS)
    m = method.fitted()
    assert m.tokens.shape == (200, teacher.seq_len) and int(m.starts[-1]) == 200
    cond = torch.tensor([[2], [5]])
    out = method.sample(cond, generator=torch.Generator().manual_seed(0))
    assert out.data.shape == (2, teacher.seq_len) and out.counters["nfe"] == 2
    support = m.probs(cond) > 0  # (2, n, V)
    assert support.gather(-1, out.data[..., None]).all()


def test_a_prefix_read_in_one_pass_gives_the_scale_by_scale_logits(teacher):
    """`start(prefix=...)` reads j whole scales with the condition in one pass under the block-causal mask: the
    logits of scale j, and the cache the following scales read, are those of j + 1 cached passes. Broken variant:
    the same pass without a mask (the released `intermediate_sample`'s) gives other logits."""
    g = torch.Generator().manual_seed(0)
    cond = torch.tensor([[1], [6]])
    tokens = torch.randint(teacher.vocab_size, (2, teacher.seq_len), generator=g)
    ends = [0, 1, 5, 14, 30]

    def stepwise(j):
        state, logits = teacher.start(cond, cfg=True)
        for si in range(j):
            logits = teacher.next_scale(state, tokens[:, ends[si] : ends[si + 1]])
        return state, logits

    def one_pass(j):
        return teacher.start(cond, cfg=True, prefix=tokens[:, : ends[j]])

    for j in (1, 2, 3):
        (s1, a), (s2, b) = stepwise(j), one_pass(j)
        assert s2.si == j and b.shape == (4, (j + 1) ** 2, teacher.vocab_size)
        torch.testing.assert_close(b, a, atol=1e-5, rtol=0)
        if j < 3:  # the cache of the one pass serves the next scale as the stepwise one does
            nxt = tokens[:, ends[j] : ends[j + 1]]
            torch.testing.assert_close(teacher.next_scale(s2, nxt), teacher.next_scale(s1, nxt), atol=1e-5, rtol=0)
    torch.testing.assert_close(one_pass(0)[1], stepwise(0)[1], atol=0, rtol=0)
    with pytest.raises(ValueError, match="whole scales"):
        teacher.start(cond, cfg=True, prefix=tokens[:, :3])
    mask = teacher.network.attn_bias_for_masking
    try:
        teacher.network.attn_bias_for_masking = torch.zeros_like(mask)
        assert (one_pass(3)[1] - stepwise(3)[1]).abs().max() > 1e-3
    finally:
        teacher.network.attn_bias_for_masking = mask


@pytest.mark.parametrize("ts,t2", [(1, 2), (1, 4), (2, 3), (2, 4), (3, 4)])
def test_pre_trained_ts_t2_costs_the_papers_passes(teacher, tmp_path, ts, t2):
    """Alg. 4 on VAR: 2 + t2 - ts forward passes (t2 when ts = 1; Table 2), counted on the networks themselves: one
    teacher pass reads the kept scales, so the count falls as ts grows."""
    method = DD(teacher, make_config(VARDDConfig, **{**FAST, "train_steps": 1}, steps=2, t2=t2, ts=ts))
    method.fit(cache=Cache(tmp_path), checkpoints=NO_CHECKPOINTS)
    with counted(teacher=teacher.network.blocks[0], student=method.student) as calls:
        out = method.sample(torch.tensor([[1], [4]]), generator=torch.Generator().manual_seed(0))
    expected = t2 if ts == 1 else 2 + t2 - ts
    assert calls == {"teacher": t2 - ts, "student": expected - (t2 - ts)}
    assert out.counters["nfe"] == 2 * expected
    planned = DD.passes(method.config, multiscale_vq.FAMILY, len(teacher.patch_nums))["method"].counts
    assert planned == {"full": calls["student"], "step": calls["teacher"]}  # what a dry run plans
