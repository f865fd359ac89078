"""What the tiny MAR pairs share (`digits-mar-c2i`, causal; `digits-mar-masked-c2i`, MAR's own masked network): images
as pixel-patch tokens in [-1, 1] (MAR also runs on patches; no autoencoder keeps everything deterministic), a target
and a smaller draft trained alike on the same data, with label dropout for CFG, and cached together on first use."""
from __future__ import annotations

import time
from typing import ClassVar

import torch
import torch.nn as nn

from core.cache import Cache
from core.training import optimizer_step, training_steps, warmup_cosine
from teachers.data.images import caption_table, from_patches, load_image_dataset, to_patches
from teachers.tiny.recipes import RecipeTeacher


class PatchPairTeacher(RecipeTeacher):
    """A subclass gives `_model(size, n_classes)`, `_loss(model, tokens, labels, mul, cond_dropout, generator)` and
    `_describe(model)` (what rebuilds it, stored with its weights); its recipe has `dataset`, `image_size`, `patch`,
    `target` and `draft` sizes, `steps`, `batch_size`, `head_batch_mul`, `lr`, `cond_dropout`, `seed`."""

    modality: ClassVar[str] = "image"
    class_offset: ClassVar[int] = 0  # condition id of class c: c + offset (1 where id 0 is the unconditional one)

    def _setup(self, name: str, info: dict) -> None:
        self.name, self.info = name, info
        r = self.recipe
        self.grid = (r.image_size // r.patch, r.image_size // r.patch)
        self.seq_len, self.token_dim = self.grid[0] * self.grid[1], r.patch * r.patch
        self.dataset_name, self.image_size = r.dataset, r.image_size
        self.n_classes = len(caption_table(r.dataset))

    @classmethod
    def _fit(cls, name: str, cache: Cache) -> dict:
        r, t0 = cls.recipe, time.perf_counter()
        train = load_image_dataset(r.dataset, "train", r.image_size)
        test = load_image_dataset(r.dataset, "test", r.image_size)
        blob, info = {}, {}
        for which in ("target", "draft"):
            model = cls._model(getattr(r, which), len(train.class_names))
            train_loss = cls._fit_model(name, which, model, to_patches(train.images, r.patch), train.labels)
            model.eval()
            with torch.no_grad():
                g = torch.Generator().manual_seed(r.seed)
                test_loss = cls._loss(model, to_patches(test.images, r.patch), test.labels, 4, 0.0, g).item()
            blob[which] = {**cls._describe(model), "state_dict": model.state_dict()}
            info |= {f"{which}_train_loss": train_loss, f"{which}_test_loss": test_loss,
                     f"{which}_n_params": sum(p.numel() for p in model.parameters())}
        blob["info"] = info | {"train_seconds": time.perf_counter() - t0}
        return blob

    @classmethod
    def _fit_model(cls, name: str, which: str, model: nn.Module, tokens: torch.Tensor, labels: torch.Tensor) -> float:
        r = cls.recipe
        g = torch.Generator().manual_seed(r.seed)
        opt = torch.optim.AdamW(model.parameters(), lr=r.lr, weight_decay=0.0, betas=(0.9, 0.95))
        sched = warmup_cosine(opt, r.steps)
        model.train()
        for _ in training_steps(r.steps, f"training {which} of {name}"):
            idx = torch.randint(len(tokens), (r.batch_size,), generator=g)
            loss = cls._loss(model, tokens[idx], labels[idx], r.head_batch_mul, r.cond_dropout, g)
            optimizer_step(loss, opt, sched, model.parameters())
        return loss.item()

    def decode(self, tokens: torch.Tensor) -> torch.Tensor:
        """(B, N, p*p) -> (B, 1, H, W) images in [0, 1]."""
        return from_patches(tokens, self.recipe.patch, self.image_size)

    def conditions(self, n: int, generator: torch.Generator) -> torch.Tensor:
        """n uniformly drawn classes as condition ids (n, 1), on the generator's device."""
        return torch.randint(self.n_classes, (n, 1), generator=generator, device=generator.device) + self.class_offset

    def captions(self, cond: torch.Tensor) -> list[str]:
        """A class condition reads as the class's first caption template (text-image metrics need the prompt)."""
        table = caption_table(self.dataset_name)
        return [table[c - self.class_offset][0] for c in cond[:, 0].tolist()]
