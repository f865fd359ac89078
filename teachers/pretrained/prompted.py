"""What the text-to-image teachers over a Hugging Face causal model share (Emu3-Gen, `teachers.pretrained.emu3`;
Lumina-mGPT and Anole, `teachers.pretrained.chameleon`): prompts read from a local file, CFG rows batched with the
prompts' rows, and an image written as a structured token sequence whose fixed positions (row ends, image start and
end, size tokens) are forced.

Every row of a batch is left-padded to the longest prompt, with an attention mask and positions counted from the row's
first unmasked token, as transformers' `generate` counts them. The unconditional branch of CFG is one more row per
image whose prompt is the teacher's `unconditional_prompt`: Emu3's negative prompt, Anole's separator (SJD's masked
prompt), or nothing at all (Lumina-mGPT's branch starts at the image-start token, position 0). Guidance is
u + s (c - u) on raw logits (`ar_token.guide`); the structure then masks the guided logits before temperature and
top-k (`ar_token.process`), the order of the official processor lists.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch

from teachers.data.prompts import COCO_CAPTIONS, missing_prompts, prompt_file
from teachers.families import ar_token
from teachers.families.ar_token import ANY_IMAGE_TOKEN
from teachers.pretrained.local import LocalFilesTeacher


@dataclass
class PromptedState:
    cache: Any  # transformers.DynamicCache over [left-padded prompt, generated tokens]
    mask: torch.Tensor  # (R, P + length) attention mask: R = batch, or 2 batch with the unconditional rows
    batch: int
    cfg: float
    prompt_len: int  # P, the padded prompt length
    # (length,) the output position of each generated slot of the cache, in cache order: its raster position, which
    # `extend_at` may give out of order (ZipAR); `extend` appends the next positions
    positions: torch.Tensor

    @property
    def length(self) -> int:
        """Generated tokens whose keys/values are cached."""
        return self.cache.get_seq_length() - self.prompt_len


def additive(reads: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A boolean attention pattern (R, 1, L, K), True where a query reads a key, as the additive mask transformers
    takes whole (4D masks are used as given): 0 where it reads, the dtype's minimum elsewhere."""
    return torch.zeros(reads.shape, dtype=dtype, device=reads.device).masked_fill(~reads, torch.finfo(dtype).min)


class PromptSet:
    """What a text-to-image teacher reads its prompts through: the prompt file, its indices as conditions (`prompts`
    set by the subclass), their captions for the text-image metrics, and the real images FID compares with. A mixin
    before a `LocalFilesTeacher`: the prompt file is one of the teacher's files and part of its key, named by the
    teacher param `prompts` (a trial's `teacher_params`; a paper suite names its prompt set there)."""

    params: ClassVar[dict[str, tuple[str, tuple[str, ...]]]] = {"prompts": (COCO_CAPTIONS, ())}
    # FID against the real images of this folder in the checkpoints folder (MS-COCO 2017 val, the SJD paper's
    # Table 1), under the key "fid.<extractor>.coco2017-val": "fid.pytorch-fid.coco2017-val" in SJD's suites
    # (`metrics.fid`)
    reference_images: ClassVar[tuple[str, str]] = ("val2017", "coco2017-val")
    prompts: list[str]

    @classmethod
    def prompt_path(cls) -> Path:
        return prompt_file(cls.root(), cls.setting("prompts"))

    @classmethod
    def files(cls) -> tuple[Path, ...]:
        return (*super().files(), cls.prompt_path())

    @classmethod
    def unavailable(cls) -> str | None:
        """The model's missing files first; then a prompt file that cannot be read (its own line: the prompts have
        their own option)."""
        return super().unavailable() or missing_prompts(cls.prompt_path())

    @classmethod
    def evaluation_data(cls) -> tuple[str, dict]:
        path = cls.prompt_path()
        return f"prompts-{path.stem}", {"file": str(path)}

    def conditions(self, n: int, generator: torch.Generator) -> torch.Tensor:
        """(n, 1) prompt indices: a random order of the prompts (each once while n <= their number; then again)."""
        m = len(self.prompts)
        order = torch.cat([torch.randperm(m, generator=generator, device=generator.device)
                           for _ in range(-(-n // m))])
        return order[:n, None]

    def captions(self, cond: torch.Tensor) -> list[str]:
        return [self.prompts[i] for i in cond[:, 0].tolist()]


class PromptedImageTeacher(PromptSet, LocalFilesTeacher):
    """The AR-token protocol over a causal model, given in `__init__` of a subclass: `model`, `prompts`,
    `prompt_ids` (the token ids of each prompt), `unconditional_prompt` (ids), `pad_id`, `vocab_size`, `seq_len`,
    `structure` (seq_len + 1 ids) with the token forced at each output position or `ANY_IMAGE_TOKEN` (position
    seq_len, one past the end, is what a window's last row predicts) and `forced`, the same on the model's device, and
    `image_tokens` (V,) bool. A subclass gives
    `_logits` (the float32 logits of a forward pass) and `decode`."""

    family: ClassVar = ar_token.FAMILY
    modality: ClassVar[str] = "image"
    supports_cfg: ClassVar[bool] = True
    # transformers' DynamicCache crops every row to one length: SJD and Jacobi decode it one sequence at a time
    ragged_cache: ClassVar[bool] = False

    model: Any
    prompt_ids: list[list[int]]
    unconditional_prompt: list[int]
    pad_id: int
    vocab_size: int
    seq_len: int
    forced: torch.Tensor
    image_tokens: torch.Tensor

    folder: ClassVar[str]  # the model's Hugging Face folder, by its official name, in the checkpoints folder
    hub: ClassVar[str]  # where that folder comes from (the Hugging Face repository)
    required: ClassVar[tuple[str, ...]] = ("config.json", "tokenizer_config.json")  # besides the safetensors shards

    @classmethod
    def path(cls) -> Path:
        return cls.root() / cls.folder

    @classmethod
    def local_files(cls) -> tuple[str, ...]:
        return tuple(f"{cls.folder}/{name}" for name in cls.required)

    @classmethod
    def weight_folders(cls) -> tuple[str, ...]:
        return (cls.folder,)

    @classmethod
    def hint(cls) -> str:
        return f"the Hugging Face folder {cls.folder} ({cls.hub})"

    # ---- the ARTokenTeacher protocol ------------------------------------------------------------------------------
    @torch.inference_mode()
    def start(self, cond: torch.Tensor, *, cfg: float) -> tuple[PromptedState, torch.Tensor]:
        from transformers import DynamicCache

        # on the meta device (the cost mode's count) a condition has no value: every row reads the first prompt
        rows = [self.prompt_ids[i] for i in ([0] * len(cond) if cond.is_meta else cond[:, 0].tolist())]
        if cfg != 1.0:
            rows += [self.unconditional_row(row) for row in rows]
        P, device = max(map(len, rows)), cond.device
        ids = torch.full((len(rows), P), self.pad_id, dtype=torch.long, device=device)
        mask = torch.zeros(len(rows), P, dtype=torch.long, device=device)
        for r, row in enumerate(rows):  # left padding: every row's last prompt token is at P - 1
            if row:
                ids[r, P - len(row) :] = torch.tensor(row, device=device)
                mask[r, P - len(row) :] = 1
        state = PromptedState(DynamicCache(), mask, len(cond), cfg, P, torch.zeros(0, dtype=torch.long, device=device))
        logits = self._prefill(state, ids)[:, -1]  # (R, V)
        return state, self._constrain(ar_token.guide(state, logits)[:, None], torch.zeros(1, dtype=torch.long,
                                                                                          device=device))[:, 0]

    @torch.inference_mode()
    def extend(self, state: PromptedState, tokens: torch.Tensor) -> torch.Tensor:
        at = torch.arange(state.length, state.length + tokens.shape[1], device=tokens.device)
        rows = tokens if state.cfg == 1.0 else torch.cat([tokens, tokens])
        state.mask = torch.cat([state.mask, torch.ones_like(rows)], 1)
        state.positions = torch.cat([state.positions, at])
        return self._constrain(ar_token.guide(state, self._forward(state, rows)), at + 1)  # (B, L, V)

    @torch.inference_mode()
    def extend_at(self, state: PromptedState, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """`extend` with each input at its own output position (ZipAR's next-set decoding, `methods.zipar`):
        positions (B, L), the same in every row (all rows share one cache), none cached before. The inputs are
        appended to the cache and each reads the prompt and every cached token at or before its position, and no
        other: the release's Lumina-mGPT inserts each input into the cache at its raster place and masks the cache
        after that place (ThisisBillhe/ZipAR @ 2a5695c, Lumina-mGPT-ZipAR/lumina_mgpt/model/chameleon/
        modeling_chameleon.py:344-357, :1556-1559); here the cache keeps its order and the mask reads the positions.
        Each input's rotary position is its output position after the row's prompt, as `extend` counts it.
        (B, L) -> (B, L, V)."""
        at = positions[0]  # not checked here: a check would wait on the device every pass
        rows = tokens if state.cfg == 1.0 else torch.cat([tokens, tokens])
        slots = torch.cat([state.positions, at])  # (length + L,)
        P = state.prompt_len
        state.mask = torch.cat([state.mask, torch.ones_like(rows)], 1)
        prompt = state.mask[:, None, :P].bool().expand(-1, len(at), -1)  # (R, L, P)
        reads = torch.cat([prompt, (slots[None, :] <= at[:, None]).expand(len(rows), -1, -1)], -1)  # (R, L, P+n)
        state.positions = slots
        logits = self._logits(input_ids=rows, attention_mask=additive(reads[:, None], self.model.dtype),
                              past_key_values=state.cache, position_ids=state.mask[:, :P].sum(-1, keepdim=True) + at,
                              use_cache=True)
        return self._constrain(ar_token.guide(state, logits), at + 1)  # (B, L, V)

    def unconditional_row(self, prompt: list[int]) -> list[int]:
        """The unconditional branch's prompt for a row with this prompt: `unconditional_prompt`, whatever the prompt."""
        return self.unconditional_prompt

    def rollback(self, state: PromptedState, length: int) -> None:
        if not 0 <= length <= state.length:
            raise ValueError(f"cannot roll a cache of {state.length} generated tokens back to {length}")
        if length < state.length:
            state.cache.crop(length - state.length)  # a negative count removes that many positions
        state.mask, state.positions = state.mask[:, : state.prompt_len + length], state.positions[:length]

    def select(self, state: PromptedState, rows: torch.Tensor) -> None:
        """Keep these rows (B',) in this order, each with its unconditional twin; a row may be kept more than once
        (SJD-PAC verifies each path of its draft tree as a row). Every row keeps the state's one length."""
        both = torch.cat([rows, rows + state.batch]) if state.cfg != 1.0 else rows
        state.cache.batch_select_indices(both)
        state.mask, state.batch = state.mask[both], len(rows)

    def _prefill(self, state: PromptedState, ids: torch.Tensor) -> torch.Tensor:  # (R, P) -> (R, P, V) float32
        """The prompts' pass: causal, as every pass."""
        return self._forward(state, ids)

    def _forward(self, state: PromptedState, ids: torch.Tensor) -> torch.Tensor:  # (R, L) -> (R, L, V) float32
        # positions as transformers' `generate` counts them: from each row's first unmasked token
        positions = (state.mask.cumsum(-1) - 1).clamp(min=0)[:, -ids.shape[1] :]
        return self._logits(input_ids=ids, attention_mask=state.mask, position_ids=positions,
                            past_key_values=state.cache, use_cache=True)

    def _logits(self, **inputs) -> torch.Tensor:
        raise NotImplementedError

    def _constrain(self, logits: torch.Tensor, outputs: torch.Tensor) -> torch.Tensor:
        """(B, L, V) logits of the output positions `outputs` (L,) -> the same with every token the image structure
        forbids at -inf. A forced position gets 0 at its token whatever the logits were, as the official processors
        write it: a row whose prompt is all masked (the unconditional branch's prefill) may carry any value there."""
        forced = self.forced[outputs.clamp(max=self.seq_len)]  # (L,)
        free = (forced == ANY_IMAGE_TOKEN)[:, None]  # (L, 1)
        one = torch.nn.functional.one_hot(forced.clamp(min=0), self.vocab_size).bool()  # (L, V)
        inf = torch.tensor(float("-inf"), device=logits.device)
        return torch.where(free, logits.masked_fill(~self.image_tokens, float("-inf")),
                           torch.where(one, torch.zeros((), device=logits.device), inf))
