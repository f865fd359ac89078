"""`code`: Collaborative Decoding for VAR (Chen et al., arXiv:2411.17787, CVPR 2025), `docs/methods/code.md`.

A large VAR (the drafter: the trial's teacher) draws the first N scales, where the image's layout is decided; a small
VAR (the refiner) draws the remaining K - N, the fine detail, reading the drafted scales as its own prefix. As the
release does it (czg1225/CoDe @ bfb204d, models/var.py, "C" below):

- the drafter runs its own next-scale sampler for scales 0 .. N - 1 and stops (`autoregressive_infer_cfg_draft`,
  C:639-640, `exit_num`);
- the refiner reads the class token and the drafted scales' inputs in one pass under VAR's block-causal mask
  (`autoregressive_infer_cfg_refine`, C:712-724, the mask `attn_bias_for_masking[:, :, :pindex, :pindex]`), which is
  the family's `start(..., prefix=...)`, and draws scale N from that pass's last scale (C:742-755), then scale by scale
  through its KV cache (C:757-761);
- both models share one multi-scale VQ-VAE (the ids are the same codes): the refiner's feature map is the drafter's.

At scale N the release also draws a token for every earlier scale from the refiner's unguided logits (C:749-752) and
discards them; that changes the generator's stream, not the law, and is not done here. Training-free CoDe pairs two
VAR releases (VAR-d30 drafts, VAR-d16 refines: README "Training-free CoDe"); the released fine-tuned pair
(`released`: Hugging Face Zigeng/VAR_CoDe `drafter_N.pth`, `refiner_N.pth`, N = 6 .. 9, README "Model Zoo") are VAR
state dicts of the same layout, read strictly into copies of the two models. With the teacher as its own refiner CoDe
is the teacher's sampler draw for draw (`tests/test_code.py`); with another refiner the law of scales N .. K - 1 is
the refiner's, and the quality drift measures it.

The release samples its FID images under its own settings (`sampler: released`, sample_CoDe.py:127-139): top-k 600,
temperature 1.1 over the first 7 of the 10 scales (applied after top-k / top-p), CFG 1.5 and top-p 0.96 as VAR's
README; its VAR baseline (infer_original.py:96) samples with top-k 900 and no temperature. `sampler: teacher` (the
default) draws CoDe's scales under the reference arm's settings, so that the drift is the collaboration's alone.
"""
from __future__ import annotations

import copy
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Mapping

import torch

from core.cache import CHECKPOINTS_ENV, Cache
from core.checkpoints import mismatch, read_state_dict
from core.errors import UserError
from core.samples import Samples
from methods.base import Method, Passes
from teachers import load_teacher, teacher_class
from teachers.families import multiscale_vq
from teachers.families.ar_token import draw

SAMPLERS = ("teacher", "released")
RELEASED_TOP_K = 600  # sample_CoDe.py:127 (newk = [600] * 10)
RELEASED_TEMPERATURE = 1.1  # sample_CoDe.py:128 (temp = [1.1] * 7 + [1.0] * 3)
RELEASED_HOT_FRACTION = 0.7  # the first 7 of 10 scales at RELEASED_TEMPERATURE; on K scales, round(0.7 K)


@dataclass(frozen=True)
class CoDeConfig:
    sampling: multiscale_vq.SamplingConfig = multiscale_vq.SamplingConfig()  # the reference arm's (VAR's README)
    draft_steps: int = 8  # N: scales the drafter draws, 1 .. K - 1 (README: 6 .. 9; infer_CoDe.py's default 8)
    refiner: str = ""  # the registered multi-scale teacher that draws the rest; "" = the teacher itself
    released: bool = False  # read the fine-tuned drafter_N.pth / refiner_N.pth (README "Model Zoo") from checkpoints
    sampler: str = "teacher"  # teacher: CoDe draws as the reference arm does; released: sample_CoDe.py's settings

    def __post_init__(self):
        if self.draft_steps < 1:
            raise ValueError(f"draft_steps must be >= 1 (and < the teacher's number of scales), got {self.draft_steps}")
        if self.sampler not in SAMPLERS:
            raise ValueError(f"sampler must be one of {', '.join(SAMPLERS)}, got {self.sampler!r}")


def released_files(config: CoDeConfig) -> tuple[str, str]:
    """The model zoo's file names for N draft steps: the drafter's, then the refiner's."""
    return f"drafter_{config.draft_steps}.pth", f"refiner_{config.draft_steps}.pth"


class CoDe(Method):
    """A large VAR drafts the first N scales, a small VAR refines the rest (collaborative decoding)."""

    families = (multiscale_vq.FAMILY,)
    modalities = ("image",)
    Config = CoDeConfig
    key_knobs = ("draft_steps", "refiner")

    @classmethod
    def lossless(cls, knobs: Mapping[str, str]) -> str | None:
        if knobs.get("refiner", "") == "" and knobs.get("released", "False") == "False" \
                and knobs.get("sampler", "teacher") == "teacher":
            return "certified: the teacher refines itself, its own sampler draw for draw (tests/test_code.py)"
        return "lossy: the scales past N are the refiner's law, a different model (the quality drift measures it)"

    @classmethod
    def passes(cls, config: CoDeConfig, family, length: int) -> dict[str, Passes]:
        n = min(config.draft_steps, length - 1)
        return {"method": Passes({"step": n, "refiner_step": length - n})}

    @classmethod
    def trains(cls, config: CoDeConfig) -> bool:
        return False  # `fit` loads the refiner and reads files; nothing is trained

    @classmethod
    def required_files(cls, config: CoDeConfig, checkpoints: Path) -> dict[Path, str]:
        """The refiner's files (a registered teacher of local files), and with `released` the model zoo's pair; an
        unknown refiner, or one of another family, is refused here, when the trial is planned."""
        out = {}
        if config.refiner:
            refiner = teacher_class(config.refiner, checkpoints)
            if refiner.family is not multiscale_vq.FAMILY:
                raise UserError(f"code: refiner {config.refiner!r} is a {refiner.family} teacher; CoDe's refiner is "
                                f"a multi-scale VQ (VAR) teacher")
            reason = getattr(refiner, "unavailable", lambda: None)() or ""
            out = {path: f"code's refiner {config.refiner!r}: {reason}" for path in getattr(refiner, "files", tuple)()}
        if config.released:
            out |= {checkpoints / f: (f"missing {checkpoints / f}: place CoDe's released {f} (Hugging Face "
                                      f"Zigeng/VAR_CoDe, README 'Model Zoo') in {checkpoints}, or name its folder "
                                      f"with --checkpoints or {CHECKPOINTS_ENV}") for f in released_files(config)}
        return out

    def __init__(self, teacher, config: CoDeConfig):
        super().__init__(teacher, config)
        K = len(teacher.patch_nums)
        if not config.draft_steps < K:
            raise UserError(f"code: draft_steps must be < the teacher's {K} scales, got {config.draft_steps}")
        self.drafter, self.refiner = teacher, teacher
        s = config.sampling
        if config.sampler == "released":
            s = replace(s, top_k=RELEASED_TOP_K)
        hot = round(RELEASED_HOT_FRACTION * K) if config.sampler == "released" else 0
        self.temperatures = [RELEASED_TEMPERATURE if si < hot else 1.0 for si in range(K)]
        self.sampling = s

    def caveats(self) -> dict[str, str]:
        if self.config.sampler == "released":
            return {"code_released_sampler": "CoDe's arm samples with the release's top-k 600 and temperature 1.1, "
                                             "the reference arm with the teacher's settings"}
        return {}

    def fit(self, *, cache: Cache, checkpoints: Path) -> dict[str, float]:
        """The refiner (a registered teacher, loaded once per process), and with `released` the fine-tuned weights of
        both models read strictly from their files."""
        cfg, device = self.config, self._device()
        if cfg.refiner:
            self.refiner = self._checked(load_teacher(cfg.refiner, cache=cache, device=device,
                                                      checkpoints=checkpoints))
        if cfg.released:
            drafter_file, refiner_file = (checkpoints / f for f in released_files(cfg))
            self.drafter = self._with_weights(self.drafter, drafter_file)
            self.refiner = self._with_weights(self.refiner, refiner_file)
        return {"refiner_params": float(sum(p.numel() for p in self.refiner.network.parameters()))
                if hasattr(self.refiner, "network") else 0.0}

    def stand_in(self) -> None:
        """The refiner at full size with seeded random weights (the cost mode's; released files change no shape), or,
        for a zoo teacher, with its own weights, as `bench.cost.build` loads a zoo teacher."""
        name = self.config.refiner
        if not name:
            return
        cls = teacher_class(name, Path("."))
        if getattr(cls, "random", None) is not None:
            self.refiner = self._checked(cls.random(name, self._device()), codebook=False)
        else:
            self.refiner = self._checked(load_teacher(name, cache=Cache(), device=self._device(),
                                                      checkpoints=Path(".")))

    def _device(self) -> torch.device:
        return next(self.teacher.network.parameters()).device if hasattr(self.teacher, "network") \
            else torch.device("cpu")

    def _checked(self, refiner, codebook: bool = True):
        """The refiner, if it shares the drafter's scales and codes (CoDe hands over token ids, not features)."""
        name = getattr(refiner, "name", "refiner")
        if refiner.family is not multiscale_vq.FAMILY or refiner.patch_nums != self.teacher.patch_nums:
            raise UserError(f"code: refiner {name!r} must be a multi-scale teacher with the teacher's scales "
                            f"{self.teacher.patch_nums}")
        if codebook and not torch.equal(refiner.codebook.cpu(), self.teacher.codebook.cpu()):
            raise UserError(f"code: refiner {name!r} has another VQ codebook than the teacher; CoDe needs one "
                            f"tokenizer shared by both models")
        return refiner

    @staticmethod
    def _with_weights(model, path: Path):
        """A copy of `model` whose VAR transformer (`multiscale_vq.NetworkTeacher.network`) holds the weights of
        `path` (a VAR state dict, read strictly into a network of the same configuration)."""
        net = getattr(model, "network", None)
        if not hasattr(type(net), "from_state_dict"):
            raise UserError(f"code: released files are VAR state dicts; {getattr(model, 'name', model)!r} has no "
                            f"VAR transformer to read {path.name} into")
        device = next(net.parameters()).device
        try:
            network = type(net).from_state_dict(net.cfg, read_state_dict(path, ()))
        except RuntimeError as exc:
            raise UserError(f"{path}: does not fit {model.name}'s VAR (depth {model.network.cfg.depth}): "
                            f"{mismatch(exc)}") from None
        out = copy.copy(model)
        out.network = network.to(device).eval().requires_grad_(False)
        return out

    def _draw(self, logits: torch.Tensor, si: int, batch: int, generator: torch.Generator) -> torch.Tensor:
        """Scale si's tokens (B, pn^2) from its logits (R, pn^2, V): guided, filtered, tempered, one draw each."""
        s, K = self.sampling, len(self.teacher.patch_nums)
        probs = multiscale_vq.process(multiscale_vq.guide(logits, batch, s.cfg, si, K), s)
        return draw(tempered(probs, self.temperatures[si]), generator)

    @torch.inference_mode()
    def sample(self, cond: torch.Tensor, *, generator: torch.Generator) -> Samples:
        B, K, N = len(cond), len(self.teacher.patch_nums), self.config.draft_steps
        guided = self.sampling.cfg != 0
        tokens: list[torch.Tensor] = []
        state, logits = self.drafter.start(cond, cfg=guided)
        for si in range(N):
            tokens.append(self._draw(logits, si, B, generator))
            if si < N - 1:
                logits = self.drafter.next_scale(state, tokens[-1])
        state, logits = self.refiner.start(cond, cfg=guided, prefix=torch.cat(tokens, 1))  # one pass, masked
        for si in range(N, K):
            tokens.append(self._draw(logits, si, B, generator))
            if si < K - 1:
                logits = self.refiner.next_scale(state, tokens[-1])
        return Samples(torch.cat(tokens, 1), cond,
                       Counter(nfe=B * K, refiner_nfe=B * (K - N), tokens=B * self.teacher.seq_len))


def tempered(probs: torch.Tensor, temperature: float) -> torch.Tensor:
    """softmax(filtered logits / T) from softmax(filtered logits): the release divides the logits after top-k and
    top-p (models/helpers.py:22-23), so the filtered-out tokens stay out."""
    if temperature == 1.0:
        return probs
    probs = probs.pow(1 / temperature)
    return probs / probs.sum(-1, keepdim=True)
