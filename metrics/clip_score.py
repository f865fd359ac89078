"""CLIP score (Hessel et al. 2021, arXiv:2104.08718) of generated images against the prompts they were sampled for.

The score is torchmetrics' `CLIPScore`: max(100 * mean cos(image, caption), 0), the per-pair cosines averaged before
the clamp (the class as implemented in torchmetrics 1.9.0; its docstring's formula clamps each pair). torchmetrics
takes a callable returning any (model, processor) pair shaped like Hugging Face's `CLIPModel` / `CLIPProcessor`; the
adapters below give it an open_clip model from `metrics.clip_models`:
- `clip`: the small CLIP trained on the teacher's dataset, key "clip.<dataset>-clip";
- `clip@<arch>` (e.g. `clip@ViT-B-16`, the SJD paper's CLIP): an open_clip architecture with the weights of the local
  checkpoint named by `ACCELBENCH_CLIP_CHECKPOINT`, key "clip.<arch>";
- `clip@hf:<folder>` (e.g. `clip@hf:clip-vit-base-patch16`, the CLIP of SJD's released evaluation): a transformers
  `CLIPModel` and `CLIPProcessor` saved in a local folder (a path, or a name under `--checkpoints`), scored with SJD's
  preprocessing (8 bits, bilinear resize to 299), key "clip.hf-<folder's name>" (`metrics.clip_hf`).
"""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import torch
import torch.nn as nn
from torchmetrics.multimodal.clip_score import CLIPScore as TorchmetricsCLIPScore

from core.cache import Cache
from core.checkpoints import check_whole
from core.errors import UserError
from metrics import clip_hf
from metrics.base import TORCHMETRICS_LOCAL, Metric
from metrics.clip_models import OpenCLIP, check_arch, checkpoint_file, load_open_clip, load_small_clip
from teachers.pretrained.hf_folder import PREFIX, is_folder_name

CHECKPOINT_ENV = "ACCELBENCH_CLIP_CHECKPOINT"
CHECKPOINT_EXAMPLE = "open_clip_checkpoint.pt"


class HFModelAdapter(nn.Module):
    """An open_clip model behind the two `CLIPModel` methods torchmetrics calls (it normalises the features itself)."""

    def __init__(self, clip: OpenCLIP):
        super().__init__()
        self.clip = clip
        # torchmetrics reads `config.text_config.max_position_embeddings` to truncate over-long token rows; the
        # open_clip tokenizer already cuts captions to the model's context length.
        text_config = SimpleNamespace(max_position_embeddings=clip.tokenizer.context_length)
        self.config = SimpleNamespace(text_config=text_config)

    def get_image_features(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.clip.model.encode_image(pixel_values)  # (B, D)

    def get_text_features(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.clip.model.encode_text(input_ids)  # (B, D); open_clip pools at <end> and needs no mask


class HFProcessorAdapter:
    """open_clip's preprocessing and tokenizer behind the `CLIPProcessor` call torchmetrics makes."""

    def __init__(self, clip: OpenCLIP):
        self.clip = clip

    def __call__(self, text: list[str] | None = None, images: list[torch.Tensor] | None = None,
                 **_: object) -> dict[str, torch.Tensor]:  # return_tensors="pt", padding=True: what it always gives
        if images is not None:
            return {"pixel_values": self.clip.preprocess(torch.stack(images))}  # (B, 3, S, S)
        ids = self.clip.tokenize(text)  # (B, L), zero-padded
        return {"input_ids": ids, "attention_mask": ids.ne(0).long()}


class CLIPScore(Metric):
    """CLIP score of images against their prompts (torchmetrics' CLIPScore; clip@<open_clip arch>, clip@hf:<folder>)."""

    name = "clip"
    higher_is_better = True

    @classmethod
    def check(cls, extractor: str | None, checkpoints: Path) -> None:
        if extractor is not None and is_folder_name(extractor):
            clip_hf.check(extractor, checkpoints)
        elif extractor is not None and (path := cls._checkpoint(extractor)) is not None:
            check_whole(path)
        return None

    @classmethod
    def check_teacher(cls, teacher: str, teacher_cls, extractor: str | None, checkpoints: Path) -> None:
        if extractor is None and not cls.has_dataset(teacher_cls):
            raise UserError(f"metric clip is the small CLIP trained on the teacher's dataset; teacher {teacher!r} "
                            f"has none here: use clip@<arch> with a local open_clip checkpoint ({CHECKPOINT_ENV}) "
                            f"or clip@hf:<folder> with a local transformers CLIP folder")

    @classmethod
    def _checkpoint(cls, arch: str) -> Path | None:
        if arch.startswith(PREFIX):  # "hf:" alone
            raise UserError(f"{cls.name}@{arch}: name the folder, clip@hf:<folder> (a path or a name under "
                            f"--checkpoints), or an open_clip architecture, clip@<arch>")
        try:
            check_arch(cls.name, arch)
        except UserError as e:  # the other kind of choice
            raise UserError(f"{e}, or a transformers CLIP folder: clip@hf:<folder>") from None
        return checkpoint_file(f"{cls.name}@{arch}", CHECKPOINT_ENV, arch, CHECKPOINT_EXAMPLE)

    def __init__(self, teacher, *, cache: Cache, device: torch.device, checkpoints: Path,
                 extractor: str | None = None):
        super().__init__(teacher, cache=cache, device=device, checkpoints=checkpoints)
        self._prepare = lambda images: images  # what torchmetrics receives of the generated images
        if extractor is not None and is_folder_name(extractor):
            self.clip = clip_hf.load(extractor, device=device, checkpoints=checkpoints)
            adapters = self.clip.model, self.clip.processor
            self._prepare = self.clip.prepare  # SJD's: 8 bits, bilinear resize to 299x299
        else:
            if extractor is None:
                self.clip = load_small_clip(teacher.dataset_name, teacher.image_size, cache=cache, device=device)
            else:
                self.clip = load_open_clip(extractor, self._checkpoint(extractor), device=device)
            adapters = HFModelAdapter(self.clip), HFProcessorAdapter(self.clip)
        self.extractor = self.clip.name
        self._score = TorchmetricsCLIPScore(model_name_or_path=lambda: adapters, **TORCHMETRICS_LOCAL).to(device)

    def update(self, images: torch.Tensor, cond: torch.Tensor) -> None:
        captions = self.teacher.captions(cond)
        for start in range(0, len(images), self.clip.batch):  # torchmetrics embeds whatever it gets in one pass
            stop = start + self.clip.batch
            self._score.update(self._prepare(images[start:stop]).to(self.device), captions[start:stop])

    def compute(self, seed: int = 0) -> dict[str, float]:
        if self._score.n_samples == 0:  # torchmetrics would only warn, and return 0 / 0
            raise ValueError(f"{self.name}: compute() before any update()")
        return {f"{self.name}.{self.extractor}": float(self._score.compute())}

    def reset(self) -> None:
        self._score.reset()
