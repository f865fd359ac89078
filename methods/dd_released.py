"""Distilled Decoding's released VAR students (Liu et al., arXiv:2412.17153; code microsoft/distilled_decoding at
3b95d33, weights on the Hugging Face repo microsoft/distilled_decoding) as the student of `dd`
(`--param student=<file>`): read, checked against the teacher, sampled as the released `VAR/sample.py` does.

The files are `VAR-DD/var-d16.pth`, `var-d20.pth`, `var-d24.pth` (VAR/README.md, "Model zoo"): a trainer checkpoint
whose weights are under `trainer` -> `ema_parameters` (what `sample.py` loads with its default `--ema`; the raw
weights are `var_wo_ddp`). The network is `DD_Model` (VAR/models/dd.py), in its own parameter names, which differs
from our `dd_student.VARDDStudent` enough to be a network of its own (`ReleasedVARDD`):
- a leading 1 x 1 scale for the class token: L + 1 positions, `pos_1LC` (1, L + 1, C), `lvl_embed` (K + 1, C);
- a data/noise embedding `n_d_embed` (2, C), and per block (and once before the heads) its own projection
  `layerwise_n_d_embed.{0..depth}` (C, C), added between each block's attention and its MLP;
- the embedding head `final_layer_conti`, PixArt's final layer (a non-affine LayerNorm, then shift and scale from
  `scale_shift_table` (2, C) plus the class embedding, then `linear` (C -> Cvae));
- the attention bias: a token sees the strictly earlier scales and itself (the class slot is scale 0).
Everything else is VAR's transformer in VAR's names (`word_embed`, `class_emb`, `pos_start`, `blocks.*`, `head_nm`,
`head`), so the blocks are the teacher's block class built at the teacher's size.

Sampling (`VAR/sample.py`; `DD_Model.perturb_data`, `final_predict`, `get_final_sequence`): the code's timestep t is
the number of known scales (the paper's t - 1; `t_list 0,5` is the paper's {1, 6}); a step keeps the known tokens,
re-inserts the original noise after them, and takes the argmax of the logits head before scale `loss_split_t` and
the embedding head from there on. The released sequence stays continuous (the last step's raw embeddings go to the
VQ decoder); the family's samples are token ids, so `dd` snaps the final sequence to the nearest code
(`methods.dd_student` says the same of ours).
"""
from __future__ import annotations

import itertools
from pathlib import Path

import torch
import torch.nn as nn

from bench.errors import UserError
from bench.rng import seeded
from teachers.pretrained.files import mismatch, read_state_dict

# The released commands' settings per teacher depth (VAR/README.md, "Few-step sampling"): the paper's t2 (the
# code's t_list 0,t2-1) and the logits/embedding split (`--loss_split_t`), in scales. d20 and d24 use {1, 5}, not
# the paper's {1, 6} (Sec. 5.1).
RELEASED_T2_SPLIT = {16: (6, 5), 20: (5, 4), 24: (5, 4)}
WRAPPER, WEIGHTS = "trainer", "ema_parameters"
# computed here, not read: the released sampler loads non-strictly, so a file may or may not carry them
BUFFERS = ("lvl_1L", "attn_bias_for_masking", "zero_k_bias")


class FinalLayer(nn.Module):
    """PixArt's final layer as `DD_Model.final_layer_conti`: LN(x) (1 + scale) + shift, then a linear map."""

    def __init__(self, width: int, out: int):
        super().__init__()
        self.norm_final = nn.LayerNorm(width, elementwise_affine=False, eps=1e-6)
        self.linear = nn.Linear(width, out)
        self.scale_shift_table = nn.Parameter(torch.zeros(2, width))

    def forward(self, x: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:  # (B, l, C), (B, C) -> (B, l, out)
        shift, scale = (self.scale_shift_table[None] + cond[:, None]).chunk(2, dim=1)  # (B, 1, C) each
        return self.linear(self.norm_final(x) * (1 + scale) + shift)


class ReleasedVARDD(nn.Module):
    """`DD_Model` at the size of a VAR teacher `network` (its config and block classes), reading X_t with the codes
    of `codebook` (V, Cvae), the teacher's."""

    def __init__(self, network, codebook: torch.Tensor):
        super().__init__()
        cfg = network.cfg
        C, Cvae, self.patch_nums = cfg.width, cfg.Cvae, (1, *cfg.patch_nums)
        L = 1 + cfg.L
        self.word_embed = nn.Linear(Cvae, C)
        self.class_emb = nn.Embedding(cfg.num_classes + 1, C)
        self.pos_start = nn.Parameter(torch.zeros(1, 1, C))
        self.pos_1LC = nn.Parameter(torch.zeros(1, L, C))
        self.lvl_embed = nn.Embedding(len(self.patch_nums), C)
        self.blocks = nn.ModuleList(type(b)(cfg) for b in network.blocks)
        self.head_nm = type(network.head_nm)(cfg)
        self.head = nn.Linear(C, cfg.vocab_size)
        self.n_d_embed = nn.Embedding(2, C)  # 0: noise, 1: data (the class slot counts as data)
        self.layerwise_n_d_embed = nn.ModuleList(nn.Linear(C, C) for _ in range(cfg.depth + 1))
        self.final_layer_conti = FinalLayer(C, Cvae)
        level = torch.cat([torch.full((pn * pn,), i) for i, pn in enumerate(self.patch_nums)])  # (L + 1,)
        self.register_buffer("lvl_1L", level[None], persistent=False)
        sees = (level[None, :] < level[:, None]) | torch.eye(L, dtype=torch.bool)
        self.register_buffer("attn_bias", torch.where(sees, 0.0, -torch.inf)[None, None], persistent=False)
        self.ends = [0, *itertools.accumulate(pn * pn for pn in cfg.patch_nums)]  # tokens of the first t scales
        self.codebook = codebook

    def forward(self, labels: torch.Tensor, x: torch.Tensor, t: int) -> tuple[torch.Tensor, torch.Tensor]:
        """`DD_Model.forward`: labels (B,), X_t (B, L, Cvae) with t known scales -> embeddings (B, L, Cvae), logits
        (B, L, V)."""
        cond = self.class_emb(labels)  # (B, C)
        h = torch.cat([cond[:, None] + self.pos_start, self.word_embed(x)], 1)  # (B, 1 + L, C)
        h = h + self.lvl_embed(self.lvl_1L) + self.pos_1LC
        is_data = torch.arange(h.shape[1], device=h.device) < 1 + self.ends[t]
        nd = self.n_d_embed(is_data.long())  # (1 + L, C)
        h = h + nd
        for block, proj in zip(self.blocks, self.layerwise_n_d_embed):
            g1, g2, s1, s2, b1, b2 = block.ada_lin(cond).view(-1, 1, 6, h.shape[-1]).unbind(2)
            h = h + block.attn(block.ln_wo_grad(h) * (1 + s1) + b1, None, self.attn_bias) * g1
            h = h + proj(nd)  # the released block adds its data/noise embedding between attention and MLP
            h = h + block.ffn(block.ln_wo_grad(h) * (1 + s2) + b2) * g2
        h = h + self.layerwise_n_d_embed[-1](nd)
        logits = self.head(self.head_nm(h.float(), cond.float())).float()
        return self.final_layer_conti(h, cond)[:, 1:], logits[:, 1:]

    def step(self, labels: torch.Tensor, x: torch.Tensor, known: int, split: int) -> torch.Tensor:
        """One released DD step: X_t (B, L, Cvae) with `known` tokens of whole scales -> the continuous sequence
        (B, L, Cvae): the codes of the logits head's argmax before `split` tokens (the known tokens' own codes), the
        embedding head (the known tokens themselves) from there on."""
        emb, logits = self(labels, x, self.ends.index(known))
        pos = torch.arange(x.shape[1], device=x.device)
        ids = torch.where(pos < known, self.nearest(x), logits.argmax(-1))  # (B, L)
        cont = torch.where((pos < known)[:, None], x, emb)
        return torch.where((pos < split)[:, None], self.codebook[ids], cont)

    def nearest(self, x: torch.Tensor) -> torch.Tensor:  # (B, L, Cvae) -> (B, L) code ids
        return torch.cdist(x, self.codebook.expand(len(x), -1, -1)).argmin(-1)

    def predict(self, cond: torch.Tensor, tokens: torch.Tensor, noise: torch.Tensor, known: int,
                split: int) -> torch.Tensor:
        """`dd_student._Student.predict` for `dd`'s samplers: ids in (the first `known` read), ids out."""
        pos = torch.arange(tokens.shape[1], device=tokens.device)
        x = torch.where((pos < known)[:, None], self.codebook[tokens], noise)
        return self.nearest(self.step(cond[:, 0], x, known, split))


def load(path: Path, teacher) -> ReleasedVARDD:
    """The released student in `path` at the size of `teacher`'s VAR (a file of another size is one line), its EMA
    weights loaded strictly but for the buffers computed here, on the teacher's device."""
    blob = read_state_dict(path, (WRAPPER,))
    if not isinstance(blob.get(WEIGHTS), dict):
        raise UserError(f"dd student {path}: not a released VAR-DD file (no {WRAPPER} -> {WEIGHTS}; the released "
                        f"files are VAR-DD/var-d16.pth ... var-d24.pth of microsoft/distilled_decoding)")
    state = {k: v for k, v in blob[WEIGHTS].items() if k.rsplit(".", 1)[-1] not in BUFFERS}
    with seeded(0), torch.device(teacher.codebook.device):  # the init is overwritten; leave the global RNG alone
        net = ReleasedVARDD(teacher.network, teacher.codebook)
    try:
        missing, unexpected = net.load_state_dict(state, strict=False)
    except RuntimeError as exc:  # a shape
        raise UserError(f"dd student {path.name} does not fit teacher {teacher.name!r}: {mismatch(exc)}") from None
    missing = [k for k in missing if k.rsplit(".", 1)[-1] not in BUFFERS]
    if missing or unexpected:
        raise UserError(f"dd student {path.name} does not fit teacher {teacher.name!r}: missing keys "
                        f"{missing[:5]}, unexpected keys {unexpected[:5]}")
    return net.eval().requires_grad_(False)
