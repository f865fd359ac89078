"""WebText documents from local files: OpenAI's gpt-2-output-dataset `webtext.{train,test}.jsonl` (one JSON object
with a "text" field per line) in the checkpoints folder (`--checkpoints`).

SDTT's MAUVE compares with "the first 1024 samples with at least 1024 tokens from the WebText dataset" (see
docs/methods/sdtt.md: OpenAI's WebText, not OpenWebText); its test file is the reference side here. The train file
is the text
`mdlm-owt` is distilled on by `sdtt`: MDLM-OWT was trained on OpenWebText, an open re-creation of WebText, which is
not at hand; WebText's own documents are the nearest local stand-in (a named departure, `teachers.pretrained.mdlm_owt`).
"""
from __future__ import annotations

import json
from pathlib import Path

from core.cache import CHECKPOINTS_ENV
from core.errors import UserError

REFERENCES = 1024  # MAUVE's reference documents (SDTT)


def path(split: str, root: Path) -> Path:
    """The split's file in `root`, the checkpoints folder."""
    return root / f"webtext.{split}.jsonl"


def missing(split: str, why: str, root: Path) -> str | None:
    p = path(split, root)
    if p.is_file():
        return None
    return (f"missing {p}: {why} reads WebText's {split} documents (openai/gpt-2-output-dataset); place it in "
            f"{p.parent} or name its folder with --checkpoints or {CHECKPOINTS_ENV}")


def documents(split: str, why: str, root: Path) -> list[str]:
    reason = missing(split, why, root)
    if reason:
        raise UserError(reason)
    return list(_texts(path(split, root)))


def _texts(file: Path):
    """The "text" of each non-empty line of a jsonl file; a line that is not a JSON object with a string "text" (a
    damaged or cut file, another dataset) is one `UserError` naming the file and the line."""
    n = 0
    try:
        with file.open(encoding="utf-8") as fh:
            for n, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    text = json.loads(line)["text"]
                except json.JSONDecodeError as exc:
                    raise UserError(f"{file}: line {n} is not JSON ({exc.msg}): damaged or truncated") from None
                except (KeyError, TypeError):
                    text = None
                if not isinstance(text, str):
                    raise UserError(f"{file}: line {n} is not a WebText document (a JSON object with a \"text\" "
                                    f"string)")
                yield text
    except UnicodeDecodeError:
        raise UserError(f"{file}: not UTF-8 text (near line {n + 1}): damaged, or not the file expected") from None
    except OSError as exc:
        raise UserError(f"{file}: cannot read it ({exc.strerror or exc})") from None


def reference_texts(tokenizer, n_tokens: int, why: str, root: Path) -> list[str]:
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
