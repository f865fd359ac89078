"""Tiny discrete-token AR image teachers (class- or text-conditional), trained and cached on first use.

The LlamaGen / Lumina-mGPT setting of SJD (arXiv:2410.01699) at CPU scale: a k-means patch tokenizer and a
raster-order causal transformer (`teachers.networks.gpt`) conditioned on a prefix (a class token, or caption tokens
from open_clip's BPE tokenizer), trained with condition dropout so classifier-free guidance works.
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import ClassVar, Literal

import torch
import torch.nn.functional as F

from core.cache import Cache
from core.training import optimizer_step, training_steps, warmup_cosine
from teachers.data.images import ImageDataset, caption_table, load_image_dataset
from teachers.data.patch_vq import PatchQuantizer
from teachers.families import ar_token
from teachers.networks.gpt import GPT, GPTConfig
from teachers.tiny.recipes import RecipeTeacher

NULL, PAD, UNK = 0, 1, 2  # condition-vocabulary ids shared by both conditionings


@dataclass(frozen=True)
class ImageARRecipe:
    dataset: str
    conditioning: Literal["class", "text"]
    image_size: int = 16
    patch: int = 2
    codebook_size: int = 128
    n_layer: int = 3
    n_head: int = 4
    n_embd: int = 96
    dropout: float = 0.1
    steps: int = 1200
    batch_size: int = 48
    lr: float = 2e-3
    cond_dropout: float = 0.1
    caption_len: int = 8
    seed: int = 0


class CaptionVocab:
    """open_clip's BPE ids of the captions, remapped to a compact table (the captions use a few dozen of 49k ids)."""

    def __init__(self, bpe_ids: list[int]):
        self.index = {b: i + 3 for i, b in enumerate(sorted(bpe_ids))}

    @staticmethod
    def bpe(texts: list[str]) -> list[list[int]]:
        import open_clip

        tok = open_clip.get_tokenizer("ViT-B-32")  # ships its BPE vocabulary; nothing is downloaded
        ids = tok(texts)  # (n, 77) with <start>, <end> and zero padding
        return [[int(t) for t in row[1:] if t not in (0, tok.sot_token_id, tok.eot_token_id)] for row in ids]

    def encode(self, texts: list[str], length: int) -> torch.Tensor:
        out = torch.full((len(texts), length), PAD, dtype=torch.long)
        for r, ids in enumerate(self.bpe(texts)):
            ids = [self.index.get(b, UNK) for b in ids][:length]
            out[r, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        return out

    def __len__(self) -> int:
        return len(self.index) + 3


class ImageARTeacher(ar_token.GuidedNetworkTeacher, RecipeTeacher):
    family: ClassVar = ar_token.FAMILY
    modality: ClassVar[str] = "image"
    supports_cfg: ClassVar[bool] = True  # trained with condition dropout
    null_id: ClassVar[int] = NULL
    recipe: ClassVar[ImageARRecipe]

    def __init__(self, name: str, network: GPT, vq: PatchQuantizer, cond_table: torch.Tensor, info: dict):
        self.name, self.network, self.vq = name, network.eval(), vq
        self.cond_table = cond_table  # (classes, templates, P) condition prefix of every (class, template)
        self.info = info
        self.seq_len = network.cfg.seq_len
        self.vocab_size = network.cfg.vocab_size
        self.grid = vq.grid
        self.dataset_name = self.recipe.dataset
        self.image_size = self.recipe.image_size

    # ---- building -------------------------------------------------------------------------------------------
    @classmethod
    def load(cls, name: str, *, cache: Cache, device: torch.device) -> "ImageARTeacher":
        blob = cls.cached_blob(name, cache)
        model = GPT(GPTConfig(**blob["gpt"]))
        model.load_state_dict(blob["model"])
        vq = PatchQuantizer(blob["codebook"], **blob["vq"])
        return cls(name, model.to(device), vq.to(device), blob["cond_table"].to(device), blob["info"])

    @classmethod
    def _cond_table(cls, data: ImageDataset) -> tuple[torch.Tensor, int]:
        r = cls.recipe
        n_cls = len(data.class_names)
        if r.conditioning == "class":
            return torch.arange(n_cls).view(n_cls, 1, 1) + 3, n_cls + 3
        captions = [data.caption(c, t) for c in range(n_cls) for t in range(len(data.templates))]
        vocab = CaptionVocab(sorted({b for ids in CaptionVocab.bpe(captions) for b in ids}))
        table = vocab.encode(captions, r.caption_len).view(n_cls, len(data.templates), r.caption_len)
        return table, len(vocab)

    @classmethod
    def _fit(cls, name: str, cache: Cache) -> dict:
        r = cls.recipe
        t0 = time.perf_counter()
        train = load_image_dataset(r.dataset, "train", r.image_size)
        test = load_image_dataset(r.dataset, "test", r.image_size)
        vq = PatchQuantizer.fit(train.images, r.patch, r.codebook_size, r.seed)
        recon_mse = F.mse_loss(vq.decode(vq.encode(test.images)), test.images).item()
        table, cond_vocab = cls._cond_table(train)
        gcfg = GPTConfig(r.codebook_size, cond_vocab, table.shape[-1], vq.grid[0] * vq.grid[1],
                         r.n_layer, r.n_head, r.n_embd, r.dropout)
        g = torch.Generator().manual_seed(r.seed)
        model = GPT(gcfg)
        tokens = vq.encode(train.images)  # (n, N)
        opt = torch.optim.AdamW(model.parameters(), lr=r.lr, weight_decay=0.01, betas=(0.9, 0.95))
        sched = warmup_cosine(opt, r.steps)
        model.train()
        for _ in training_steps(r.steps, f"training teacher {name}"):
            idx = torch.randint(len(tokens), (r.batch_size,), generator=g)
            cond = cls._conds(table, train.labels[idx], g)
            drop = torch.rand(r.batch_size, generator=g) < r.cond_dropout
            cond[drop] = NULL
            logits = model(cond, tokens[idx])
            loss = F.cross_entropy(logits.reshape(-1, gcfg.vocab_size), tokens[idx].reshape(-1))
            optimizer_step(loss, opt, sched, model.parameters())
        model.eval()
        with torch.no_grad():
            test_tokens = vq.encode(test.images)
            logits = model(cls._conds(table, test.labels, g), test_tokens)
            test_nll = F.cross_entropy(logits.reshape(-1, gcfg.vocab_size), test_tokens.reshape(-1)).item()
        info = {"train_loss": loss.item(), "test_nll_per_token": test_nll, "vq_test_mse": recon_mse,
                "n_params": sum(p.numel() for p in model.parameters()), "train_seconds": time.perf_counter() - t0}
        return {"gpt": dataclasses.asdict(gcfg), "model": model.state_dict(), "codebook": vq.codebook,
                "vq": {"patch": vq.patch, "channels": vq.channels, "image_size": vq.image_size},
                "cond_table": table, "info": info}

    @staticmethod
    def _conds(table, labels, g):
        templates = torch.randint(table.shape[1], (len(labels),), generator=g, device=g.device)
        return table[labels, templates].clone()  # (B, P)

    # ---- the ARTokenTeacher protocol ------------------------------------------------------------------------
    def conditions(self, n: int, generator: torch.Generator) -> torch.Tensor:
        """n conditions with uniformly drawn classes (and caption templates): (n, P), on the generator's device."""
        labels = torch.randint(self.cond_table.shape[0], (n,), generator=generator, device=generator.device)
        return self._conds(self.cond_table.to(generator.device), labels, generator)

    @property
    def codebook(self) -> torch.Tensor:
        """(K, D) the tokenizer's code vectors (distillation methods flow into this space)."""
        return self.vq.codebook

    def decode(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.vq.decode(tokens)

    def captions(self, cond: torch.Tensor) -> list[str]:
        """The caption of each condition row (B, P): text-image metrics such as CLIP score need the prompt.

        A class condition reads as the class's first caption template ("a handwritten seven").
        """
        table = self.cond_table.flatten(0, 1)  # (classes * templates, P)
        match = (cond.unsqueeze(1) == table.unsqueeze(0)).all(-1)  # (B, classes * templates)
        if not match.any(-1).all():
            raise ValueError(f"{self.name}: a condition row is not one of the teacher's conditions")
        texts = [row[t] for row in caption_table(self.dataset_name) for t in range(self.cond_table.shape[1])]
        return [texts[i] for i in match.int().argmax(-1).tolist()]
