"""Tiny causal LMs trained on the same chunks and tokenizer as a corpus' MDLM: SDTT's AR baseline with a KV cache
(arXiv:2410.21035 §4.4, GPT-2 at CPU scale) and a fast evaluator for generative perplexity. Members of the AR-token
family: `ar`, `jacobi` and `sjd` decode them like any image-token model (unconditional: an empty condition).

The transformer is `teachers.networks.gpt.GPT` with a one-token condition acting as BOS, so the output at the BOS
predicts the first token and every token of a chunk is scored and sampled.
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
from teachers.families import ar_token
from teachers.networks.gpt import GPT, GPTConfig, GuidedState
from teachers.tiny.text_lm import TextTeacher

BOS = 0  # the only condition id


class TextGPTTeacher(TextTeacher):
    family: ClassVar = ar_token.FAMILY
    supports_cfg: ClassVar[bool] = False  # an unconditional LM: nothing to guide with
    ragged_cache: ClassVar[bool] = True  # the GPT's `RaggedKVCache`
    network_class = (GPT, GPTConfig, "gpt")

    @classmethod
    def _fit(cls, name: str, cache: Cache) -> dict:
        r, t0 = cls.recipe, time.perf_counter()
        data = load_text_data(r.data, cache)
        cfg = GPTConfig(data.tokenizer.vocab_size, 1, 1, r.data.seq_len, r.n_layer, r.n_head, r.n_embd, r.dropout)
        model, g = GPT(cfg), torch.Generator().manual_seed(r.seed)
        ema = copy.deepcopy(model).requires_grad_(False)
        opt = torch.optim.AdamW(model.parameters(), lr=r.lr, betas=(0.9, 0.95), weight_decay=0.01)
        sched = warmup_cosine(opt, r.steps)
        train = data.chunks["train"]
        for step in training_steps(r.steps, f"training teacher {name}"):
            x = train[torch.randint(len(train), (r.batch_size,), generator=g)]
            loss = cls._nll(model, x).mean()
            optimizer_step(loss, opt, sched, model.parameters())
            ema_update(ema, model, r.ema, step)
        with torch.no_grad():
            valid = torch.cat([cls._nll(ema.eval(), x) for x in data.chunks["valid"].split(256)]).mean().item()
        info = {"train_loss": loss.item(), "valid_nll_per_token": valid, "valid_ppl": math.exp(valid),
                "n_params": sum(p.numel() for p in ema.parameters()), "train_seconds": time.perf_counter() - t0}
        return {"gpt": dataclasses.asdict(cfg), "state_dict": ema.state_dict(), "tokenizer": data.tokenizer.to_json(),
                "reference": data.chunks["test"], "info": info}

    @staticmethod
    def _nll(model: GPT, ids: torch.Tensor) -> torch.Tensor:
        bos = torch.full((len(ids), 1), BOS, dtype=torch.long, device=ids.device)
        logits = model(bos, ids)  # (B, L, V): row i predicts token i
        return F.cross_entropy(logits.transpose(1, 2), ids, reduction="none")  # (B, L)

    @torch.inference_mode()
    def token_nll(self, ids: torch.Tensor) -> torch.Tensor:
        """(B, L) ids -> (B, L): -log p(x_i | BOS, x_<i), the evaluator behind `gen_ppl@tiny`."""
        return self._nll(self.network, ids)

    # ---- the ARTokenTeacher protocol ------------------------------------------------------------------------
    @torch.inference_mode()
    def start(self, cond: torch.Tensor, *, cfg: float, ragged: bool = False) -> tuple[GuidedState, torch.Tensor]:
        """cond (B, 0): the LM is unconditional, its only prefix the BOS."""
        if cond.shape[1]:
            raise ValueError(f"{self.name} is unconditional: its conditions are empty, got {tuple(cond.shape)}")
        bos = torch.full((len(cond), 1), BOS, dtype=torch.long, device=cond.device)
        return self.network.start(bos, cfg=cfg, null_id=BOS, ragged=ragged)

    @torch.inference_mode()
    def extend(self, state: GuidedState, tokens: torch.Tensor) -> torch.Tensor:
        return self.network.extend_guided(state, tokens)

    def rollback(self, state: GuidedState, length: int | torch.Tensor) -> None:
        state.truncate(length)

    def select(self, state: GuidedState, rows: torch.Tensor) -> None:
        state.select(rows)
