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
from teachers.pretrained.hf_causal_lm import random_network
from teachers.families.ar_token import ANY_IMAGE_TOKEN
from teachers.pretrained.prompted import PromptedImageTeacher

FOLDER = "Emu3-Gen-hf"
POSITIVE_SUFFIX = " masterpiece, film grained, best quality."  # appended to every prompt by the official script
NEGATIVE_PROMPT = ("lowres, bad anatomy, bad hands, text, error, missing fingers, extra digit, fewer digits, cropped, "
                   "worst quality, low quality, normal quality, jpeg artifacts, signature, watermark, username, "
                   "blurry.")  # the official script's
VERSION = 1  # bump when a change alters what the same files give
# Emu3's special tokens by name (baaivision/Emu3 emu3/mllm/tokenization_emu3.py, `Emu3Tokenizer`'s defaults;
# transformers' Emu3Processor names the same): begin and end of sequence, padding, image start and end, the image
# wrapper, end of line and end of frame
BOS, EOS, PAD, BOI, EOI, WRAPPER, EOL, EOF = ("<|extra_203|>", "<|extra_204|>", "<|endoftext|>", "<|image start|>",
                                              "<|image end|>", "<|image token|>", "<|extra_200|>", "<|extra_201|>")


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


class StandInProcessor:
    """What the random build (`Emu3Gen.random`) has for `Emu3Processor`, no file read: it is its own tokenizer, with
    the ids of a vocabulary map (`Emu3Gen.stand_in_vocabulary`); its generation size is the processor's own
    (`calculate_generate_size`); and it reads no text: a prompt is the special tokens the processor adds around it,
    BOS, the image start and the image wrapper (the text and the "H*W" size are not tokenized)."""

    downsample_ratio = 8  # Emu3Processor's
    eof_token, image_end_token = EOF, EOI

    def __init__(self, vocabulary: dict[str, int]):
        self.vocabulary, self.tokenizer = vocabulary, self
        self.pad_token_id, self.eos_token_id = vocabulary[PAD], vocabulary[EOS]

    def convert_tokens_to_ids(self, token: str) -> int:
        return self.vocabulary[token]

    def calculate_generate_size(self, ratio: str, image_area: int, spatial_factor: int) -> tuple[int, int]:
        from transformers import Emu3Processor

        return Emu3Processor.calculate_generate_size(self, ratio, image_area, spatial_factor)  # reads no state

    def __call__(self, text: str, **kwargs) -> dict[str, list[list[int]]]:
        return {"input_ids": [[self.vocabulary[token] for token in (BOS, BOI, WRAPPER)]]}


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
        self.structure = structure(self.height, self.width, self.seq_len + 1, ids)
        self.forced = torch.tensor(self.structure, device=device)
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

    @staticmethod
    def stand_in_vocabulary(codes: int) -> dict[str, int]:
        """The random build's vocabulary map: the special tokens, then the VQ's `codes` under Emu3's visual-token
        names (transformers' `Emu3ImageVocabularyMapping` reads a code from the six digits of the name). Not the
        release's ids (no tokenizer or config.json is read): which id a token has changes no pass and no FLOP."""
        tokens = [BOS, EOS, PAD, BOI, EOI, WRAPPER, EOL, EOF, *(f"<|visual token {k:06d}|>" for k in range(codes))]
        return {token: i for i, token in enumerate(tokens)}

    @classmethod
    def random(cls, name: str, device: torch.device) -> "Emu3Gen":
        """Emu3-Gen as `load` builds it (transformers' `Emu3ForConditionalGeneration`: the LM and the VQ-VAE) at full
        size with seeded random weights, no file read: the cost mode's (`bench.cost`). The sizes are transformers'
        `Emu3Config` defaults: the LM's (vocabulary 184622, hidden 4096, intermediate 14336, 32 layers, 32 heads, 8
        key-value heads) are BAAI/Emu3-Chat's config.json, whose architecture Emu3-Gen shares (BAAI/Emu3-Gen's seven
        float32 shards, 33.97 GB, are its 8.49 B values); the VQ-VAE's (codebook 32768, embed_dim 4, z_channels 4, ch
        256, ch_mult [1, 2, 2, 4], 2 residual blocks, attention at 3, temporal downsampling 4) are
        BAAI/Emu3-VisionTokenizer's config.json. No tokenizer, processor or prompt file: `StandInProcessor`, and
        one prompt of its special tokens alone; the text's tokens (a caption, the script's suffix or negative prompt:
        a few tens, read once, against 8193 image tokens per row) are not counted."""
        from transformers import Emu3Config, Emu3ForConditionalGeneration, Emu3VQVAEConfig

        vocabulary = cls.stand_in_vocabulary(Emu3VQVAEConfig().codebook_size)
        model = random_network(Emu3ForConditionalGeneration._from_config, Emu3Config(vocabulary_map=vocabulary),
                               device)
        info = {"n_params": sum(p.numel() for p in model.parameters()), "n_prompts": 1}
        return cls(name, model, StandInProcessor(vocabulary), [""], info)

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
