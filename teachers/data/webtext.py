"""WebText documents from local files: OpenAI's gpt-2-output-dataset `webtext.{train,test}.jsonl` (one JSON object
with a "text" field per line) in the checkpoints folder (`--checkpoints`).

SDTT's MAUVE compares with "the first 1024 samples with at least 1024 tokens from the WebText dataset" (sdtt note
§3.2: OpenAI's WebText, not OpenWebText); its test file is the reference side here. The train file is the text
`mdlm-owt` is distilled on by `sdtt`: MDLM-OWT was trained on OpenWebText, an open re-creation of WebText, which is
not at hand; WebText's own documents are the nearest local stand-in (a named departure, `teachers.pretrained.mdlm_owt`).
"""
from __future__ import annotations

import json
from pathlib import Path

from bench.cache import CHECKPOINTS_ENV, checkpoint_dir
from bench.errors import UserError

REFERENCES = 1024  # MAUVE's reference documents (SDTT)


def path(split: str, root: Path | None = None) -> Path:
    """The split's file in `root`, by default the checkpoints folder."""
    return (root or checkpoint_dir()) / f"webtext.{split}.jsonl"


def missing(split: str, why: str, root: Path | None = None) -> str | None:
    p = path(split, root)
    if p.is_file():
        return None
    return (f"missing {p}: {why} reads WebText's {split} documents (openai/gpt-2-output-dataset); place it in "
            f"{p.parent} or name its folder with --checkpoints or {CHECKPOINTS_ENV}")


def documents(split: str, why: str, root: Path | None = None) -> list[str]:
    reason = missing(split, why, root)
    if reason:
        raise UserError(reason)
    with path(split, root).open() as fh:
        return [json.loads(line)["text"] for line in fh if line.strip()]


def reference_texts(tokenizer, n_tokens: int, why: str, root: Path | None = None) -> list[str]:
    """MAUVE's reference side: the first `REFERENCES` test documents of at least `n_tokens` tokens, cut to
    `n_tokens` and decoded."""
    out = []
    for text in documents("test", why, root):
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        if len(ids) >= n_tokens:
            out.append(tokenizer.decode(ids[:n_tokens]))
            if len(out) == REFERENCES:
                break
    if not out:
        raise UserError(f"{path('test', root)}: no document of {n_tokens} tokens or more")
    return out
