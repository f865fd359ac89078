"""Tiny MDLM teachers (Sahoo et al. 2024, arXiv:2406.07524), the teacher family of SDTT (arXiv:2410.21035), trained on
a text corpus and cached.

MDLM's recipe at CPU scale: the log-linear schedule and antithetic times, the masked-token cross-entropy (or, with
`loss="nelbo"`, the continuous-time NELBO; see `TextLMRecipe.loss`), AdamW, grad clip 1.0 and an EMA of the weights
(docs/methods/sdtt.md, 'MDLM background'). The recorded figure of merit is the NELBO per token on the
validation chunks (a perplexity upper bound).
"""
from __future__ import annotations

import copy
import dataclasses
import math
import time
from typing import ClassVar

import torch
import torch.nn.functional as F

from core.cache import Cache
from core.training import ema_update, optimizer_step, training_steps, warmup_cosine
from teachers.data.text import load_text_data
from teachers.families import masked_diffusion as md
from teachers.networks.mdlm import MDLMNet, MDLMNetConfig
from teachers.tiny.text_lm import TextTeacher


class TextMDLMTeacher(TextTeacher):
    family: ClassVar = md.FAMILY
    network_class = (MDLMNet, MDLMNetConfig, "net")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.mask_id = self.vocab_size

    @classmethod
    def _fit(cls, name: str, cache: Cache) -> dict:
        r, t0 = cls.recipe, time.perf_counter()
        data = load_text_data(r.data, cache)
        cfg = MDLMNetConfig(data.tokenizer.vocab_size, r.data.seq_len, r.n_layer, r.n_head, r.n_embd, r.dropout)
        model, g = MDLMNet(cfg), torch.Generator().manual_seed(r.seed)
        ema = copy.deepcopy(model).requires_grad_(False)
        opt = torch.optim.AdamW(model.parameters(), lr=r.lr, betas=(0.9, 0.999), weight_decay=0.0)
        sched = warmup_cosine(opt, r.steps)
        train, mask_id = data.chunks["train"], cfg.vocab_size
        for step in training_steps(r.steps, f"training teacher {name}"):
            x = train[torch.randint(len(train), (r.batch_size,), generator=g)]
            t = md.antithetic_times(r.batch_size, g)
            z = md.corrupt(x, t, mask_id, g)
            logits = model(z)
            if r.loss == "nelbo":
                loss = md.nelbo(logits, x, z, t, mask_id).mean()
            else:
                masked = z == mask_id
                loss = F.cross_entropy(logits[masked][:, :mask_id], x[masked])
            optimizer_step(loss, opt, sched, model.parameters())
            ema_update(ema, model, r.ema, step)
        valid = cls.nelbo_per_token(ema.eval(), data.chunks["valid"], mask_id, seed=r.seed)
        info = {"train_loss": loss.item(), "valid_nelbo_per_token": valid, "valid_ppl_bound": math.exp(valid),
                "n_params": sum(p.numel() for p in ema.parameters()), "train_seconds": time.perf_counter() - t0}
        return {"net": dataclasses.asdict(cfg), "state_dict": ema.state_dict(), "tokenizer": data.tokenizer.to_json(),
                "reference": data.chunks["test"], "info": info}

    @staticmethod
    @torch.no_grad()
    def nelbo_per_token(model: MDLMNet, chunks: torch.Tensor, mask_id: int, *, seed: int, repeats: int = 4) -> float:
        """The NELBO per token on `chunks` (n, L), a Monte-Carlo estimate over `repeats` antithetic time draws."""
        g, total = torch.Generator().manual_seed(seed), 0.0
        for _ in range(repeats):
            for x in chunks.split(256):
                t = md.antithetic_times(len(x), g)
                z = md.corrupt(x, t, mask_id, g)
                total += md.nelbo(model(z), x, z, t, mask_id).sum().item()
        return total / (repeats * len(chunks))

    # ---- the MaskedDiffusionLM protocol ---------------------------------------------------------------------
    @torch.inference_mode()
    def denoise(self, z: torch.Tensor) -> torch.Tensor:
        return md.subs(self.network(z), z, self.mask_id)
