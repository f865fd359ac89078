"""`sjd-pac`: SJD with Proactive drafting and Adaptive Continuation (Kang et al., arXiv:2603.18599),
`docs/methods/sjd_pac.md`.

SJD (`methods.sjd`) with two changes to what a pass verifies, as the release implements them for Lumina-mGPT
(KangJialiang/SJD-PAC @ 4fbc099, scheduler/sjd_pac_iteration_lumina_mgpt.py, "PAC" below):

- proactive drafting (`tree_width` K, `tree_depth` D): the D - 1 positions after the pending token carry K candidate
  tokens each, drawn without replacement (PAC:208), and a pass verifies every combination of them, the K^(D-1)
  root-to-leaf paths of a K-ary tree (PAC:362-424); the first path, all first candidates, goes on as a chain to the
  end of the window, which the tree's other nodes shorten (PAC:370-376). At a position the candidates are tried in
  order, each against the residual the earlier ones left (recursive rejection sampling: the target of candidate k is
  max(0, p - q) of candidate k - 1, its draft law q with the earlier candidates removed, PAC:151-164).
- adaptive continuation (`continuation`): verification goes on past the first rejection, as SCD's maximal coupling
  (`methods.scd`): a later draft is kept with probability min(1, p/q) or redrawn from the residual, and the kept or
  redrawn token is the next pass's first candidate there, with draft law p (PAC:181-220).

Fresh drafts are uniform over the teacher's draft vocabulary with that uniform as their draft law (PAC:346-358, :204),
where SJD's release gives them a one-hot law: exact either way, and a uniform law accepts V times more often.

The release's verifier (PAC:140-222) departs from the exact rule in four places; `mode: released` keeps them, `exact`
is the rule the paper states (the enumeration behind each: `docs/methods/sjd_pac.md`):

1. every path is verified on its own, with one uniform per tree node (PAC:168), and the path accepted furthest wins
   (PAC:175-176), where recursive rejection sampling stops at each position at the first accepted candidate;
2. the other candidates of a continued position are drawn from the residual max(0, p - q) but verified as drawn from
   p (PAC:197, 208-220);
3. where a continued tree position is rejected, its residual is the one left after all K candidates (PAC:186-195,
   `last_siblings`), though only the first was tested;
4. after the main path accepts every draft, the next token is drawn from max(0, p - q) with the q of a position that
   had no draft (PAC:197-207), not from p.

The tree is verified as K^(D-1) rows of one batched pass (each row one path, the cache's row repeated for it and
the winning row kept after), not with the release's tree attention mask: the same passes and the same law, at K^(D-1)
times the tokens a pass computes, so FLOPs and wall speed-ups here are those of this implementation, below the
release's. K = 4, D = 3 and a window of 64 are the paper table's (README:31, 153); the release's scripts default to
K = 3 (test_lumina_mgpt.py:52, PAC:569).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import ClassVar, Literal

import torch

from core.acceptance import count_prefix
from core.errors import UserError
from core.samples import Samples
from methods.base import Passes
from methods.sjd import SJD, SJDConfig, batch_refusal, random_tokens
from methods.verify import residual
from teachers.families import ar_token
from teachers.families.ar_token import draw, process

Mode = Literal["released", "exact"]


def tree_nodes(K: int, D: int) -> int:
    """Nodes of a K-ary tree of D levels, the root included (PAC:363-366)."""
    return D if K == 1 else (K**D - 1) // (K - 1)


@dataclass(frozen=True)
class SJDPACConfig(SJDConfig):
    window: int = 64  # L, the pending token included: README:153 (the table's); eval_model.py:69 defaults to 16
    tree_width: int = 4  # K: README:31, 153; the scripts' default is 3 (test_lumina_mgpt.py:52)
    tree_depth: int = 3  # D, the root (the pending token) included: README:31, test_lumina_mgpt.py:53
    continuation: bool = True  # adaptive continuation; False: SJD's refinement after the first rejection (Eq. 3)
    mode: Mode = "released"  # `exact`: the rule without the release's four departures (module doc)
    verify_modes: ClassVar[tuple[str, ...]] = ("exact",)

    def __post_init__(self):
        super().__post_init__()
        if self.tree_width < 1 or self.tree_depth < 1:
            raise ValueError(f"tree_width and tree_depth must be >= 1, got {self.tree_width}, {self.tree_depth}")
        if tree_nodes(self.tree_width, self.tree_depth) > self.window:
            raise ValueError(f"a tree of width {self.tree_width} and depth {self.tree_depth} has "
                             f"{tree_nodes(self.tree_width, self.tree_depth)} nodes, more than the window of "
                             f"{self.window} (PAC:370-374)")
        if self.init != "random" or self.ar_head or self.ar_tail or not self.refine:
            raise ValueError("sjd-pac drafts as its release does: init must be random, ar_head and ar_tail 0 and "
                             "refine true")


def without_replacement(q: torch.Tensor, first: torch.Tensor, k: int, generator) -> torch.Tensor:
    """k tokens (M, k) drawn one after another without replacement from q (M, V) with `first` (M,) already drawn
    (Gumbel top-k over q with `first` removed); -1 where q's support runs out."""
    u = torch.rand(q.shape, generator=generator, device=q.device).clamp_(min=torch.finfo().tiny)
    keys = q.log() - (-u.log()).log()
    keys.scatter_(1, first[:, None], -torch.inf)
    top = keys.topk(k, dim=1)
    return torch.where(top.values > -torch.inf, top.indices, -1)


class _Window:
    """One pass's layout for a sequence: T tree levels of K candidates after the pending token, R = K^T paths, the
    main path `main` tokens long (the pending token included). Path r's candidate at level d (1..T) is digit
    (r // K^(T-d)) % K, the first digit the most significant (the release's leaf order, PAC:432-436)."""

    def __init__(self, K: int, T: int, main: int):
        self.K, self.T, self.R, self.main = K, T, K**T, main

    def digit(self, r: int, d: int) -> int:
        return (r // self.K ** (self.T - d)) % self.K

    def stride(self, d: int) -> int:
        return self.K ** (self.T - d)


def layout(c: SJDPACConfig, L: int) -> _Window:
    """The deepest tree of width K and at most D levels whose nodes fit the window L, and the main path's length:
    the window less the tree's nodes off it (PAC:366-376)."""
    T = min(c.tree_depth, L) - 1
    while T > 0 and tree_nodes(c.tree_width, T + 1) > L:
        T -= 1
    return layout_with(c, T, L)


@torch.inference_mode()
def pac_decode(teacher, cond: torch.Tensor, c: SJDPACConfig, generator):
    """Decode a batch of sequences (cond: (B, P)) with SJD-PAC; returns tokens (B, N) and SJD's counters."""
    B, N, V, s = len(cond), teacher.seq_len, teacher.vocab_size, c.sampling
    if refusal := batch_refusal(teacher, B):
        raise UserError(refusal)
    exact = c.mode == "exact"
    ragged = getattr(teacher, "ragged_cache", False)
    pool = ar_token.draft_vocabulary(teacher)
    state, logits = teacher.start(cond, cfg=s.cfg, ragged=True) if ragged else teacher.start(cond, cfg=s.cfg)
    P0 = process(logits, s)  # (B, V)
    device = P0.device
    fresh_q = torch.zeros(V, device=device)
    fresh_q[pool.to(device) if pool is not None else slice(None)] = 1.0
    fresh_q /= fresh_q.sum()  # PAC:357: fresh drafts are uniform over the image tokens, and say so
    K1 = c.tree_width - 1
    # Per sequence: positions < n_out committed, n_out the pending token, then n_drafts drafts; seq holds each
    # position's first candidate, alts its others (-1: none yet), dists its draft law.
    seq = torch.zeros(B, N, dtype=torch.long, device=device)
    alts = torch.full((B, N, max(K1, 1)), -1, dtype=torch.long, device=device)
    dists = fresh_q.repeat(B, N, 1)  # a position never drafted has the release's uniform pad as its q (PAC:204)
    seq[:, 0] = draw(P0, generator)
    n_out, n_drafts = [0] * B, [0] * B
    out = torch.empty(B, N, dtype=torch.long, device=device)
    rows, counts = list(range(B)), Counter(nfe=B, batch_forwards=1, tokens=B * N)
    while True:
        done = [m for m in range(len(rows)) if n_out[m] + 1 >= N]
        if done:
            for m in done:
                out[rows[m]] = seq[m]
            if len(done) == len(rows):
                break
            keep = [m for m in range(len(rows)) if m not in done]
            if ragged:
                teacher.select(state, torch.tensor(keep, device=device))
            idx = torch.tensor(keep, device=device)
            seq, alts, dists = seq[idx], alts[idx], dists[idx]
            rows, n_out, n_drafts = [rows[m] for m in keep], [n_out[m] for m in keep], [n_drafts[m] for m in keep]
        M = len(rows)
        wins = [layout(c, min(c.window, N - 1 - n_out[m])) for m in range(M)]  # the decided token fits
        T = min(w.T for w in wins)  # one tree for the batch's rows: any T is exact, and padding stays aligned
        wins = [w if w.T == T else layout_with(c, T, min(c.window, N - 1 - n_out[m])) for m, w in enumerate(wins)]
        R, Lp = wins[0].R, max(w.main for w in wins)
        for m, w in enumerate(wins):  # fresh drafts where the main path reaches past the drafts
            lo, hi = n_out[m] + 1 + n_drafts[m], n_out[m] + w.main
            if hi > lo:
                seq[m, lo:hi] = random_tokens(hi - lo, V, pool, generator, device)
                dists[m, lo:hi] = fresh_q
                alts[m, lo:hi] = -1
            n_drafts[m] = w.main - 1
            for d in range(1, T + 1):  # the tree's other candidates, where a position has none yet
                pos = n_out[m] + d
                if K1 and alts[m, pos, 0] < 0:
                    alts[m, pos] = without_replacement(dists[m, pos][None], seq[m, pos][None], K1, generator)[0]
        tokens = torch.empty(M * R, Lp, dtype=torch.long, device=device)
        for m, w in enumerate(wins):
            base = seq[m, n_out[m] + torch.arange(Lp, device=device).clamp(max=N - 1 - n_out[m])]  # (Lp,)
            for r in range(R):
                row = base.clone()
                for d in range(1, T + 1):
                    k = w.digit(r, d)
                    if k and alts[m, n_out[m] + d, k - 1] >= 0:
                        row[d] = alts[m, n_out[m] + d, k - 1]
                tokens[m * R + r] = row
        if R > 1:
            teacher.select(state, torch.arange(M, device=device).repeat_interleave(R))
        P = process(teacher.extend(state, tokens), s).view(M, R, Lp, V)  # row t of a path predicts its level t + 1
        counts.update(nfe=M, batch_forwards=1)
        winners, pends = [], []
        for m, w in enumerate(wins):
            n_ok, path, pending, verified = (verify_exact if exact else verify_released)(
                P[m], w, seq[m], alts[m], dists[m], n_out[m], generator)
            counts["drafts_verified"] += verified
            counts["drafts_accepted"] += n_ok
            count_prefix(counts, torch.tensor([n_ok]), torch.tensor([w.main - 1]))
            seq[m, n_out[m]: n_out[m] + n_ok + 1] = tokens[m * R + path, : n_ok + 1]  # the accepted path's tokens
            after = continue_window(P[m], w, path, n_ok, seq[m], alts[m], dists[m], n_out[m], c, exact, generator)
            pend = n_out[m] + 1 + n_ok
            seq[m, pend] = pending
            n_drafts[m] = after
            winners.append(m * R + path)
            pends.append(pend)
            n_out[m] = pend
        if R > 1:
            teacher.select(state, torch.tensor(winners, device=device))
        teacher.rollback(state, torch.tensor(pends, device=device) if ragged else pends[0])
    return out, counts


def layout_with(c: SJDPACConfig, T: int, L: int) -> _Window:
    """The window L with a tree of exactly T levels (a batch's shallowest)."""
    K = c.tree_width if T > 0 else 1
    return _Window(K, T, L - (tree_nodes(K, T + 1) - (T + 1)))


def next_target(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """The target of the next candidate of a position after one drawn from q was rejected against p: the residual
    max(0, p - q), normalised (PAC:158-164)."""
    r = residual(p, q)
    return r / r.sum()


def remove(q: torch.Tensor, token: int) -> torch.Tensor:
    """The draft law of the next candidate of a position: q without `token`, drawn before it (PAC:153-156)."""
    q = q.clone()
    q[token] = 0
    return q / q.sum()


def _candidates(w: _Window, seq_m, alts_m, pos: int) -> list[int]:
    return [int(seq_m[pos])] + [int(a) for a in alts_m[pos, : w.K - 1] if a >= 0]


def verify_exact(P, w: _Window, seq_m, alts_m, dists_m, n_out: int, generator):
    """Recursive rejection sampling down the tree, then SJD's test along the main path. P (R, Lp, V) this pass's
    distributions of the sequence's paths. Returns the drafts accepted, the path they lie on, the token decided after
    them (the next pending token) and the drafts tested."""
    path, verified = 0, 0
    for d in range(1, w.T + 1):
        p, q = P[path, d - 1], dists_m[n_out + d]
        chosen, cands = None, _candidates(w, seq_m, alts_m, n_out + d)
        for k, x in enumerate(cands):
            if k:  # candidate k was drawn from q without the earlier ones
                q = remove(q, cands[k - 1])
            verified += 1
            if torch.rand((), generator=generator, device=p.device) * q[x] < p[x]:
                chosen = k
                break
            p = next_target(p, q)
        if chosen is None:
            return d - 1, path, int(draw(p[None], generator)[0]), verified
        path += chosen * w.stride(d)
    if path:  # a side path ends at the tree's last level: its next token is the teacher's own draw
        return w.T, path, int(draw(P[path, w.T][None], generator)[0]), verified
    for t in range(w.T + 1, w.main):
        x, p, q = int(seq_m[n_out + t]), P[0, t - 1], dists_m[n_out + t]
        verified += 1
        if not torch.rand((), generator=generator, device=p.device) * q[x] < p[x]:
            return t - 1, 0, int(draw(residual(p, q)[None], generator)[0]), verified
    return w.main - 1, 0, int(draw(P[0, w.main - 1][None], generator)[0]), verified


def _sibling_targets(P, w: _Window, seq_m, alts_m, dists_m, n_out: int, r: int, d: int):
    """The release's target and draft law of path r at level d (PAC:151-164): its candidate's earlier siblings removed
    from q, p the residual they left in turn."""
    p, q = P[r, d - 1], dists_m[n_out + d]
    cands = _candidates(w, seq_m, alts_m, n_out + d)
    for k in range(w.digit(r, d)):
        p, q = next_target(p, q), remove(q, cands[k])
    return p, q


def verify_released(P, w: _Window, seq_m, alts_m, dists_m, n_out: int, generator):
    """The release's verifier (PAC:140-222): each path tested on its own with one uniform per tree node, the path
    accepted furthest winning (departure 1), and a main path accepted to its end followed by a draw from the residual
    against a stale q (departure 4)."""
    u_node = {}
    best, best_path, best_reject = -1, 0, None
    verified = 0
    for r in range(w.R):
        if any(w.digit(r, d) >= len(_candidates(w, seq_m, alts_m, n_out + d)) for d in range(1, w.T + 1)):
            continue  # a path through a candidate the draft law could not supply
        n_ok, reject = 0, None
        for d in range(1, w.T + 1):
            key = (d, r // w.stride(d))
            if key not in u_node:
                u_node[key] = torch.rand((), generator=generator, device=P.device)
            p, q = _sibling_targets(P, w, seq_m, alts_m, dists_m, n_out, r, d)
            x = int(seq_m[n_out + d]) if not w.digit(r, d) else int(alts_m[n_out + d, w.digit(r, d) - 1])
            verified += 1
            if not u_node[key] * q[x] < p[x]:
                reject = d
                break
            n_ok += 1
        if reject is None and r == 0:
            for t in range(w.T + 1, w.main):
                x, p, q = int(seq_m[n_out + t]), P[0, t - 1], dists_m[n_out + t]
                verified += 1
                if not torch.rand((), generator=generator, device=P.device) * q[x] < p[x]:
                    reject = t
                    break
                n_ok += 1
        if n_ok > best:
            best, best_path, best_reject = n_ok, r, reject
    r, t = best_path, best + 1  # the first position after the accepted ones, level t
    if best_reject is not None and t <= w.T:
        last = r - w.digit(r, t) * w.stride(t) + (len(_candidates(w, seq_m, alts_m, n_out + t)) - 1) * w.stride(t)
        p, q = _sibling_targets(P, w, seq_m, alts_m, dists_m, n_out, last, t)  # the last sibling's residual
        return best, r, int(draw(residual(p, q)[None], generator)[0]), verified
    if best_reject is not None:
        p, q = P[r, t - 1], dists_m[n_out + t]
        return best, r, int(draw(residual(p, q)[None], generator)[0]), verified
    if r:  # a side path accepted to its last level: the tree's level T + 1 has no draft, q is 0 there (PAC:196)
        return best, r, int(draw(P[r, w.T][None], generator)[0]), verified
    p, q = P[0, w.main - 1], dists_m[n_out + w.main]  # departure 4: a position past the main path, its stale q
    return best, r, int(draw(residual(p, q)[None], generator)[0]), verified


def continue_window(P, w: _Window, path: int, n_ok: int, seq_m, alts_m, dists_m, n_out: int, c: SJDPACConfig,
                    exact: bool, generator) -> int:
    """The next drafts after the decided token, in place: each later position of the window takes this pass's draw
    (SJD's Eq. 3) or, with continuation, its old draft kept with probability min(1, p/q) or else a residual draw, of
    law p either way, p the winning path's prediction on its levels and the main path's after them (PAC:182).
    Returns how many drafts follow the new pending token."""
    count = 0
    for t in range(n_ok + 2, w.main + 1):  # level t: a pass's row t - 1 predicts it
        pos = n_out + t
        row = path if t <= w.T + 1 else 0
        p, has_draft = P[row, t - 1], t < w.main
        if has_draft and not exact and 0 < t <= w.T and w.digit(row, t):  # the release tests the path's own candidate
            old = int(alts_m[pos, w.digit(row, t) - 1])
            p_old, q = _sibling_targets(P, w, seq_m, alts_m, dists_m, n_out, row, t)
        else:
            old, p_old, q = int(seq_m[pos]), p, dists_m[pos]
        if c.continuation and has_draft:
            kept = bool(torch.rand((), generator=generator, device=p.device) * q[old] < p_old[old])
            res = residual(p_old, q)
            if not exact and t <= w.T and not kept:  # departure 3: the residual the last sibling left
                last = row + (len(_candidates(w, seq_m, alts_m, pos)) - 1 - w.digit(row, t)) * w.stride(t)
                res = residual(*_sibling_targets(P, w, seq_m, alts_m, dists_m, n_out, last, t))
            token = old if kept else int(draw(res[None], generator)[0])
        else:
            token = int(draw(p[None], generator)[0])
        if not exact and c.continuation and has_draft and w.K > 1:  # departure 2: the others from the residual
            alts_m[pos] = without_replacement(res[None] / res.sum(), torch.tensor([token], device=p.device),
                                              w.K - 1, generator)[0]
        else:  # drawn from p without replacement when the position next sits in the tree
            alts_m[pos] = -1
        seq_m[pos], dists_m[pos] = token, p
        count += 1
    return count


class SJDPAC(SJD):
    """SJD-PAC: SJD verifying a K-ary tree of candidates at the positions after each rejection (proactive drafting)
    and continuing verification past it (adaptive continuation); lossless in `mode: exact`."""

    headline = False
    Config = SJDPACConfig
    key_knobs = ("window", "tree_width", "tree_depth", "continuation", "mode")

    @classmethod
    def lossless(cls, knobs):
        if knobs.get("mode") == "exact":
            return "certified: tests/test_sjd_pac.py"
        # benchmarks/lossless_audit.py: 20,000 draws, the table model, drafting alone (docs/guide/lossless.md)
        return "not lossless: TV 0.26, p 0"

    @classmethod
    def passes(cls, config: SJDPACConfig, family, length: int) -> dict[str, Passes]:
        return {"method": Passes({"window": length}, at_most=True)}

    def sample(self, cond, *, generator):
        tokens, counts = pac_decode(self.teacher, cond, self.config, generator)
        return Samples(tokens, cond, counts)
