"""A LlamaGen-style causal transformer over tokens, with a truncatable KV cache.

Used by the AR-token family (image tokens in raster order for SJD, arXiv:2410.01699, and Distilled Decoding,
arXiv:2412.17153; text tokens after a BOS for the tiny causal LMs) and, with continuous tokens in and hidden states
out, by the MAR-style continuous-token family (CSpD, arXiv:2411.11925). The sequence is `[c_1 .. c_P, x_1 .. x_N]`:
P condition tokens (class id, caption tokens or BOS; all NULL for the unconditional branch of CFG) followed by N
tokens. The output at position P-1+i predicts x_{i+1}
(as logits over the codes, or as the vector z a diffusion head turns into the token).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass(frozen=True)
class GPTConfig:
    vocab_size: int  # image codes; 0 = continuous tokens (`token_dim`) and hidden states (B, L, n_embd) out
    cond_vocab: int  # condition token ids, NULL included
    cond_len: int  # P
    seq_len: int  # N
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    dropout: float = 0.0
    token_dim: int = 0  # > 0: tokens are vectors in R^token_dim, read by a linear layer (needs vocab_size = 0)

    def __post_init__(self):
        if (self.vocab_size > 0) == (self.token_dim > 0):
            raise ValueError(f"exactly one of vocab_size ({self.vocab_size}) and token_dim ({self.token_dim}) "
                             f"must be > 0")
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd={self.n_embd} is not divisible by n_head={self.n_head}")


class KVCache:
    """Keys/values of every layer for a batch whose rows share one length, preallocated to the full context;
    `truncate` rolls back."""

    scratch = 0  # slots after the context that no real input reads

    def __init__(self, cfg: GPTConfig, batch: int, device, dtype):
        hd = cfg.n_embd // cfg.n_head
        shape = (cfg.n_layer, batch, cfg.n_head, cfg.cond_len + cfg.seq_len + self.scratch, hd)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.length = 0  # positions (condition + image) currently valid
        self.hidden: torch.Tensor | None = None  # (batch, slots) keys no other position reads: `hide`

    def positions(self, L: int) -> torch.Tensor:
        """Absolute positions of L new inputs: (L,)."""
        return torch.arange(self.length, self.length + L, device=self.k.device)

    def hide(self, padding: torch.Tensor) -> None:
        """Mask a condition's padding (batch, P) (True: padded) from every later read: LlamaGen's `generate`
        (autoregressive/models/generate.py) multiplies the causal mask by the embedding mask and then sets the
        diagonal, so a padded position reads only itself and no position reads it."""
        self.hidden = torch.zeros(self.k.shape[1], self.k.shape[3], dtype=torch.bool, device=self.k.device)
        self.hidden[:, : padding.shape[1]] = padding

    def _unhidden(self, allowed: torch.Tensor, queries: torch.Tensor) -> torch.Tensor:
        """allowed (L, S) or (B, 1, L, S) less the hidden keys, each query's own slot kept -> (B, 1, L, S);
        queries: the inputs' positions, (L,) or (B, L)."""
        slots = torch.arange(allowed.shape[-1], device=allowed.device)
        own = slots == queries[..., None]  # (L, S) or (B, L, S)
        own = own if own.dim() == 2 else own[:, None]
        return (allowed & ~self.hidden[:, None, None, : allowed.shape[-1]]) | own

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store the new (B, H, L, hd) keys/values; return every valid one, (B, H, length + L, hd) each."""
        start, L = self.length, k.shape[2]
        self.k[layer, :, :, start : start + L] = k
        self.v[layer, :, :, start : start + L] = v
        return self.k[layer, :, :, : start + L], self.v[layer, :, :, : start + L]

    def mask(self, L: int, causal: torch.Tensor) -> torch.Tensor | None:
        # New input t sits at absolute position start+t and may see positions <= start+t; one input sees all.
        allowed = causal[self.length : self.length + L, : self.length + L]
        if self.hidden is not None:
            return self._unhidden(allowed, self.positions(L))
        return allowed if L > 1 else None

    def advance(self, L: int) -> None:
        self.length += L

    def truncate(self, length: int) -> None:
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot truncate a cache of length {self.length} to {length}")
        self.length = length


class RaggedKVCache(KVCache):
    """A KV cache whose rows have their own lengths (B,): speculative decoding commits a different number of tokens
    per row. Attention reads the whole buffer; a row's stale slots sit beyond its positions and are masked.

    Windows of different lengths share a pass padded to one length, so a row near its end may feed padding past the
    context: those inputs take the last position (embeddings, mask) and write their keys/values to a scratch slot
    after the context, which no query reads; the caller ignores their outputs and rolls the row back."""

    scratch = 1

    def __init__(self, cfg: GPTConfig, batch: int, device, dtype):
        super().__init__(cfg, batch, device, dtype)
        self.length = torch.zeros(batch, dtype=torch.long, device=device)
        self.at: torch.Tensor | None = None  # `place`: the slots of the next inputs, (B, L)

    def place(self, slots: torch.Tensor) -> None:
        """The next inputs go to these absolute slots (B, L), wherever the rows' lengths are: ZipAR (`methods.zipar`)
        writes each row of the image at its own raster position. A query reads every slot at or before its own,
        written or not; an unwritten slot holds zeros, as a static cache does (LlamaGen's `KVCache`)."""
        self.at = slots

    def _slots(self, L: int) -> torch.Tensor:
        if self.at is not None:
            return self.at
        return self.length[:, None] + torch.arange(L, device=self.k.device)  # (B, L), past the context for padding

    def advance(self, L: int) -> None:
        if self.at is None:
            return super().advance(L)
        self.length = torch.maximum(self.length, self.at.max(1).values + 1)
        self.at = None

    def positions(self, L: int) -> torch.Tensor:
        return self._slots(L).clamp(max=self.k.shape[3] - 1 - self.scratch)  # (B, L)

    def update(self, layer, k, v):
        B, H, L, hd = k.shape
        idx = self._slots(L).clamp(max=self.k.shape[3] - 1)[:, None, :, None].expand(B, H, L, hd)
        self.k[layer].scatter_(2, idx, k.to(self.k.dtype))  # autocast computes k, v in a lower precision
        self.v[layer].scatter_(2, idx, v.to(self.v.dtype))
        return self.k[layer], self.v[layer]

    def mask(self, L, causal):
        slots = torch.arange(self.k.shape[3], device=self.k.device)
        allowed = (slots <= self.positions(L)[..., None])[:, None]  # (B, 1, L, S)
        return allowed if self.hidden is None else self._unhidden(allowed, self.positions(L))

    def select(self, rows: torch.Tensor) -> None:
        """Keep only these rows (finished sequences leave the batch)."""
        self.k, self.v, self.length = self.k[:, rows], self.v[:, rows], self.length[rows]
        if self.hidden is not None:
            self.hidden = self.hidden[rows]

    def truncate(self, length: torch.Tensor) -> None:
        length = torch.as_tensor(length, device=self.length.device).expand_as(self.length)
        if not ((0 <= length) & (length <= self.length)).all():
            raise ValueError(f"cannot truncate a cache of lengths {self.length.tolist()} to {length.tolist()}")
        self.length = length.clone()


@dataclass
class GuidedState:
    """A decoding state over [condition, tokens]: the KV cache of `batch` rows, doubled to 2 * batch rows when
    `cfg` != 1 (the second half is the unconditional branch, its condition all NULL)."""

    cache: KVCache
    cfg: float
    batch: int
    cond_len: int

    @property
    def length(self) -> int | torch.Tensor:
        """Tokens cached after the condition: an int, or (batch,) per row for a ragged cache."""
        length = self.cache.length
        return (length[: self.batch] if torch.is_tensor(length) else length) - self.cond_len

    def truncate(self, length: int | torch.Tensor) -> None:
        """Keep the first `length` tokens after the condition: an int, or (batch,) per row for a ragged cache, the
        unconditional branch's rows with their conditional twins."""
        if torch.is_tensor(length) and self.cfg != 1.0:
            length = torch.cat([length, length])
        self.cache.truncate(self.cond_len + length)

    def select(self, rows: torch.Tensor) -> None:
        """Keep only these rows (batch',) of a ragged cache, in this order, each with its unconditional twin: finished
        sequences leave the batch."""
        self.cache.select(torch.cat([rows, rows + self.batch]) if self.cfg != 1.0 else rows)
        self.batch = len(rows)


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.n_head = cfg.n_head
        self.qkv = nn.Linear(cfg.n_embd, 3 * cfg.n_embd)
        self.proj = nn.Linear(cfg.n_embd, cfg.n_embd)
        self.dropout = cfg.dropout

    def forward(self, x, layer: int | None = None, cache: KVCache | None = None, mask=None):
        B, L, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        q, k, v = (t.view(B, L, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))  # (B, H, L, hd)
        if cache is None:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                               dropout_p=self.dropout if self.training else 0.0)
        else:
            k_all, v_all = cache.update(layer, k, v)  # (B, H, S, hd)
            y = F.scaled_dot_product_attention(q, k_all, v_all, attn_mask=mask)
        y = y.transpose(1, 2).contiguous().view(B, L, C)
        return self.proj(y)


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.n_embd)
        self.attn = CausalSelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.n_embd)
        self.mlp = nn.Sequential(
            nn.Linear(cfg.n_embd, 4 * cfg.n_embd), nn.GELU(), nn.Linear(4 * cfg.n_embd, cfg.n_embd),
            nn.Dropout(cfg.dropout),
        )

    def forward(self, x, layer=None, cache=None, mask=None):
        x = x + self.attn(self.ln1(x), layer, cache, mask)
        return x + self.mlp(self.ln2(x))


class GuidedDecoding:
    """Cached decoding with classifier-free guidance branches, for a network with `cfg` (a frozen dataclass with the
    cache's shape, n_layer, n_head, n_embd, cond_len, seq_len, and a `dropout`), `embed_condition`, `embed_tokens`,
    `trunk(x, cache)` and `logits`; and the shape and `clone` of the TokenNetwork contract (`ar_token`)."""

    @property
    def cond_len(self) -> int:
        return self.cfg.cond_len

    @property
    def seq_len(self) -> int:
        return self.cfg.seq_len

    @property
    def width(self) -> int:
        return self.cfg.n_embd

    def clone(self, dropout: float):
        """A trainable copy with the same weights and another dropout rate (built fresh, then loaded)."""
        net = type(self)(dataclasses.replace(self.cfg, dropout=dropout)).to(next(self.parameters()).device)
        net.load_state_dict(self.state_dict())
        return net

    def new_cache(self, batch: int, ragged: bool = False) -> KVCache:
        p = next(self.parameters())
        return (RaggedKVCache if ragged else KVCache)(self.cfg, batch, p.device, p.dtype)

    def prefill(self, cond, cache: KVCache, prefix: torch.Tensor | None = None):
        """Consume the condition, and the tokens `prefix` (B, k) after it in the same pass; return the output for the
        next token, (B, V) or (B, n_embd)."""
        x = self.embed_condition(cond)  # (B, P, d)
        if prefix is not None and prefix.shape[1]:
            x = torch.cat([x, self.embed_tokens(prefix)], 1)  # (B, P + k, d)
        return self.logits(self.trunk(x, cache))[:, -1]

    def extend(self, tokens, cache: KVCache):
        """Append tokens (B, L) or (B, L, D) after each row's cached ones; outputs (B, L, ...), row t predicts
        the token after t."""
        return self.logits(self.trunk(self.embed_tokens(tokens), cache))

    def null_condition(self, cond: torch.Tensor, null_id: int) -> torch.Tensor:
        """The unconditional branch's condition for `cond`: every position `null_id`."""
        return torch.full_like(cond, null_id)

    def start(self, cond: torch.Tensor, *, cfg: float, null_id: int, ragged: bool = False,
              prefix: torch.Tensor | None = None, padding: torch.Tensor | None = None):
        """Prefill the condition (B, P) (or (B, P, D) embeddings), and with cfg != 1 its unconditional twin
        (`null_condition`) as rows B..2B-1; returns the state and the outputs for the first token, (B or 2B, ...).
        With `prefix` (B, k) those tokens are read in the same pass, after the condition, and the outputs are for the
        token after them. `padding` (B, P) (True: padded) hides condition positions in both branches (`KVCache.hide`).
        """
        B, P = cond.shape[:2]
        if cfg != 1.0:
            cond = torch.cat([cond, self.null_condition(cond, null_id)])
            padding = None if padding is None else torch.cat([padding, padding])
        state = GuidedState(self.new_cache(len(cond), ragged), cfg, B, P)
        if padding is not None:
            state.cache.hide(padding)
        if prefix is not None and cfg != 1.0:
            prefix = torch.cat([prefix, prefix])  # both branches read the same tokens
        return state, self.prefill(cond, state.cache, prefix)

    def extend_guided(self, state: GuidedState, tokens: torch.Tensor):
        """`extend` for every branch: both CFG branches see the same tokens (B, L[, D]) -> (B or 2B, L, ...)."""
        if state.cfg != 1.0:
            tokens = torch.cat([tokens, tokens])
        return self.extend(tokens, state.cache)


class GPT(GuidedDecoding, nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        self.tok_emb = (nn.Embedding(cfg.vocab_size, cfg.n_embd) if cfg.vocab_size
                        else nn.Linear(cfg.token_dim, cfg.n_embd))
        self.cond_emb = nn.Embedding(cfg.cond_vocab, cfg.n_embd)
        self.pos_emb = nn.Embedding(cfg.cond_len + cfg.seq_len, cfg.n_embd)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd)
        self.head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False) if cfg.vocab_size else nn.Identity()
        n_pos = cfg.cond_len + cfg.seq_len
        self.register_buffer("causal", torch.ones(n_pos, n_pos, dtype=torch.bool).tril(), persistent=False)
        self.apply(self._init_weights)
        for name, p in self.named_parameters():
            if name.endswith("proj.weight") or name.endswith("mlp.2.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init_weights(m):
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    # ---- the rest of the TokenNetwork contract (`teachers.families.ar_token`) ---------------------------------
    def token_embedding(self) -> nn.Parameter:
        return self.tok_emb.weight

    def embed_condition(self, cond: torch.Tensor) -> torch.Tensor:
        return self.cond_emb(cond)

    def trunk(self, x: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        """Input embeddings (B, L, d) -> final-normed hidden states (B, L, d): positions (after the cache's, if any)
        added, dropout, the causal blocks; a cache is read and extended."""
        L = x.shape[1]
        positions = torch.arange(L, device=x.device) if cache is None else cache.positions(L)
        x = self.drop(x + self.pos_emb(positions))
        mask = None if cache is None else cache.mask(L, self.causal)
        for i, block in enumerate(self.blocks):
            x = block(x, i, cache, mask)
        if cache is not None:
            cache.advance(L)
        return self.ln_f(x)

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """(B, L, d) -> (B, L, V) logits, or the hidden states themselves for continuous tokens."""
        return self.head(h)

    def embed_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        """(B, L) ids or (B, L, D) vectors -> (B, L, d)."""
        return self.tok_emb(tokens)

    def forward(self, cond, tokens):
        """Teacher-forced outputs for every token: cond (B, P), tokens (B, N) or (B, N, D) -> (B, N, V)
        logits, or (B, N, n_embd) hidden states for continuous tokens."""
        x = torch.cat([self.cond_emb(cond), self.tok_emb(tokens[:, :-1])], dim=1)  # (B, P+N-1, C)
        return self.logits(self.trunk(x))[:, self.cfg.cond_len - 1 :]
