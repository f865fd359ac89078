"""MDLM-OWT (Sahoo et al. 2024, arXiv:2406.07524; the Hugging Face release kuleshov-group/mdlm-owt), the teacher SDTT
distils (arXiv:2410.21035 §4): the registered masked-diffusion teacher `mdlm-owt` (`mdlm`, `sdtt`).

Files, in the checkpoints folder (`--checkpoints`, docs/checkpoints.md, 'MDLM-OWT'):
- `mdlm-owt/`: the release's `config.json` (`hidden_dim`, `cond_dim`, `model_length`, `n_blocks`, `n_heads`,
  `dropout`, `vocab_size`, `time_conditioning`) and `model.safetensors`, whose keys carry the prefix `backbone.`
  (dropped here; a file without it loads too). The custom `modeling_mdlm.py` is not run: the weights load strictly
  into `teachers.networks.mdlm_dit.MDLMDiT`, the official `DIT` in its own names (proved by a golden fixture);
- `gpt2/`: GPT-2's tokenizer (MDLM-OWT's: 50257 tokens, mask id 50257 = the model's last row) and, for the AR
  baseline of SDTT (`companion_lm`, the teacher `hf:gpt2`), GPT-2's weights.
Sequences are the model's 1024 tokens, unconditional, sampled by the family's ancestral sampler (SUBS, log-linear
schedule; `ddpm_cache` as `--param cache=true`). `mdlm-owt-prompted` is the same model under SDTT's conditional
protocol (`MDLMOWTPrompted`: WebText prompts, in-painted; prompt-conditioned MAUVE and per-prompt self-BLEU).

`sdtt` distils on text: WebText's train documents (`teachers.data.webtext`, `webtext.train.jsonl`), each wrapped as
BOS + document + EOS, concatenated and cut into 1024-token chunks as MDLM's OpenWebText loader wraps them; the first
`TRAIN_TOKENS` tokens (a sample of the file: the distillation draws random chunks). MDLM-OWT was trained on
OpenWebText, which is not at hand here; WebText is the corpus it re-creates (a named departure).
"""
from __future__ import annotations

import functools
from pathlib import Path
from typing import ClassVar

import torch

from core.cache import Cache, config_key, file_key
from core.errors import UserError
from core.rng import seeded
from core.samples import Texts
from core.training import library_bars
from teachers.data import webtext
from teachers.families import masked_diffusion as md
from teachers.networks.mdlm_dit import MDLMDiT, MDLMDiTConfig
from core.checkpoints import from_folder, mismatch, read_config, read_safetensors
from teachers.pretrained.local import LocalFilesTeacher

FOLDER, TOKENIZER = "mdlm-owt", "gpt2"
PREFIX = "backbone."  # of every key in the release's safetensors
# The release's config.json: MDLM's configs/model/small.yaml (hidden 768, cond_dim 128, 1024 positions, 12 blocks, 12
# heads) over GPT-2's 50,257 tokens and the mask; 169,627,250 values (tests/fixtures/mdlm/mdlm_owt_keys.json).
SMALL = MDLMDiTConfig(vocab_size=50258, hidden_size=768, cond_dim=128, length=1024, n_blocks=12, n_heads=12)
TRAIN_TOKENS = 1 << 24  # ~16.8 M tokens (16,384 chunks of 1024) of WebText's train file for `sdtt`
VERSION = 1  # bump when a change alters what the same files give


class MDLMOWT(LocalFilesTeacher):
    """MDLM-OWT (169.6 M parameters): unconditional 1024-token texts, GPT-2 tokenizer, SUBS ancestral sampling."""

    family: ClassVar = md.FAMILY
    modality: ClassVar[str] = "text"

    def __init__(self, name: str, network: MDLMDiT, tokenizer, info: dict):
        self.name, self.info, self.tokenizer = name, info, tokenizer
        self.network = network.eval().requires_grad_(False)
        self.seq_len = network.cfg.length
        self.vocab_size = self.mask_id = network.cfg.vocab_size - 1
        self.companion_lm = f"hf:{self.root() / TOKENIZER}"  # SDTT's AR baseline: GPT-2 with its KV cache

    # ---- files ------------------------------------------------------------------------------------------------
    @classmethod
    def local_files(cls) -> tuple[str, ...]:
        """The release's config.json and model.safetensors, then the GPT-2 folder's tokenizer."""
        return f"{FOLDER}/config.json", f"{FOLDER}/model.safetensors", f"{TOKENIZER}/tokenizer_config.json"

    @classmethod
    def hint(cls) -> str:
        return f"the Hugging Face folders {FOLDER} (kuleshov-group/mdlm-owt) and {TOKENIZER} (openai-community/gpt2)"

    @classmethod
    def key_parts(cls) -> tuple:
        return "mdlm-owt", VERSION

    @classmethod
    def key_files(cls) -> tuple[Path, ...]:
        """Its files and the tokenizer's vocabulary, which `tokenizer_config.json` does not hold."""
        gpt2 = cls.root() / TOKENIZER
        return (*super().key_files(), gpt2 / "tokenizer.json", gpt2 / "vocab.json")

    @classmethod
    def config(cls) -> MDLMDiTConfig:
        """The network of the release's config.json (its own field names)."""
        path = cls.root() / FOLDER / "config.json"
        c = read_config(path.parent)
        fields = ("vocab_size", "hidden_dim", "cond_dim", "model_length", "n_blocks", "n_heads")
        if not all(isinstance(c.get(f), int) for f in fields):
            raise UserError(f"{path}: not MDLM-OWT's configuration: expected the integers {', '.join(fields)}")
        if c.get("time_conditioning", False):
            raise UserError(f"{path}: time_conditioning is true; mdlm-owt's denoiser ignores the time (MDLM-OWT's "
                            f"release has it false)")
        return MDLMDiTConfig(vocab_size=c["vocab_size"], hidden_size=c["hidden_dim"], cond_dim=c["cond_dim"],
                             length=c["model_length"], n_blocks=c["n_blocks"], n_heads=c["n_heads"],
                             dropout=c.get("dropout", 0.1))

    @classmethod
    def evaluation_data(cls) -> tuple[str, dict]:
        return "webtext-test", {"file": str(webtext.path("test", cls.root())), "tokenizer": TOKENIZER}

    @classmethod
    def load(cls, name: str, *, cache: Cache, device: torch.device) -> "MDLMOWT":
        from transformers import AutoTokenizer

        cls.require_files()
        config, weights, tokenizer_config, *_ = cls.files()  # then the prompted protocol's WebText file
        gpt2 = tokenizer_config.parent
        state = {k.removeprefix(PREFIX): v for k, v in read_safetensors(weights).items()}
        try:
            network = MDLMDiT.from_state_dict(cls.config(), state)
        except RuntimeError as exc:
            raise UserError(f"{name}: {weights} does not fit {config}: {mismatch(exc)}") from None
        with library_bars():
            tokenizer = from_folder(AutoTokenizer.from_pretrained, gpt2)
        if len(tokenizer) != network.cfg.vocab_size - 1:
            raise UserError(f"{name}: the tokenizer in {gpt2} has {len(tokenizer)} tokens; the model reads "
                            f"{network.cfg.vocab_size - 1} and MASK")
        info = {"n_params": sum(p.numel() for p in network.parameters())}
        return cls(name, network.to(device), tokenizer, info)

    @classmethod
    def random(cls, name: str, device: torch.device) -> "MDLMOWT":
        """The release's network (`SMALL`) at full size with seeded random weights, no file read and no tokenizer:
        the cost mode's (`bench.cost`)."""
        with seeded(0), torch.device(device):
            network = MDLMDiT(SMALL)
        return cls(name, network, None, {"n_params": sum(p.numel() for p in network.parameters())})

    # ---- the MaskedDiffusionLM protocol ---------------------------------------------------------------------
    def conditions(self, n: int, generator: torch.Generator) -> torch.Tensor:
        return torch.zeros(n, 0, dtype=torch.long, device=generator.device)

    @torch.inference_mode()
    def denoise(self, z: torch.Tensor) -> torch.Tensor:
        return md.subs(self.network(z), z, self.mask_id)

    def training_chunks(self, cache: Cache) -> torch.Tensor:
        """(n, 1024) WebText train tokens on the model's device, cached under the file's identity."""
        def build() -> torch.Tensor:
            tok, ids = self.tokenizer, []
            bos = eos = tok.eos_token_id  # GPT-2's one special token
            for text in webtext.documents("train", f"sdtt on teacher {self.name}", self.root()):
                ids += [bos, *tok(text, add_special_tokens=False)["input_ids"], eos]
                if len(ids) >= TRAIN_TOKENS:
                    break
            n = min(len(ids), TRAIN_TOKENS) // self.seq_len
            if not n:
                raise UserError(f"{webtext.path('train', self.root())}: fewer than {self.seq_len} tokens")
            return torch.tensor(ids[: n * self.seq_len]).view(n, self.seq_len)

        key = config_key("webtext-chunks", file_key(webtext.path("train", self.root())), self.key(), TRAIN_TOKENS)
        chunks, _ = cache.get_or_build("text-chunks", key, build)
        return chunks.to(self.network.output_layer.linear.weight.device)

    def decode(self, tokens: torch.Tensor) -> Texts:
        """The texts without special tokens, and their GPT-2 ids (what SDTT's gen-PPL scores, `metrics.gen_ppl`)."""
        tokens = tokens.cpu()
        return Texts(self.tokenizer.batch_decode(tokens, skip_special_tokens=True), tokens)

    def encode(self, texts: list[str]) -> list[list[int]]:
        return self.tokenizer(texts, add_special_tokens=False)["input_ids"]

    def reference_texts(self) -> list[str]:
        return self._references

    @functools.cached_property
    def _references(self) -> list[str]:  # read and tokenised once per loaded teacher, not once per trial
        return webtext.reference_texts(self.tokenizer, self.seq_len, f"mauve on teacher {self.name}", self.root())


class MDLMOWTPrompted(MDLMOWT):
    """MDLM-OWT under SDTT's conditional protocol: 50-token WebText prompts, 50 new tokens, 5 continuations each."""

    # SDTT §4 and its code (docs/methods/sdtt.md): the first 1024 WebText test documents of at least 1024 tokens, cut to
    # 100 tokens; the first 50 are the prompt, in-painted; 5 continuations per prompt; MAUVE on the 100 tokens, prompt
    # included, against the real 100-token prefixes; self-BLEU among each prompt's continuations.
    protocol: ClassVar[str] = "webtext-prompted"
    prompt_tokens: ClassVar[int] = 50
    length: ClassVar[int] = 100
    continuations: ClassVar[int] = 5
    n_prompts: ClassVar[int] = 1024

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.model_length, self.seq_len = self.seq_len, self.length

    @classmethod
    def key_parts(cls) -> tuple:
        return *super().key_parts(), cls.protocol, cls.prompt_tokens, cls.length, cls.continuations, cls.n_prompts

    @classmethod
    def local_files(cls) -> tuple[str, ...]:
        """MDLM-OWT's, and WebText's test file, which `load` reads the prompts from: a dry run lists it and a run
        missing it stops at plan time, like the weights."""
        return *super().local_files(), webtext.path("test", Path()).as_posix()

    @classmethod
    def hint(cls) -> str:
        return f"{super().hint()}, and WebText's test file (openai/gpt-2-output-dataset)"

    @classmethod
    def key_files(cls) -> tuple[Path, ...]:
        test = webtext.path("test", cls.root())
        # the test file last, where it was before it was one of `local_files`: the same files keep their key
        return *(p for p in super().key_files() if p != test), test

    @classmethod
    def evaluation_data(cls) -> tuple[str, dict]:
        name, source = super().evaluation_data()
        return f"{name}-prompts", {**source, "prompt_tokens": cls.prompt_tokens, "length": cls.length,
                                   "continuations": cls.continuations}

    @functools.cached_property
    def prefixes(self) -> torch.Tensor:
        """(M, 100) the first `length` tokens of the first `n_prompts` test documents as long as the model's context."""
        rows, need = [], max(self.length, self.model_length)
        for text in webtext.documents("test", f"teacher {self.name}", self.root()):
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            if len(ids) >= need:
                rows.append(ids[: self.length])
                if len(rows) == self.n_prompts:
                    break
        if not rows:
            raise UserError(f"{webtext.path('test', self.root())}: no document of {need} tokens or more")
        return torch.tensor(rows)

    def conditions(self, n: int, generator: torch.Generator) -> torch.Tensor:
        """(n, 50) prompts, each `continuations` times in a row, prompts in a random order (each once while they
        last)."""
        m, k = len(self.prefixes), -(-n // self.continuations)
        order = torch.cat([torch.randperm(m, generator=generator, device=generator.device) for _ in range(-(-k // m))])
        rows = order[:k].repeat_interleave(self.continuations)[:n]
        return self.prefixes.to(generator.device)[rows, : self.prompt_tokens]

    def reference_texts(self) -> list[str]:
        """The real 100-token prefixes of the prompts' documents (MAUVE's reference side, prompt included)."""
        return self.tokenizer.batch_decode(self.prefixes)
