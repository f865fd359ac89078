"""The default image-metric extractor (`cnn` in `metrics.features`): a small CNN classifier trained on the dataset.

The standard Inception needs weights from a local file (`metrics.inception`), so the default FID/KID/IS/precision/
recall extractor is a classifier trained from scratch on the dataset's train split (cached on disk by config hash,
seconds on digits, ~45 s on Fashion-MNIST). Its pooled penultimate activations are the features, its logits feed the
inception score; metric names carry `DatasetClassifier.name` so a number always says which extractor produced it.
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from core.cache import Cache, config_key
from core.rng import seeded
from core.training import optimizer_step, threads
from teachers.data.images import load_image_dataset

EXTRACTOR_VERSION = 1  # bump when training code changes what a recipe produces


@dataclass(frozen=True)
class ClassifierRecipe:
    dataset: str
    image_size: int
    width: int = 16  # channels of the first block; the blocks have width, 2*width, 4*width
    epochs: int = 10
    batch_size: int = 64
    lr: float = 1e-2
    weight_decay: float = 1e-4
    seed: int = 0


# Per-dataset departures from the defaults (which are the digits recipe). Fashion-MNIST's 60k 28x28 images make an
# epoch over 100x costlier than digits': 3 epochs of larger batches reach ~90 % test accuracy in under a minute.
_RECIPES = {"fashion-mnist": {"epochs": 3, "batch_size": 128, "lr": 2e-2}}


def classifier_recipe(dataset: str, image_size: int) -> ClassifierRecipe:
    return ClassifierRecipe(dataset=dataset, image_size=image_size, **_RECIPES.get(dataset, {}))


class ClassifierNet(nn.Module):
    """Three conv-BN-ReLU blocks (two 2x max-pools between them), global average pooling, a linear head."""

    def __init__(self, channels: int, classes: int, width: int):
        super().__init__()

        def block(c_in: int, c_out: int) -> list[nn.Module]:
            return [nn.Conv2d(c_in, c_out, 3, padding=1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU()]

        self.body = nn.Sequential(*block(channels, width), nn.MaxPool2d(2), *block(width, 2 * width), nn.MaxPool2d(2),
                                  *block(2 * width, 4 * width), nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.head = nn.Linear(4 * width, classes)
        self.num_features = 4 * width

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


class DatasetClassifier(nn.Module):
    """A trained `ClassifierNet`, frozen in eval mode, that checks its input images (a `metrics.features` extractor)."""

    batch = 256  # images per forward pass (bounds the activations held at once)
    max_reference = None  # the whole reference split: it costs milliseconds
    preprocessing = "none (the dataset's float images in [0, 1] at the teacher's size)"

    def __init__(self, name: str, net: ClassifierNet, channels: int, image_size: int, test_accuracy: float,
                 info: dict):
        super().__init__()
        self.name, self.net = name, net.requires_grad_(False)
        self.channels, self.image_size = channels, image_size
        self.num_features, self.num_classes = net.num_features, net.head.out_features
        self.test_accuracy, self.info = test_accuracy, info
        self.fingerprint = info["key"]  # the recipe hash determines the weights
        self.eval()

    def train(self, mode: bool = True) -> "DatasetClassifier":
        # BatchNorm in train mode would normalise with batch statistics, making features depend on the batch;
        # a parent's `.train()` (a torchmetrics Metric is an nn.Module) must not switch that on.
        return super().train(False)

    def _check(self, images: torch.Tensor) -> None:
        expected = (self.channels, self.image_size, self.image_size)
        if images.dim() != 4 or tuple(images.shape[1:]) != expected or not images.is_floating_point():
            raise ValueError(f"{self.name} expects float images (B, {', '.join(map(str, expected))}) in [0, 1]; "
                             f"got {images.dtype} {tuple(images.shape)}")

    @torch.no_grad()
    def features(self, images: torch.Tensor) -> torch.Tensor:
        """Pooled penultimate activations (B, num_features) of float images (B, C, H, W) in [0, 1]."""
        self._check(images)
        return self.net.body(images)

    @torch.no_grad()
    def logits(self, images: torch.Tensor) -> torch.Tensor:
        """Class logits (B, classes) of float images (B, C, H, W) in [0, 1]."""
        self._check(images)
        return self.net(images)


def _train(recipe: ClassifierRecipe) -> dict:
    t0 = time.perf_counter()
    train = load_image_dataset(recipe.dataset, "train", recipe.image_size)
    test = load_image_dataset(recipe.dataset, "test", recipe.image_size)
    channels, classes = train.images.shape[1], len(train.class_names)
    arch = {"channels": channels, "classes": classes, "width": recipe.width}
    g = torch.Generator().manual_seed(recipe.seed)
    with seeded(recipe.seed):  # parameter init
        net = ClassifierNet(**arch)
    opt = torch.optim.AdamW(net.parameters(), lr=recipe.lr, weight_decay=recipe.weight_decay)
    n = len(train.labels)
    steps_per_epoch = -(-n // recipe.batch_size)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=recipe.lr, total_steps=recipe.epochs * steps_per_epoch)
    # One thread (on a busy 2-core machine two threads made a step ~50x slower for these tiny convolutions).
    with threads(1):
        net.train()
        for _ in range(recipe.epochs):
            for idx in torch.randperm(n, generator=g).split(recipe.batch_size):
                loss = F.cross_entropy(net(train.images[idx]), train.labels[idx])
                optimizer_step(loss, opt, sched, net.parameters(), clip=None)
        net.eval()
        with torch.no_grad():
            test_accuracy = (net(test.images).argmax(-1) == test.labels).float().mean().item()
    info = {"train_loss": loss.item(), "n_params": sum(p.numel() for p in net.parameters()),
            "n_train": n, "n_test": len(test.labels), "train_seconds": time.perf_counter() - t0}
    return {"config": dataclasses.asdict(recipe), "arch": arch, "state_dict": net.state_dict(),
            "test_accuracy": test_accuracy, "info": info}


def load_classifier(dataset: str, image_size: int, *, cache: Cache, device: torch.device) -> DatasetClassifier:
    """The dataset's classifier at this image size: loaded from `cache`, or trained and cached on first use."""
    recipe = classifier_recipe(dataset, image_size)
    key = config_key(dataclasses.asdict(recipe), EXTRACTOR_VERSION)
    blob, cached = cache.get_or_build("extractors", key, lambda: _train(recipe))
    with torch.device("meta"):  # no random init (it would draw from the caller's global RNG) for weights we replace
        net = ClassifierNet(**blob["arch"])
    net.load_state_dict(blob["state_dict"], assign=True)
    info = {**blob["info"], "cached": cached, "key": key}
    return DatasetClassifier(f"{dataset}-cnn", net, blob["arch"]["channels"], image_size, blob["test_accuracy"],
                             info).to(device)
