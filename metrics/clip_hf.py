"""A Hugging Face `CLIPModel` in a local folder as the CLIP of `clip@hf:<folder>`, scored as the SJD paper's released
evaluation scores it (Speculative Jacobi Decoding, arXiv:2410.01699; tyshiwo1/Accelerating-T2I-AR-with-SJD 3d0b4e0,
evaluation_metrics.py:190-265):
- torchmetrics' `CLIPScore(model_name_or_path="openai/clip-vit-base-patch16")` (evaluation_metrics.py:197; torchmetrics
  1.6.1 and transformers 4.47.1, environment.yaml): 100 * mean cos(image, caption) over every pair, clamped at 0;
- the images are 8-bit RGB tensors, resized bilinearly to 299x299 (`F.interpolate(..., mode="bilinear",
  align_corners=False)` on the uint8 tensor, evaluation_metrics.py:225-236) before `CLIPScore.update`, whose
  `CLIPProcessor` then rescales, resizes the short side to 224 (bicubic), centre-crops and normalises;
- one image per update (batchsize=1, evaluation_metrics.py:329), which changes nothing but float rounding.

Here the float images in [0, 1] are rounded to 8 bits (as `metrics.inception.to_uint8`; SJD reads PNG files of its
samples, which its pipelines truncate to 8 bits: the teachers' `decode` gives those levels, so the rounding returns
the release's bytes, tests/test_release_pixels.py), resized as SJD does, and scored by torchmetrics 1.9's
`CLIPScore` with the folder's model and processor. The processor's image side is transformers' PIL backend
(`CLIPImageProcessorPil`), the one transformers 4.47 used by default; transformers 5's default is a torchvision
backend, whose bicubic resize differs slightly. transformers 5's
`CLIPModel.get_*_features` return model outputs instead of tensors, which torchmetrics 1.9 cannot normalise:
`FeaturesOf` gives it the projected embeddings (`pooler_output`), what transformers 4.47 returned.

`<folder>` is a path, or a name inside the checkpoints folder (`--checkpoints`), as for `gen_ppl@hf:<folder>`: e.g.
`clip@hf:clip-vit-base-patch16` reads `<checkpoints>/clip-vit-base-patch16` (the files `save_pretrained` writes for
the model and its processor, as downloaded from openai/clip-vit-base-patch16). Key: "clip.hf-<folder's name>".
"""
from __future__ import annotations

import re
from pathlib import Path

import torch
import torch.nn as nn

from core import files
from core.cache import CHECKPOINTS_ENV
from metrics.inception import to_uint8
from core.checkpoints import from_folder, read_config
from teachers.pretrained.hf_folder import PREFIX, folder

SJD_SIZE = 299  # SJD resizes its 8-bit images to 299x299 before CLIPScore (evaluation_metrics.py:235-236)
BATCH = 16  # images per torchmetrics update (SJD: 1; a batch changes only float rounding)
REQUIRED = ("config.json", "tokenizer_config.json")  # written by save_pretrained for the model and the processor


def key_name(name: str) -> str:
    """`hf:<folder>` -> "hf-<folder's name>", a valid MLflow metric-name part."""
    return "hf-" + re.sub(r"[^A-Za-z0-9_.-]", "-", Path(name[len(PREFIX):]).name)


def check(name: str, checkpoints: Path) -> Path:
    """Refuse, in one line and before any work, a folder without a saved CLIP model and processor; return the folder.

    Inside a dry run's audit a missing file is recorded instead (`core.files.require`)."""
    path = folder(name, checkpoints)
    present = True
    for needed in REQUIRED:
        file = path / needed
        present &= files.require(file, f"missing {file}: clip@{name} is a Hugging Face CLIP folder (CLIPModel and "
                                       f"CLIPProcessor, save_pretrained's files, e.g. openai/clip-vit-base-patch16 "
                                       f"as SJD uses); place it in {checkpoints}, name its parent with "
                                       f"--checkpoints or {CHECKPOINTS_ENV}, or give a path after {PREFIX!r}")
    if present:
        read_config(path, model_type="clip")
    return path


def sjd_preprocess(images: torch.Tensor) -> torch.Tensor:
    """Float images (B, C, H, W) in [0, 1] -> (B, 3, 299, 299) uint8: 8 bits, then SJD's bilinear resize of them."""
    x = to_uint8(images.detach().cpu())  # uint8 bilinear interpolation is a CPU kernel, as SJD runs it
    return nn.functional.interpolate(x, size=(SJD_SIZE, SJD_SIZE), mode="bilinear", align_corners=False)


class FeaturesOf(nn.Module):
    """A transformers `CLIPModel` behind the two methods torchmetrics calls, returning the projected embeddings
    (transformers 5 returns them as `pooler_output` of a model output; torchmetrics 1.9 expects the tensor)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model
        self.config = model.config  # torchmetrics truncates captions to config.text_config.max_position_embeddings

    def get_image_features(self, pixel_values: torch.Tensor) -> torch.Tensor:
        out = self.model.get_image_features(pixel_values=pixel_values)
        return out if isinstance(out, torch.Tensor) else out.pooler_output  # (B, D)

    def get_text_features(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        out = self.model.get_text_features(input_ids=input_ids, attention_mask=attention_mask)
        return out if isinstance(out, torch.Tensor) else out.pooler_output  # (B, D)


class HFCLIP:
    """A local transformers CLIP folder: `model` (torchmetrics-shaped), `processor`, SJD's `prepare`, its key name."""

    batch = BATCH

    def __init__(self, name: str, model: nn.Module, processor):
        self.name, self.processor = key_name(name), processor
        self.model = FeaturesOf(model.eval().requires_grad_(False))

    @staticmethod
    def prepare(images: torch.Tensor) -> torch.Tensor:
        return sjd_preprocess(images)


def load(name: str, *, device: torch.device, checkpoints: Path) -> HFCLIP:
    """The CLIP of the folder `hf:<folder>`, in float32, read with `local_files_only=True` (nothing is downloaded)."""
    from transformers import AutoImageProcessor, AutoTokenizer, CLIPModel, CLIPProcessor

    from core.training import library_bars

    path = check(name, checkpoints)
    with library_bars():
        model = from_folder(CLIPModel.from_pretrained, path, dtype=torch.float32, local_files_only=True).to(device)
        image_processor = from_folder(AutoImageProcessor.from_pretrained, path, backend="pil", local_files_only=True)
        tokenizer = from_folder(AutoTokenizer.from_pretrained, path, local_files_only=True)
    return HFCLIP(name, model, CLIPProcessor(image_processor=image_processor, tokenizer=tokenizer))
