"""Distilled Decoding on VAR (arXiv:2412.17153, the VAR-DD rows of Table 1): scale-by-scale pairs, the VAR student's
attention, the samplers' passes and the onestep* baseline, on the tiny random-weight VAR in the official format."""
from __future__ import annotations

import pytest
import torch
from scipy.stats import chisquare

from bench.cache import Cache
from bench.errors import UserError
from methods.dd import DD, VARDDConfig
from methods.dd_pairs import map_noise
from methods.dd_student import VARDDStudent
from methods.onestep import OneStep, VAROneStepConfig
from methods.token_flow import FlowConfig
from teachers.families import multiscale_vq
from tests.fakes import make_config, tiny_var_teacher

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
    for knobs, passes in (({"steps": 1}, 1), ({"steps": 2}, 2), ({"steps": 2, "ts": 2}, 1 + 2 + 1),
                          ({"steps": 2, "ts": 1}, 2 + 1)):
        method = DD(teacher, make_config(VARDDConfig, **FAST, t2=3, **knobs))
        method.fit(cache=cache)
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


def test_onestep_star_on_var_draws_every_scale_from_the_marginals_or_refuses_too_many(teacher, tmp_path, monkeypatch):
    method = OneStep(teacher, make_config(VAROneStepConfig, n_pairs=200, cfg=1.5, top_k=8, top_p=0.0))
    method.fit(cache=Cache(tmp_path))
    m = method.fitted()
    assert m.probs.shape == (len(m.conds) + 1, teacher.seq_len, teacher.vocab_size)
    out = method.sample(torch.tensor([[2], [5]]), generator=torch.Generator().manual_seed(0))
    assert out.data.shape == (2, teacher.seq_len) and out.counters["nfe"] == 2
    monkeypatch.setattr("methods.onestep.MAX_MARGINALS", 1000)
    with pytest.raises(UserError, match="exceed 1000 values"):
        OneStep(teacher, make_config(VAROneStepConfig, n_pairs=200)).fit(cache=Cache(tmp_path))
