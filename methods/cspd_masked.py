"""CSpD's loop on the masked family (`teachers.families.masked_ar`: MAR's bidirectional random-order sampler; Wang et
al., arXiv:2411.11925).

The first floor(K * prefill) + 1 of the K steps come from the target alone (the released code's
`step <= num_iter * ratio`), on the order and noise MAR's own sampler (`sample_mar`) draws; then, accepted by
`methods.cspd_verify` (Eq. 9-13):
- `released` is the released `SpecDecodeRunner.run`: the draft steps on, reading its own drafts; a window ends at every
  step that is a multiple of gamma and at the last step (so the first one after the pre-fill may be shorter), and
  the target predicts the window from the verified tokens alone (the drafts masked), at the window's last step's CFG
  scale, each drafted token accepted or replaced on its own.
- `exact` and `paper` need one token per step (num_iter 0): the target's law of step i given the prefix and drafts
  1..i-1 comes from one batched pass over gamma + 1 known sets (docs/methods/cspd.md), then Leviathan's truncation,
  which makes `exact` lossless against `sample_mar` on the same order and noise.
The draft denoises on the target's noise (alignment), or, with `align` off (Table 4 "w/o align"), on its own, drawn
after the order.
"""
from __future__ import annotations

import math
from collections import Counter

import torch

from core.acceptance import count_each
from core.samples import Samples
from methods.cspd_verify import accept_each, at_rows, stack, truncate, unflatten
from teachers.families import masked_ar
from teachers.families.continuous_ar import HeadOutput, TokenNoise


def sample(teacher, config, cond: torch.Tensor, generator: torch.Generator) -> Samples:
    """CSpD samples of a `masked_ar` teacher under a `methods.cspd.MaskedCSpDConfig`, for conditions `cond` (B,)."""
    cfg, t = config, teacher
    B, N, D, s = len(cond), t.seq_len, t.token_dim, cfg.sampling
    noise = TokenNoise.draw(B, N, D, s.steps, generator, cond.device)  # as `sample_mar` draws them
    order = masked_ar.GenerationOrder.draw(B, N, s.iterations(N), generator, cond.device)
    own = noise if cfg.align else TokenNoise.draw(B, N, D, s.steps, generator, cond.device)  # the draft's noise
    K, scales = order.n_steps, order.cfg_scales(s)
    tokens = torch.zeros(B, N, D, device=cond.device)
    known = torch.zeros(B, N, dtype=torch.bool, device=cond.device)
    n_pre = min(K, math.floor(K * cfg.prefill) + 1)  # the released code's `step <= num_iter * ratio`
    c = Counter(tokens=B * N, nfe=B * n_pre, head_chains=int((order.step < n_pre).sum()))
    for k in range(n_pre):  # token pre-filling: the target alone, on the same noise
        _step(t.target, s, tokens, known, cond, order, k, scales, noise)
    if cfg.mode == "released":
        _released_windows(t, cfg, tokens, known, cond, order, n_pre, scales, noise, own, generator, c)
    else:
        _leviathan_rounds(t, cfg, tokens, known, cond, order, n_pre, scales, noise, own, generator, c)
    return Samples(tokens, cond, c)


def _step(model, s, tokens, known, cond, order, k: int, scales, noise: TokenNoise) -> HeadOutput:
    """One step of MAR's sampler with `model` under sampling settings s, in place: the positions of step k predicted
    from the known ones."""
    z = model.condition(tokens, known, cond, guided=s.cfg != 1)
    rows, pos = (order.step == k).nonzero(as_tuple=True)
    out = model.denoise(z[rows, pos], *noise.at(rows, pos), s, float(scales[k]))
    tokens[rows, pos] = out.x0
    known[rows, pos] = True
    return out


def _released_windows(t, cfg, tokens, known, cond, order, k: int, scales, noise, own, generator,
                      c: Counter) -> None:
    """The released `SpecDecodeRunner.run` after the pre-fill: the draft steps on (reading its own drafts, on its
    noise `own`); at every step that is a multiple of gamma (not 0) and at the last, the target predicts the window
    (the steps since the last verification) from the verified tokens alone, at the CFG scale of the window's last
    step, and every window token is accepted or replaced on its own."""
    s, K, (B, N, _) = cfg.sampling, order.n_steps, tokens.shape
    q = HeadOutput(tokens.clone(), torch.zeros_like(tokens), torch.zeros_like(tokens),
                   torch.zeros(B, N, device=tokens.device))  # the draft's last-step Gaussians by position
    verified = known.clone()
    while k < K:
        end = next(j for j in range(k, K) if (j % cfg.gamma == 0 and j != 0) or j == K - 1)
        for j in range(k, end + 1):
            out = _step(t.draft, s, tokens, known, cond, order, j, scales, own)
            rows, pos = (order.step == j).nonzero(as_tuple=True)
            for f in HeadOutput.__dataclass_fields__:
                getattr(q, f)[rows, pos] = getattr(out, f)
        rows, pos = (known & ~verified).nonzero(as_tuple=True)
        z = t.target.condition(tokens, verified, cond, guided=s.cfg != 1)
        p = t.target.denoise(z[rows, pos], *noise.at(rows, pos), s, float(scales[end]))
        tokens[rows, pos], ok = accept_each(cfg, tokens[rows, pos], p, at_rows(q, rows, pos), generator, c)
        count_each(c, order.step[rows, pos] - k + 1, ok, B)  # position: the draft step in the window
        c.update(nfe=B, draft_nfe=B * (end + 1 - k), head_chains=len(rows), draft_head_chains=len(rows),
                 drafts=len(rows))
        verified, k = known.clone(), end + 1


def _leviathan_rounds(t, cfg, tokens, known, cond, order, k: int, scales, noise, own, generator,
                      c: Counter) -> None:
    """`exact` and `paper` with one token per step: per row, gamma draft steps (on the draft's noise `own`), then
    one target pass over gamma + 1 known sets (the prefix, then each draft added) gives p of every drafted step and
    of the bonus step; Leviathan's truncation at the first rejection. Rows move on at their own pace."""
    s, g_max = cfg.sampling, cfg.gamma
    B, N, _ = tokens.shape
    seq = order.step.argsort(dim=1)  # (B, N): the position of step j
    rows = torch.arange(B if k < N else 0, device=tokens.device)
    step = torch.full((len(rows),), k, device=tokens.device)  # each row's next step
    guided = s.cfg != 1
    while len(rows):
        M, g = len(rows), min(g_max, int((N - step).min()))
        ar = torch.arange(M, device=tokens.device)
        work, seen, outs = tokens[rows], known[rows], []
        for j in range(g):
            z = t.draft.condition(work, seen, cond[rows], guided=guided)
            pos = seq[rows, step + j]
            outs.append(t.draft.denoise(z[ar, pos], *own.at(rows, pos), s, scales[step + j]))
            work[ar, pos], seen[ar, pos] = outs[-1].x0, True
        q = stack(outs)
        slots = torch.arange(g + 1, device=tokens.device)
        at = (step[:, None] + slots).clamp(max=N - 1)  # (M, g+1) the steps verified, then the bonus step
        pos = seq[rows[:, None], at]
        sets = known[rows][:, None].repeat(1, g + 1, 1)  # (M, g+1, N): the prefix, then each draft added
        for i in range(g):
            sets[ar[:, None], slots[None, i + 1:], pos[:, i, None]] = True
        z = t.target.condition(work.repeat_interleave(g + 1, 0), sets.flatten(0, 1),
                               cond[rows].repeat_interleave(g + 1, 0), guided=guided).unflatten(0, (M, g + 1))
        z = z[ar[:, None], slots[None], pos]  # (M, g+1, branches, d): each slot's own position
        x_T, eps = noise.at(rows[:, None].expand(M, g), pos[:, :g])
        p = unflatten(t.target.denoise(z[:, :g].flatten(0, 1), x_T.flatten(0, 1), eps.flatten(0, 1), s,
                                       scales[at[:, :g]].flatten()), M)
        c.update(nfe=M, target_rows=M * (g + 1), draft_nfe=M * g, head_chains=M * g, draft_head_chains=M * g,
                 drafts=M * g)

        def bonus(b):  # the target's own token at the step after g accepted drafts, rows b
            return t.target.denoise(z[b, g], *noise.at(rows[b], pos[b, g]), s, scales[at[b, g]]).x0

        new, n_new = truncate(cfg, q.x0, p, q, step + g < N, bonus, generator, c)
        put = slots[None] < n_new[:, None]  # (M, g+1)
        r, cols = rows[:, None].expand_as(pos)[put], pos[put]
        tokens[r, cols], known[r, cols] = new[put], True
        step = step + n_new
        live = step < N
        rows, step = rows[live], step[live]
