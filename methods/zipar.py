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

On a structured sequence whose rows close with a forced newline token (Lumina-mGPT, Emu3: `newline_schedule`), as the
release does it for Lumina-mGPT (Lumina-mGPT-ZipAR/lumina_mgpt/model/chameleon/modeling_chameleon.py, "L" below):

- the forced outputs before the image (Lumina-mGPT's image start and size tokens) are decoded one pass each, as
  transformers' `generate` does before the image starts (L:1907-1921), and the first row starts from the token
  before it; the rows are not decoded whole first;
- a row counts the token before it (the size token, or the newline closing the row above) with its own (L:1914-1916,
  :2061: a new row's count starts at 1), so the next row starts once the row holds s - 1 image tokens (L:2055);
- the new row's first input is that newline, a known token at its own position (L:2058-2061), not a copy;
- a finished row's last image token is fed once more at its position, its output unused (L:2068-2070, :1785-1791),
  and the last row's newline and the end tokens are written without a pass (L:2062-2066);
- each input reads every decoded token at or before its raster position, and none after (L:344-357 inserts it into
  the cache at its place; :1556-1559 masks the rest): no empty slots, unlike LlamaGen's static cache.

A window above the row's image tokens plus one waits for the whole row above (the release would never start the
next row there). The Lumina-mGPT release samples with window 16 (generate_examples/generate.py:31).

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
from teachers.families.ar_token import ANY_IMAGE_TOKEN, draw, process


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


def newline_schedule(rows: int, width: int, s: int, offset: int) -> list[list[Feed]]:
    """The passes after the prefill on a structured sequence (the module's docstring, "L"): `rows` rows of `width`
    image tokens each closed by a forced newline, after `offset` forced outputs; feeds in output positions. With
    `offset` 0 the prefill predicts the first image token."""
    cols, k = width + 1, min(s - 1, width)  # k: image tokens a row holds when the next one starts (L:2055)
    passes: list[list[Feed]] = [[(p, p, None)] for p in range(offset - 1)]  # the forced outputs, one pass each
    count, active, done_last = [0] * rows, [0], None  # image tokens decoded per row; the rows decoding

    def drawn(active: list[int]) -> list[int]:  # each active row's token drawn, in the release's order (L:2055-2070)
        nonlocal done_last
        started, finished = [], []
        for r in active:  # the window test, then the row's end
            count[r] += 1
            if count[r] == k and r + 1 < rows and r + 1 not in active:
                started.append(r + 1)
            if count[r] == width:
                finished.append(r)
                done_last = offset + r * cols + width - 1
        return [r for r in active if r not in finished] + started

    if offset == 0:  # the prefill fed the token before the first row and predicted its first token
        active = drawn(active)
    while active:
        feeds: list[Feed] = []
        if done_last is not None:  # a finished row's last image token, at its position (L:1785-1791)
            feeds.append((done_last, done_last, None))
            done_last = None
        for r in active:  # the row's last token, or the token before the row: a size token or a newline
            first = offset + r * cols
            feeds.append((first + count[r] - 1, first + count[r] - 1, first + count[r]))
        active = drawn(active)
        passes.append(feeds)
    return passes


def newline_raster(teacher) -> int:
    """The output position of the first image token of a teacher whose `structure` closes each row of its
    `grid` with a forced token (Lumina-mGPT, Emu3): image tokens at offset + r (W + 1) + c for c < W, forced tokens
    everywhere else. Another structure is refused in one line."""
    rows, cols = teacher.grid
    free = [t == ANY_IMAGE_TOKEN for t in teacher.structure[: teacher.seq_len]]
    offset = free.index(True) if True in free else 0
    raster = [False] * offset + ([True] * (cols - 1) + [False]) * rows
    if cols < 2 or free != raster + [False] * (len(free) - len(raster)):
        raise UserError(f"zipar decodes a plain raster (LlamaGen) or rows closed by a forced newline token "
                        f"(Lumina-mGPT, Emu3): teacher {teacher.name!r} has neither")
    return offset


@torch.inference_mode()
def zipar_decode(teacher, cond: torch.Tensor, c: ZipARConfig, generator,
                 offset: int | None = None) -> tuple[torch.Tensor, Counter]:
    """Decode a batch (cond: (B, P)) by `schedule`, or by `newline_schedule` on a structured teacher whose image
    starts at output `offset` (`newline_raster`); returns tokens (B, N) and counters (`nfe` summed over rows,
    `batch_forwards`, `tokens`)."""
    B, s = len(cond), c.sampling
    rows, cols = teacher.grid
    structured = offset is not None
    state, logits = teacher.start(cond, cfg=s.cfg, **({} if structured else {"ragged": True}))
    if structured:  # the forced tokens written, the image's drawn
        tokens = torch.tensor(teacher.structure[: teacher.seq_len], device=logits.device).clamp(min=0).repeat(B, 1)
        passes = newline_schedule(rows, cols - 1, c.window, offset)
    else:
        tokens = torch.zeros(B, rows * cols, dtype=torch.long, device=logits.device)
        passes = schedule(rows, cols, min(c.window, cols))
    if not offset:
        tokens[:, 0] = draw(process(logits, s), generator)
    for feeds in passes:
        src = torch.tensor([f[0] for f in feeds], device=tokens.device)
        at = torch.tensor([f[1] for f in feeds], device=tokens.device).expand(B, -1)
        P = process(teacher.extend_at(state, tokens[:, src], at), s)  # (B, L, V)
        for j, (_, _, target) in enumerate(feeds):
            if target is not None:
                tokens[:, target] = draw(P[:, j], generator)
    n = 1 + len(passes)
    return tokens, Counter(nfe=B * n, batch_forwards=n, tokens=tokens.numel())


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
        self.offset = None  # the structured teacher's first image output (`newline_raster`), read once
        if getattr(teacher, "structure", None) is not None:
            self.offset = newline_raster(teacher)
            if config.window < 2:
                raise UserError(f"zipar's window must be >= 2 on rows closed by a newline: the release counts the "
                                f"token before a row with the row's own (L:2061), got {config.window}")

    def sample(self, cond, *, generator):
        tokens, counts = zipar_decode(self.teacher, cond, self.config, generator, self.offset)
        return Samples(tokens, cond, counts)
