"""Distilled Decoding's released students (Liu et al., arXiv:2412.17153; code microsoft/distilled_decoding at
3b95d33, weights on the Hugging Face repo microsoft/distilled_decoding) as the student of `dd`
(`--param student=<file>`): read, checked against the teacher, sampled as the released samplers do.

VAR (`VAR-DD/var-d16.pth`, `var-d20.pth`, `var-d24.pth`; VAR/README.md, "Model zoo"): a trainer checkpoint whose
weights are under `trainer` -> `ema_parameters` (what `VAR/sample.py` loads with its default `--ema`; the raw weights
are `var_wo_ddp`). The network, `DD_Model` (VAR/models/dd.py), differs from our `dd_student.VARDDStudent` enough to
be a network of its own (`ReleasedVARDD`):
- a leading 1 x 1 scale for the class token: L + 1 positions, `pos_1LC` (1, L + 1, C), `lvl_embed` (K + 1, C);
- a data/noise embedding `n_d_embed` (2, C), and per block (and once before the heads) its own projection
  `layerwise_n_d_embed.{0..depth}` (C, C), added between each block's attention and its MLP;
- the embedding head `final_layer_conti`, PixArt's final layer (a non-affine LayerNorm, then shift and scale from
  `scale_shift_table` (2, C) plus the class embedding, then `linear` (C -> Cvae));
- the attention bias: a token sees the strictly earlier scales and itself (the class slot is scale 0).
Everything else is VAR's transformer in VAR's names (`word_embed`, `class_emb`, `pos_start`, `blocks.*`, `head_nm`,
`head`), so the blocks are the teacher's block class built at the teacher's size.

LlamaGen (`LlamaGen-DD/llamagen-B.pt`, `llamagen-L.pt`; LlamaGen/README.md): the weights under `ema` (the README's
`--ema`). `DDTransformer` (LlamaGen/autoregressive/models/dd.py) is our `dd_student.DDStudent`'s design (the token
table replaced by a linear map of the code vectors, causal with the position itself, a data/noise embedding) with
the embedding head as PixArt's final layer on the un-normed states, in LlamaGen's names (`ReleasedLlamaGenDD`).

Sampling (`VAR/sample.py` and `LlamaGen/autoregressive/sample/eval_fewstep.py`: `perturb_data`, `final_predict`,
`get_final_sequence`/`get_final_x_BLC`): the code's timestep t counts the known steps (the paper's t - 1: `t_list
0,5` is VAR's {1, 6}, `0,80` LlamaGen's {1, 81}); a step keeps the known tokens, re-inserts the original noise after
them, and takes the argmax of the logits head before the split (`--loss_split_t` scales, `--split_t` tokens) and
the embedding head from there on. The released sequence stays continuous (the last step's raw embeddings go to the
VQ decoder); the family's samples are token ids, so `dd` snaps the final sequence to the nearest code
(`methods.dd_student` says the same of ours).
"""
from __future__ import annotations

import itertools
from pathlib import Path

import torch
import torch.nn as nn

from core.errors import UserError
from core.rng import seeded
from teachers.families import multiscale_vq
from core.checkpoints import mismatch, read_state_dict

# The released commands' settings per teacher depth (VAR/README.md, "Few-step sampling"): the paper's t2 (the
# code's t_list 0,t2-1) and the logits/embedding split (`--loss_split_t`), in scales. d20 and d24 use {1, 5}, not
# the paper's {1, 6} (Sec. 5.1).
RELEASED_T2_SPLIT = {16: (6, 5), 20: (5, 4), 24: (5, 4)}
# LlamaGen/README.md: t_list 0,80 (the paper's {1, 81}) with --split_t 80 for GPT-B, 130 for GPT-L, at 256 px
RELEASED_TOKEN_T2_SPLIT = {(768, 12, 256): (81, 80), (1024, 24, 256): (81, 130)}
# where the weights are in a file: what `VAR/sample.py` and `eval_fewstep.py` load with the README's (default) --ema
VAR_WEIGHTS, TOKEN_WEIGHTS = ("trainer", "ema_parameters"), ("ema",)
LLAMAGEN_PARTS = ("cls_embedding", "layers", "norm", "rope")  # what the token student reads of a LlamaGen network
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


class ReleasedStudent(nn.Module):
    """What both released students share: their sampling step (`get_final_sequence` of `final_predict`, the same in
    both trees) over `forward(labels, x, known)` -> (embeddings, logits), with the teacher's `codebook` (V, C)."""

    codebook: torch.Tensor

    def keep_codebook(self, codebook: torch.Tensor) -> None:
        """The teacher's code vectors, kept out of the state dict: the released files hold none (a VQ's codebook is
        an `nn.Parameter`, which a plain attribute would register as a key the release lacks)."""
        self.register_buffer("codebook", codebook.detach(), persistent=False)

    def step(self, labels: torch.Tensor, x: torch.Tensor, known: int, split: int) -> torch.Tensor:
        """One released DD step: X_t (B, L, C) with `known` tokens -> the continuous sequence (B, L, C): the codes
        of the logits head's argmax before `split` tokens (the known tokens' own codes), the embedding head (the
        known tokens themselves) from there on."""
        emb, logits = self(labels, x, known)
        pos = torch.arange(x.shape[1], device=x.device)
        ids = torch.where(pos < known, self.nearest(x), logits.argmax(-1))  # (B, L)
        cont = torch.where((pos < known)[:, None], x, emb)
        return torch.where((pos < split)[:, None], self.codebook[ids], cont)

    def nearest(self, x: torch.Tensor) -> torch.Tensor:  # (B, L, C) -> (B, L) code ids
        return torch.cdist(x, self.codebook.expand(len(x), -1, -1)).argmin(-1)

    def predict(self, cond: torch.Tensor, tokens: torch.Tensor, noise: torch.Tensor, known: int,
                split: int) -> torch.Tensor:
        """`dd_student._Student.predict` for `dd`'s samplers: ids in (the first `known` read), ids out."""
        pos = torch.arange(tokens.shape[1], device=tokens.device)
        x = torch.where((pos < known)[:, None], self.codebook[tokens], noise)
        return self.nearest(self.step(cond[:, 0], x, known, split))


class ReleasedVARDD(ReleasedStudent):
    """`DD_Model` at the size of a VAR teacher `network` (its config and block classes), reading X_t with the codes
    of `codebook` (V, Cvae), the teacher's."""

    def __init__(self, network, codebook: torch.Tensor):
        super().__init__()
        cfg = network.cfg
        C, Cvae, patch_nums = cfg.width, cfg.Cvae, (1, *cfg.patch_nums)  # the class token's 1 x 1 scale first
        L = 1 + cfg.L
        self.word_embed = nn.Linear(Cvae, C)
        self.class_emb = nn.Embedding(cfg.num_classes + 1, C)
        self.pos_start = nn.Parameter(torch.zeros(1, 1, C))
        self.pos_1LC = nn.Parameter(torch.zeros(1, L, C))
        self.lvl_embed = nn.Embedding(len(patch_nums), C)
        self.blocks = nn.ModuleList(type(b)(cfg) for b in network.blocks)
        self.head_nm = type(network.head_nm)(cfg)
        self.head = nn.Linear(C, cfg.vocab_size)
        self.n_d_embed = nn.Embedding(2, C)  # 0: noise, 1: data (the class slot counts as data)
        self.layerwise_n_d_embed = nn.ModuleList(nn.Linear(C, C) for _ in range(cfg.depth + 1))
        self.final_layer_conti = FinalLayer(C, Cvae)
        level = torch.cat([torch.full((pn * pn,), i) for i, pn in enumerate(patch_nums)])  # (L + 1,)
        self.register_buffer("lvl_1L", level[None], persistent=False)
        sees = (level[None, :] < level[:, None]) | torch.eye(L, dtype=torch.bool)
        self.register_buffer("attn_bias", torch.where(sees, 0.0, -torch.inf)[None, None], persistent=False)
        self.ends = [0, *itertools.accumulate(pn * pn for pn in cfg.patch_nums)]  # tokens of the first t scales
        self.keep_codebook(codebook)

    def forward(self, labels: torch.Tensor, x: torch.Tensor, known: int) -> tuple[torch.Tensor, torch.Tensor]:
        """`DD_Model.forward`: labels (B,), X_t (B, L, Cvae) with `known` tokens (whole scales: the code's t scales)
        -> embeddings (B, L, Cvae), logits (B, L, V)."""
        cond = self.class_emb(labels)  # (B, C)
        h = torch.cat([cond[:, None] + self.pos_start, self.word_embed(x)], 1)  # (B, 1 + L, C)
        h = h + self.lvl_embed(self.lvl_1L) + self.pos_1LC
        is_data = torch.arange(h.shape[1], device=h.device) < 1 + known
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


class ReleasedLlamaGenDD(ReleasedStudent):
    """`DDTransformer` (LlamaGen/autoregressive/models/dd.py) at the size of a LlamaGen teacher `network` (its config
    and layer classes): LlamaGen's GPT in its names, the token table replaced by `tok_embeddings` Linear(C -> d), a
    data/noise embedding `n_d_embed` added to the input (the class token counts as data), causal attention (a
    position sees itself), and the embedding head `final_layer_conti` on the un-normed last states."""

    def __init__(self, network, codebook: torch.Tensor):
        super().__init__()
        cfg = network.cfg
        d, C = cfg.n_embd, codebook.shape[1]
        self.cls_embedding = type(network.cls_embedding)(cfg)
        self.tok_embeddings = nn.Linear(C, d)
        self.layers = nn.ModuleList(type(layer)(cfg) for layer in network.layers)
        self.norm = type(network.norm)(d, cfg.norm_eps)
        self.output = nn.Linear(d, cfg.vocab_size, bias=False)
        self.final_layer_conti = FinalLayer(d, C)
        self.n_d_embed = nn.Embedding(2, d)  # 0: noise, 1: data
        self.register_buffer("rope", network.rope.clone(), persistent=False)  # the class token's rotation is zero
        self.keep_codebook(codebook)

    def forward(self, labels: torch.Tensor, x: torch.Tensor, known: int) -> tuple[torch.Tensor, torch.Tensor]:
        """`DDTransformer.forward`: labels (B,), X_t (B, N, C) with `known` tokens -> embeddings (B, N, C), logits
        (B, N, V)."""
        cond = self.cls_embedding.embedding_table(labels)  # (B, d)
        h = torch.cat([cond[:, None], self.tok_embeddings(x)], 1)  # (B, 1 + N, d)
        h = h + self.n_d_embed((torch.arange(h.shape[1], device=h.device) <= known).long())
        for i, layer in enumerate(self.layers):
            h = layer(h, self.rope[: h.shape[1]], i)  # no cache: causal
        logits = self.output(self.norm(h)).float()
        return self.final_layer_conti(h, cond).float()[:, 1:], logits[:, 1:]


def released_defaults(teacher) -> tuple[int, int] | None:
    """The released commands' (t2, split) for this teacher's size (t2 1-based; split in scales on VAR, in tokens on
    LlamaGen), or None for a size DD released no student of."""
    cfg = teacher.network.cfg
    if teacher.family is multiscale_vq.FAMILY:
        return RELEASED_T2_SPLIT.get(cfg.depth)
    return RELEASED_TOKEN_T2_SPLIT.get((cfg.n_embd, cfg.n_layer, cfg.seq_len))


def unsupported(teacher) -> str | None:
    """Why no released student fits this teacher's network, or None."""
    if teacher.family is multiscale_vq.FAMILY or all(hasattr(teacher.network, a) for a in LLAMAGEN_PARTS):
        return None
    return (f"released DD students are VAR's (var-d16/20/24) and LlamaGen's (llamagen-b/l); teacher "
            f"{getattr(teacher, 'name', '?')!r} has neither network")


def load(path: Path, teacher) -> ReleasedStudent:
    """The released student in `path` at the size of `teacher`'s network (a file of another size is one line), its
    EMA weights loaded strictly but for the buffers computed here, on the teacher's device."""
    var = teacher.family is multiscale_vq.FAMILY
    wrappers, names = ((VAR_WEIGHTS, "VAR-DD/var-d16.pth ... var-d24.pth") if var else
                       (TOKEN_WEIGHTS, "LlamaGen-DD/llamagen-B.pt, llamagen-L.pt"))
    blob = read_state_dict(path, ())
    for key in wrappers:
        if not isinstance(blob, dict) or not isinstance(blob.get(key), dict):
            raise UserError(f"dd student {path}: not a released DD file (no {' -> '.join(wrappers)}; the released "
                            f"files are {names} of microsoft/distilled_decoding)")
        blob = blob[key]
    return from_state(blob, teacher, path.name)


def at_random(teacher) -> ReleasedStudent:
    """The released student's architecture at the size of `teacher`'s network with seeded random weights (the cost
    mode's: DD Table 1's #Para counts this network)."""
    cls = ReleasedVARDD if teacher.family is multiscale_vq.FAMILY else ReleasedLlamaGenDD
    with seeded(0), torch.device(teacher.codebook.device):  # leave the global RNG alone
        return cls(teacher.network, teacher.codebook).eval().requires_grad_(False)


def from_state(state: dict[str, torch.Tensor], teacher, name: str) -> ReleasedStudent:
    """The released student of a state dict in the release's keys (`DD_Model.state_dict()` or `DDTransformer`'s)
    on `teacher`'s network and device; `name` (the file) is what a mismatch names."""
    state = {k: v for k, v in state.items() if k.rsplit(".", 1)[-1] not in BUFFERS}
    net = at_random(teacher)  # the init is overwritten
    try:
        missing, unexpected = net.load_state_dict(state, strict=False)
    except RuntimeError as exc:  # a shape
        raise UserError(f"dd student {name} does not fit teacher {teacher.name!r}: {mismatch(exc)}") from None
    missing = [k for k in missing if k.rsplit(".", 1)[-1] not in BUFFERS]
    if missing or unexpected:
        raise UserError(f"dd student {name} does not fit teacher {teacher.name!r}: missing keys "
                        f"{missing[:5]}, unexpected keys {unexpected[:5]}")
    return net
