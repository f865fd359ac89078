"""Per-token flow matching of Distilled Decoding (arXiv:2412.17153, Sec. 3.2) and the Prop. 3.1 two-token toy."""
import math

import pytest
import torch

from core.cache import Cache
from methods.dd_pairs import PairConfig, generate_pairs, map_noise
from methods.onestep import OneStep, OneStepConfig
from methods.dd_token_flow import FlowConfig, flow_map, velocity
from teachers.families import ar_token
from tests.fakes import NO_CHECKPOINTS

V, C, N_NOISE = 32, 8, 20_000
SOLVER_SLACK = 0.015  # measured TV above an i.i.d. sample: <= 0.008 for dpm++2m-10, <= 0.003 for the others


@pytest.fixture(scope="module")
def target():
    """A random unit codebook (V, C), Dirichlet(1) probabilities (V,) and N_NOISE noises (N_NOISE, C)."""
    g = torch.Generator().manual_seed(0)
    codebook = torch.nn.functional.normalize(torch.randn(V, C, generator=g), dim=-1)
    p = torch._standard_gamma(torch.ones(V, dtype=torch.float64), generator=g)
    return codebook, p / p.sum(), torch.randn(N_NOISE, C, generator=g)


def tv(ids, p):
    return 0.5 * (torch.bincount(ids, minlength=len(p)).double() / len(ids) - p).abs().sum().item()


def iid_tv(p, n):
    """E[TV] of n i.i.d. draws from p (normal approximation of E|Bin(n, p)/n - p|)."""
    return 0.5 * torch.sqrt(2 * p * (1 - p) / (math.pi * n)).sum().item()


@pytest.mark.parametrize("cfg", [FlowConfig("euler", 100), FlowConfig("dpm++2m", 10), FlowConfig("dpm++3m", 10)],
                         ids=["euler-100", "dpm++2m-10", "dpm++3m-10"])
def test_corrected_flow_map_reproduces_the_categorical(target, cfg):
    codebook, p, noise = target
    ids = flow_map(noise, p.float().expand(N_NOISE, V), codebook, cfg)
    assert tv(ids, p) <= iid_tv(p, N_NOISE) + SOLVER_SLACK  # about 0.014 + 0.015


def test_printed_eq3_does_not(target):
    codebook, p, noise = target
    ids = flow_map(noise, p.float().expand(N_NOISE, V), codebook, FlowConfig("euler", 100, field="printed"))
    assert tv(ids, p) >= 0.3  # measured 0.47-0.79 over seeds


def test_flow_map_is_deterministic_and_row_wise(target):
    codebook, p, noise = target
    probs = p.float().expand(N_NOISE, V)
    ids = flow_map(noise, probs, codebook, FlowConfig())
    assert torch.equal(ids, flow_map(noise, probs, codebook, FlowConfig()))
    assert torch.equal(ids[:100], flow_map(noise[:100], probs[:100], codebook, FlowConfig()))


def test_top_k_truncated_target(target):
    codebook, p, noise = target
    probs = ar_token.process(p.log().float(), ar_token.SamplingConfig(top_k=5))  # 27 codes at p = 0
    ids = flow_map(noise, probs.expand(N_NOISE, V), codebook, FlowConfig())
    assert probs[ids].min() > 0
    assert tv(ids, probs.double()) <= iid_tv(probs.double(), N_NOISE) + SOLVER_SLACK


def test_velocity_is_the_marginal_field_and_stays_finite_near_t1(target):
    """Against autograd: E[x_1 | x_t = x] = (x + (1-t)^2 grad log p_t(x)) / t (Tweedie), V = (E[x_1|x] - x) / (1-t)."""
    codebook, p, noise = target
    x = noise[:64].double().requires_grad_()
    cb = codebook.double()
    for t in (0.1, 0.5, 0.9):
        # p_t = sum_j p_j N(t c_j, (1-t)^2 I), the law of (1-t) eps + t x_1
        log_pt = torch.logsumexp(p.log() - (x[:, None] - t * cb).square().sum(-1) / (2 * (1 - t) ** 2), -1).sum()
        score, = torch.autograd.grad(log_pt, x)
        x1_hat = (x + (1 - t) ** 2 * score) / t
        torch.testing.assert_close(velocity(x.detach(), t, p.expand(64, V), cb), (x1_hat - x).detach() / (1 - t))
    probs = ar_token.process(p.log().float(), ar_token.SamplingConfig(top_k=3)).expand(64, V)
    assert torch.isfinite(velocity(noise[:64], 1 - 1e-7, probs, codebook)).all()


class TwoTokenToy:
    """The paper's toy (Sec. 3.1) through the family protocol: x1 uniform on {0, 1}, then x2 = x1."""

    family = ar_token.FAMILY
    ragged_cache = False  # one length for the batch
    seq_len, vocab_size, grid = 2, 2, (1, 2)
    codebook = torch.tensor([[1.0, 0.0, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0]])

    def conditions(self, n, generator):
        return torch.zeros(n, 1, dtype=torch.long)

    def start(self, cond, *, cfg):
        return {"length": 0}, torch.zeros(len(cond), 2)

    def extend(self, state, tokens):
        state["length"] += tokens.shape[1]
        return torch.log(torch.nn.functional.one_hot(tokens, 2).float())  # (B, L, V): delta at the last token

    def rollback(self, state, length):
        state["length"] = length


def test_two_token_toy_pairs_are_valid_and_onestep_star_is_not(tmp_path):
    toy, s = TwoTokenToy(), ar_token.SamplingConfig()
    pairs = generate_pairs(toy, s, PairConfig(n_pairs=2000, batch=500), cache=Cache(tmp_path), noise=True)
    noise = pairs.noise.read("noise", torch.arange(500, 1000))  # the second generation batch
    assert pairs.tokens.shape == (2000, 2) and pairs.noise.n == 2000 and noise.shape == (500, 2, 4)
    assert (pairs.tokens[:, 0] == pairs.tokens[:, 1]).all()  # 100 % valid
    assert 0.45 < pairs.tokens[:, 0].float().mean() < 0.55
    assert torch.equal(map_noise(toy, noise, pairs.cond[500:1000], s, FlowConfig()), pairs.tokens[500:1000])

    method = OneStep(toy, OneStepConfig(n_pairs=2000))
    method.fit(cache=Cache(tmp_path), checkpoints=NO_CHECKPOINTS)
    out = method.sample(toy.conditions(2000, None), generator=torch.Generator().manual_seed(0))
    invalid = (out.data[:, 0] != out.data[:, 1]).float().mean().item()
    assert 0.4 < invalid < 0.6  # Prop. 3.1: (0,1) and (1,0) as likely as (0,0) and (1,1)
