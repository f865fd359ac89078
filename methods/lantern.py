"""`sjd` with `verify: lantern`: LANTERN's relaxed acceptance (Jang et al., arXiv:2410.03355, ICLR 2025; LANTERN++,
arXiv:2502.06352) as a verifier of SJD's own drafts, `docs/methods/lantern.md`.

LANTERN lets a draft token take the target mass of its nearest neighbours in the VQ latent space, so that among
image tokens, which the target spreads thinly over many near-equivalent codes, a draft is accepted more often. As
the release implements it (jadohu/LANTERN @ 3a56e45, models/ea_model_llamagen.py `evaluate_posterior`, ea:709-787):

- the neighbour table (entrypoints/generate_codebook.py:53-65): for each code, every other code by increasing L2
  distance between the raw codebook vectors; the first k are read at run time;
- the relaxed target of draft x (ea:743-758): p~(x) = p(x) + the mass of the longest prefix of x's k nearest
  neighbours whose total target mass is at most the budget: delta (LANTERN, when `lantern_delta` <= 1,
  ea:749-750), or (lambda - 1) p(x) (LANTERN++, when it is > 1, ea:747-748), which caps p~(x) at lambda p(x);
- the test: accept x with probability min(1, p~(x) / q(x)) (ea:760-767, q one-hot for the drafter's top-k drafts).

Here the drafts are SJD's (fresh ones one-hot, refined ones drawn from the previous pass's distribution), not
EAGLE's trained drafter: the paper's speed-ups pair the rule with that drafter, and `docs/methods/lantern.md` says
what differs. On rejection the residual is max(0, p~ - q), p~ the target with the prefix's mass moved onto x: the
law the test accepted against. The release instead zeroes x and its first k + 1 neighbours (ea:768-773, dynamic
tree) or keeps their mass (ea:646-661, static tree); both moved differently from the test. Defaults: k = 1000,
delta = 0.1 (entrypoints/generate_images.py:54-55); the release's run.sh uses (k, lambda) = (10, 5), (5, 10),
(5, 20).
"""
from __future__ import annotations

import torch

from methods.verify import draft_masses, verify
from teachers.families import ar_token


def neighbour_table(vectors: torch.Tensor, k: int, chunk: int = 1024) -> torch.Tensor:
    """(V, min(k, V - 1)) int32: each token's nearest other tokens by L2 distance between `vectors` rows, nearest
    first (generate_codebook.py:55-59: `cdist`, the diagonal +inf). Rows `chunk` at a time: LlamaGen's 16,384 codes
    would take a 1 GB distance matrix at once."""
    V, k = len(vectors), min(k, len(vectors) - 1)
    out = torch.empty(V, k, dtype=torch.int32, device=vectors.device)
    for lo in range(0, V, chunk):
        distance = torch.cdist(vectors[lo : lo + chunk], vectors)  # (chunk, V)
        rows = torch.arange(len(distance), device=vectors.device)
        distance[rows, lo + rows] = float("inf")
        out[lo : lo + chunk] = distance.topk(k, largest=False).indices
    return out


def relaxed_rule(teacher, k: int, delta: float, lam: float):
    """The verifier of LANTERN's relaxed acceptance over the teacher's codebook (`ar_token.token_vectors`): SJD's test
    against p~, the residual from p~. `lam` > 1 is LANTERN++'s budget (lambda - 1) p(x); otherwise `delta`."""
    table = neighbour_table(ar_token.token_vectors(teacher, "codebook"), k)  # (V, k)

    def rule(P, drafts, qs, S, n_valid, generator):
        M, D = drafts.shape
        Pd = P[:, :D]  # (M, D, V)
        p_d, q_d = draft_masses(P, drafts, qs)
        near = table[drafts].long()  # (M, D, k)
        mass = Pd.gather(-1, near).cumsum(-1)  # (M, D, k) the mass of each prefix of the neighbour list
        budget = (lam - 1) * p_d if lam > 1 else torch.full_like(p_d, delta)
        taken = mass <= budget[..., None]  # a prefix: the cumulative mass only grows
        moved = (Pd.gather(-1, near) * taken).sum(-1)  # (M, D)
        relaxed = Pd.clone()  # p~: the prefix's mass moved onto the draft
        relaxed.scatter_(-1, near, torch.where(taken, 0.0, Pd.gather(-1, near)))
        relaxed.scatter_(-1, drafts[..., None], (p_d + moved)[..., None])
        P_tilde = torch.cat([relaxed, P[:, D:]], 1)
        n_ok, replacement, _ = verify(P_tilde, drafts, qs, n_valid, generator, p_d + moved, q_d)
        return n_ok, replacement

    return rule
