"""LlamaGen's text-to-image GPT-XL (Sun et al., arXiv:2406.06525; FoundationVision/LlamaGen), the LlamaGen model of
SJD (arXiv:2410.01699, App. D, Table 3), loaded from local files as registered AR-token teachers:
`llamagen-t2i-xl-256` (stage 1, 16 x 16 tokens) and `llamagen-t2i-xl-512` (stage 2, 32 x 32 tokens), for `ar`,
`jacobi` and `sjd` (batches too: the network's ragged KV cache carries the caption padding).

Files, in the folder named by `--checkpoints` or $ACCELBENCH_CHECKPOINTS, by the names of LlamaGen's README: the GPT
(`t2i_XL_stage1_256.pt` or `t2i_XL_stage2_512.pt`, weights under "model"), the VQ-16 tokenizer `vq_ds16_t2i.pt` (the
c2i tokenizer's architecture, other weights) and the text encoder FLAN-T5-XL as a transformers folder `flan-t5-xl`
(`save_pretrained` of google/flan-t5-xl: config, tokenizer files, weights); and the prompts (`teachers.data.prompts`:
COCO 2017 val captions by default). The GPT and VQ load strictly, only `freqs_cis` and the VQ encoder dropped by name
(the official sampler loads the GPT with strict=False). On CUDA the T5 encoder runs in bfloat16, the official scripts'
default precision (sample_t2i.py, SJD's test_llamagen.py `--precision bf16`), elsewhere in float32.

Conditioning as LlamaGen's autoregressive/sample/sample_t2i.py `main` and language/t5.py `T5Embedder`: each prompt is
cleaned (`clean_caption`), tokenized to 120 tokens (`padding="max_length"`, truncation, the closing `</s>`), and
encoded by `T5EncoderModel`; its valid rows (its last hidden states, 2048 wide) are moved to the end of the 120
positions and the rest zeroed (left padding, `new_emb_masks = flip(emb_masks)`), and the padding is masked in both CFG
branches (`teachers.networks.llamagen`). A prompt is encoded once per loaded teacher, when `conditions` draws it (before
any timed batch, so the arms' timings hold the GPT alone) or, for a condition drawn elsewhere, at its first `start`.
Only the prompts a trial draws are encoded, not the file's 5,000: on an H200 FLAN-T5-XL's encoder (random weights, the
real shapes, bfloat16) took 1.2 ms per prompt at 32 prompts a pass (18 ms for one alone), against 0.97 s per 256 px
sample of the GPT's 256 cached AR steps with CFG at batch 8 (a pass is ~0.3 TFLOP: seconds per prompt on a CPU).

Sampling as LlamaGen's `generate`: CFG on raw logits with the learned unconditional caption, u + s (c - u), then
temperature, top-k, top-p and a draw (`ar_token.process`). SJD's settings for Table 3 (tyshiwo1/
Accelerating-T2I-AR-with-SJD test_llamagen.py): guidance 7.5 (line 35, and `--cfg_scale` line 217), top-k 1000
(line 33, `image_top_k`), top-p 1.0 (line 220), temperature 1.0 (line 219), window 16 (line 31,
`max_num_new_tokens`); its init "repeat_horizon" (line 32) falls back to random drafts for LlamaGen (no image width
reaches scheduler/jacobi_iteration_lumina_mgpt.py's initialiser, line 1069), and `jacobi_loop_interval_l/r` (lines
39-40) leave a few tokens at the start and, at 512 px, at the end to one-token steps: `--param cfg=7.5 --param
top_k=1000 --param window=16 --param init=random`. LlamaGen's sample_t2i.py has the same defaults (cfg 7.5, top-k 1000).

Images: the teacher param `decode` says how the VQ's output in [-1, 1] becomes an image in [0, 1]. `value-range`
(the default) as LlamaGen's own sample_t2i.py saves it (`save_image(..., normalize=True, value_range=(-1, 1))`:
(x + 1) / 2, clamped); `minmax` as SJD's scripts write theirs (test_llamagen.py:188-191, model_wrappers/
model_loader.py:555-558): clamped to [-1, 1], stretched to [0, 255] by the image's own minimum and maximum, and cast to
8 bits by truncation (`astype("uint8")`), so an image that does not reach -1 and 1 comes out brighter or darker and
with more contrast than under `value-range`.
"""
from __future__ import annotations

import dataclasses
import html
import re
import urllib.parse
from typing import ClassVar

import torch

from core.cache import Cache
from core.checkpoints import from_folder, read_config
from core.errors import UserError
from core.rng import seeded
from core.training import library_bars
from teachers.data.prompts import read_prompts
from teachers.families import ar_token
from teachers.networks.llamagen import LlamaGenConfig, LlamaGenGPT, t2i_config
from teachers.networks.vq16 import VQ16Decoder
from teachers.pretrained.llamagen import LlamaGenC2I
from teachers.pretrained.prompted import PromptSet

VQ_FILE = "vq_ds16_t2i.pt"
T5_FOLDER = "flan-t5-xl"
T5_REQUIRED = ("config.json", "tokenizer_config.json")
ENCODE_BATCH = 32  # prompts per T5 pass
VERSION = 1  # bump when a change alters what the same files give

_DASHES = re.compile("[\u002d\u058a\u05be\u1400\u1806\u2010-\u2015\u2e17\u2e1a\u2e3a\u2e3b\u2e40\u301c\u3030\u30a0"
                     "\ufe31\ufe32\ufe58\ufe63\uff0d]+")
_STRAY = re.compile(r"[#®•©™&@·º½¾¿¡§~)(\]\[}{|\\/*]+")


def clean_caption(text: str) -> str:
    """A prompt as LlamaGen's T5 embedder cleans it before tokenizing (language/t5.py `T5Embedder.text_preprocessing`:
    `clean_caption` twice), in what it changes in plain prompts: URL-unquoted, HTML-unescaped and lower-cased; dashes
    and quotes unified; runs of dots and stray symbols made spaces; dashes and underscores made spaces when more than
    three; a space after a mark glued to a word; whitespace collapsed; enclosing quotes and leading or trailing
    separators dropped. The rules aimed at scraped web captions (URLs, HTML tags, CJK ranges, file names,
    ids, shop phrases) and ftfy's mojibake repair are not applied."""
    for _ in range(2):
        t = urllib.parse.unquote_plus(str(text)).strip().lower()
        t = _DASHES.sub("-", t)
        t = re.sub("[`´«»“”¨]", '"', re.sub("[‘’]", "'", t))
        t = re.sub(r"[\"']{2,}", '"', re.sub(r"\.{2,}", " ", t))
        t = re.sub(r"\s+\.\s+", " ", _STRAY.sub(" ", t))
        if len(re.findall(r"[-_]", t)) > 3:
            t = re.sub(r"[-_]", " ", t)
        t = html.unescape(html.unescape(t)).strip()
        t = re.sub(r"(\D[,./])\b", r"\1 ", re.sub(r"\b\s+:\s+", ": ", t))
        t = re.sub(r"\s+", " ", t)
        t = re.sub(r"^[\"']([\w\W]+)[\"']$", r"\1", t)
        t = re.sub(r"[-'_,:+]$", "", re.sub(r"^['_,\-:;]", "", t))
        text = re.sub(r"^\.\S+$", "", t).strip()
    return text


def stretch(images: torch.Tensor) -> torch.Tensor:
    """(B, C, H, W) VQ outputs -> SJD's 8-bit images of them, / 255 (test_llamagen.py:188-191: clamped to [-1, 1],
    (x - min) / (max - min) * 255 over each image's pixels and channels, truncated to uint8). The metrics' rounding
    to 8 bits (`metrics.inception.to_uint8`) gives back those exact bytes. A constant image, which the release would
    divide by zero, is black."""
    x = images.float().clamp(-1, 1)
    lo, hi = x.amin(dim=(1, 2, 3), keepdim=True), x.amax(dim=(1, 2, 3), keepdim=True)
    return torch.floor((x - lo) / (hi - lo).clamp(min=torch.finfo(x.dtype).tiny) * 255) / 255


class LlamaGenT2I(PromptSet, LlamaGenC2I):
    """LlamaGen GPT-XL text-to-image, stage 1 at 256 px (t2i_XL_stage1_256.pt, 16 x 16 tokens), VQ-16 decoder,
    FLAN-T5-XL captions. No `network` attribute: DD's student reads class ids, not captions."""

    params: ClassVar[dict[str, tuple[str, tuple[str, ...]]]] = {
        **PromptSet.params, "decode": ("value-range", ("value-range", "minmax"))}  # the module's docstring
    reference_statistics: ClassVar[None] = None  # not ImageNet's: FID against `reference_images` (COCO val2017/)
    size: ClassVar[str] = "GPT-XL"
    image_size: ClassVar[int] = 256
    checkpoint: ClassVar[str] = "t2i_XL_stage1_256.pt"
    vq_file: ClassVar[str] = VQ_FILE

    def __init__(self, name: str, gpt: LlamaGenGPT, vq: VQ16Decoder, t5, tokenizer, prompts: list[str], info: dict):
        """`t5` and `tokenizer` None: no caption can be encoded, only those already in `_states` (`random`)."""
        self.name, self.info = name, info
        self.gpt, self.vq = gpt.eval().requires_grad_(False), vq.eval().requires_grad_(False)
        self.t5 = None if t5 is None else t5.eval().requires_grad_(False)
        self.tokenizer, self.prompts = tokenizer, prompts
        c = gpt.cfg
        self.seq_len, self.vocab_size, self.grid = c.seq_len, c.vocab_size, (c.grid, c.grid)
        self._states: dict[int, torch.Tensor] = {}  # prompt index -> its T5 states, valid tokens only (n, width)

    @classmethod
    def config(cls) -> LlamaGenConfig:
        return t2i_config(cls.size, (cls.image_size // cls.vq_config().downsample) ** 2)

    # ---- files ------------------------------------------------------------------------------------------------
    @classmethod
    def local_files(cls) -> tuple[str, ...]:
        """The GPT checkpoint, the VQ tokenizer, then the T5 folder's files."""
        return cls.checkpoint, cls.vq_file, *(f"{T5_FOLDER}/{name}" for name in T5_REQUIRED)

    @classmethod
    def weight_folders(cls) -> tuple[str, ...]:
        return (T5_FOLDER,)

    @classmethod
    def hint(cls) -> str:
        return (f"{cls.checkpoint}, {cls.vq_file} (FoundationVision/LlamaGen, README) and the transformers folder "
                f"{T5_FOLDER} (google/flan-t5-xl)")

    @classmethod
    def key_parts(cls) -> tuple:
        return "llamagen-t2i", dataclasses.asdict(cls.config()), dataclasses.asdict(cls.vq_config()), VERSION

    @classmethod
    def load(cls, name: str, *, cache: Cache, device: torch.device) -> "LlamaGenT2I":
        cls.require_files()
        from transformers import AutoTokenizer, T5EncoderModel

        gpt, vq = cls.read_networks(name)
        t5_dir = cls.root() / T5_FOLDER
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
        read_config(t5_dir, model_type="t5")
        with library_bars():
            t5 = from_folder(T5EncoderModel.from_pretrained, t5_dir, dtype=dtype).to(device)
            tokenizer = from_folder(AutoTokenizer.from_pretrained, t5_dir)
        if t5.config.d_model != gpt.cfg.caption_dim:
            raise UserError(f"{name}: {t5_dir} gives {t5.config.d_model}-wide states, the GPT reads "
                            f"{gpt.cfg.caption_dim}: FLAN-T5-XL's")
        prompts = read_prompts(cls.prompt_path())
        info = {"n_params": sum(p.numel() for p in gpt.parameters()), "n_prompts": len(prompts)}
        return cls(name, gpt.to(device), vq.to(device), t5, tokenizer, prompts, info)

    @classmethod
    def random(cls, name: str, device: torch.device) -> "LlamaGenT2I":
        """The GPT (GPT-XL, `t2i_config`: tests/fixtures/llamagen_t2i/GPT-XL-t2i.keys.json is the official module's
        key set) and the VQ-16 decoder at full size with seeded random weights, no file read: the cost mode's
        (`bench.cost`). No T5, tokenizer or prompt file: one stand-in prompt whose states are 120 zero rows, a caption
        of all 120 positions (what `caption_embeddings` gives on the meta device). What an arm costs does not depend
        on them: captions are encoded when `conditions` draws them, before any arm's passes (the module's
        docstring), and the GPT reads all 120 caption positions of any caption (padding is masked, not skipped)."""
        with seeded(0), torch.device(device):
            gpt, vq = LlamaGenGPT(cls.config()), VQ16Decoder(cls.vq_config())
        c = gpt.cfg
        teacher = cls(name, gpt, vq, None, None, [""], {"n_params": sum(p.numel() for p in gpt.parameters())})
        teacher._states[0] = torch.zeros(c.cond_len, c.caption_dim, device=device)
        return teacher

    # ---- captions ---------------------------------------------------------------------------------------------
    def conditions(self, n: int, generator: torch.Generator) -> torch.Tensor:
        """(n, 1) prompt indices, in a random order of the prompts (`PromptSet.conditions`), their captions
        encoded."""
        cond = super().conditions(n, generator)
        self._encode(cond[:, 0].tolist())
        return cond

    @torch.inference_mode()
    def _encode(self, indices: list[int]) -> None:
        """T5's last hidden states of the prompts `indices` not encoded yet, valid tokens only (T5Embedder
        `get_text_embeddings`: 120 tokens, right-padded, the attention mask given)."""
        todo = sorted(set(indices) - set(self._states))
        for k in range(0, len(todo), ENCODE_BATCH):
            chunk, device = todo[k : k + ENCODE_BATCH], next(self.t5.parameters()).device
            enc = self.tokenizer([clean_caption(self.prompts[i]) for i in chunk], max_length=self.gpt.cfg.cond_len,
                                 padding="max_length", truncation=True, add_special_tokens=True,
                                 return_attention_mask=True, return_tensors="pt").to(device)
            states = self.t5(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"]).last_hidden_state
            for i, s, valid in zip(chunk, states, enc["attention_mask"].sum(1).tolist()):
                self._states[i] = s[:valid].clone()

    def caption_embeddings(self, cond: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cond (B, 1) prompt indices -> the GPT's condition (B, 120, 2048), each caption's valid states at the end
        and zeros before them (sample_t2i.py's left padding), and its padding (B, 120), True where padded. On the
        meta device (the cost mode's count, `bench.cost`) a condition holds no index to read: shapes only, a caption
        of all 120 positions, which costs the GPT what any caption does (padding is masked, not skipped)."""
        c = self.gpt.cfg
        emb = torch.zeros(len(cond), c.cond_len, c.caption_dim, device=cond.device)
        padding = torch.ones(len(cond), c.cond_len, dtype=torch.bool, device=cond.device)
        if cond.is_meta:
            return emb, ~padding
        self._encode(cond[:, 0].tolist())
        for row, i in enumerate(cond[:, 0].tolist()):
            states = self._states[i]
            emb[row, c.cond_len - len(states) :] = states.to(emb)
            padding[row, c.cond_len - len(states) :] = False
        return emb, padding

    # ---- the ARTokenTeacher protocol (rollback and select: `GuidedNetworkTeacher`) ---------------------------------
    @torch.inference_mode()
    def start(self, cond: torch.Tensor, *, cfg: float, ragged: bool = False):
        emb, padding = self.caption_embeddings(cond)
        # null_id is not read: the unconditional branch's caption is the learned `uncond_embedding`
        state, logits = self.gpt.start(emb, cfg=cfg, null_id=0, ragged=ragged, padding=padding)
        return state, ar_token.guide(state, logits)

    @torch.inference_mode()
    def extend(self, state, tokens: torch.Tensor) -> torch.Tensor:
        return ar_token.guide(state, self.gpt.extend_guided(state, tokens))

    @torch.inference_mode()
    def decode(self, tokens: torch.Tensor) -> torch.Tensor:  # (B, N) codes -> (B, 3, H, W) in [0, 1]
        if self.setting("decode") == "minmax":
            return stretch(self.vq(tokens, self.grid))
        return super().decode(tokens)


class LlamaGenT2I512(LlamaGenT2I):
    """LlamaGen GPT-XL text-to-image, stage 2 at 512 px (t2i_XL_stage2_512.pt, 32 x 32 tokens), VQ-16 decoder,
    FLAN-T5-XL captions."""

    image_size, checkpoint = 512, "t2i_XL_stage2_512.pt"
