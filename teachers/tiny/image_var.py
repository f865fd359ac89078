"""A tiny VAR (next-scale prediction, Tian et al. 2024, arXiv:2404.02905) on scikit-learn's digits: the embedded
teacher of the multi-scale VQ family, trained and cached on first use (DD's VAR setting, arXiv:2412.17153 §5, at CPU
scale).

The tokenizer stands in for VAR's multi-scale VQ-VAE as the k-means patch quantiser stands in for LlamaGen's VQ-GAN:
no network, the feature map is the image itself cut into p x p pixel patches ((16 / 2)^2 cells of 4 values in
[-1, 1]), quantised scale by scale as VAR does (`msvq.MultiScaleVQ.encode_map`: the residual, area-downsampled to the
scale, takes its nearest code; the code, upsampled bicubically, leaves the next residual) with one codebook shared by
the scales and no Phi convolution (VAR's `quant_resi` 0). The codebook is k-means on the residual vectors of every
scale, refitted `kmeans_rounds` times on the residuals the previous codebook leaves. The transformer is VAR's own
(`teachers.networks.var`) at a small size, trained by teacher forcing under the block-causal mask with class dropout,
so that CFG works; it samples with the family's sampler (VAR's CFG ramp, top-k, top-p).

Measured for the registered recipe (`digits-var-c2i`, 2 cores): 8 min 41 s to train (2000 steps at ~4 a second),
1.25 M parameters, test NLL 1.87 nats a token, tokenizer test MSE 0.00062 (pixels in [0, 1]).
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn as nn
import torch.nn.functional as F

from core.cache import Cache
from core.training import optimizer_step, training_steps, warmup_cosine
from teachers.data.images import caption_table, load_image_dataset
from teachers.families import multiscale_vq
from teachers.networks.msvq import MSVQConfig, MultiScaleVQ
from teachers.networks.var import VAR, VARConfig
from teachers.tiny.recipes import RecipeTeacher


@dataclass(frozen=True)
class ImageVARRecipe:
    dataset: str = "digits"
    image_size: int = 16
    patch: int = 2  # the map's cells: patch x patch pixels (Cvae = patch^2)
    patch_nums: tuple[int, ...] = (1, 2, 4, 8)
    codebook_size: int = 128
    kmeans_rounds: int = 3
    depth: int = 4
    width: int = 128
    heads: int = 4
    steps: int = 2000
    batch_size: int = 64
    lr: float = 1e-3
    cond_dropout: float = 0.1
    seed: int = 0


class ImageVARTeacher(multiscale_vq.NetworkTeacher, RecipeTeacher):
    family: ClassVar = multiscale_vq.FAMILY
    modality: ClassVar[str] = "image"
    supports_cfg: ClassVar[bool] = True  # trained with class dropout
    recipe: ClassVar[ImageVARRecipe]

    def __init__(self, name: str, network: VAR, vq: MultiScaleVQ, info: dict):
        self.name, self.info = name, info
        self.network, self.vq = network.eval().requires_grad_(False), vq.eval().requires_grad_(False)
        c = network.cfg
        self.patch_nums, self.seq_len, self.vocab_size, self.n_classes = c.patch_nums, c.L, c.vocab_size, c.num_classes
        self.dataset_name, self.image_size = self.recipe.dataset, self.recipe.image_size

    @classmethod
    def configs(cls, n_classes: int) -> tuple[VARConfig, MSVQConfig]:
        r = cls.recipe
        vq = MSVQConfig(vocab_size=r.codebook_size, Cvae=r.patch ** 2, ch=0, quant_resi=0.0, share_quant_resi=1,
                        patch_nums=r.patch_nums)
        net = VARConfig(depth=r.depth, num_classes=n_classes, vocab_size=r.codebook_size, Cvae=r.patch ** 2,
                        patch_nums=r.patch_nums, embed_dim=r.width, num_heads=r.heads)
        return net, vq

    @classmethod
    def load(cls, name: str, *, cache: Cache, device: torch.device) -> "ImageVARTeacher":
        blob = cls.cached_blob(name, cache)
        net_cfg, vq_cfg = cls.configs(blob["n_classes"])
        network, vq = VAR(net_cfg), MultiScaleVQ(vq_cfg)
        network.load_state_dict(blob["model"])
        vq.load_state_dict(blob["vq"])
        return cls(name, network.to(device), vq.to(device), blob["info"])

    @staticmethod
    def to_map(images: torch.Tensor, patch: int) -> torch.Tensor:
        """(B, 1, H, W) in [0, 1] -> the feature map (B, patch^2, H / patch, W / patch) in [-1, 1]."""
        return F.pixel_unshuffle(images * 2 - 1, patch)

    @classmethod
    def fit_codebook(cls, vq: MultiScaleVQ, f: torch.Tensor) -> None:
        """k-means on the residual vectors of every scale, refitted on the residuals each codebook leaves."""
        from sklearn.cluster import KMeans

        r = cls.recipe
        vectors = torch.cat([vq.downsample(si, f).flatten(2).transpose(1, 2).reshape(-1, f.shape[1])
                             for si in range(len(r.patch_nums))])  # round 0: the map itself at every scale
        init = "k-means++"
        for _ in range(r.kmeans_rounds):
            km = KMeans(n_clusters=r.codebook_size, init=init, n_init=1, random_state=r.seed)
            codebook = torch.tensor(km.fit(vectors.double().numpy()).cluster_centers_, dtype=torch.float32)
            with torch.no_grad():
                vq.quantize.embedding.weight.copy_(codebook)
            rest, parts = f.clone(), []
            for si, idx in enumerate(vq.encode_map(f)):
                parts.append(vq.downsample(si, rest).flatten(2).transpose(1, 2).reshape(-1, f.shape[1]))
                rest = rest - vq.accumulate(si, torch.zeros_like(rest), idx)
            vectors, init = torch.cat(parts), codebook.double().numpy()

    @classmethod
    def _fit(cls, name: str, cache: Cache) -> dict:
        r, t0 = cls.recipe, time.perf_counter()
        train = load_image_dataset(r.dataset, "train", r.image_size)
        test = load_image_dataset(r.dataset, "test", r.image_size)
        n_classes = len(train.class_names)
        net_cfg, vq_cfg = cls.configs(n_classes)
        vq = MultiScaleVQ(vq_cfg).requires_grad_(False)
        cls.fit_codebook(vq, cls.to_map(train.images, r.patch))
        test_codes = vq.encode_map(cls.to_map(test.images, r.patch))
        recon_mse = F.mse_loss((vq.decode_codes(test_codes) + 1) / 2, test.images).item()
        codes = vq.encode_map(cls.to_map(train.images, r.patch))  # per scale (n, pn^2)
        inputs, targets = vq.var_input(codes), torch.cat(codes, 1)  # (n, L - 1, Cvae), (n, L)
        model = VAR(net_cfg)
        for module in model.modules():  # small-init as VAR's `init_weights` does (std sqrt(1 / 3C))
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.trunc_normal_(module.weight, std=(1 / net_cfg.width / 3) ** 0.5)
        for p in (model.pos_start, model.pos_1LC):
            nn.init.trunc_normal_(p, std=(1 / net_cfg.width / 3) ** 0.5)
        g = torch.Generator().manual_seed(r.seed)
        opt = torch.optim.AdamW(model.parameters(), lr=r.lr, weight_decay=0.01, betas=(0.9, 0.95))
        sched = warmup_cosine(opt, r.steps)
        model.train()
        for _ in training_steps(r.steps, f"training teacher {name}"):
            idx = torch.randint(len(targets), (r.batch_size,), generator=g)
            labels = train.labels[idx].clone()
            labels[torch.rand(r.batch_size, generator=g) < r.cond_dropout] = n_classes  # the null class
            logits = model(labels, inputs[idx])
            loss = F.cross_entropy(logits.reshape(-1, r.codebook_size), targets[idx].reshape(-1))
            optimizer_step(loss, opt, sched, model.parameters())
        model.eval()
        with torch.no_grad():
            logits = model(test.labels, vq.var_input(test_codes))
            test_nll = F.cross_entropy(logits.reshape(-1, r.codebook_size), torch.cat(test_codes, 1).reshape(-1))
        info = {"train_loss": loss.item(), "test_nll_per_token": test_nll.item(), "vq_test_mse": recon_mse,
                "n_params": sum(p.numel() for p in model.parameters()), "train_seconds": time.perf_counter() - t0}
        return {"model": model.state_dict(), "vq": vq.state_dict(), "n_classes": n_classes, "info": info,
                "recipe": dataclasses.asdict(r)}

    # ---- the MultiScaleTeacher protocol (start, next_scale, decode: `multiscale_vq.NetworkTeacher`) ------------
    def conditions(self, n: int, generator: torch.Generator) -> torch.Tensor:
        """n uniformly drawn class ids, (n, 1), on the generator's device."""
        return torch.randint(self.n_classes, (n, 1), generator=generator, device=generator.device)

    def captions(self, cond: torch.Tensor) -> list[str]:
        """A class reads as its first caption template ("a handwritten seven")."""
        table = caption_table(self.dataset_name)
        return [table[c][0] for c in cond[:, 0].tolist()]
