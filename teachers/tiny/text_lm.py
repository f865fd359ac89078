"""What the tiny text teachers share (MDLM and its AR sibling, SDTT's setting, arXiv:2410.21035): a corpus, its BPE
tokenizer and fixed-length packed chunks (`teachers.data.text`), the training recipe, decoding and the held-out text.

Both teachers of a corpus are trained on the same chunks with the same tokenizer, so the AR LM is a like-for-like
latency baseline for the MDLM and a fast generative-perplexity evaluator (`companion_lm`).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

import torch

from core.cache import Cache, config_key
from teachers.data.text import TextDataRecipe, TextTokenizer, corpus_sha, load_text_data
from teachers.tiny.recipes import RecipeTeacher


@dataclass(frozen=True)
class TextLMRecipe:
    data: TextDataRecipe = TextDataRecipe()
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    dropout: float = 0.1
    # 2000 x 32 chunks of 64 tokens (10 passes over the WordNet glosses' 0.4M training tokens): 0.18 s per MDLM step
    # on 2 cores at this width (batch 64: 0.39 s), so about 6 min; the GPT trains in half that.
    steps: int = 2000
    batch_size: int = 32
    lr: float = 1e-3
    ema: float = 0.999
    seed: int = 0
    # MDLM only. "masked_ce": the mean cross-entropy over masked tokens, which has the NELBO's optimum without its 1/t
    # weight, whose variance at L = 64 (a handful of masked tokens weighted up to 1e5 at small t, then gradient
    # clipping) stalls a tiny model (docs/methods/sdtt.md); "nelbo": the paper's objective. The NELBO is what
    # the teacher reports either way.
    loss: str = "masked_ce"


class TextTeacher(RecipeTeacher):
    modality: ClassVar[str] = "text"
    recipe: ClassVar[TextLMRecipe]
    network_class: ClassVar[tuple]  # (module class, its config class, the blob key of the config)
    companion_lm: ClassVar[str]  # the registered causal LM trained on the same chunks (gen-PPL@tiny, AR latency arm)

    @classmethod
    def key(cls) -> str:
        # A user corpus file can change under the same recipe: its content is part of the key; and the MDLM and its AR
        # sibling share a recipe: the family tells them apart.
        return config_key(dataclasses.asdict(cls.recipe), cls.recipe_version, corpus_sha(cls.recipe.data.corpus),
                          cls.family)

    @classmethod
    def load(cls, name: str, *, cache: Cache, device: torch.device):
        blob = cls.cached_blob(name, cache)
        net_class, config_class, blob_key = cls.network_class
        network = net_class(config_class(**blob[blob_key]))
        network.load_state_dict(blob["state_dict"])
        return cls(name, network.to(device), TextTokenizer.from_json(blob["tokenizer"]), blob["reference"].to(device),
                   blob["info"])

    def __init__(self, name: str, network: torch.nn.Module, tokenizer: TextTokenizer, reference: torch.Tensor,
                 info: dict):
        self.name, self.network, self.tokenizer, self.info = name, network.eval().requires_grad_(False), tokenizer, info
        self.reference = reference  # (n, L) held-out test chunks
        self.seq_len = self.recipe.data.seq_len
        self.vocab_size = tokenizer.vocab_size
        self.grid = (self.seq_len,)

    @classmethod
    def evaluation_data(cls) -> tuple[str, dict]:
        d = cls.recipe.data
        return f"{d.corpus}-test", {"corpus": d.corpus, "split": "test", "seq_len": d.seq_len,
                                    "vocab_size": d.vocab_size}

    def conditions(self, n: int, generator: torch.Generator) -> torch.Tensor:
        """Unconditional generation: n empty conditions, (n, 0), on the generator's device."""
        return torch.zeros(n, 0, dtype=torch.long, device=generator.device)

    def decode(self, tokens: torch.Tensor) -> list[str]:
        return self.tokenizer.decode(tokens.cpu())

    def encode(self, texts: list[str]) -> list[list[int]]:
        return self.tokenizer.encode(texts)

    def reference_texts(self) -> list[str]:
        """The test split as the samples look: decoded chunks of `seq_len` tokens."""
        return self.decode(self.reference)

    def training_chunks(self, cache: Cache) -> torch.Tensor:
        """The training split the teacher was trained on, (n, L) (distillation draws its x_0 from it)."""
        return load_text_data(self.recipe.data, cache).chunks["train"].to(self.reference.device)

    def test_documents(self, cache: Cache) -> list[str]:
        """The held-out documents of the corpus, whole (downstream tasks build passages from them)."""
        return load_text_data(self.recipe.data, cache).documents["test"]
