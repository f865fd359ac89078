"""The masked-diffusion family (MDLM): SUBS, the schedule, the ancestral sampler's invariants, and the exact
distribution of one parallel step on an enumerable model."""
from __future__ import annotations

import itertools

import pytest
import torch

from teachers.families import masked_diffusion as md
from tests.fakes import tiny_mdlm_teacher

V, L = 8, 8
MASK = V


def _z(seed=0, p=0.5):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(V, (16, L), generator=g)
    return torch.where(torch.rand(16, L, generator=g) < p, torch.full_like(x, MASK), x)


def test_subs_copies_unmasked_tokens_and_never_predicts_mask():
    z = _z()
    logp = md.subs(torch.randn(16, L, V + 1), z, MASK)
    assert torch.allclose(logp.exp().sum(-1), torch.ones(16, L))
    assert (logp[..., MASK] <= md.NEG / 2).all() and (logp[..., MASK].exp() == 0).all()
    un = z != MASK
    assert (logp[un].argmax(-1) == z[un]).all() and (logp[un].max(-1).values == 0).all()


def test_reverse_step_keeps_unmasked_tokens_and_unmasks_at_rate_dt_over_t():
    z = _z(p=1.0).repeat(200, 1)  # all masked, 3200 x 8 tokens
    logp = md.subs(torch.randn(*z.shape, V + 1), z, MASK)
    g = torch.Generator().manual_seed(0)
    z1 = md.reverse_step(logp, z, 0.8, 0.6, MASK, g)
    rate = (z1 != MASK).float().mean().item()
    assert abs(rate - 0.25) < 0.01  # (t - s) / t
    z2 = md.reverse_step(md.subs(torch.randn(*z.shape, V + 1), z1, MASK), z1, 0.6, 0.0, MASK, g)
    assert (z2 != MASK).all(), "s = 0 unmasks everything"
    assert torch.equal(z2[z1 != MASK], z1[z1 != MASK]), "an unmasked token never changes"


def test_per_sequence_times_match_scalar_times():
    z = _z(p=1.0)
    logp = md.subs(torch.randn(16, L, V + 1), z, MASK)
    a = md.reverse_step(logp, z, 0.5, 0.25, MASK, torch.Generator().manual_seed(3))
    b = md.reverse_step(logp, z, torch.full((16,), 0.5), torch.full((16,), 0.25), MASK,
                        torch.Generator().manual_seed(3))
    assert torch.equal(a, b)


@pytest.mark.parametrize("steps", [1, 4, 16])
def test_sampler_unmasks_everything_and_tokens_never_come_back(steps, monkeypatch):
    teacher = tiny_mdlm_teacher()
    history = []
    real = md.reverse_step

    def spy(logp, z, t, s, mask_id, generator, **kw):
        out = real(logp, z, t, s, mask_id, generator, **kw)
        history.append((z.clone(), out.clone()))
        return out

    monkeypatch.setattr(md, "reverse_step", spy)
    out = md.sample_teacher(teacher, torch.zeros(32, 0, dtype=torch.long), md.SamplingConfig(steps=steps),
                            generator=torch.Generator().manual_seed(0))
    assert len(history) == steps
    for before, after in history:
        kept = before != MASK
        assert torch.equal(after[kept], before[kept]), "an unmasked token changed or was masked again"
    assert (out.data != MASK).all() and out.data.shape == (32, L)
    assert out.counters["nfe"] in (32 * steps, 32 * (steps + 1))  # + the noise-removal pass if a token was left


def test_caching_gives_the_same_samples_with_fewer_passes():
    teacher = tiny_mdlm_teacher()
    cond = torch.zeros(8, 0, dtype=torch.long)
    runs = {c: md.sample_teacher(teacher, cond, md.SamplingConfig(steps=64, cache=c),
                                 generator=torch.Generator().manual_seed(1)) for c in (False, True)}
    assert torch.equal(runs[False].data, runs[True].data)
    assert runs[True].counters["nfe"] < runs[False].counters["nfe"]  # 64 steps for 8 tokens: most change nothing


@pytest.mark.parametrize("draw", ["exact", "released-fp32"])
def test_one_step_samples_the_product_of_marginals_exactly(draw):
    """With T = 1 every token is drawn at once from x_theta(all MASK): the sampled joint distribution must be the
    product of the per-position marginals (chi-square), and not the denoiser's joint (a broken 'sequential' sampler
    would match the joint instead); the same for both draws."""
    vocab, n = 2, 2
    probs = torch.tensor([[0.8, 0.2], [0.3, 0.7]])  # per-position marginals

    def denoise(z):
        logits = torch.full((*z.shape, vocab + 1), md.NEG)
        logits[..., :vocab] = probs.log()
        return md.subs(logits, z, vocab)

    N = 20_000
    out = md.sample_ancestral(denoise, torch.zeros(N, 0, dtype=torch.long), n, vocab,
                              md.SamplingConfig(steps=1, draw=draw), generator=torch.Generator().manual_seed(0))
    counts = {seq: 0 for seq in itertools.product(range(vocab), repeat=n)}
    for row in out.data.tolist():
        counts[tuple(row)] += 1
    expected = {s: N * float(probs[0, s[0]] * probs[1, s[1]]) for s in counts}
    chi2 = sum((counts[s] - expected[s]) ** 2 / expected[s] for s in counts)
    assert chi2 < 16.3  # chi-square, 3 dof, p = 0.001
    correlated = {(0, 0): 0.5, (1, 1): 0.5, (0, 1): 1e-9, (1, 0): 1e-9}  # a joint the sampler must not reproduce
    assert sum((counts[s] - N * correlated[s]) ** 2 / (N * correlated[s]) for s in counts) > 1e3


def test_the_float32_race_and_the_float64_draw_differ_and_are_a_named_setting():
    """`draw`: the released samplers' float32 race against the float64 inverse-CDF draw on the same uniforms' source,
    each reproducible; a draw of another name is one line listing the valid ones, as a knob too."""
    from core.config import build_config
    from core.errors import UserError

    teacher = tiny_mdlm_teacher(train_steps=100)
    cond = torch.zeros(64, 0, dtype=torch.long)

    def run(draw, seed=1):
        return md.sample_teacher(teacher, cond, md.SamplingConfig(steps=4, draw=draw),
                                 generator=torch.Generator().manual_seed(seed)).data

    assert torch.equal(run("released-fp32"), run("released-fp32")) and torch.equal(run("exact"), run("exact"))
    assert (run("released-fp32") != run("exact")).float().mean() > 0.3
    # the race itself, in float32: q / E with E = 1e-10 - log(U + 1e-10), argmax (mdlm diffusion.py:24-28)
    q = torch.rand(3, 5, V + 1, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    u = torch.rand(q.shape, generator=torch.Generator().manual_seed(3))
    by_hand = (q.float() / (1e-10 - (u + 1e-10).log())).argmax(-1)
    assert torch.equal(md.released_draw(q, torch.Generator().manual_seed(3)), by_hand)
    assert not torch.equal(md.draw(q, torch.Generator().manual_seed(3)), by_hand)  # broken: the other draw
    with pytest.raises(ValueError, match="^draw must be one of exact, released-fp32, got 'fp16'$"):
        md.SamplingConfig(draw="fp16")
    with pytest.raises(UserError, match="knob 'draw' must be one of exact, released-fp32, got 'fp16'"):
        build_config(md.SamplingConfig, {"draw": "fp16"}, owner="mdlm")
    assert build_config(md.SamplingConfig, {"draw": "released-fp32"}, owner="mdlm").draw == "released-fp32"


def test_nelbo_is_lower_for_a_trained_teacher():
    chunks = tiny_mdlm_teacher().training_chunks(None)[:256]
    from teachers.tiny.text_mdlm import TextMDLMTeacher

    untrained = TextMDLMTeacher.nelbo_per_token(tiny_mdlm_teacher().network, chunks, MASK, seed=0)
    trained = TextMDLMTeacher.nelbo_per_token(tiny_mdlm_teacher(train_steps=200).network, chunks, MASK, seed=0)
    assert trained < untrained - 0.3
