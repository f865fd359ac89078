"""`zipar`: ZipAR's next-set decoding by spatial locality (He et al., arXiv:2412.04062), `docs/methods/zipar.md`.

A raster-order image model decodes row i + 1 before row i is done: the token at row i + 1, column j is predicted as
soon as the row above holds its first j + s tokens, s the window, so several rows advance in one forward pass, one
token each. As the release does it for LlamaGen (ThisisBillhe/ZipAR @ 2a5695c,
LlamaGen-ZipAR/autoregressive/models/generate_zipar.py, "Z" below):

- the first row is decoded token by token (Z:269-273), then row 1 starts from the first row's last token (Z:131,
  :154-162);
- a row that reaches s tokens starts the next one (Z:199-206): the new row's first input is a copy of the last token
  decoded above it, fed at the position of the above row's end, whose output predicts the row's first token
  (Z:155-158, :204);
- each pass feeds every active row's last token at its own raster position, and a row that is done feeds its last
  token once more at its position, its output unused (Z:146-152, :183-187, :208-210), overwriting the copy there;
- every input reads every cache slot at or before its position (Z:171; the release's static cache and causal mask,
  gpt.py:336-337, :364): slots of tokens not decoded yet hold zeros, or the copy.

Not the teacher's law: a token reads a context with holes where raster order would give it the rest of the row
above. The distance from the teacher's law is measured on an enumerable teacher (`docs/guide/lossless.md`). With s
equal to the row length every row waits for the one above and every token reads its whole context: AR decoding, one
pass a token, and so with a window above it (where the release would never start the next row). The window
defaults to 8 (gpt.py:302, scripts/autoregressive/sample_c2i.sh).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import torch

from core.errors import UserError
from core.samples import Samples
from methods.base import Method, Passes
from teachers.families import ar_token
from teachers.families.ar_token import draw, process


@dataclass(frozen=True)
class ZipARConfig:
    sampling: ar_token.SamplingConfig = ar_token.SamplingConfig()
    window: int = 8  # s: tokens of the row above decoded before a row starts (gpt.py:302, sample_c2i.sh)

    def __post_init__(self):
        if self.window < 1:
            raise ValueError(f"window must be >= 1, got {self.window}")
        if self.sampling.greedy:
            raise ValueError("greedy must be false: ZipAR samples each token (the release's sample_logits=True)")


Feed = tuple[int, int, int | None]  # (raster index of the token fed, raster position it is fed at, target or None)


def schedule(rows: int, cols: int, s: int) -> list[list[Feed]]:
    """The passes after the prefill (which predicts token 0), each a list of feeds: deterministic, the same for
    every sequence (it depends on counts, not on the tokens drawn)."""
    passes: list[list[Feed]] = [[(c - 1, c - 1, c)] for c in range(1, cols)]  # the first row, token by token
    count = [cols] + [0] * (rows - 1)
    active, done_last = ([1] if rows > 1 else []), None
    while active:
        feeds: list[Feed] = []
        if done_last is not None:  # a finished row's last token, at its own position (Z:146-152)
            feeds.append((done_last, done_last, None))
            done_last = None
        for r in active:
            if count[r] == 0:  # the above row's last decoded token, fed at the above row's end (Z:155-158)
                feeds.append(((r - 1) * cols + count[r - 1] - 1, r * cols - 1, r * cols))
            else:
                last = r * cols + count[r] - 1
                feeds.append((last, last, last + 1))
        started, finished = [], []
        for r in active:  # each row's token of this pass drawn, in the release's order (Z:188-210)
            count[r] += 1
            if count[r] == s and r + 1 < rows and r + 1 not in active:
                started.append(r + 1)
            if count[r] == cols:
                finished.append(r)
                done_last = r * cols + cols - 1
        active = [r for r in active if r not in finished] + started
        passes.append(feeds)
    return passes


@torch.inference_mode()
def zipar_decode(teacher, cond: torch.Tensor, c: ZipARConfig, generator) -> tuple[torch.Tensor, Counter]:
    """Decode a batch (cond: (B, P)) by `schedule`; returns tokens (B, N) and counters (`nfe` summed over rows,
    `batch_forwards`, `tokens`)."""
    B, s = len(cond), c.sampling
    rows, cols = teacher.grid
    state, logits = teacher.start(cond, cfg=s.cfg, ragged=True)
    tokens = torch.zeros(B, rows * cols, dtype=torch.long, device=logits.device)
    tokens[:, 0] = draw(process(logits, s), generator)
    passes = schedule(rows, cols, min(c.window, cols))
    for feeds in passes:
        src = torch.tensor([f[0] for f in feeds], device=tokens.device)
        at = torch.tensor([f[1] for f in feeds], device=tokens.device).expand(B, -1)
        P = process(teacher.extend_at(state, tokens[:, src], at), s)  # (B, L, V)
        for j, (_, _, target) in enumerate(feeds):
            if target is not None:
                tokens[:, target] = draw(P[:, j], generator)
    n = 1 + len(passes)
    return tokens, Counter(nfe=B * n, batch_forwards=n, tokens=B * rows * cols)


class ZipAR(Method):
    """ZipAR: rows decoded in parallel once the row above holds `window` tokens (lossy, training-free)."""

    families = (ar_token.FAMILY,)
    modalities = ("image",)
    Config = ZipARConfig
    key_knobs = ("window",)
    needs = ("extend_at",)  # a ragged state whose inputs go to given positions (`GuidedNetworkTeacher.extend_at`)

    @classmethod
    def passes(cls, config: ZipARConfig, family, length: int) -> dict[str, Passes]:
        side = int(round(length**0.5))  # the paper's teachers are square rasters; another raster: the bound
        if side * side != length:
            return {"method": Passes({"window": length}, at_most=True)}
        return {"method": Passes({"window": 1 + len(schedule(side, side, min(config.window, side)))})}

    @classmethod
    def lossless(cls, knobs):  # benchmarks/lossless_audit.py, 20,000 draws (docs/guide/lossless.md)
        return "lossy: TV 0.069 at window 1 on 3 rows of 2 tokens (noise floor 0.012); AR at the row length"

    def __init__(self, teacher, config: ZipARConfig):
        super().__init__(teacher, config)
        if len(teacher.grid) != 2:
            raise UserError(f"zipar decodes the rows of an image: teacher {teacher.name!r} has a 1-D grid "
                            f"{tuple(teacher.grid)}")

    def sample(self, cond, *, generator):
        tokens, counts = zipar_decode(self.teacher, cond, self.config, generator)
        return Samples(tokens, cond, counts)
