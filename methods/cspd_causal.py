"""CSpD's loop on the causal family (`teachers.families.continuous_ar`: a MAR-style continuous-token AR teacher with a
KV cache; Wang et al., arXiv:2411.11925).

The first floor(N * prefill) + 1 tokens come from the target alone (token pre-filling, the released code's count).
Then, per round, the draft drafts gamma tokens; the target reads them in one transformer pass and runs its diffusion
head on the same noise per position (trajectory alignment: shared x_T and eps_t), and `methods.cspd_verify` accepts
them (Eq. 9-13). `exact` and `paper` truncate at the first rejection (Algorithm 1, fixed: a bonus token when every
draft is accepted) and roll both caches back to the committed tokens, each row at its own pace; `released` accepts or
replaces every draft on its own, so rows advance gamma tokens in lockstep and re-read from the first replaced one.
Here the target reads the drafts, as the paper's text says of MAR, where the released MAR code conditions it on the
verified prefix only (`caveat.cspd_released_conditioning`).
With `align` off (Table 4 "w/o align") the draft denoises on its own noise, drawn after the target's.
"""
from __future__ import annotations

import math
from collections import Counter

import torch

from core.samples import Samples
from methods.cspd_verify import replace_each, stack, truncate, unflatten
from teachers.families.continuous_ar import HeadOutput, TokenNoise


def sample(teacher, config, cond: torch.Tensor, generator: torch.Generator) -> Samples:
    """CSpD samples of a `continuous_ar` teacher under a `methods.cspd.CSpDConfig`, for conditions `cond` (B,)."""
    cfg, t = config, teacher
    B, N, D, s = len(cond), t.seq_len, t.token_dim, cfg.sampling
    noise = TokenNoise.draw(B, N, D, s.steps, generator, cond.device)  # as the target-alone sampler draws it
    own = noise if cfg.align else TokenNoise.draw(B, N, D, s.steps, generator, cond.device)  # the draft's noise
    tokens = torch.empty(B, N, D, device=cond.device)
    c = Counter(tokens=B * N, nfe=B, draft_nfe=B)  # the two condition prefills
    n_pre = min(N, math.floor(N * cfg.prefill) + 1)
    tgt, z = t.target.start(cond, cfg=s.cfg)
    drf, _ = t.draft.start(cond, cfg=s.cfg)
    for i in range(n_pre):  # token pre-filling: the target alone, on the same noise
        tokens[:, i] = t.target.denoise(z, noise.x_T[:, i], noise.eps[:, i], s).x0
        if i + 1 < n_pre:
            z = t.target.extend(tgt, tokens[:, i : i + 1])[:, 0]
    c.update(nfe=B * (n_pre - 1), head_chains=B * n_pre)
    if n_pre > 1:  # the draft reads what the target read, in one pass
        t.draft.extend(drf, tokens[:, : n_pre - 1])
        c["draft_nfe"] += B
    # Per unfinished row: `length` tokens committed; both models have read all but the last k = pending.shape[1].
    rows = torch.arange(B if n_pre < N else 0, device=cond.device)
    length = torch.full((len(rows),), n_pre, device=cond.device)
    pending = tokens[rows, n_pre - 1 : n_pre]  # (M, k, D)
    while len(rows):
        M, k, g = len(rows), pending.shape[1], min(cfg.gamma, int((N - length).min()))
        drafts, q = _draft(t.draft, s, drf, pending, rows, length, g, own, c)
        z = t.target.extend(tgt, torch.cat([pending, drafts], 1))[:, k - 1 :]  # (M, g+1, branches, d)
        x_T, eps = noise.at(rows[:, None].expand(M, g), length[:, None] + torch.arange(g, device=cond.device))
        p = unflatten(t.target.denoise(z[:, :g].flatten(0, 1), x_T.flatten(0, 1), eps.flatten(0, 1), s), M)
        c.update(nfe=M, head_chains=M * g, drafts=M * g)
        if cfg.mode == "released":  # rows advance in lockstep; re-read from the first replaced token on
            new, reread = replace_each(cfg, drafts, p, q, generator, c)
            n_new, keep, next_pending = torch.full_like(length, g), length + reread, new[:, reread:g]
        else:
            def bonus(b):  # the target's own token after g accepted drafts, rows b
                return t.target.denoise(z[b, g], *noise.at(rows[b], length[b] + g), s).x0

            new, n_new = truncate(cfg, drafts, p, q, length + g < N, bonus, generator, c)
            keep = length + n_new - 1  # the last committed token is the next pending one
            next_pending = new.gather(1, (n_new - 1)[:, None, None].expand(M, 1, D))
            if (keep > drf.length).any():  # a row took every draft and a bonus: the draft must read its last
                t.draft.extend(drf, drafts[:, -1:])
                c["draft_nfe"] += M
        slot = torch.arange(g + 1, device=cond.device)
        put = slot[None] < n_new[:, None]  # (M, g+1)
        pos = (length[:, None] + slot).clamp(max=N - 1)
        tokens[rows[:, None].expand_as(pos)[put], pos[put]] = new[put]
        length, pending = length + n_new, next_pending
        t.target.rollback(tgt, keep)
        t.draft.rollback(drf, keep)
        live = (length < N).nonzero().squeeze(1)
        if len(live) < M:
            rows, length, pending = rows[live], length[live], pending[live]
            t.target.select(tgt, live)
            t.draft.select(drf, live)
    return Samples(tokens, cond, c)


def _draft(draft, s, drf, pending, rows, length, g, noise: TokenNoise, c: Counter) -> tuple[torch.Tensor, HeadOutput]:
    """g tokens per row from the `draft` model under sampling settings s, each on its position's noise: (M, g, D) and
    the draft's head outputs (M, g, ...)."""
    M = len(rows)
    z = draft.extend(drf, pending)[:, -1]
    outs = []
    for j in range(g):
        outs.append(draft.denoise(z, *noise.at(rows, length + j), s))
        if j + 1 < g:
            z = draft.extend(drf, outs[-1].x0[:, None])[:, 0]
    c.update(draft_nfe=M * g, draft_head_chains=M * g)
    q = stack(outs)
    return q.x0, q
