"""A k-means patch quantiser: the image tokenizer of the tiny discrete AR teachers.

Stands in for the VQ-GAN of LlamaGen-style models (SJD, arXiv:2410.01699; DD, arXiv:2412.17153). Each non-overlapping
p x p patch is replaced by its nearest k-means centroid. Under squared error this is the best fixed codebook for
non-overlapping patches, it is deterministic given a seed, fits in seconds on CPU and exposes real codebook vectors
(DD flows into them), which is all the AR teachers need from a tokenizer at this scale.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

# k-means fits a fixed random subset of at most this many patches: Fashion-MNIST's 2.9M 4x4 patches would take
# minutes, while 200k give a test reconstruction error within 2 % of 300k. Digits (92k patches) uses all of them.
FIT_PATCHES = 200_000


class PatchQuantizer(nn.Module):
    def __init__(self, codebook: torch.Tensor, patch: int, channels: int, image_size: int):
        super().__init__()
        self.register_buffer("codebook", codebook)  # (K, C*p*p)
        self.patch, self.channels, self.image_size = patch, channels, image_size

    @property
    def grid(self) -> tuple[int, int]:
        g = self.image_size // self.patch
        return g, g

    @classmethod
    def fit(cls, images: torch.Tensor, patch: int, codebook_size: int, seed: int) -> "PatchQuantizer":
        from sklearn.cluster import KMeans

        patches = cls._patches(images, patch).reshape(-1, images.shape[1] * patch * patch)  # (B*h*w, D)
        if len(patches) > FIT_PATCHES:
            keep = torch.randperm(len(patches), generator=torch.Generator().manual_seed(seed))[:FIT_PATCHES]
            patches = patches[keep]
        km = KMeans(n_clusters=codebook_size, n_init=1, random_state=seed).fit(patches.double().numpy())
        codebook = torch.tensor(km.cluster_centers_, dtype=torch.float32)
        return cls(codebook, patch, images.shape[1], images.shape[-1])

    @staticmethod
    def _patches(images, p):
        cols = F.unfold(images, kernel_size=p, stride=p)  # (B, C*p*p, h*w)
        return cols.transpose(1, 2)  # (B, h*w, C*p*p)

    @torch.no_grad()
    def encode(self, images: torch.Tensor) -> torch.Tensor:
        """(B, C, H, W) in [0, 1] -> (B, h*w) token ids in raster order."""
        x = self._patches(images, self.patch)
        d = torch.cdist(x, self.codebook.unsqueeze(0).expand(x.shape[0], -1, -1))  # (B, h*w, K)
        return d.argmin(dim=-1)

    @torch.no_grad()
    def decode(self, tokens: torch.Tensor) -> torch.Tensor:
        """(B, h*w) token ids -> (B, C, H, W) images."""
        cols = self.codebook[tokens].transpose(1, 2)  # (B, C*p*p, h*w)
        size = (self.image_size, self.image_size)
        return F.fold(cols, size, kernel_size=self.patch, stride=self.patch).clamp(0, 1)
