"""Distilled Decoding (arXiv:2412.17153): the student, its training and the three samplers, on tiny teachers."""
from __future__ import annotations

import contextlib

import pytest
import torch
import torch.nn.functional as F

from core.cache import Cache
from core.errors import UserError
from methods.dd import DD, DDConfig
from methods.dd_student import DDStudent
from methods.onestep import OneStep, OneStepConfig
from tests.fakes import NO_CHECKPOINTS, make_config, tiny_gpt_teacher, tiny_llamagen_teacher

FAST = dict(n_pairs=256, train_steps=40, batch=16, solver_steps=4)


@contextlib.contextmanager
def counted(**modules: torch.nn.Module):
    """{name: forward calls of that module} while the block runs."""
    calls = dict.fromkeys(modules, 0)

    def hook(name):
        def add(*_):
            calls[name] += 1
        return add

    hooks = [m.register_forward_hook(hook(name)) for name, m in modules.items()]
    try:
        yield calls
    finally:
        for h in hooks:
            h.remove()


def toy_teacher(steps: int = 150):
    """The paper's Prop. 3.1 toy as a real transformer teacher: trained on {(0, 0), (1, 1)} (one condition), so
    p(x1) = 1/2 and p(x2 | x1) = delta(x1)."""
    teacher = tiny_gpt_teacher(vocab=2, grid=(1, 2), cond_len=1)
    teacher.vq.codebook = torch.tensor([[0.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
    model = teacher.network
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        for p in model.parameters():  # back to the usual scale: tiny_gpt_teacher inflates weights for SJD tests
            p.data.div_(8.0)
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
        model.train()
        data = torch.tensor([[0, 0], [1, 1]]).repeat(32, 1)  # (64, 2)
        cond = torch.full((64, 1), 3)
        for _ in range(steps):
            loss = F.cross_entropy(model(cond, data).reshape(-1, 2), data.reshape(-1))
            opt.zero_grad()
            loss.backward()
            opt.step()
        model.eval()
    teacher.cond_table = torch.full((1, 1, 1), 3)
    return teacher


@pytest.fixture(scope="module")
def toy():
    return toy_teacher()


def test_student_starts_from_the_teacher(tmp_path):
    teacher = tiny_gpt_teacher()
    student = DDStudent(teacher.network, teacher.codebook)
    # Least-squares input layer: codebook vectors land nearer the teacher's token embeddings than a zero map would.
    mapped = student.inp(teacher.codebook)
    target = teacher.network.tok_emb.weight
    assert (mapped - target).pow(2).sum() < target.pow(2).sum()
    assert torch.equal(student.net.head.weight, teacher.network.head.weight)
    assert student.net.head.weight.data_ptr() != teacher.network.head.weight.data_ptr()  # a copy, the teacher untouched
    cond = teacher.conditions(3, torch.Generator().manual_seed(0))
    tokens = torch.randint(teacher.vocab_size, (3, teacher.seq_len))
    noise = torch.randn(3, teacher.seq_len, 4)
    logits, emb = student(cond, *student.inputs(tokens, noise, torch.tensor([0, 2, 5])))
    assert logits.shape == (3, teacher.seq_len, teacher.vocab_size) and emb.shape == (3, teacher.seq_len, 4)
    out = student.predict(cond, tokens, noise, known=5, split=teacher.seq_len)
    assert torch.equal(out[:, :5], tokens[:, :5])  # Eq. 6: the data prefix is copied


def test_student_dropout_is_its_own():
    """The student copies the teacher's weights but not its dropout: at 0 a training-mode pass is deterministic."""
    teacher = tiny_gpt_teacher()
    cond = teacher.conditions(2, torch.Generator().manual_seed(0))
    x, is_data = torch.randn(2, teacher.seq_len, 4), torch.zeros(2, teacher.seq_len, dtype=torch.bool)
    outputs = {}
    for rate in (0.0, 0.5):
        student = DDStudent(teacher.network, teacher.codebook, dropout=rate).train()
        assert torch.equal(student.net.blocks[0].mlp[0].weight, teacher.network.blocks[0].mlp[0].weight)
        outputs[rate] = [student(cond, x, is_data)[0] for _ in range(2)]
    assert torch.equal(*outputs[0.0]) and not torch.equal(*outputs[0.5])


def test_student_output_depends_only_on_earlier_positions():
    teacher = tiny_gpt_teacher()
    student = DDStudent(teacher.network, teacher.codebook).eval()
    cond = teacher.conditions(1, torch.Generator().manual_seed(0))
    noise = torch.randn(1, teacher.seq_len, 4)
    tokens = torch.zeros(1, teacher.seq_len, dtype=torch.long)
    known = torch.tensor([0])
    base, _ = student(cond, *student.inputs(tokens, noise, known))
    noise2 = noise.clone()
    noise2[:, 7] += 1.0
    moved, _ = student(cond, *student.inputs(tokens, noise2, known))
    torch.testing.assert_close(moved[:, :7], base[:, :7])  # q_i depends on q_<i and eps_i only
    assert not torch.allclose(moved[:, 7], base[:, 7])


def test_training_lowers_the_loss_and_is_cached(tmp_path):
    teacher, cache = tiny_gpt_teacher(), Cache(tmp_path)
    short = DD(teacher, make_config(DDConfig, **{**FAST, "train_steps": 1}))
    long = DD(teacher, make_config(DDConfig, **{**FAST, "train_steps": 60}))
    first = short.fit(cache=cache, checkpoints=NO_CHECKPOINTS)
    trained = long.fit(cache=cache, checkpoints=NO_CHECKPOINTS)
    assert trained["train_ce"] < first["train_ce"] and not trained["student_cached"]
    again = DD(teacher, make_config(DDConfig, **{**FAST, "train_steps": 60}, steps=2))  # sampling only
    again = again.fit(cache=cache, checkpoints=NO_CHECKPOINTS)
    assert again["student_cached"] == 1.0 and again["pairs_cached"] == 1.0


def test_samplers_count_their_passes_and_are_deterministic(tmp_path):
    teacher, cache = tiny_gpt_teacher(), Cache(tmp_path)
    n = teacher.seq_len  # 12: t2 defaults to round(81/256 * 12) = 4
    cond = teacher.conditions(3, torch.Generator().manual_seed(0))
    for knobs, passes in (({"steps": 1}, 1), ({"steps": 2}, 2), ({"steps": 2, "ts": 2}, 2 + (4 - 2)),
                          ({"steps": 2, "ts": 1}, 1 + (4 - 1))):
        method = DD(teacher, make_config(DDConfig, **FAST, **knobs))
        method.fit(cache=cache, checkpoints=NO_CHECKPOINTS)
        a, b = (method.sample(cond, generator=torch.Generator().manual_seed(9)) for _ in range(2))
        assert torch.equal(a.data, b.data) and a.counters == b.counters, knobs
        assert a.counters["nfe"] == 3 * passes and a.counters["tokens"] == 3 * n, knobs
    one = DD(teacher, make_config(DDConfig, **FAST, steps=1))
    one.fit(cache=cache, checkpoints=NO_CHECKPOINTS)
    two = DD(teacher, make_config(DDConfig, **FAST, steps=2))
    two.fit(cache=cache, checkpoints=NO_CHECKPOINTS)
    x1 = one.sample(cond, generator=torch.Generator().manual_seed(9)).data
    x2 = two.sample(cond, generator=torch.Generator().manual_seed(9)).data
    assert torch.equal(x1[:, :3], x2[:, :3])  # step 2 keeps the first t2 - 1 tokens of step 1 (same noise)


def test_bad_timesteps_are_refused():
    teacher = tiny_gpt_teacher()
    with pytest.raises(UserError, match="t2 must be in"):
        DD(teacher, make_config(DDConfig, t2=13))
    with pytest.raises(UserError, match="ts must be < t2"):
        DD(teacher, make_config(DDConfig, steps=2, t2=4, ts=4))
    with pytest.raises(UserError, match="needs steps=2"):
        make_config(DDConfig, ts=2)
    with pytest.raises(UserError, match="split must be in"):
        DD(teacher, make_config(DDConfig, split=13))
    assert DD(teacher, DDConfig()).split == 6  # 0.5 * n by default
    assert DD(teacher, make_config(DDConfig, split=12)).split == 12


def test_two_token_toy_dd_is_valid_where_onestep_star_is_not(toy, tmp_path):
    """Prop. 3.1: per-position marginals pair tokens at random (~50 % invalid); DD learns the joint (~0 %)."""
    cache = Cache(tmp_path)
    cond = toy.conditions(1000, torch.Generator().manual_seed(0))
    dd = DD(toy, make_config(DDConfig, n_pairs=512, train_steps=150, batch=64, lr=3e-3, t2=2))
    dd.fit(cache=cache, checkpoints=NO_CHECKPOINTS)
    onestep = OneStep(toy, make_config(OneStepConfig, n_pairs=512))
    onestep.fit(cache=cache, checkpoints=NO_CHECKPOINTS)
    invalid = {}
    for name, method in (("dd", dd), ("onestep*", onestep)):
        x = method.sample(cond, generator=torch.Generator().manual_seed(1)).data
        invalid[name] = (x[:, 0] != x[:, 1]).float().mean().item()
    assert invalid["dd"] < 0.05 and 0.4 < invalid["onestep*"] < 0.6, invalid


@pytest.mark.parametrize("ts,t2", [(1, 4), (2, 4), (3, 4), (2, 6), (5, 6)])
def test_pre_trained_ts_t2_passes_are_the_networks_calls(tmp_path, ts, t2):
    """Alg. 4 on the AR-token family: the teacher's passes counted on its network, t2 - ts (the condition and the
    prefix in one pass, then one per further token: the paper's 2 + t2 - ts with DD's two steps), and DD's steps on the
    student's."""
    teacher = tiny_gpt_teacher()
    method = DD(teacher, make_config(DDConfig, **{**FAST, "train_steps": 1}, steps=2, t2=t2, ts=ts))
    method.fit(cache=Cache(tmp_path), checkpoints=NO_CHECKPOINTS)
    # the teacher's first block runs once per teacher pass (the student's network is a copy)
    with counted(teacher=teacher.network.blocks[0], student=method.student) as calls:
        out = method.sample(teacher.conditions(2, torch.Generator().manual_seed(0)),
                            generator=torch.Generator().manual_seed(0))
    assert calls == {"teacher": t2 - ts, "student": 1 + (ts > 1)}
    assert out.counters["nfe"] == 2 * sum(calls.values())
    planned = DD.passes(method.config, teacher.family, teacher.seq_len)["method"].counts
    assert planned == {"full": calls["student"], "step": calls["teacher"]}  # what a dry run plans


@pytest.mark.parametrize("make", [tiny_gpt_teacher, tiny_llamagen_teacher], ids=["gpt", "llamagen"])
def test_a_prefix_read_with_the_condition_gives_the_token_by_token_logits(make):
    """`start(cond, cfg, prefix=...)` (one pass over the condition and DD's tokens) gives the logits, and leaves the
    cache, that the condition's prefill and then the prefix give; the prefix in another order does not."""
    teacher = make()
    cond = teacher.conditions(3, torch.Generator().manual_seed(0))
    prefix = torch.randint(teacher.vocab_size, (3, 5), generator=torch.Generator().manual_seed(1))
    nxt = torch.randint(teacher.vocab_size, (3, 2), generator=torch.Generator().manual_seed(2))
    one, first = teacher.start(cond, cfg=2.0, prefix=prefix)
    two, _ = teacher.start(cond, cfg=2.0)
    second = teacher.extend(two, prefix)[:, -1]
    torch.testing.assert_close(first, second, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(teacher.extend(one, nxt), teacher.extend(two, nxt), atol=1e-5, rtol=1e-5)
    _, flipped = teacher.start(cond, cfg=2.0, prefix=prefix.flip(1))  # broken: the tokens at the wrong positions
    assert not torch.allclose(flipped, second, atol=1e-3)
