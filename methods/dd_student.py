"""The Distilled Decoding student (Liu et al., arXiv:2412.17153, Sec. 3.3 and App. B), initialised from the teacher.

It reads X_t = (q_1 .. q_{t-1}, eps_t .. eps_n): data tokens as their codebook vectors, the rest as the flow-matching
noise, both in R^C, and predicts every final token at once. As in the released LlamaGen-DD code:
- the teacher's token embedding `Embedding(V, d)` becomes `Linear(C -> d)` on continuous vectors (initialised by least
  squares so that codebook vectors land on the teacher's token embeddings), plus two learnt embeddings telling data
  from noise positions (t is conveyed by them only, no timestep embedding);
- position i sees the condition, positions < i and itself (causal, self included): q_i depends on q_<i and eps_i only,
  so the output at the position of x_i predicts q_i, and the sequence needs no extra slot;
- two heads: the teacher's logits head (cross-entropy against the token) and a new embedding head (regression onto the
  codebook vector; the paper's LPIPS term, see `methods.dd`).
Everything else is a trainable copy of the teacher's network (`TokenNetwork.clone`, the AR-token family's contract:
condition embedding, trunk, logits head) with the student's own dropout rate (`methods.dd` says why its default is
0); the copy's token table is not used and stays frozen.

`VARDDStudent` is the released VAR-DD's: a step is a scale; VAR's transformer reads every token's vector through its
own `word_embed` (Cvae -> width: no new input layer) with its scale and position embeddings and the data/noise
embedding; the class token (VAR's first input) comes first and every token sees it, the tokens of earlier scales and
itself only (the released attention bias; App. B's "same-step tokens see each other" is not what the code does).
The released code adds a 1 x 1 scale slot for the class token (L + 1 positions); here the class token keeps the
teacher's first input and token 0 shares its scale and position embedding.
"""
from __future__ import annotations

import copy

import torch
import torch.nn as nn

from teachers.families.ar_token import TokenNetwork


class _Student(nn.Module):
    """What both students share: X_t's inputs and F_theta(X_t, t) as token ids, given `forward` and `codebook`."""

    codebook: torch.Tensor

    def inputs(self, tokens: torch.Tensor, noise: torch.Tensor, known: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """X_t with t - 1 = `known` (B,): x (B, n, C) = codebook vectors of `tokens` (B, n) before `known`, noise
        (B, n, C) from there on; and is_data (B, n)."""
        is_data = torch.arange(tokens.shape[1], device=tokens.device) < known[:, None]  # (B, n)
        return torch.where(is_data[..., None], self.codebook[tokens], noise), is_data

    def predict(self, cond: torch.Tensor, tokens: torch.Tensor, noise: torch.Tensor, known: int,
                split: int) -> torch.Tensor:
        """F_theta(X_t, t) as token ids (B, n), t - 1 = `known`: the data prefix copied, the rest predicted (Eq. 6).

        Positions < `split` take the argmax of the logits head, the others the codebook vector nearest to the
        embedding head's output (the paper's split point; the released code feeds the raw embedding to the VQ decoder,
        our family's outputs are token ids). `tokens` beyond the prefix are ignored.
        """
        B, n = tokens.shape
        x, is_data = self.inputs(tokens, noise, torch.full((B,), known, device=tokens.device))
        logits, emb = self(cond, x, is_data)
        by_emb = torch.cdist(emb, self.codebook.expand(B, -1, -1)).argmin(-1)  # (B, n)
        pos = torch.arange(n, device=tokens.device)
        return torch.where(is_data, tokens, torch.where(pos < split, logits.argmax(-1), by_emb))


class DDStudent(_Student):
    def __init__(self, teacher_network: TokenNetwork, codebook: torch.Tensor, dropout: float = 0.0):
        super().__init__()
        self.net = teacher_network.clone(dropout)
        table = self.net.token_embedding()
        table.requires_grad_(False)
        self.cond_len, self.seq_len = self.net.cond_len, self.net.seq_len
        d, C = self.net.width, codebook.shape[1]
        self.inp = nn.Linear(C, d).to(codebook.device)
        with torch.no_grad():  # [codebook, 1] @ [W; b] ~= the teacher's token embeddings, in the least-squares sense
            design = torch.cat([codebook, torch.ones(len(codebook), 1, device=codebook.device)], 1)  # (V, C+1)
            sol = torch.linalg.lstsq(design.double(), table.double()).solution  # (C+1, d)
            self.inp.weight.copy_(sol[:C].T)
            self.inp.bias.copy_(sol[C])
        self.kind_emb = nn.Embedding(2, d).to(codebook.device)  # 0: noise position, 1: data position
        nn.init.normal_(self.kind_emb.weight, std=0.02)
        self.emb_head = nn.Linear(d, C).to(codebook.device)
        self.register_buffer("codebook", codebook.clone())

    def forward(self, cond: torch.Tensor, x: torch.Tensor, is_data: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cond (B, P) ids, x (B, n, C) vectors, is_data (B, n) bool -> logits (B, n, V), embeddings (B, n, C)."""
        P = cond.shape[1]
        h = torch.cat([self.net.embed_condition(cond), self.inp(x) + self.kind_emb(is_data.long())], 1)  # (B, P+n, d)
        h = self.net.trunk(h)[:, P:]  # (B, n, d): no cache, causal; the output at x_i's own position predicts q_i
        return self.net.logits(h), self.emb_head(h)


class VARDDStudent(_Student):
    def __init__(self, network, codebook: torch.Tensor, dropout: float = 0.0):
        super().__init__()
        if network.cfg.patch_nums[0] != 1:
            raise ValueError(f"VAR's first scale is 1 x 1, got {network.cfg.patch_nums[0]}")
        self.net = copy.deepcopy(network).requires_grad_(True)  # VAR has no dropout: `dropout` has nothing to set
        C, Cvae, device = network.cfg.width, codebook.shape[1], codebook.device
        self.kind_emb = nn.Embedding(2, C).to(device)  # 0: noise position, 1: data position
        nn.init.normal_(self.kind_emb.weight, std=0.02)
        self.emb_head = nn.Linear(C, Cvae).to(device)
        self.register_buffer("codebook", codebook.clone())
        scale = network.lvl_1L[0]  # (L,)
        sees = (scale[None, :] < scale[:, None]) | torch.eye(len(scale), dtype=torch.bool, device=device)
        mask = torch.zeros(len(scale) + 1, len(scale) + 1, dtype=torch.bool, device=device)
        mask[:, 0], mask[1:, 1:] = True, sees  # the class token sees itself; a token, it and the earlier scales
        self.register_buffer("mask", mask[None, None])

    def forward(self, cond: torch.Tensor, x: torch.Tensor, is_data: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cond (B, 1) class ids, x (B, L, Cvae), is_data (B, L) -> logits (B, L, V), embeddings (B, L, Cvae)."""
        c = self.net.class_emb(cond[:, 0])  # (B, C)
        h = torch.cat([self.net.first_input(c), self.net.word_embed(x) + self.net.lvl_pos()
                       + self.kind_emb(is_data.long())], 1)  # (B, 1 + L, C)
        for block in self.net.blocks:
            h = block(h, c, None, self.mask)
        h = h[:, 1:]
        return self.net.logits(h, c), self.emb_head(h)
