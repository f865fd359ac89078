"""A Hugging Face causal LM (transformers `AutoModelForCausalLM`) as an AR-token teacher: prompted text generation
with the model's own KV cache (`DynamicCache`), rolled back by cropping for Jacobi windows.

The condition of a sample is its prompt, a fixed number of tokens (so that a batch needs no padding); the teacher
generates `seq_len` new tokens after it. Logits are computed in float32 whatever the model's dtype. The family's
sampler, SJD and Jacobi decoding run on it unchanged (SJD, arXiv:2410.01699, Sec. 4.1: the window is appended to the
cache and cut back to the accepted prefix).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from teachers.families import ar_token


@dataclass
class HFState:
    cache: Any  # transformers.DynamicCache over [prompt, generated tokens]
    prompt_len: int

    @property
    def length(self) -> int:
        """Generated tokens whose keys/values are cached."""
        return self.cache.get_seq_length() - self.prompt_len


class HFCausalLMTeacher:
    family: ClassVar = ar_token.FAMILY
    modality: ClassVar[str] = "text"
    supports_cfg: ClassVar[bool] = False  # no unconditional branch: guidance would need a prompt-free twin

    def __init__(self, name: str, network: torch.nn.Module, tokenizer, prompts: torch.Tensor, references: list[str],
                 new_tokens: int, info: dict):
        if prompts.dim() != 2 or not prompts.shape[1]:
            raise ValueError(f"{name}: prompts must be (n, P) token ids with P >= 1, got {tuple(prompts.shape)}")
        self.name, self.network, self.tokenizer, self.info = name, network.eval().requires_grad_(False), tokenizer, info
        self.prompts = prompts  # (M, P) on the model's device
        self.references = references  # held-out texts of the same kind (MAUVE's reference side)
        self.seq_len, self.grid = new_tokens, (new_tokens,)
        self.vocab_size = network.config.vocab_size

    def conditions(self, n: int, generator: torch.Generator) -> torch.Tensor:
        """n prompts drawn uniformly from the table (with replacement), (n, P), on the generator's device."""
        rows = torch.randint(len(self.prompts), (n,), generator=generator, device=generator.device)
        return self.prompts.to(generator.device)[rows]

    @torch.inference_mode()
    def start(self, cond: torch.Tensor, *, cfg: float) -> tuple[HFState, torch.Tensor]:
        from transformers import DynamicCache

        state = HFState(DynamicCache(), cond.shape[1])
        logits = self.network(input_ids=cond, past_key_values=state.cache, use_cache=True).logits
        return state, logits[:, -1].float()  # (B, V)

    @torch.inference_mode()
    def extend(self, state: HFState, tokens: torch.Tensor) -> torch.Tensor:
        return self.network(input_ids=tokens, past_key_values=state.cache, use_cache=True).logits.float()  # (B, L, V)

    def rollback(self, state: HFState, length: int) -> None:
        if not 0 <= length <= state.length:
            raise ValueError(f"cannot roll a cache of {state.length} generated tokens back to {length}")
        if length < state.length:
            state.cache.crop(length - state.length)  # a negative count removes that many positions

    def decode(self, tokens: torch.Tensor) -> list[str]:
        """The generated continuations (without their prompts), special tokens dropped."""
        return self.tokenizer.batch_decode(tokens.cpu(), skip_special_tokens=True)

    def encode(self, texts: list[str]) -> list[list[int]]:
        return self.tokenizer(texts, add_special_tokens=False)["input_ids"]

    def reference_texts(self) -> list[str]:
        return self.references
