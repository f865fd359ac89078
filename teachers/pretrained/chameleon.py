"""Lumina-mGPT (Liu et al., arXiv:2408.02657; Alpha-VLLM) and Anole (Chern et al., arXiv:2407.06135; GAIR), the two
Chameleon-based text-to-image models SJD is measured on (arXiv:2410.01699, Tables 1, 2, 4, 5 and 8), through
transformers' Chameleon classes: the registered AR-token teachers `lumina-mgpt-7b-512`, `-768`, `-1024` and
`anole-7b` (`ar`, `jacobi`, `sjd`).

Files, in the checkpoints folder (`--checkpoints`, $ACCELBENCH_CHECKPOINTS):
- the Hugging Face folder of the model: `Lumina-mGPT-7B-768` (Alpha-VLLM/Lumina-mGPT-7B-768; also -512, -1024) or
  `Anole-7b-v0.1-hf` (leloy/Anole-7b-v0.1-hf): config.json with the vocabulary map, safetensors shards, tokenizer;
- Chameleon's VQGAN, which neither folder holds, where Lumina-mGPT's README puts it: `chameleon/tokenizer/vqgan.ckpt`
  and `vqgan.yaml` (Meta's release; `teachers.networks.chameleon_vqgan`);
- the prompts (`teachers.data.prompts`: COCO 2017 val captions by default).

Loading. The weights are read from the shards into transformers' `ChameleonForConditionalGeneration`, strictly, with
named exceptions: the VQ-VAE encoder (`model.vqmodel.*`, never used to generate) is dropped, and the QK LayerNorm
weights, which Lumina-mGPT's own Chameleon copy stores per model-parallel shard, (1, head_dim) for the 7B, are
repeated over the heads as its forward does (`repeat_interleave`); transformers stores (heads, head_dim). The forward
of transformers' Chameleon sets every image token's logit to the float minimum: the logits here are the LM head over
the base model's hidden states (`model.lm_head(model.model(...))`), the library untouched. On CUDA the model runs in
bfloat16, as both official scripts load it; elsewhere in float32. Logits are float32 either way.

Generation as the official inference code (tyshiwo1/Accelerating-T2I-AR-with-SJD, a copy of Lumina-mGPT's):
- prompt, Lumina-mGPT: "Generate an image of {S}x{S} according to the following prompt:\\n{prompt}"
  (model_wrappers/model_loader.py:373) followed by the conversation separator <reserved08706>, with BOS
  (lumina_mgpt/data/convertsation.py `Conversation.process`; xllmx/data/item_processor.py:212); Anole:
  "Generate an image of {prompt}" (model_loader.py:399), BOS and the separator as `ChameleonProcessor` adds them;
- the image, Lumina-mGPT: <racm3:break>, the height and width tokens <reserved{8800 + S/32}> (the model samples them;
  they are forced here, to the size the prompt asks for, so every sample has one length), S/16 rows of S/16 image
  tokens each ending with the newline <reserved08799>, <eoss>, then the separator that ends generation
  (inference_solver.py:341, eos 8710): 3 + 48 x 49 + 2 = 2357 tokens at 768 px, the paper's count (App. C).
  Anole: <racm3:break>, 32 x 32 image tokens, <eoss> (model_loader.py:407, 1026 new tokens);
- the structure constraint of `MultiModalLogitsProcessor` (inference_solver.py:134-223): newline and end tokens
  forced, only image tokens elsewhere in the image; the image tokens are the vocabulary map's IMGIMG* entries
  (inference_solver.py:154's ids 4..8195 in the released vocabulary);
- CFG on raw logits, s (c - u) + u (inference_solver.py:125). Lumina-mGPT's unconditional branch is the output
  alone, from the image-start token at position 0 with its own cache (`get_unconditional_logits`): here a row whose
  prompt is all masked. Lumina-mGPT guides only after the two size tokens, which are forced here, so guiding them too
  changes nothing. ZipAR's release batches the branch instead: the prompt's BOS then padding tokens, all read
  (`uncond: pad-prompt`, `unconditional_row`), and its prompt pass reads the prompt both ways (`prefill:
  bidirectional`, `_prefill`; the default `causal` is the model's).
  SJD's release builds that branch by masking all of the prompt but its last token, the separator
  (scheduler/jacobi_iteration_lumina_mgpt.py:1000, prefill_num = prompt length - 1; :1007-1014 and :755-758 zero the
  unconditional rows' mask before it), which then sits at position 0 (:703-706): one token of context more than
  Lumina-mGPT's branch. Lumina-mGPT's teacher param `uncond` names the branch: `image-start` (the default),
  `separator` or `pad-prompt`. Anole's transformers `generate` has no CFG, so SJD's is the only official one:
  Anole's unconditional prompt is the separator (`Anole7B`);
- the paper's settings (eval_model.py:96 and :114): `--param cfg=3.0 --param top_k=2000` for Lumina-mGPT, whose
  logits processor applies the top-k (jacobi_iteration_lumina_mgpt.py:440-466), temperature 1. Anole's path stores
  `image_top_k` (jacobi_iteration_anhole.py:99-102) but never reads it: its `generate` (:136-272) adds only the
  structure processors, and the top-k is transformers' from the generation config (model_loader.py:404-409 passes
  none; Anole-7b-v0.1-hf's generation_config.json sets none; transformers 4.47.1, environment.yaml:89, defaults
  `top_k` to 50, generation/configuration_utils.py:422, appended as `TopKLogitsWarper` after the structure,
  generation/utils.py:1039-1062): `--param top_k=50` for Anole;
- random drafts (SJD `init: random`) from the image tokens only (`draft_tokens`), as the release draws them from
  Chameleon's tokenizer's IMGIMG ids (jacobi_iteration_lumina_mgpt.py:502-509, `img_vocab` of :879-886,
  lumina_mgpt/model/chameleon_vae_ori/vocab.py:55-56) for Lumina-mGPT and Anole alike (jacobi_iteration_anhole.py:328-
  329 installs the same sampler).
The teacher's `grid` is (S/16, S/16 + 1) for Lumina-mGPT (a row ends with its newline, as SJD's spatial initialisation
counts, methods/sjd.py `_Drafter`) and (32, 32) for Anole.

Images: `decode` gives the 8-bit levels, / 255, of the PNG each release writes and FID and CLIP read back, so the
metrics' rounding to 8 bits (`metrics.inception.to_uint8`) returns those bytes exactly (`tests/test_release_pixels.py`
recomputes them by hand):
- Lumina-mGPT: Chameleon's image tokenizer, `(clamp(x, -1, 1) + 1) / 2` in float32, times 255 and cast to uint8 by
  truncation (lumina_mgpt/model/chameleon_vae_ori/image_tokenizer.py:100, :106, through item_processor.py:211; the
  grid of one image, model_loader.py:384, pastes it unchanged): `chameleon_levels`, on average half a level darker
  than rounding (x + 1) / 2 to the nearest level;
- Anole, the SJD release's path (teacher param `decode: postprocess`, the default): `model.decode_image_tokens`
  then `ChameleonProcessor.postprocess_pixel_values` (model_loader.py:415-420). transformers 4.47.1, which
  environment.yaml:89 pins, has neither; they are those of the Anole conversion's transformers branch (leloykun/
  transformers fc--anole, 1ce50c63a: processing_chameleon.py:169-181 calls image_processing_chameleon.py:369-411), on
  the VQ's output in the model's bfloat16 (model_loader.py:71, :87): x * std + mean with mean = std = 1 (:452), times
  1 / rescale_factor = 1 / 0.0078 (:400, :409), clipped to [0, 255], cast to uint8 by truncation (:411), the
  processor's defaults (:121, :142-143), which the conversion saves (convert_chameleon_weights_to_hf.py:390-392):
  `postprocess_levels`. 1 / 0.0078 = 128.2 is not 127.5: every level is about 0.5 % brighter than Chameleon's, and
  x above 0.989 saturates at 255. Ours decodes in float32 and rounds its output to bfloat16 before that arithmetic;
  the release's VQGAN computes in bfloat16 throughout. `decode: chameleon` converts as Lumina-mGPT does, Chameleon's
  own tokenizer, which GAIR-NLP/anole's inference uses (chameleon/inference/image_tokenizer.py
  `_pil_from_chw_tensor`).
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import ClassVar

import torch

from core.cache import Cache
from core.errors import UserError
from core.rng import seeded
from teachers.data.prompts import read_prompts
from teachers.networks.chameleon_vqgan import ChameleonVQConfig, ChameleonVQGAN, load_vqgan_state
from core.checkpoints import from_folder, mismatch, read_config, read_safetensors, read_state_dict
from teachers.pretrained.hf_causal_lm import random_network
from teachers.families.ar_token import ANY_IMAGE_TOKEN
from teachers.pretrained.prompted import PromptedImageTeacher, additive

VQGAN = ("chameleon/tokenizer/vqgan.ckpt", "chameleon/tokenizer/vqgan.yaml")  # Lumina-mGPT README's layout
DROPPED = ("model.vqmodel.",)  # the VQ-VAE encoder: images are never encoded here
QK_NORMS = ("self_attn.q_norm.", "self_attn.k_norm.")
START, END, NEWLINE, SEPARATOR = "<racm3:break>", "<eoss>", "<reserved08799>", "<reserved08706>"
BOS, PAD = "<s>", "<pad>"  # Chameleon's (lumina_mgpt/model/chameleon_vae_ori/vocab.py `VocabInfo`)
LATENT = 16  # pixels per image token (the VQGAN downsamples 16x)
# bump when a change alters what the same files give (2: Anole's unconditional prompt is the separator; 3: the
# releases' 8-bit conversions)
VERSION = 3
# Anole's image processor: ChameleonImageProcessor's rescale_factor and unnormalising mean and std (leloykun/
# transformers fc--anole 1ce50c63a image_processing_chameleon.py:121, :142-143), the values the conversion saves
# (convert_chameleon_weights_to_hf.py:390-392 saves the processor built with its defaults)
RESCALE_FACTOR, MEAN, STD = 0.0078, 1.0, 1.0


def chameleon_levels(x: torch.Tensor) -> torch.Tensor:
    """(B, 3, H, W) VQGAN outputs -> Chameleon's image tokenizer's 8-bit image, / 255: clamped to [-1, 1], mapped to
    [0, 1] and scaled to 255 in float32, truncated (Lumina-mGPT's `_pil_from_chw_tensor`, image_tokenizer.py:100,
    :106 of SJD's copy)."""
    return torch.floor((x.float().clamp(-1.0, 1.0) + 1.0) / 2.0 * 255) / 255


def postprocess_levels(x: torch.Tensor) -> torch.Tensor:
    """(B, 3, H, W) VQGAN outputs -> the 8-bit image of the SJD release's Anole path, / 255: in bfloat16, the
    model's dtype there, unnormalised (x * STD + MEAN), times 1 / RESCALE_FACTOR, clipped to [0, 255] and truncated
    (the fork's `ChameleonImageProcessor.postprocess`, image_processing_chameleon.py:405-411; the module's
    docstring)."""
    y = x.to(torch.bfloat16) * STD + MEAN
    return (y * (1.0 / RESCALE_FACTOR)).clamp(0, 255).to(torch.uint8).float() / 255


def size_token(n_grids: int) -> str:
    """Lumina-mGPT's token for a side of n_grids x 32 px (item_processor.py:104)."""
    return f"<reserved{8800 + n_grids:05d}>"


def image_token(code: int) -> str:
    """The vocabulary's name of a VQGAN code: its digits written A-J between IMGIMG and Z (transformers'
    `ChameleonImageVocabularyMapping.bpe2img` reads them back)."""
    return "IMGIMG" + "".join(chr(ord("A") + int(d)) for d in str(code)) + "Z"


class StandInTokenizer:
    """What the random build (`LuminaMGPT768.random`) has for a tokenizer, no file read: the ids of its vocabulary
    map (`stand_in_vocabulary`), and no text: a text encodes as the special tokens it holds (a prompt as its closing
    separator; the template and the caption are not tokenized)."""

    def __init__(self, vocabulary: dict[str, int], specials: list[str]):
        self.vocabulary = vocabulary
        self.bos_token_id, self.pad_token_id = vocabulary[BOS], vocabulary[PAD]
        self._specials = re.compile("|".join(map(re.escape, specials)))

    def convert_tokens_to_ids(self, token: str) -> int:
        return self.vocabulary[token]

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [self.vocabulary[t] for t in self._specials.findall(text)]


def read_chameleon(folder: Path, device: torch.device, dtype: torch.dtype):
    """transformers' `ChameleonForConditionalGeneration` from a Hugging Face folder's shards, strictly, without its
    VQ-VAE encoder (`DROPPED`), QK-norm weights stored per model-parallel shard repeated over the heads."""
    from transformers import ChameleonConfig, ChameleonForConditionalGeneration
    from transformers.models.chameleon.modeling_chameleon import ChameleonRotaryEmbedding

    read_config(folder, model_type="chameleon")
    config = from_folder(ChameleonConfig.from_pretrained, folder)
    with torch.device("meta"):  # no random init of weights the files replace
        model = ChameleonForConditionalGeneration(config)
    model.model.vqmodel = None
    heads = {QK_NORMS[0]: config.num_attention_heads, QK_NORMS[1]: config.num_key_value_heads}
    state = {}
    for shard in sorted(folder.glob("*.safetensors")):
        for key, value in read_safetensors(shard, device=str(device)).items():
            if key.startswith(DROPPED):
                continue
            norm = next((n for n in QK_NORMS if n in key), None)
            if norm and value.dim() == 2:  # (shards, head_dim) -> (heads, head_dim), Lumina's repeat_interleave
                value = value.repeat_interleave(heads[norm] // value.shape[0], dim=0)
            state[key] = value.to(dtype)
    model.load_state_dict(state, strict=True, assign=True)
    with torch.device(device):  # a buffer outside the state dict, left on meta above
        model.model.rotary_emb = ChameleonRotaryEmbedding(config)
    return model.eval().requires_grad_(False)


class LuminaMGPT768(PromptedImageTeacher):
    """Lumina-mGPT 7B at 768 px (48 x 48 image tokens, rows ending with a newline: 2357 outputs), Chameleon's VQGAN."""

    folder: ClassVar[str] = "Lumina-mGPT-7B-768"
    hub: ClassVar[str] = "Alpha-VLLM/Lumina-mGPT-7B-768"
    image_size: ClassVar[int] = 768
    # `uncond`, the unconditional branch of CFG: `image-start`, Lumina-mGPT's own (the output alone), `separator`,
    # SJD's release's (the prompt masked but for its separator), or `pad-prompt`, ZipAR's release's
    # (`unconditional_row`); the module's docstring gives the sources
    # `prefill`, the prompt's pass: `causal`, the model's, or `bidirectional`, ZipAR's release's (`_prefill`)
    params: ClassVar[dict[str, tuple[str, tuple[str, ...]]]] = {
        **PromptedImageTeacher.params, "uncond": ("image-start", ("image-start", "separator", "pad-prompt")),
        "prefill": ("causal", ("causal", "bidirectional"))}

    def __init__(self, name: str, model, vq: ChameleonVQGAN, tokenizer, prompts: list[str], info: dict):
        self.name, self.info = name, info
        self.model, self.vq, self.tokenizer, self.prompts = model, vq.eval().requires_grad_(False), tokenizer, prompts
        self.vocab_size = model.config.vocab_size
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.bos_token_id
        self.side = self.image_size // LATENT  # image tokens per row and per column
        device = model.lm_head.weight.device
        mapping = model.model.vocabulary_mapping
        self.image_tokens = torch.zeros(self.vocab_size, dtype=torch.bool, device=device)
        self.image_tokens[mapping.image_tokens] = True
        self.codes = torch.zeros(self.vocab_size, dtype=torch.long, device=device)  # BPE id -> VQGAN code
        self.codes[list(mapping.bpe2img)] = torch.tensor(list(mapping.bpe2img.values()), device=device)
        # random drafts: the image tokens, as SJD's release (their sorted ids, `image_tokens.nonzero()` off the meta
        # device, where nonzero has no shape to give)
        self.draft_tokens = torch.tensor(mapping.image_tokens, device=device)
        layout = self.layout()
        self.seq_len = len(layout)
        # position seq_len (a window's last row predicts one past the end) is beyond the image: the separator
        self.structure = [*layout, self._id(SEPARATOR)]
        self.forced = torch.tensor(self.structure, device=device)
        self.prompt_ids = [[tokenizer.bos_token_id, *tokenizer.encode(self.prompt_text(p) + SEPARATOR,
                                                                        add_special_tokens=False)] for p in prompts]
        self.unconditional_prompt = self.unconditional_ids()

    def unconditional_ids(self) -> list[int]:
        """The unconditional branch's prompt: nothing (`uncond: image-start`: the output alone, from the image-start
        token at position 0), the separator at position 0 (`uncond: separator`), or None: one per prompt
        (`uncond: pad-prompt`, `unconditional_row`)."""
        return {"image-start": [], "separator": [self._id(SEPARATOR)], "pad-prompt": None}[self.setting("uncond")]

    def unconditional_row(self, prompt: list[int]) -> list[int]:
        """`uncond: pad-prompt`: the prompt's first token (BOS) then a padding token in place of each other, all of
        them read, at the prompt's positions: ZipAR's release batches CFG so (ThisisBillhe/ZipAR @ 2a5695c,
        Lumina-mGPT-ZipAR/lumina_mgpt/model/chameleon/modeling_chameleon.py:1929-1933: ids 0 then 1, Chameleon's BOS
        and padding, beside an all-ones attention mask; inference_solver.py:511 drops Lumina-mGPT's own branch)."""
        if self.unconditional_prompt is not None:
            return super().unconditional_row(prompt)
        return [prompt[0], *[self.pad_id] * (len(prompt) - 1)]

    def _prefill(self, state, ids: torch.Tensor) -> torch.Tensor:
        """`prefill: bidirectional`: every prompt token reads every prompt token of its row, padding excepted, as
        ZipAR's release computes the prompt's pass (ThisisBillhe/ZipAR @ 2a5695c, Lumina-mGPT-ZipAR/lumina_mgpt/model/
        chameleon/modeling_chameleon.py): its decoder layers use the eager attention whatever the model's attention
        implementation (:636-637), which adds the mask it is given and nothing else, while transformers 4.44 loads
        the model with SDPA (`_supports_sdpa`, :1150), whose mask builder gives no mask for a pass over an unpadded
        batch (`_update_causal_mask`, :1449-1457), counting on SDPA's own causal flag. The later passes read one
        token, or ZipAR's explicit mask."""
        if self.setting("prefill") == "causal":
            return super()._prefill(state, ids)
        R, P = ids.shape
        reads = state.mask[:, None, None, :].bool().expand(R, 1, P, P)
        positions = (state.mask.cumsum(-1) - 1).clamp(min=0)
        return self._logits(input_ids=ids, attention_mask=additive(reads, self.model.dtype), position_ids=positions,
                            past_key_values=state.cache, use_cache=True)

    def _id(self, token: str) -> int:
        return self.tokenizer.convert_tokens_to_ids(token)

    @property
    def grid(self) -> tuple[int, int]:
        return self.side, self.side + 1

    def prompt_text(self, prompt: str) -> str:
        return f"Generate an image of {self.image_size}x{self.image_size} according to the following prompt:\n{prompt}"

    def layout(self) -> list[int]:
        """The token forced at each output position, `ANY_IMAGE_TOKEN` where an image token comes."""
        size = self._id(size_token(self.image_size // (2 * LATENT)))
        row = [ANY_IMAGE_TOKEN] * self.side + [self._id(NEWLINE)]
        return [self._id(START), size, size, *row * self.side, self._id(END), self._id(SEPARATOR)]

    def image_codes(self, tokens: torch.Tensor) -> torch.Tensor:  # (B, N) outputs -> (B, side * side) image BPE ids
        rows = tokens[:, 3 : 3 + self.side * (self.side + 1)].reshape(len(tokens), self.side, self.side + 1)
        return rows[:, :, : self.side].flatten(1)

    # ---- files ------------------------------------------------------------------------------------------------
    @classmethod
    def local_files(cls) -> tuple[str, ...]:
        return (*super().local_files(), *VQGAN)

    @classmethod
    def hint(cls) -> str:
        return f"{super().hint()} and Chameleon's image tokenizer (Meta's release: {', '.join(VQGAN)})"

    @classmethod
    def key_parts(cls) -> tuple:
        return "chameleon-t2i", cls.__name__, cls.image_size, VERSION

    @classmethod
    def evaluation_data(cls) -> tuple[str, dict]:
        name, data = super().evaluation_data()
        return name, {**data, "image_size": cls.image_size}

    @classmethod
    def load(cls, name: str, *, cache: Cache, device: torch.device) -> "LuminaMGPT768":
        cls.require_files()
        from transformers import AutoTokenizer

        ckpt, yaml_file = (cls.root() / name for name in VQGAN)
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
        try:
            with torch.device("meta"):
                vq = ChameleonVQGAN(ChameleonVQConfig.from_yaml(yaml_file))
            load_vqgan_state(vq, read_state_dict(ckpt, ("state_dict",)))
            model = read_chameleon(cls.path(), device, dtype)
        except ValueError as exc:  # a vqgan.yaml the decoder cannot follow: one line naming it
            raise UserError(f"{name}: {exc}") from None
        except RuntimeError as exc:
            raise UserError(f"{name}: {cls.folder} or {ckpt.name} does not fit transformers' Chameleon or the VQGAN: "
                            f"{mismatch(exc)}") from None
        tokenizer = from_folder(AutoTokenizer.from_pretrained, cls.path())
        prompts = read_prompts(cls.prompt_path())
        info = {"n_params": sum(p.numel() for p in model.parameters()), "n_prompts": len(prompts)}
        return cls(name, model, vq.float().to(device), tokenizer, prompts, info)

    @classmethod
    def stand_in_vocabulary(cls) -> tuple[dict[str, int], list[str]]:
        """The random build's vocabulary map and its special tokens: BOS, padding and the tokens this teacher's image
        structure forces, then the VQGAN's codes under Chameleon's image-token names (`image_token`). Not the
        release's ids (no tokenizer or config.json is read): which id a token has changes no pass and no FLOP."""
        specials = [BOS, PAD, START, END, NEWLINE, SEPARATOR, size_token(cls.image_size // (2 * LATENT))]
        codes = [image_token(k) for k in range(ChameleonVQConfig().n_embed)]
        return {token: i for i, token in enumerate(specials + codes)}, specials

    @classmethod
    def random(cls, name: str, device: torch.device) -> "LuminaMGPT768":
        """Chameleon 7B as `read_chameleon` builds it (transformers' `ChameleonForConditionalGeneration` without
        its VQ-VAE encoder) and the VQGAN decoder, at full size with seeded random weights, no file read: the cost
        mode's (`bench.cost`). The 7B is `ChameleonConfig`'s defaults, the sizes of Lumina-mGPT's own 7B module
        (tests/fixtures/chameleon/MAKING.md: vocabulary 65536, hidden 4096, intermediate 11008, 32 layers, 32 heads;
        Anole 7B is Chameleon 7B too); the VQGAN is `ChameleonVQConfig`'s defaults (tests/fixtures/chameleon_vqgan/
        MAKING.md). No tokenizer or prompt file: the vocabulary is `stand_in_vocabulary`'s and the one prompt is
        its special tokens alone (`StandInTokenizer`: BOS and the separator); the template's and the caption's tokens,
        a few tens read once, against thousands of image tokens per row, are not counted."""
        from transformers import ChameleonConfig, ChameleonForConditionalGeneration

        vocabulary, specials = cls.stand_in_vocabulary()
        model = random_network(ChameleonForConditionalGeneration._from_config,
                               ChameleonConfig(vocabulary_map=vocabulary), device)
        model.model.vqmodel = None  # as `read_chameleon`: images are never encoded here
        with seeded(0), torch.device(device):
            vq = ChameleonVQGAN(ChameleonVQConfig())
        info = {"n_params": sum(p.numel() for p in model.parameters()), "n_prompts": 1}
        return cls(name, model, vq, StandInTokenizer(vocabulary, specials), [""], info)

    # ---- the ARTokenTeacher protocol (the rest: `PromptedImageTeacher`) -------------------------------------------
    def _logits(self, **inputs) -> torch.Tensor:
        return self.model.lm_head(self.model.model(**inputs).last_hidden_state).float()

    @torch.inference_mode()
    def decode(self, tokens: torch.Tensor) -> torch.Tensor:  # (B, N) outputs -> (B, 3, S, S) in [0, 1]
        codes = self.codes[self.image_codes(tokens)]
        return self.levels(self.vq(codes, (self.side, self.side)))

    def levels(self, x: torch.Tensor) -> torch.Tensor:
        """The VQGAN's output as the release writes its image (the module's docstring, "Images")."""
        return chameleon_levels(x)


class LuminaMGPT512(LuminaMGPT768):
    """Lumina-mGPT 7B at 512 px (32 x 32 image tokens, rows ending with a newline: 1061 outputs), Chameleon's VQGAN."""

    folder, hub, image_size = "Lumina-mGPT-7B-512", "Alpha-VLLM/Lumina-mGPT-7B-512", 512


class LuminaMGPT1024(LuminaMGPT768):
    """Lumina-mGPT 7B at 1024 px (64 x 64 image tokens, rows ending with a newline: 4165 outputs), Chameleon's
    VQGAN."""

    folder, hub, image_size = "Lumina-mGPT-7B-1024", "Alpha-VLLM/Lumina-mGPT-7B-1024", 1024


class Anole7B(LuminaMGPT768):
    """Anole 7B at 512 px (32 x 32 image tokens between the image start and end: 1026 outputs), Chameleon's VQGAN."""

    folder, hub, image_size = "Anole-7b-v0.1-hf", "leloy/Anole-7b-v0.1-hf", 512
    # one CFG, SJD's; `decode`, the 8-bit image: `postprocess`, the SJD release's (transformers' Anole branch), or
    # `chameleon`, Chameleon's own tokenizer's (the module's docstring, "Images")
    params: ClassVar[dict[str, tuple[str, tuple[str, ...]]]] = {
        **PromptedImageTeacher.params, "decode": ("postprocess", ("postprocess", "chameleon"))}

    def levels(self, x: torch.Tensor) -> torch.Tensor:
        return postprocess_levels(x) if self.setting("decode") == "postprocess" else chameleon_levels(x)

    _prefill = PromptedImageTeacher._prefill  # causal: `prefill` is a setting of ZipAR's Lumina-mGPT release

    @property
    def grid(self) -> tuple[int, int]:
        return self.side, self.side

    def unconditional_ids(self) -> list[int]:
        return [self._id(SEPARATOR)]  # SJD's masked prompt, the only CFG Anole has (the module's docstring)

    def prompt_text(self, prompt: str) -> str:
        return f"Generate an image of {prompt}"

    def layout(self) -> list[int]:
        return [self._id(START), *[ANY_IMAGE_TOKEN] * self.side ** 2, self._id(END)]

    def image_codes(self, tokens: torch.Tensor) -> torch.Tensor:
        return tokens[:, 1 : 1 + self.side ** 2]
