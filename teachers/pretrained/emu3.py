"""Emu3-Gen (Wang et al., arXiv:2409.18869; BAAI), a text-to-image model of the SJD paper (arXiv:2410.01699, App. B,
Fig. 10: 8193 tokens decoded in ~3500 SJD steps), through transformers' `Emu3ForConditionalGeneration`: the registered
AR-token teacher `emu3-gen` (`ar`, `jacobi`, `sjd`).

Files (docs/checkpoints.md, 'Emu3'): the Hugging Face folder `Emu3-Gen-hf` (config with the vocabulary map, safetensors
shards holding the LM and the VQ-VAE, tokenizer and processor files) in the checkpoints folder (`--checkpoints`,
$ACCELBENCH_CHECKPOINTS), and the prompts (`teachers.data.prompts`: COCO 2017 val captions by default). On CUDA the
model runs in bfloat16, as the official script (baaivision/Emu3 `image_generation.py`) loads it; elsewhere in float32.
Logits are float32 either way.

Generation as the official script (docs/checkpoints.md, 'Emu3'):
- prompt: BOS + text + " masterpiece, film grained, best quality." + BOI + "{H}*{W}" + image-wrapper token, built by
  transformers' `Emu3Processor` (`return_for_image_generation`); H x W = 90 x 90 tokens for 720 px at ratio 1:1;
- CFG 3.0 against the script's negative prompt, itself passed through the same image-generation processor (so it
  also ends with BOI + size + wrapper; the transformers docs' example leaves that suffix out). The script guides in
  log-softmax space, g (s - u) + u; that differs from raw-logit CFG by a constant per row, so the sampling
  distribution is the same (`ar_token.guide`). Prompts of a batch and the negative prompt differ in length: rows are
  left-padded, with an attention mask and positions counted from each row's first real token;
- the prefix constraint of `Emu3PrefixConstrainedLogitsHelper`: position i of the output (offset i + 1 after the
  wrapper token) may be only EOL when the offset is a multiple of W + 1, then EOF, EOI and EOS after the H rows, any
  visual token otherwise. It masks the guided logits before `ar_token.process` applies temperature and top-k, the
  order of transformers' processor list; top-k 2048 (`--param top_k=2048 --param cfg=3.0`, the script's values).
The teacher's sequence is the whole structured output, H (W + 1) + 3 tokens (8193 at 720 px, the paper's count), and
its raster `grid` is (H, W + 1): a row ends with its EOL token, as SJD's spatial init expects (docs/methods/sjd.md).
The forced positions have one allowed token, so SJD accepts their drafts or replaces them by it.
"""
from __future__ import annotations

from typing import ClassVar

import torch

from core.cache import Cache
from core.training import library_bars
from teachers.data.prompts import read_prompts
from core.checkpoints import from_folder, read_config
from teachers.pretrained.prompted import ANY_IMAGE_TOKEN, PromptedImageTeacher

FOLDER = "Emu3-Gen-hf"
POSITIVE_SUFFIX = " masterpiece, film grained, best quality."  # appended to every prompt by the official script
NEGATIVE_PROMPT = ("lowres, bad anatomy, bad hands, text, error, missing fingers, extra digit, fewer digits, cropped, "
                   "worst quality, low quality, normal quality, jpeg artifacts, signature, watermark, username, "
                   "blurry.")  # the official script's
VERSION = 1  # bump when a change alters what the same files give


def structure(height: int, width: int, n: int, ids: dict[str, int]) -> list[int]:
    """The token forced at each of the output positions 0 .. n-1, or `ANY_IMAGE_TOKEN` where any visual token may
    come: the rule of `Emu3PrefixConstrainedLogitsHelper`, in its order (the EOL test first), for offsets 1 .. n."""
    out, rows = [], (width + 1) * height
    for offset in range(1, n + 1):
        if offset % (width + 1) == 0:
            out.append(ids["eol"])
        elif offset > rows:
            out.append({1: ids["eof"], 2: ids["eoi"], 3: ids["eos"]}.get(offset - rows, ids["pad"]))
        else:
            out.append(ANY_IMAGE_TOKEN)
    return out


class Emu3Gen(PromptedImageTeacher):
    """Emu3-Gen (8.5 B) via transformers, 720 x 720 px (90 x 90 VQ tokens, each row ending with EOL), text prompts."""

    folder: ClassVar[str] = FOLDER
    hub: ClassVar[str] = f"BAAI/{FOLDER}"
    required: ClassVar[tuple[str, ...]] = ("config.json", "tokenizer_config.json", "processor_config.json")
    ratio: ClassVar[str] = "1:1"  # width:height
    image_area: ClassVar[int] = 518400  # 720^2, the processor's and the official config's default

    def __init__(self, name: str, model, processor, prompts: list[str], info: dict):
        self.name, self.info = name, info
        self.model = model.eval().requires_grad_(False)
        self.processor, self.prompts = processor, prompts
        tok, vocab = processor.tokenizer, model.vocabulary_mapping
        self.height, self.width = processor.calculate_generate_size(self.ratio, self.image_area,
                                                                    processor.downsample_ratio)
        self.seq_len = self.height * (self.width + 1) + 3  # rows with their EOL, then EOF, EOI, EOS
        self.grid = (self.height, self.width + 1)
        self.vocab_size = model.config.text_config.vocab_size
        self.pad_id = tok.pad_token_id
        ids = {"eol": vocab.eol_token_id, "eof": tok.convert_tokens_to_ids(processor.eof_token),
               "eoi": tok.convert_tokens_to_ids(processor.image_end_token), "eos": tok.eos_token_id, "pad": self.pad_id}
        device = model.device
        # position n (a pass may predict one past the end) is beyond the image: pad, as the official rule says
        self.forced = torch.tensor(structure(self.height, self.width, self.seq_len + 1, ids), device=device)
        self.image_tokens = torch.zeros(self.vocab_size, dtype=torch.bool, device=device)
        self.image_tokens[vocab.image_tokens] = True
        self.prompt_ids = [self._encode(p + POSITIVE_SUFFIX) for p in prompts]
        self.unconditional_prompt = self._encode(NEGATIVE_PROMPT)

    def _encode(self, text: str) -> list[int]:
        enc = self.processor(text=text, return_for_image_generation=True, ratio=self.ratio,
                             image_area=self.image_area)
        return enc["input_ids"][0]

    @classmethod
    def key_parts(cls) -> tuple:
        return "emu3-gen", cls.ratio, cls.image_area, POSITIVE_SUFFIX, NEGATIVE_PROMPT, VERSION

    @classmethod
    def load(cls, name: str, *, cache: Cache, device: torch.device) -> "Emu3Gen":
        cls.require_files()
        from transformers import Emu3ForConditionalGeneration, Emu3Processor

        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
        read_config(cls.path(), model_type="emu3")
        with library_bars():
            model = from_folder(Emu3ForConditionalGeneration.from_pretrained, cls.path(), dtype=dtype).to(device)
            processor = from_folder(Emu3Processor.from_pretrained, cls.path())
        prompts = read_prompts(cls.prompt_path())
        info = {"n_params": sum(p.numel() for p in model.parameters()), "n_prompts": len(prompts)}
        return cls(name, model, processor, prompts, info)

    # ---- the ARTokenTeacher protocol (the rest: `PromptedImageTeacher`) -------------------------------------------
    def _logits(self, **inputs) -> torch.Tensor:
        return self.model(**inputs).logits.float()

    @torch.inference_mode()
    def decode(self, tokens: torch.Tensor) -> torch.Tensor:  # (B, N) structured output -> (B, 3, 8H, 8W) in [0, 1]
        images = self.model.model.decode_image_tokens(image_tokens=tokens, height=self.height, width=self.width)
        p = self.processor.image_processor
        if p.do_normalize:  # the decoder's output is in the processor's normalised space
            mean = torch.tensor(p.image_mean, device=images.device)[:, None, None]
            std = torch.tensor(p.image_std, device=images.device)[:, None, None]
            images = images.float() * std + mean
        return images.float().clamp(0, 1)
