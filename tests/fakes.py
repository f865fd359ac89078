"""Tiny fake teachers, one per family, small enough to enumerate every output exactly."""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import ClassVar

import torch

from teachers import discrete_ar


@dataclass
class _TableState:
    rows: list  # the tokens of each sequence of the batch
    cfg: float

    @property
    def length(self) -> int:
        return len(self.rows[0])


class TableAR:
    """A discrete AR 'model' whose next-token logits are a random table indexed by the whole prefix.

    Every prefix gets its own distribution, so verification bugs that only a real prefix dependence exposes are not
    hidden. `extend` also records every prefix it was asked about, for KV-rollback checks. Sequences of a batch are
    looked up one by one; `codebook` is a fixed random unit vector per token (flow-matching methods map into it).
    """

    family: ClassVar[str] = discrete_ar.FAMILY

    def __init__(self, vocab=3, seq_len=4, grid=(2, 2), seed=0, sharpness=1.5):
        g = torch.Generator().manual_seed(seed)
        self.vocab_size, self.seq_len, self.grid = vocab, seq_len, grid
        n_prefixes = sum(vocab**k for k in range(seq_len))
        self._cond = sharpness * torch.randn(n_prefixes, vocab, generator=g)
        self._uncond = sharpness * torch.randn(n_prefixes, vocab, generator=g)
        self.codebook = torch.nn.functional.normalize(torch.randn(vocab, 4, generator=g), dim=-1)  # (V, 4)

    def _index(self, prefix) -> int:
        offset = sum(self.vocab_size**k for k in range(len(prefix)))
        return offset + sum(int(t) * self.vocab_size**i for i, t in enumerate(prefix))

    def _logits(self, prefix, cfg):
        i = self._index(prefix)
        c, u = self._cond[i], self._uncond[i]
        return c if cfg == 1.0 else u + cfg * (c - u)

    def conditions(self, n, generator):
        return torch.zeros(n, 1, dtype=torch.long)

    def start(self, cond, *, cfg):
        state = _TableState([[] for _ in range(len(cond))], cfg)
        return state, self._logits([], cfg).expand(len(cond), -1)

    def extend(self, state, tokens):
        out = []
        for row, new in zip(state.rows, tokens.tolist()):
            steps = []
            for t in new:
                row.append(t)
                steps.append(self._logits(row, state.cfg))
            out.append(torch.stack(steps))
        return torch.stack(out)  # (B, L, V)

    def rollback(self, state, length):
        for row in state.rows:
            del row[length:]

    def decode(self, tokens):
        return tokens.float().view(len(tokens), 1, *self.grid) / max(1, self.vocab_size - 1)

    def sample(self, cond, *, generator, sampling, greedy=False):
        return discrete_ar.sample_ar(self, cond, sampling, generator=generator, greedy=greedy)

    def exact_distribution(self, s: discrete_ar.SamplingConfig) -> dict[tuple, float]:
        """Probability of every sequence under the processed (CFG, temperature, top-k) sampling distribution."""
        out = {}
        for seq in itertools.product(range(self.vocab_size), repeat=self.seq_len):
            p = 1.0
            for i in range(self.seq_len):
                p *= float(discrete_ar.process(self._logits(list(seq[:i]), s.cfg), s)[seq[i]])
            out[seq] = p
        return out


def tiny_gpt_teacher(seed=0, vocab=16, grid=(3, 4), cond_len=2):
    """An untrained raster transformer wrapped as an image AR teacher: real KV cache, CFG branches, no training."""
    from teachers.gpt import GPT, GPTConfig
    from teachers.image_ar import ImageARRecipe, ImageARTeacher
    from teachers.patch_vq import PatchQuantizer

    class Tiny(ImageARTeacher):
        recipe = ImageARRecipe(dataset="digits", conditioning="class", image_size=grid[0] * 2, patch=2)

    torch.manual_seed(seed)
    cfg = GPTConfig(vocab_size=vocab, cond_vocab=13, cond_len=cond_len, seq_len=grid[0] * grid[1], n_layer=2,
                    n_head=2, n_embd=32)
    model = GPT(cfg)
    for p in model.parameters():  # larger weights than the init, so the logits depend strongly on the prefix
        p.data.mul_(8.0)
    vq = PatchQuantizer(torch.rand(vocab, 4), patch=2, channels=1, image_size=grid[0] * 2)
    table = (torch.arange(10).view(10, 1, 1) + 3).expand(10, 1, cond_len).clone()
    teacher = Tiny("tiny", model, vq, table, {})
    teacher.grid = grid  # the quantizer is square; the raster of this fake is not, to catch row/col mix-ups
    return teacher
