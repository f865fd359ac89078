"""Any Hugging Face causal LM in a local folder (GPT-2, SmolLM2, Llama-style) as the AR-token teacher `hf:<folder>`:
SDTT's autoregressive baseline (GPT-2 with its KV cache, arXiv:2410.21035 §4.1), a teacher of `ar`, `jacobi` and
`sjd`, and the evaluator of `gen_ppl@hf:<folder>` and `mauve@hf:<folder>` (GPT-2 large in the paper).

`<folder>` is a path, or a name inside the checkpoints folder (`--checkpoints`): `hf:gpt2-large` reads
`<checkpoints>/gpt2-large` (the model's `config.json`, weights and tokenizer files, as `save_pretrained` writes them).
The model runs in float32. It generates unconditionally, from its BOS token (GPT-2: `<|endoftext|>`), as SDTT's
baseline does, `min(1024, context - 1)` tokens: SDTT's sequence length, within the model's positions (1023 for GPT-2,
whose 1024 positions include the BOS). MAUVE scores its texts against WebText's test documents of the same length
(`teachers.data.webtext`).
"""
from __future__ import annotations

import functools
from pathlib import Path
from typing import ClassVar

import torch

from core import files
from core.cache import Cache
from core.errors import UserError
from core.training import library_bars
from teachers.data import webtext
from core.checkpoints import from_folder
from teachers.pretrained.hf_causal_lm import HFCausalLMTeacher, context_length, random_network
from teachers.pretrained.local import LocalFilesTeacher

PREFIX = "hf:"
MAX_NEW_TOKENS = 1024  # SDTT's sequence length
VERSION = 1  # bump when a change alters what the same folder gives
# GPT-2's four sizes, (layers, width, heads), by the folder names of OpenAI's releases on the Hugging Face hub
# (openai-community/gpt2, gpt2-medium, gpt2-large, gpt2-xl): layers and width as the GPT-2 paper's Table 2 gives them
# (Radford et al. 2019), the heads as those folders' config.json (`n_head`); vocabulary 50257 and 1024 positions,
# `GPT2Config`'s defaults, for all four. What `HFFolderLM.random` builds where the folder is absent: 124M, 355M, 774M
# and 1558M values, the counts of openai/gpt-2's README (the paper's 117M ... 1542M were wrong, it says).
GPT2_SIZES = {"gpt2": (12, 768, 12), "gpt2-medium": (24, 1024, 16), "gpt2-large": (36, 1280, 20),
              "gpt2-xl": (48, 1600, 25)}


def is_folder_name(name: str) -> bool:
    return name.startswith(PREFIX) and len(name) > len(PREFIX)


def folder(name: str, checkpoints: Path) -> Path:
    """`hf:<folder>` -> the folder: a path, or a name inside the checkpoints folder."""
    path = Path(name[len(PREFIX) :]).expanduser()
    return path.absolute() if path.is_absolute() or path.exists() else checkpoints / path


def check(name: str, checkpoints: Path) -> None:
    """Refuse, in one line, a folder without the files `save_pretrained` writes (listed in a dry run)."""
    cls = teacher_class(name).at(checkpoints)
    reason = cls.unavailable()
    for path in cls.files():
        files.require(path, reason or "")


@functools.cache
def teacher_class(name: str) -> type:
    """The registered teacher `name` = "hf:<folder>" (`TEACHERS.register_prefix`): one class per name."""
    return type("HFFolderLM", (HFFolderLM,), {"folder_name": name, "__doc__": HFFolderLM.__doc__})


class HFFolderLM(LocalFilesTeacher, HFCausalLMTeacher):
    """A Hugging Face causal LM from a local folder, unconditional from its BOS (min(1024, context - 1) tokens)."""

    folder_name: ClassVar[str]

    @property
    def evaluator_name(self) -> str:
        """The model's name in metric keys: its folder's (gen_ppl.gpt2-large)."""
        return folder(self.folder_name, self.root()).name

    @classmethod
    def local_files(cls) -> tuple[str, ...]:
        """The folder's configuration and tokenizer, by its absolute path where it is not in the checkpoints
        folder."""
        path = folder(cls.folder_name, cls.root())
        return tuple(str(path / needed) for needed in ("config.json", "tokenizer_config.json"))

    @classmethod
    def hint(cls) -> str:
        return (f"the Hugging Face causal LM folder {folder(cls.folder_name, cls.root()).name} (save_pretrained's "
                f"files; or give its path after {PREFIX!r})")

    @classmethod
    def key_parts(cls) -> tuple:
        return "hf-causal-lm", MAX_NEW_TOKENS, VERSION

    @classmethod
    def key_files(cls) -> tuple[Path, ...]:
        """Every file of the folder: its weights are in any of the formats `save_pretrained` writes."""
        path = folder(cls.folder_name, cls.root())
        return tuple(sorted(path.iterdir())) if path.is_dir() else (path,)

    @classmethod
    def load(cls, name: str, *, cache: Cache, device: torch.device) -> "HFFolderLM":
        from transformers import AutoModelForCausalLM, AutoTokenizer

        check(name, cls.root())
        path = folder(name, cls.root())
        with library_bars():
            network = from_folder(AutoModelForCausalLM.from_pretrained, path, dtype=torch.float32).to(device)
            tokenizer = from_folder(AutoTokenizer.from_pretrained, path)
        bos = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
        positions = context_length(network.config)
        prompts = torch.zeros(1, 0, dtype=torch.long, device=device)  # no prompt: every sample starts from BOS
        info = {"n_params": sum(p.numel() for p in network.parameters())}
        return cls(name, network, tokenizer, prompts, [], min(MAX_NEW_TOKENS, positions - 1), info, bos_id=bos)

    @classmethod
    def random(cls, name: str, device: torch.device) -> "HFFolderLM":
        """The folder's causal LM at full size with seeded random weights, no weights or tokenizer read: the cost
        mode's (`bench.cost`). Its configuration is the folder's config.json where the folder is here; else, for a
        folder named as one of GPT-2's releases, that size (`GPT2_SIZES`); any other absent folder is refused in one
        line. Unconditional from BOS as `load` builds it: the configuration's BOS (GPT-2's `<|endoftext|>`, 50256)."""
        from transformers import AutoConfig, AutoModelForCausalLM, GPT2Config

        path = folder(name, cls.root())
        if (path / "config.json").is_file():
            config = from_folder(AutoConfig.from_pretrained, path)
        elif path.name in GPT2_SIZES:
            n_layer, n_embd, n_head = GPT2_SIZES[path.name]
            config = GPT2Config(n_layer=n_layer, n_embd=n_embd, n_head=n_head)
        else:
            raise UserError(f"cost mode: teacher {name}: no {path / 'config.json'} to build it from, and "
                            f"{path.name!r} is none of GPT-2's sizes ({', '.join(GPT2_SIZES)})")
        network = random_network(AutoModelForCausalLM.from_config, config, device)
        bos = config.bos_token_id if config.bos_token_id is not None else config.eos_token_id
        # as `load`: every sample starts from BOS; the empty table on the CPU, since `conditions` copies it to the
        # generator's device, which a meta tensor cannot be copied to
        prompts = torch.zeros(1, 0, dtype=torch.long)
        info = {"n_params": sum(p.numel() for p in network.parameters())}
        return cls(name, network, None, prompts, [], min(MAX_NEW_TOKENS, context_length(config) - 1), info, bos_id=bos)

    def reference_texts(self) -> list[str]:
        """WebText test documents of this teacher's length (MAUVE's reference side, read when MAUVE first asks)."""
        return self._references

    @functools.cached_property
    def _references(self) -> list[str]:
        return webtext.reference_texts(self.tokenizer, self.seq_len, f"mauve on teacher {self.name}", self.root())
