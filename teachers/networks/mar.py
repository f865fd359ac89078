"""MAR, the masked autoregressive image model with a per-token diffusion head (Li et al., arXiv:2406.11838;
LTH14/mar `models/mar.py`), in the official parameter names (docs/checkpoints.md, 'MAR'), so `checkpoint-last.pth`'s
`model_ema` loads strictly once `diffloss.net.*` is renamed to our head's names (`official_to_ours`).

A bidirectional MAE-style encoder-decoder: tokens -> `z_proj`, a buffer of `buffer_size` slots in front that all
hold the class embedding (`fake_latent` when unconditional), learned positions, `z_proj_ln`; the encoder sees only
the buffer and the known tokens; the decoder scatters them back among `mask_token`s, adds its positions, and after
the blocks drops the buffer and adds `diffusion_pos_embed_learned`: z, the condition of every position's diffusion
head (`teachers.networks.diffusion_head`, MAR's `SimpleMLPAdaLN`). timm `Block`s (qkv bias, LayerNorm eps 1e-6,
exact-erf GELU, no layer scale).

The official encoder drops the unknown tokens, which needs the same number known in every row; here each row keeps
its known tokens in position order, padded to the longest row with keys masked out of attention, so rows with
different known sets (CSpD's verification of a window) go in one batch. With equal counts there is no padding and
this is the official computation.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from teachers.networks.diffusion_head import DiffusionHead, HeadConfig

# official DiffLoss (`diffloss.net.`) names -> our head's (SimpleMLPAdaLN is our DiffusionHead, the same computation)
HEAD_PREFIXES = (("time_embed.", "time_emb."), ("cond_embed.", "cond_emb."), ("input_proj.", "inp."),
                 ("res_blocks.", "blocks."), ("final_layer.linear.", "out."),
                 ("final_layer.adaLN_modulation.", "final_ada."))
HEAD_INFIXES = ((".in_ln.", ".norm."), (".adaLN_modulation.", ".ada."))


@dataclass(frozen=True)
class MARConfig:
    seq_len: int = 256  # (256 px / VAE stride 16)^2 tokens, patch size 1
    token_dim: int = 16  # the KL-16 VAE's channels
    encoder_width: int = 768
    encoder_depth: int = 12
    encoder_heads: int = 12
    decoder_width: int = 768
    decoder_depth: int = 12
    decoder_heads: int = 12
    mlp_ratio: float = 4.0
    buffer_size: int = 64
    class_rows: int = 1000  # `class_emb` rows; the unconditional embedding is `fake_latent`
    head_width: int = 1024  # DiffLoss: read from the checkpoint, not implied by the model's name (docs/checkpoints.md)
    head_depth: int = 6
    head_clip: float = 0.0  # bounded tokens only (see HeadConfig.clip); MAR's latents are unbounded
    # the blocks' and the encoder/decoder norms' eps: 1e-6 in `mar_base/large/huge`, torch's 1e-5 where MAR's
    # constructor is called without them (`z_proj_ln` and the head are 1e-6 either way)
    norm_eps: float = 1e-6

    def __post_init__(self):
        for width, heads in ((self.encoder_width, self.encoder_heads), (self.decoder_width, self.decoder_heads)):
            if width % heads:
                raise ValueError(f"width {width} is not a multiple of heads {heads}")


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)

    def forward(self, x, keep=None):  # (B, L, C); keep (B, 1, 1, L) keys to attend to, or None (all)
        B, L, C = x.shape
        q, k, v = self.qkv(x).reshape(B, L, 3, self.heads, C // self.heads).permute(2, 0, 3, 1, 4)  # (B, H, L, hd)
        return self.proj(F.scaled_dot_product_attention(q, k, v, attn_mask=keep).transpose(1, 2).reshape(B, L, C))


class Mlp(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(dim, hidden), nn.Linear(hidden, dim)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))  # exact erf GELU (timm's default), not tanh


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, mlp_ratio: float, eps: float):
        super().__init__()
        self.norm1, self.attn = nn.LayerNorm(dim, eps=eps), Attention(dim, heads)
        self.norm2, self.mlp = nn.LayerNorm(dim, eps=eps), Mlp(dim, int(dim * mlp_ratio))

    def forward(self, x, keep=None):
        x = x + self.attn(self.norm1(x), keep)
        return x + self.mlp(self.norm2(x))


class MAR(nn.Module):
    """(tokens (B, N, D), known (B, N) bool, class embedding (B, C)) -> z (B, N, decoder_width); `head` samples."""

    def __init__(self, cfg: MARConfig):
        super().__init__()
        self.cfg = cfg
        N, buf, Ce, Cd = cfg.seq_len, cfg.buffer_size, cfg.encoder_width, cfg.decoder_width
        self.class_emb = nn.Embedding(cfg.class_rows, Ce)
        self.fake_latent = nn.Parameter(torch.zeros(1, Ce))
        self.z_proj, self.z_proj_ln = nn.Linear(cfg.token_dim, Ce), nn.LayerNorm(Ce, eps=1e-6)
        self.encoder_pos_embed_learned = nn.Parameter(torch.zeros(1, N + buf, Ce))
        self.encoder_blocks = nn.ModuleList(Block(Ce, cfg.encoder_heads, cfg.mlp_ratio, cfg.norm_eps)
                                            for _ in range(cfg.encoder_depth))
        self.encoder_norm = nn.LayerNorm(Ce, eps=cfg.norm_eps)
        self.decoder_embed = nn.Linear(Ce, Cd)
        self.mask_token = nn.Parameter(torch.zeros(1, 1, Cd))
        self.decoder_pos_embed_learned = nn.Parameter(torch.zeros(1, N + buf, Cd))
        self.decoder_blocks = nn.ModuleList(Block(Cd, cfg.decoder_heads, cfg.mlp_ratio, cfg.norm_eps)
                                            for _ in range(cfg.decoder_depth))
        self.decoder_norm = nn.LayerNorm(Cd, eps=cfg.norm_eps)
        self.diffusion_pos_embed_learned = nn.Parameter(torch.zeros(1, N, Cd))
        self.head = DiffusionHead(HeadConfig(cfg.token_dim, Cd, cfg.head_width, cfg.head_depth, cfg.head_clip))

    def class_embedding(self, labels: torch.Tensor | None, n: int) -> torch.Tensor:
        """(n, C): the classes' embeddings, or `fake_latent` (the unconditional one) when labels is None."""
        return self.fake_latent.expand(n, -1) if labels is None else self.class_emb(labels)

    def forward(self, tokens: torch.Tensor, known: torch.Tensor, class_embedding: torch.Tensor,
                known_count: int | None = None) -> torch.Tensor:
        """Every position's z (B, N, Cd) given `known` (B, N) tokens: the encoder reads the buffer and the known tokens
        alone (rows padded to the longest); `known_count`, the known tokens of every row where all have as many."""
        B, N, _ = tokens.shape
        buf = self.cfg.buffer_size
        x = self.z_proj(tokens)  # (B, N, Ce)
        x = torch.cat([class_embedding[:, None].expand(B, buf, -1), x], 1)  # every buffer slot holds the class
        x = self.z_proj_ln(x + self.encoder_pos_embed_learned)
        seen = torch.cat([known.new_ones(B, buf), known], 1)  # (B, buf + N)
        count = seen.sum(1)
        L = buf + known_count if known_count is not None else int(count.max())
        idx = seen.to(torch.int8).argsort(dim=1, descending=True, stable=True)[:, :L]  # seen positions first, in order
        x = x.gather(1, idx[..., None].expand(-1, -1, x.shape[-1]))  # (B, L, Ce)
        pad = torch.arange(L, device=x.device) >= count[:, None]  # (B, L)
        keep = None if known_count is not None or not bool(pad.any()) else ~pad[:, None, None, :]
        for block in self.encoder_blocks:
            x = block(x, keep)
        x = self.decoder_embed(self.encoder_norm(x))  # (B, L, Cd)
        mask_token = self.mask_token.expand(B, buf + N, -1)
        x = torch.where(pad[..., None], self.mask_token, x)  # a pad slot's index is an unseen position
        x = mask_token.scatter(1, idx[..., None].expand(-1, -1, x.shape[-1]), x) + self.decoder_pos_embed_learned
        for block in self.decoder_blocks:
            x = block(x)
        return self.decoder_norm(x)[:, buf:] + self.diffusion_pos_embed_learned  # (B, N, Cd)


def official_to_ours(official: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """An official MAR state dict in our names: `diffloss.net.<x>` -> `head.<x renamed>`, the rest as is."""
    out = {}
    for key, value in official.items():
        if key.startswith("diffloss.net."):
            key = key[len("diffloss.net."):]
            theirs, ours = next(pair for pair in HEAD_PREFIXES if key.startswith(pair[0]))
            key = ours + key[len(theirs):]
            for theirs, ours in HEAD_INFIXES:
                key = key.replace(theirs, ours)
            key = "head." + key
        out[key] = value
    return out
