"""Text corpora, their deterministic split, a byte-level BPE tokenizer (Hugging Face `tokenizers`) and MDLM-style
packing into fixed-length chunks: the data of the text teachers (MDLM and its AR sibling, SDTT arXiv:2410.21035).

Corpora that exist offline (docs/guide/teachers.md, 'Datasets'): the WordNet glosses timm ships (always installed, a
dependency of open_clip), Debian's `fortunes`, and any user text file or folder (`file:<path>`). Documents are split
into train / valid / test by a hash of their text, so adding documents never moves the existing ones. Sequences are
packed as MDLM packs OpenWebText: documents concatenated, each followed by EOS, wrapped into rows of `seq_len`.
"""
from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from core.cache import Cache, config_key
from core.errors import UserError

CORPORA = ("wordnet", "fortunes")  # and "file:<path>"
FORTUNES_DIR = Path("/usr/share/games/fortunes")
EOS = "<|endoftext|>"
VERSION = 1  # bump when a change alters the data a recipe produces


def _wordnet() -> list[str]:
    path = Path(importlib.util.find_spec("timm").origin).parent / "data" / "_info" / "imagenet_synset_to_definition.txt"
    return [line.split("\t", 1)[1] for line in path.read_text().splitlines() if "\t" in line]


def _fortunes() -> list[str]:
    if not FORTUNES_DIR.is_dir():
        raise UserError(f"corpus 'fortunes': {FORTUNES_DIR} not found; install the Debian package `fortunes`")
    files = sorted(p for p in FORTUNES_DIR.iterdir() if p.is_file() and not p.is_symlink() and not p.suffix)
    return [entry for p in files for entry in re.split(r"^%$", p.read_text(errors="replace"), flags=re.M)]


def _paragraphs(path: Path) -> list[str]:
    if not path.exists():
        raise UserError(f"corpus 'file:{path}': no such file or folder")
    files = sorted(path.rglob("*.txt")) if path.is_dir() else [path]
    return [para for f in files for para in re.split(r"\n\s*\n", f.read_text(errors="replace"))]


def load_documents(corpus: str) -> list[str]:
    """The corpus' documents, stripped, empty ones and exact duplicates dropped, in corpus order."""
    if corpus == "wordnet":
        raw = _wordnet()
    elif corpus == "fortunes":
        raw = _fortunes()
    elif corpus.startswith("file:"):
        raw = _paragraphs(Path(corpus[5:]).expanduser())
    else:
        raise UserError(f"unknown corpus {corpus!r}; valid: {', '.join(CORPORA)}, file:<path>")
    docs = [d.strip() for d in raw]
    return list(dict.fromkeys(d for d in docs if d))


def _sha(docs: list[str]) -> str:
    return hashlib.sha256("\x00".join(docs).encode()).hexdigest()[:20]


def corpus_sha(corpus: str) -> str:
    """A hash of the corpus' documents: part of every cache key built from them (a user file can change)."""
    return _sha(load_documents(corpus))


def split_documents(docs: list[str], valid: float = 0.05, test: float = 0.05) -> dict[str, list[str]]:
    """train / valid / test by a hash of each document's text (not Python's salted `hash`), order kept."""
    splits = {"train": [], "valid": [], "test": []}
    for d in docs:
        u = int.from_bytes(hashlib.blake2b(d.encode(), digest_size=8).digest(), "big") / 2**64
        splits["test" if u < test else "valid" if u < test + valid else "train"].append(d)
    return splits


class TextTokenizer:
    """A trained byte-level BPE `tokenizers.Tokenizer` with an EOS token; any text encodes without unknown ids."""

    def __init__(self, tokenizer):
        self._tok = tokenizer
        self.vocab_size = tokenizer.get_vocab_size()
        self.eos_id = tokenizer.token_to_id(EOS)

    def encode(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self._tok.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids) -> list[str]:
        """Rows of ids (a (B, L) tensor or lists) -> texts, EOS rendered as a newline."""
        rows = ids.tolist() if torch.is_tensor(ids) else ids
        out = []
        for row in rows:
            pieces, start = [], 0
            for i, t in enumerate(row + [self.eos_id]):
                if t == self.eos_id:
                    pieces.append(self._tok.decode(row[start:i]))
                    start = i + 1
            out.append("\n".join(pieces).strip())
        return out

    def to_json(self) -> str:
        return self._tok.to_str()

    @classmethod
    def from_json(cls, s: str) -> "TextTokenizer":
        from tokenizers import Tokenizer

        return cls(Tokenizer.from_str(s))


def train_tokenizer(docs: list[str], vocab_size: int) -> TextTokenizer:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(docs, trainer)
    return TextTokenizer(tok)


def pack(token_lists: list[list[int]], seq_len: int, eos_id: int) -> torch.Tensor:
    """Documents concatenated, each followed by EOS, wrapped into (n, seq_len) rows; the ragged tail is dropped."""
    flat = [t for ids in token_lists for t in (*ids, eos_id)]
    n = len(flat) // seq_len
    return torch.tensor(flat[: n * seq_len], dtype=torch.long).view(n, seq_len)


@dataclass(frozen=True)
class TextDataRecipe:
    corpus: str = "wordnet"
    vocab_size: int = 2048
    seq_len: int = 64
    valid: float = 0.05
    test: float = 0.05

    def __post_init__(self):
        if self.vocab_size < 257 or self.seq_len < 2:
            raise ValueError(f"need vocab_size >= 257 (the 256 bytes + EOS) and seq_len >= 2, got {self.vocab_size}, "
                             f"{self.seq_len}")
        if not (0 < self.valid and 0 < self.test and self.valid + self.test < 1):
            raise ValueError(f"need valid, test > 0 and valid + test < 1, got {self.valid}, {self.test}")


@dataclass
class TextData:
    tokenizer: TextTokenizer
    documents: dict[str, list[str]]  # per split
    chunks: dict[str, torch.Tensor]  # per split: (n, seq_len) int64
    corpus_sha: str


def load_text_data(recipe: TextDataRecipe, cache: Cache) -> TextData:
    """The recipe's split, tokenizer (trained on the train split only) and chunks; built once, cached by the recipe
    and the corpus content."""
    docs = load_documents(recipe.corpus)
    sha = _sha(docs)
    splits = split_documents(docs, recipe.valid, recipe.test)

    def build() -> dict:
        tok = train_tokenizer(splits["train"], recipe.vocab_size)
        chunks = {k: pack(tok.encode(v), recipe.seq_len, tok.eos_id) for k, v in splits.items()}
        return {"tokenizer": tok.to_json(), "chunks": chunks}

    blob, _ = cache.get_or_build("text-data", config_key(dataclasses.asdict(recipe), sha, VERSION), build)
    return TextData(TextTokenizer.from_json(blob["tokenizer"]), splits, blob["chunks"], sha)
