"""Tiny class-conditional DiT teachers in pixel space (ARD's teacher family, arXiv:2504.11295), trained and cached.

DiT's recipe at CPU scale: eps-prediction (no learned variance: a deterministic DDIM sampler never reads it) with the
linear 1000-step schedule, label dropout 0.1 for classifier-free guidance, AdamW and an EMA of the weights. Images
are scaled to [-1, 1]; there is no autoencoder (pixels stand in for DiT's latents).
"""
from __future__ import annotations

import copy
import dataclasses
import time
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F

from core.cache import Cache
from core.training import ema_update, optimizer_step, training_steps, warmup_cosine
from teachers.data.images import caption_table, load_image_dataset
from teachers.families import ode_diffusion
from teachers.networks.dit import DiT, DiTConfig
from teachers.tiny.recipes import RecipeTeacher

@dataclass(frozen=True)
class ImageDiTRecipe:
    dataset: str
    image_size: int = 16
    patch: int = 4
    hidden: int = 96
    depth: int = 4
    heads: int = 4
    steps: int = 4000
    batch_size: int = 64
    lr: float = 1e-3
    ema: float = 0.999
    label_dropout: float = 0.1
    seed: int = 0


class ImageDiTTeacher(RecipeTeacher):
    family: ClassVar = ode_diffusion.FAMILY
    modality: ClassVar[str] = "image"
    recipe: ClassVar[ImageDiTRecipe]

    def __init__(self, name: str, network: DiT, info: dict):
        self.name, self.network, self.info = name, network.eval().requires_grad_(False), info
        c = network.cfg
        self.image_shape = (c.channels, c.image_size, c.image_size)
        self.n_classes, self.dataset_name, self.image_size = c.n_classes, self.recipe.dataset, c.image_size

    @classmethod
    def load(cls, name: str, *, cache: Cache, device: torch.device):
        blob = cls.cached_blob(name, cache)
        model = DiT(DiTConfig(**blob["dit"]))
        model.load_state_dict(blob["state_dict"])
        return cls(name, model.to(device), blob["info"])

    @classmethod
    def _fit(cls, name: str, cache: Cache) -> dict:
        r, t0 = cls.recipe, time.perf_counter()
        train = load_image_dataset(r.dataset, "train", r.image_size)
        test = load_image_dataset(r.dataset, "test", r.image_size)
        cfg = DiTConfig(r.image_size, train.images.shape[1], r.patch, len(train.class_names), r.hidden, r.depth,
                        r.heads)
        model, g = DiT(cfg), torch.Generator().manual_seed(r.seed)
        ema = copy.deepcopy(model).requires_grad_(False)
        ab = ode_diffusion.alpha_bar().float()
        opt = torch.optim.AdamW(model.parameters(), lr=r.lr, weight_decay=0.0)
        sched = warmup_cosine(opt, r.steps)

        def loss_of(m, images, labels, gen):
            t = torch.randint(ode_diffusion.TRAIN_STEPS, (len(images),), generator=gen)
            noise = torch.randn(images.shape, generator=gen)
            a = ab[t].view(-1, 1, 1, 1)
            return F.mse_loss(m(a.sqrt() * images + (1 - a).sqrt() * noise, t, labels), noise)

        x, y = train.images * 2 - 1, train.labels
        for step in training_steps(r.steps, f"training teacher {name}"):
            idx = torch.randint(len(x), (r.batch_size,), generator=g)
            labels = torch.where(torch.rand(r.batch_size, generator=g) < r.label_dropout, cfg.n_classes, y[idx])
            loss = loss_of(model, x[idx], labels, g)
            optimizer_step(loss, opt, sched, model.parameters())
            ema_update(ema, model, r.ema, step)
        with torch.no_grad():
            test_loss = loss_of(ema, test.images * 2 - 1, test.labels, torch.Generator().manual_seed(r.seed)).item()
        info = {"train_loss": loss.item(), "test_loss": test_loss, "n_params": sum(p.numel() for p in ema.parameters()),
                "train_seconds": time.perf_counter() - t0}
        return {"dit": dataclasses.asdict(cfg), "state_dict": ema.state_dict(), "info": info}

    # ---- the ODEDiffusionTeacher protocol -------------------------------------------------------------------
    def conditions(self, n: int, generator: torch.Generator) -> torch.Tensor:
        """n uniformly drawn class ids, (n, 1), on the generator's device."""
        return torch.randint(self.n_classes, (n, 1), generator=generator, device=generator.device)

    @torch.inference_mode()
    def eps(self, x, t, cond, *, cfg):
        y = cond[:, 0]
        if cfg == 1.0:
            return self.network(x, t, y)
        e = self.network(torch.cat([x, x]), torch.cat([t, t]), torch.cat([y, torch.full_like(y, self.n_classes)]))
        e_c, e_u = e.chunk(2)
        return e_u + cfg * (e_c - e_u)

    def decode(self, x: torch.Tensor) -> torch.Tensor:
        return ((x + 1) / 2).clamp(0, 1)

    def captions(self, cond: torch.Tensor) -> list[str]:
        table = caption_table(self.dataset_name)
        return [table[c][0] for c in cond[:, 0].tolist()]

    def real_images(self, split: str) -> tuple[torch.Tensor, torch.Tensor]:
        data = load_image_dataset(self.dataset_name, split, self.image_size)
        return data.images * 2 - 1, data.labels
