"""`gsd`: Grouped Speculative Decoding (So et al., arXiv:2508.07747, ICCV 2025), `docs/methods/gsd.md`.

SJD (`methods.sjd`) whose acceptance test credits a draft with the target mass of a group of tokens like it: image
tokens are interchangeable often enough that a draft whose near neighbours are likely is as good as a likely draft.
Lossy by design. As the release implements it (junhyukso/GSD @ 4216c7c, scheduler/jacobi_iteration_lumina_mgpt.py;
everything but the acceptance ratio is the SJD release's loop):

- the group of draft d (GSD:300-325): the tokens at ranks r - 7 .. r + 6 around d's rank r in this pass's processed
  target distribution, sorted ascending (GSD:305-307), kept where |p(g) - p(d)| < 0.15 (GSD:315, 318) and the
  squared L2 distance between g's and d's rows of the network's input embedding is < 0.5 (GSD:316, 319-320; computed
  once per generation over the first 10,000 ids, :1195-1199); d is always in its group;
- the test (GSD:329-341): accept d with probability min(1, p(G) / q(G)), q the draft distribution (one-hot for a
  fresh draft, so the group's target mass); a draft whose rank is below 7 falls back to SJD's min(1, p(d) / q(d))
  (the release's slice then wraps and its `except` takes SJD's ratio, GSD:336-337);
- on rejection, SJD's token-level residual max(0, p - q) (GSD:351-362), then the window is refined as SJD's.

The half-widths and thresholds are the release's literals, knobs here. The distance threshold is in the units of the
teacher's embedding (Lumina-mGPT's, bf16): on another teacher the same 0.5 groups other numbers of tokens, so the
report states the knobs and `docs/methods/gsd.md` the group sizes measured. The release forces a window of 16 after
every pass (GSD:451): the default here.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from methods.sjd import SJD, SJDConfig
from methods.verify import draft_masses, verify
from teachers.families import ar_token


@dataclass(frozen=True)
class GSDConfig(SJDConfig):
    below: int = 7  # group: ranks r - below .. r + above (GSD:307, `[r-7, r+7)`)
    above: int = 6
    p_gap: float = 0.15  # |p(g) - p(d)| below this (GSD:315)
    distance: float = 0.5  # squared L2 between input embeddings below this (GSD:316); 0 turns the group off
    verify_modes = ("exact",)  # its own rule

    def __post_init__(self):
        super().__post_init__()
        if self.below < 0 or self.above < 0:
            raise ValueError(f"below and above must be >= 0, got {self.below}, {self.above}")
        if self.p_gap < 0 or self.distance < 0:
            raise ValueError(f"p_gap and distance must be >= 0, got {self.p_gap}, {self.distance}")


def grouped_rule(vectors: torch.Tensor, c: GSDConfig):
    """The verifier of GSD over `vectors` (V, D), the teacher's input embedding: SJD's test and residual with each
    draft's token masses replaced by its group's."""
    offsets = torch.arange(-c.below, c.above + 1, device=vectors.device)  # (G,)

    def rule(P, drafts, qs, S, n_valid, generator):
        M, D = drafts.shape
        V = P.shape[-1]
        Pd = P[:, :D]  # (M, D, V)
        order = Pd.argsort(dim=-1, stable=True)  # ascending, as GSD:305
        rank = torch.empty_like(order).scatter_(-1, order, torch.arange(V, device=P.device).expand_as(order))
        r = rank.gather(-1, drafts[..., None])  # (M, D, 1)
        at = r + offsets  # (M, D, G)
        inside = (at >= 0) & (at < V)
        group = order.gather(-1, at.clamp(0, V - 1))  # (M, D, G)
        p_d, q_d = draft_masses(P, drafts, qs)
        p_g = Pd.gather(-1, group)
        near = ((vectors[group] - vectors[drafts][..., None, :]) ** 2).sum(-1) < c.distance
        keep = inside & near & ((p_g - p_d[..., None]).abs() < c.p_gap)
        grouped = (r.squeeze(-1) >= c.below) & (c.distance > 0)  # (M, D); else SJD's ratio (GSD:336-337)
        p_G = torch.where(grouped, (p_g * keep).sum(-1), p_d)
        q_G = torch.where(grouped, (qs.gather(-1, group) * keep).sum(-1), q_d)
        n_ok, replacement, _ = verify(P, drafts, qs, n_valid, generator, p_G, q_G)
        return n_ok, replacement

    return rule


class GSD(SJD):
    """Grouped Speculative Decoding: SJD whose test accepts a draft with the target mass of its group of similar
    tokens (logit-rank neighbours, filtered by probability gap and embedding distance); lossy."""

    headline = False
    Config = GSDConfig
    key_knobs = ("window", "p_gap", "distance")

    @classmethod
    def lossless(cls, knobs):  # docs/guide/lossless.md: the table model, 20,000 draws
        return "lossy: TV 0.03-0.22 as its group widens (at its defaults 6 codes form no group: exact)"

    def __init__(self, teacher, config: GSDConfig):
        super().__init__(teacher, config)
        self.rule = grouped_rule(ar_token.token_vectors(teacher, "embedding"), config)
