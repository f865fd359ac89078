"""open_clip models for the text-image metrics (CLIP score, HPSv2), built without downloading anything.

Two sources (open_clip, github.com/mlfoundations/open_clip):
- a small CLIP trained contrastively (open_clip's `ClipLoss`, Radford et al. 2021) on the teacher's own dataset and its
  class captions, cached on disk by recipe hash like the dataset classifier (`metrics.extractors`), seconds on a CPU;
- any open_clip architecture with its weights from a local checkpoint file named by an environment variable (a real
  CLIP such as the SJD paper's ViT-B-16, or the HPS v2 ViT-H-14); pretrained tags are never passed to open_clip.

`OpenCLIP` wraps either one with its BPE tokenizer and its eval preprocessing, applied to our float image tensors.
"""
from __future__ import annotations

import dataclasses
import difflib
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import open_clip
import torch
import torch.nn as nn
from open_clip.transform import PreprocessCfg, image_transform_v2

from core.cache import Cache, config_key
from core import files
from core.checkpoints import mismatch, torch_load_errors
from core.errors import UserError
from core.rng import seeded
from core.training import optimizer_step, threads
from teachers.data.images import load_image_dataset

CLIP_VERSION = 1  # bump when training code changes what a recipe produces
EXAMPLE_ARCHS = ("ViT-B-16", "ViT-B-32", "ViT-L-14", "ViT-H-14")  # suggested when an architecture name is unknown
SMALL_BATCH = 1024  # images per forward pass of the small CLIP (16x16 images: ~20 MB of activations)
CHECKPOINT_BATCH = 16  # images per forward pass of a checkpoint model (a 224x224 ViT-H-14 batch: ~1 GB)


@dataclass(frozen=True)
class CLIPRecipe:
    dataset: str
    image_size: int
    patch_size: int = 4
    width: int = 64  # of both towers
    layers: int = 2  # of both towers
    head_width: int = 32  # heads = width / head_width
    embed_dim: int = 64
    context_length: int = 16  # BPE tokens per caption, <start> and <end> included
    steps: int = 400  # a fixed number of steps (not epochs) bounds the training time on a larger dataset too
    batch_size: int = 32
    lr: float = 3e-3
    weight_decay: float = 0.1
    seed: int = 0


def small_clip_config(recipe: CLIPRecipe) -> dict:
    """The open_clip model config (the JSON format of `open_clip.add_model_config`) of the recipe's small CLIP."""
    return {"embed_dim": recipe.embed_dim,
            "vision_cfg": {"image_size": recipe.image_size, "patch_size": recipe.patch_size, "width": recipe.width,
                           "layers": recipe.layers, "head_width": recipe.head_width},
            "text_cfg": {"context_length": recipe.context_length, "width": recipe.width, "layers": recipe.layers,
                         "heads": recipe.width // recipe.head_width}}


def eval_transform(model: nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
    """open_clip's eval preprocessing of `model` as a function of float images (B, C, H, W) in [0, 1] -> (B, 3, S, S).

    open_clip's transform takes tensors as they are (its RGB conversion and ToTensor act on PIL images only): resize
    to the model's size with its interpolation, centre crop, normalise with its mean / std. Grey images are repeated
    to 3 channels first, as PIL's convert("RGB") would. The PIL path also rounds the resized image to 8 bits and clips
    bicubic overshoot; on upscaled digits the two differ by 0.006 on average (normalised units).
    """
    # open_clip's defaults under what the model carries (`create_model` sets all of it, a bare `CLIP` only its size).
    cfg = PreprocessCfg(**{**dataclasses.asdict(PreprocessCfg()), **open_clip.get_model_preprocess_cfg(model)})
    transform = image_transform_v2(cfg, is_train=False)
    return lambda images: transform(images.float().expand(-1, 3, -1, -1))


class OpenCLIP(nn.Module):
    """A frozen open_clip model with its tokenizer and eval preprocessing, for float image tensors in [0, 1]."""

    def __init__(self, name: str, model: nn.Module, tokenizer, batch: int, info: dict):
        super().__init__()
        self.name, self.model, self.tokenizer = name, model.eval().requires_grad_(False), tokenizer
        self.preprocess = eval_transform(model)  # (B, C, H, W) in [0, 1] -> (B, 3, S, S)
        self.batch = batch  # images per forward pass
        self.info = info

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def tokenize(self, texts: list[str]) -> torch.Tensor:
        return self.tokenizer(texts)  # (B, context_length) long

    @torch.no_grad()
    def image_features(self, images: torch.Tensor) -> torch.Tensor:
        """Unit-norm embeddings (B, D) of float images (B, C, H, W) in [0, 1]."""
        return torch.cat([self.model.encode_image(self.preprocess(b).to(self.device), normalize=True)
                          for b in images.split(self.batch)])

    @torch.no_grad()
    def text_features(self, texts: list[str]) -> torch.Tensor:
        """Unit-norm embeddings (B, D) of captions."""
        return torch.cat([self.model.encode_text(self.tokenize(texts[i:i + self.batch]).to(self.device), normalize=True)
                          for i in range(0, len(texts), self.batch)])


def _small_clip(recipe: CLIPRecipe, model: open_clip.CLIP, info: dict) -> OpenCLIP:
    tokenizer = open_clip.SimpleTokenizer(context_length=recipe.context_length)
    return OpenCLIP(f"{recipe.dataset}-clip", model, tokenizer, batch=SMALL_BATCH, info=info)


def _evaluate(clip: OpenCLIP, dataset: str, image_size: int) -> dict:
    """Retrieval accuracy on the test split: image -> class (zero-shot) and caption -> image (top-1 image's class)."""
    test = load_image_dataset(dataset, "test", image_size)
    image = clip.image_features(test.images)  # (N, D)
    # Templates as callables of the class index: the dataset's own captions ("an ankle boot"), not str.format.
    templates = [lambda k, t=t: test.caption(k, t) for t in range(len(test.templates))]
    classes = open_clip.build_zero_shot_classifier(clip.model, clip.tokenizer, range(len(test.class_names)),
                                                   templates, num_classes_per_batch=None, device=clip.device)  # (D, K)
    captions = [test.caption(c, t) for c in range(len(test.class_names)) for t in range(len(test.templates))]
    caption_class = torch.arange(len(test.class_names)).repeat_interleave(len(test.templates))
    nearest = (clip.text_features(captions) @ image.T).argmax(-1)  # (K * T,) the test image closest to each caption
    return {"zero_shot_top1": (image @ classes).argmax(-1).eq(test.labels).float().mean().item(),
            "text_to_image_top1": test.labels[nearest].eq(caption_class).float().mean().item()}


def _train(recipe: CLIPRecipe) -> dict:
    t0 = time.perf_counter()
    train = load_image_dataset(recipe.dataset, "train", recipe.image_size)
    tokenizer = open_clip.SimpleTokenizer(context_length=recipe.context_length)
    n_cls, n_tmpl = len(train.class_names), len(train.templates)
    captions = [train.caption(c, t) for c in range(n_cls) for t in range(n_tmpl)]
    tokens = tokenizer(captions).view(n_cls, n_tmpl, recipe.context_length)  # (K, T, L)
    if tokens[..., -1].ne(0).any():  # the tokenizer truncates silently; a cut caption would train on a wrong text
        raise ValueError(f"{recipe.dataset} captions need more than context_length={recipe.context_length} tokens")
    g = torch.Generator().manual_seed(recipe.seed)
    with seeded(recipe.seed):  # parameter init
        model = open_clip.CLIP(**small_clip_config(recipe))
    # The captions use a few dozen of the 49k BPE ids: learning the whole (49408, width) table would cost most of each
    # step for rows that never appear. Fixed random rows are distinct enough for the transformer above them.
    model.token_embedding.requires_grad_(False)
    loss_fn = open_clip.ClipLoss()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=recipe.lr,
                            weight_decay=recipe.weight_decay)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=recipe.lr, total_steps=recipe.steps)
    pixels = eval_transform(model)(train.images)  # (N, 3, S, S): preprocessed once, it has no random augmentation
    params = [p for p in model.parameters() if p.requires_grad]
    # One thread (on the 2-core machine with another process busy, 8 s against 22-105 s on two threads).
    with threads(1):
        model.train()
        for _ in range(recipe.steps):
            idx = torch.randint(len(pixels), (recipe.batch_size,), generator=g)
            template = torch.randint(n_tmpl, (recipe.batch_size,), generator=g)  # a random caption of the image's class
            loss = loss_fn(*model(pixels[idx], tokens[train.labels[idx], template]))
            optimizer_step(loss, opt, sched, params, clip=None)
            with torch.no_grad():  # as open_clip's training loop: a temperature below 1/100 destabilises training
                model.logit_scale.clamp_(0, math.log(100))
        figures = _evaluate(_small_clip(recipe, model, info={}), recipe.dataset, recipe.image_size)
    info = {**figures, "train_loss": loss.item(), "n_params": sum(p.numel() for p in model.parameters()),
            "n_train": len(pixels), "train_seconds": time.perf_counter() - t0}
    return {"config": dataclasses.asdict(recipe), "state_dict": model.state_dict(), "info": info}


def load_small_clip(dataset: str, image_size: int, *, cache: Cache, device: torch.device) -> OpenCLIP:
    """The small CLIP of the dataset at this image size, named "<dataset>-clip": cached, or trained on first use."""
    recipe = CLIPRecipe(dataset=dataset, image_size=image_size)
    key = config_key(dataclasses.asdict(recipe), CLIP_VERSION)
    blob, cached = cache.get_or_build("extractors", key, lambda: _train(recipe))
    # Built on the CPU, not the meta device: open_clip keeps the text tower's causal mask as a non-persistent buffer,
    # which the state dict does not restore. Initialising this small model costs milliseconds.
    with seeded(recipe.seed):  # the init, replaced by the cached weights, leaves the caller's RNG alone
        model = open_clip.CLIP(**small_clip_config(recipe))
    model.load_state_dict(blob["state_dict"])
    return _small_clip(recipe, model.to(device), info={**blob["info"], "cached": cached, "key": key})


def offline_archs() -> list[str]:
    """open_clip architectures that build offline: every registered one except those with a Hugging Face text tower
    or tokenizer, whose configuration alone would be fetched from the Hub."""
    def hub(arch: str) -> bool:
        text_cfg = open_clip.get_model_config(arch)["text_cfg"]
        return "hf_model_name" in text_cfg or "hf_tokenizer_name" in text_cfg

    return [arch for arch in open_clip.list_models() if not hub(arch)]


def check_arch(metric: str, arch: str) -> None:
    """UserError unless `arch` is an open_clip architecture that builds offline."""
    archs = offline_archs()
    if arch not in archs:
        suggestions = difflib.get_close_matches(arch, archs, n=4) or EXAMPLE_ARCHS
        raise UserError(f"{metric}@{arch}: unknown open_clip architecture {arch!r}; valid e.g. "
                        f"{', '.join(suggestions)} (open_clip.list_models() without a Hugging Face text tower)")


def checkpoint_file(owner: str, env: str, arch: str, example: str) -> Path | None:
    """The local checkpoint named by the environment variable `env`.

    UserError "<owner>: ..." naming the variable (and the file) when it is unset or the file is missing; `example` is
    a file name for the message. Inside a dry run's audit (`core.files`) a missing one is listed instead (an unset
    variable as `$ENV`) and None returned.
    """
    value = os.environ.get(env)
    path = Path(value).expanduser().resolve() if value else Path(f"${env}")
    missing = (f"{owner}: checkpoint {path} (from {env}) not found" if value else
               f"{owner}: no checkpoint; set {env}=/path/to/{example} ({arch})")
    return path if files.require(path, missing) else None


def load_open_clip(arch: str, path: Path, *, device: torch.device) -> OpenCLIP:
    """open_clip architecture `arch` with the weights of a local checkpoint, named `arch`.

    The checkpoint is a state dict, or a dict with one under "state_dict" (as the HPS v2 files), keys optionally
    prefixed "module." (DDP); open_clip's own loader handles all three and loads strictly. The absolute path can never
    be mistaken for a pretrained tag, so nothing is downloaded. A file open_clip cannot read, or the checkpoint of
    another architecture, is one `UserError` naming it.
    """
    with torch_load_errors(path):
        try:
            with seeded(0):  # the random init, replaced by the checkpoint, draws from the global generators
                model = open_clip.create_model(arch, pretrained=str(path), device=device)
        except RuntimeError as exc:
            if "Error(s) in loading state_dict" not in str(exc):
                raise
            raise UserError(f"{path}: not a checkpoint of open_clip's {arch} ({mismatch(exc)})") from None
        except (AttributeError, StopIteration):  # open_clip takes what the file holds as a non-empty mapping
            raise UserError(f"{path}: holds no state dict (a mapping of names to tensors)") from None
    return OpenCLIP(arch, model, open_clip.get_tokenizer(arch), batch=CHECKPOINT_BATCH, info={"checkpoint": str(path)})
