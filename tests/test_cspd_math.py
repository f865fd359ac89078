"""CSpD math (Continuous Speculative Decoding, Wang et al., arXiv:2411.11925): the pure functions of
methods/cspd_verify.py.

Speculative sampling between Gaussians and a mixture is exact, the Sigma-weighted residual sampler (Eq. 13) draws from
max(0, Sigma p - q) / Z, Theorem 1 and Eq. 7 of the trajectory alignment hold, the max_tries fallback is flagged, and
the paper's Sigma rule (Eq. 8) is biased unless the two models' step stds agree
(docs/methods/cspd.md).
"""
import math

import numpy as np
import pytest
import torch
from scipy import stats
from scipy.integrate import cumulative_trapezoid, trapezoid

from methods.cspd_verify import acceptance_log_ratio, log_density, log_sigma, residual_sample
from teachers.networks.diffusion_head import HeadOutput

N = 100_000
KS_OK, KS_BIASED = 1e-3, 1e-6  # p-value floors: an exact sampler passes, a biased one is rejected
GRID = np.linspace(-20, 20, 400_001)  # for TV, Z and CDFs: the densities below are negligible outside
P, Q = stats.norm(0.0, 1.0), stats.norm(0.7, 1.3)
T, LAM = 20, 0.15  # the toy chain's steps and pull towards its mean


def gen(seed):
    return torch.Generator().manual_seed(seed)


def head(x0, mean, std, log_std_sum=0.0):
    """HeadOutput of one last-step Gaussian per row of x0 (n, D); mean / std broadcast to x0."""
    full = lambda v: torch.as_tensor(v, dtype=x0.dtype).expand_as(x0)  # noqa: E731
    return HeadOutput(x0, full(mean), full(std).log(), torch.as_tensor(log_std_sum, dtype=x0.dtype).expand(len(x0)))


def gauss_residual(p, q, mode, ignore_q=False):
    """residual_sample's first four arguments for some rows of p, q, proposing from p's last step as CSpD._residual
    does; ignore_q plants a bug: alpha_s = 1, so the residual is plain p."""
    def args(rows, g):
        mp, lp, mq, lq = p.mean[rows], p.log_std[rows], q.mean[rows], q.log_std[rows]
        propose = lambda m: mp + lp.exp() * torch.randn(mp.shape, generator=g, dtype=mp.dtype)  # noqa: E731
        log_q = (lambda x: torch.full(x.shape[:1], -math.inf)) if ignore_q else (lambda x: log_density(x, mq, lq))
        return propose, lambda x: log_density(x, mp, lp), log_q, log_sigma(p, q, mode)[rows]
    return args


def speculate(x, log_r, residual_args, g, max_tries=10_000):
    """One speculative step per row: keep the draft x (n, D) if log u < log r, else a residual sample."""
    ok = torch.rand(len(x), generator=g).log() < log_r
    rej = (~ok).nonzero().squeeze(1)
    y, tries, exhausted = residual_sample(*residual_args(rej, g), g, max_tries)
    assert not exhausted.any()  # a capped row is not a residual sample; the cap has its own test
    out = x.clone()
    out[rej] = y
    return out, ok, tries


def ks(x, cdf):
    return stats.kstest(x[:, 0].numpy(), cdf).pvalue


def test_gaussian_speculative_sampling_is_exact():
    g = gen(0)
    x = 0.7 + 1.3 * torch.randn(N, 1, generator=g)
    p, q = head(x, 0.0, 1.0), head(x, 0.7, 1.3)
    out, ok, tries = speculate(x, acceptance_log_ratio(x, p, q, "exact", 1.0), gauss_residual(p, q, "exact"), g)
    tv = 0.5 * trapezoid(np.abs(P.pdf(GRID) - Q.pdf(GRID)), GRID)
    assert ks(out, P.cdf) > KS_OK
    assert abs(ok.float().mean().item() - (1 - tv)) < 0.01  # P(accept) = int min(p, q)
    # each proposal is kept with probability int p max(0, 1 - q/p) = TV, so tries ~ Geometric(TV)
    assert abs(tries.float().mean().item() * tv - 1) < 0.03
    assert abs((tries == 1).float().mean().item() - tv) < 0.01


def test_residual_that_ignores_q_is_detected():
    # the same run with a planted bug: rejected tokens redrawn from p itself give min(p, q) + TV p, not p
    g = gen(0)
    x = 0.7 + 1.3 * torch.randn(N, 1, generator=g)
    p, q = head(x, 0.0, 1.0), head(x, 0.7, 1.3)
    out, _, _ = speculate(x, acceptance_log_ratio(x, p, q, "exact", 1.0), gauss_residual(p, q, "exact", True), g)
    assert ks(out, P.cdf) < KS_BIASED


def test_mixture_target_speculative_sampling_is_exact():
    # residual_sample only sees callables, so a target that is no Gaussian (nor what log_sigma reads) must work too
    g, w, mu, sd = gen(1), torch.tensor([0.4, 0.6]), torch.tensor([-1.5, 1.2]), torch.tensor([0.6, 0.8])
    log_p = lambda x: torch.logsumexp(w.log() + log_density(x[:, None], mu[:, None], sd.log()[:, None]), 1)  # noqa
    log_q = lambda x: log_density(x, torch.zeros(1), torch.tensor([1.5]).log())  # noqa: E731

    def propose(m):
        k = torch.multinomial(w, m, replacement=True, generator=g)
        return (mu[k] + sd[k] * torch.randn(m, generator=g))[:, None]

    x = 1.5 * torch.randn(N, 1, generator=g)
    out, _, _ = speculate(x, log_p(x) - log_q(x), lambda rows, g: (propose, log_p, log_q, torch.zeros(len(rows))), g)
    assert ks(out, lambda v: 0.4 * stats.norm.cdf(v, -1.5, 0.6) + 0.6 * stats.norm.cdf(v, 1.2, 0.8)) > KS_OK


@pytest.mark.parametrize("mode", ["exact", "paper", "released"])
def test_identical_draft_is_always_accepted(mode):
    g = gen(2)
    mean, log_std = torch.randn(N, 4, generator=g), 0.3 * torch.randn(N, 4, generator=g)
    x = mean + log_std.exp() * torch.randn(N, 4, generator=g)
    p = HeadOutput(x, mean, log_std, torch.randn(N, generator=g))
    q = HeadOutput(x, mean.clone(), log_std.clone(), p.log_std_sum.clone())
    log_r = acceptance_log_ratio(x, p, q, mode, 42.0)
    assert (log_r == 0).all()
    assert (torch.rand(N, generator=g).log() < log_r).all()  # u < 1: no token ever needs the residual sampler


def test_log_sigma_conventions():
    x = torch.zeros(2, 1)
    p, q = head(x, 0.0, 1.0, torch.tensor([0.5, -2.0])), head(x, 0.0, 1.0, torch.tensor([1.5, 1.0]))
    assert torch.equal(log_sigma(p, q, "exact"), torch.zeros(2))
    assert torch.equal(log_sigma(p, q, "paper"), torch.tensor([1.0, 3.0]))  # Eq. 8: prod sqrt|S_q| / prod sqrt|S_p|
    assert torch.equal(log_sigma(p, q, "released"), torch.tensor([-1.0, -3.0]))  # the released code's reciprocal


def test_sigma_weighted_residual_follows_max_sigma_p_minus_q():
    g, sig, z = gen(3), 1.7, torch.zeros(N, 1)
    p, q = head(z, 0.0, 1.0), head(z, 0.7, 1.3, math.log(sig))  # paper mode: log Sigma = log 1.7 on every row
    y, tries, exhausted = residual_sample(*gauss_residual(p, q, "paper")(torch.arange(N), g), g, 10_000)
    dens = np.maximum(0, sig * P.pdf(GRID) - Q.pdf(GRID))
    mass = trapezoid(dens, GRID)
    ecdf = np.searchsorted(np.sort(y[:, 0].numpy()), GRID, side="right") / N
    assert not exhausted.any()
    assert np.abs(cumulative_trapezoid(dens, GRID, initial=0) / mass - ecdf).max() < 0.01
    assert abs(tries.float().mean().item() * mass / sig - 1) < 0.03  # P(keep) = int p alpha_s = Z / Sigma


@pytest.mark.parametrize("log_sig", [100.0, -100.0])
def test_extreme_sigma_stays_in_log_space(log_sig, monkeypatch):
    # |log Sigma| reaches ~80 on MAR and exp overflows float32 above 88 (docs/methods/cspd.md): alpha_s must stay in
    # [0, 1], and log r must stay finite
    g, M, tries_cap = gen(4), 10_000, 5
    z = torch.zeros(M, 1)
    p, q = head(z, 0.0, 1.0), head(z, 0.7, 1.3, log_sig)
    seen, rand = [], torch.rand

    class Uniforms:  # residual_sample keeps alpha_s internal; it only shows when compared with the uniforms
        def __init__(self, u):
            self.u = u

        def __lt__(self, alpha):
            seen.append(alpha)
            return self.u < alpha

    monkeypatch.setattr(torch, "rand", lambda *a, **k: Uniforms(rand(*a, **k)))
    y, tries, exhausted = residual_sample(*gauss_residual(p, q, "paper")(torch.arange(M), g), g, tries_cap)
    monkeypatch.undo()
    alpha = torch.cat(seen)
    assert len(seen) and not alpha.isnan().any() and ((alpha >= 0) & (alpha <= 1)).all()
    assert torch.isfinite(y).all()
    if log_sig > 0:  # Sigma p >> q everywhere: every first proposal is kept
        assert (alpha == 1).all() and (tries == 1).all() and not exhausted.any()
    else:  # Sigma p << q everywhere: the residual has no mass
        assert (alpha == 0).all() and (tries == tries_cap).all() and exhausted.all()
    x = 0.7 + 1.3 * torch.randn(M, 1, generator=g)
    log_r = acceptance_log_ratio(x, p, q, "paper", 1.0)
    torch.testing.assert_close(log_r - log_sig, acceptance_log_ratio(x, p, q, "exact", 1.0))


def test_max_tries_flags_exhausted_rows_and_returns_the_last_proposal():
    # the released code returns a zero token here; cspd_verify.py must return a real proposal and count the row
    g, M, proposals = gen(8), 2000, []

    def propose(m):
        proposals.append(torch.randn(m, 1, generator=g))
        return proposals[-1]

    log_p = lambda x: log_density(x, torch.zeros(1), torch.zeros(1))  # noqa: E731
    log_q = lambda x: log_density(x, torch.full((1,), 0.01), torch.zeros(1))  # q = p shifted: alpha_s <= ~0.01  # noqa
    y, tries, exhausted = residual_sample(propose, log_p, log_q, torch.zeros(M), g, max_tries=2)
    assert len(proposals) == 2 and exhausted.float().mean() > 0.95
    assert (tries[exhausted] == 2).all() and ((tries >= 1) & (tries <= 2)).all()
    assert torch.equal(y, torch.stack(proposals)[tries - 1, torch.arange(M)])  # the kept proposal, else the last one
    assert torch.isfinite(y).all() and (y[exhausted] != 0).all() and y[exhausted].std() > 0.5


def chain(x_T, eps, m, s):
    """A linear-Gaussian reverse chain x_{k-1} = (1 - LAM) x_k + LAM m + s eps_k, its last step sampled, as a
    token's HeadOutput; eps (T, n, 1), eps[0] the last step's."""
    x = x_T
    for k in range(T - 1, 0, -1):
        x = (1 - LAM) * x + LAM * m + s * eps[k]
    mean = (1 - LAM) * x + LAM * m
    return head(mean + s * eps[0], mean, s, (T - 1) * math.log(s))


def chain_marginal(m, s):
    mu, var = 0.0, 1.0
    for _ in range(T):
        mu, var = (1 - LAM) * mu + LAM * m, (1 - LAM) ** 2 * var + s**2
    return stats.norm(mu, math.sqrt(var))


@pytest.mark.parametrize("mode, draft_std, exact",
                         [("exact", 0.23, True), ("paper", 0.23, False), ("paper", 0.2, True)])
def test_linear_gaussian_chain(mode, draft_std, exact):
    # Given the shared noise both last steps are plain Gaussians, so Sigma := 1 is Leviathan's rule and exact; the
    # paper's Sigma = prod s_q / prod s_p is 1 only when the step stds agree (docs/methods/cspd.md, 'Numerics')
    g = gen(5)
    x_T, eps = torch.randn(N, 1, generator=g), torch.randn(T, N, 1, generator=g)
    p, q = chain(x_T, eps, 0.0, 0.2), chain(x_T, eps, 0.3, draft_std)
    out, ok, _ = speculate(q.x0, acceptance_log_ratio(q.x0, p, q, mode, 1.0), gauss_residual(p, q, mode), g)
    pvalue = ks(out, chain_marginal(0.0, 0.2).cdf)
    if exact:
        assert pvalue > KS_OK and (~ok).float().mean() > 0.1  # the residual path carried real weight
    else:
        assert pvalue < KS_BIASED


def test_theorem1_alignment_reduces_distance():
    g, D, n, f64 = gen(6), 8, 200_000, torch.float64
    mu_p, mu_q = torch.randn(D, generator=g, dtype=f64), torch.randn(D, generator=g, dtype=f64)
    sp, sq = 0.2 + 1.5 * torch.rand(D, generator=g, dtype=f64), 0.2 + 1.5 * torch.rand(D, generator=g, dtype=f64)
    e1, e2 = torch.randn(n, D, generator=g, dtype=f64), torch.randn(n, D, generator=g, dtype=f64)
    unaligned = (mu_q + sq * e2 - mu_p - sp * e1).pow(2).sum(1).mean()
    aligned = (mu_q + sq * e1 - mu_p - sp * e1).pow(2).sum(1).mean()
    base = (mu_q - mu_p).pow(2).sum() + (sp**2 + sq**2).sum()  # ||dmu||^2 + tr(S_p + S_q)
    assert abs(unaligned / base - 1) < 0.02
    assert abs(aligned / (base - 2 * (sp * sq).sum()) - 1) < 0.02  # tr sqrt(S_p S_q) = sum s_p s_q for diagonals


@pytest.mark.parametrize("scale", [1.0, 42.0])
def test_eq7_shared_noise_density_ratio_is_the_std_ratio(scale):
    g, f64 = gen(7), torch.float64
    mu_p, mu_q, eps = (3 * torch.randn(1000, 16, generator=g, dtype=f64) for _ in range(3))
    lp, lq = (0.7 * torch.randn(1000, 16, generator=g, dtype=f64) for _ in range(2))
    diff = log_density(mu_p + lp.exp() * eps, mu_p, lp, scale) - log_density(mu_q + lq.exp() * eps, mu_q, lq, scale)
    torch.testing.assert_close(diff, lq.sum(1) - lp.sum(1), atol=1e-5, rtol=0)
    # scale divides the exponent only (the released code's inner temperature): N(mean, (scale std)^2) up to D log scale
    ref = torch.distributions.Normal(mu_p, lp.exp() * scale).log_prob(eps).sum(1) + 16 * math.log(scale)
    torch.testing.assert_close(log_density(eps, mu_p, lp, scale), ref)
