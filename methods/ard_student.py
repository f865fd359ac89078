"""The ARD student (Kim et al., arXiv:2504.11295, Sec. 3.2; the released models_ARD.py):
a copy of the teacher DiT that predicts the next point of the teacher's ODE trajectory from the whole history.

The S inputs x_{tau_S} (noise), x_{tau_{S-1}}, .. go through the teacher's shared patch embedding and positions; each
input's tokens carry its own time: `adaln_tokenwise` (the released code: token-wise adaLN condition
t_emb(t_k) + y_emb(y)) or `additive` (the paper's other reading: t_emb(t_k) added to the tokens like VAR's level
embedding, adaLN on y_emb(y) alone). Only the lower N blocks read the history, under mask M1 (self only: step
distillation), M2 (previous input + self), M3 (noise + self) or M4 (all earlier inputs: ARD's default); the upper
blocks see the current input alone.
One output head per step, each a copy of the teacher's final layer.

`forward` is the teacher-forced pass (all S inputs at once under a block mask); `step` is one sampling step that
reads the keys/values of earlier steps from a cache; the two give the same outputs.
"""
from __future__ import annotations

import copy

import torch
import torch.nn as nn

from teachers.families.ode_diffusion import DiTNetwork

MASKS = ("M1", "M2", "M3", "M4")
TIME_EMBEDS = ("adaln_tokenwise", "additive")


def visible(mask: str, k: int, j: int) -> bool:
    """May the tokens of input k attend to those of input j (inputs 0 = noise .. S-1)?"""
    return {"M1": j == k, "M2": k - 1 <= j <= k, "M3": j in (0, k), "M4": j <= k}[mask]


class ARDStudent(nn.Module):
    def __init__(self, teacher: DiTNetwork, steps: int, history_layers: int, mask: str, time_embed: str,
                 time_labels: list[float]):
        super().__init__()
        if mask not in MASKS or time_embed not in TIME_EMBEDS:
            raise ValueError(f"mask must be one of {MASKS} and time_embed one of {TIME_EMBEDS}")
        if not 0 <= history_layers <= teacher.cfg.depth:
            raise ValueError(f"history_layers must be in [0, {teacher.cfg.depth}], got {history_layers}")
        dit = copy.deepcopy(teacher).train().requires_grad_(True)
        self.cfg, self.S, self.N, self.mask, self.time_embed = dit.cfg, steps, history_layers, mask, time_embed
        self.x_embedder, self.t_embedder, self.y_embedder, self.blocks = (
            dit.x_embedder, dit.t_embedder, dit.y_embedder, dit.blocks)
        self.register_buffer("pos_embed", dit.pos_embed.clone(), persistent=False)
        self.heads = nn.ModuleList(copy.deepcopy(dit.final_layer) for _ in range(steps))
        self.unpatchify = dit.unpatchify
        self.register_buffer("labels", torch.tensor(time_labels, dtype=torch.float32))  # (S,) time of input k

    def _image(self, out):  # a head's (B, L, p*p*C_out) -> (B, C, H, W); a learned-sigma teacher's variance half
        return self.unpatchify(out)[:, : self.cfg.channels]  # is no prediction of x_0: the student drops it

    def _time(self, y, k):  # (B, d)
        return self.t_embedder(self.labels[k].expand(len(y)))

    def _tokens(self, x, y, k):  # input k (B, C, H, W) -> (B, L, d)
        h = self.x_embedder(x).flatten(2).transpose(1, 2) + self.pos_embed
        return h + self._time(y, k)[:, None] if self.time_embed == "additive" else h

    def _cond(self, y, k):  # the adaLN condition of input k's tokens: (B, d)
        return self.y_embedder(y) + (self._time(y, k) if self.time_embed == "adaln_tokenwise" else 0)

    def attn_mask(self, layer: int) -> torch.Tensor:
        """(S*L, S*L) bool block mask of one layer for the teacher-forced pass: upper layers see their own input."""
        L, S = self.cfg.tokens, self.S
        rule = self.mask if layer < self.N else "M1"
        blocks = torch.tensor([[visible(rule, k, j) for j in range(S)] for k in range(S)])
        return blocks.repeat_interleave(L, 0).repeat_interleave(L, 1).to(self.labels.device)

    def forward(self, inputs: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Teacher forcing: inputs (B, S, C, H, W) -> predictions (B, S, C, H, W), output k from inputs 0..k."""
        B, S, L = inputs.shape[0], self.S, self.cfg.tokens
        h = torch.cat([self._tokens(inputs[:, k], y, k) for k in range(S)], 1)  # (B, S*L, d)
        c = torch.cat([self._cond(y, k)[:, None].expand(B, L, -1) for k in range(S)], 1)  # (B, S*L, d) token-wise
        for i, block in enumerate(self.blocks):
            h, _ = block(h, c, self.attn_mask(i))
        outs = [self.heads[k](h[:, k * L : (k + 1) * L], c[:, k * L : (k + 1) * L]) for k in range(S)]
        return torch.stack([self._image(o) for o in outs], 1)

    def step(self, x: torch.Tensor, y: torch.Tensor, k: int, cache: list[list]) -> torch.Tensor:
        """Sampling step k: input k (B, C, H, W) -> prediction (B, C, H, W). cache[i] holds the keys/values of the
        earlier inputs in lower block i (the upper blocks keep nothing)."""
        h, c = self._tokens(x, y, k), self._cond(y, k)
        for i, block in enumerate(self.blocks):
            if i < self.N:
                past = [kv for j, kv in enumerate(cache[i]) if visible(self.mask, k, j)]
                history = (torch.cat([p[0] for p in past], 2), torch.cat([p[1] for p in past], 2)) if past else None
                h, kv = block(h, c, history=history)
                cache[i].append(kv)
            else:
                h, _ = block(h, c)
        return self._image(self.heads[k](h, c))

    def rollout(self, x_T: torch.Tensor, y: torch.Tensor, inputs: torch.Tensor | None = None) -> torch.Tensor:
        """S sequential steps from noise, each input the previous prediction (or, for teacher-supplied history,
        inputs[:, k] (B, S, C, H, W)); returns every prediction (B, S, C, H, W)."""
        cache, x, preds = [[] for _ in range(self.N)], x_T, []
        for k in range(self.S):
            if inputs is not None:
                x = inputs[:, k]
            x = self.step(x, y, k, cache)
            preds.append(x)
        return torch.stack(preds, 1)
