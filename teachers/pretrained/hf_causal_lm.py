"""A Hugging Face causal LM (transformers `AutoModelForCausalLM`) as an AR-token teacher: prompted text generation
with the model's own KV cache (`DynamicCache`), rolled back by cropping for Jacobi windows.

The condition of a sample is its prompt, a fixed number of tokens (so that a batch needs no padding); the teacher
generates `seq_len` new tokens after it. Logits are computed in float32 whatever the model's dtype. The family's
sampler, SJD and Jacobi decoding run on it unchanged (SJD, arXiv:2410.01699, Sec. 4.1: the window is appended to the
cache and cut back to the accepted prefix). The same model is an evaluator of other teachers' samples: the
next-token NLL of generative perplexity (`metrics.gen_ppl`: token ids or texts, in windows of the model's context) and
the last hidden state MAUVE featurises with.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.nn.functional as F

from core.rng import seeded
from core.samples import Texts
from teachers.families import ar_token


def random_network(build, config, device: torch.device) -> torch.nn.Module:
    """`build(config, attn_implementation=...)` (a transformers class's `_from_config`, or an auto class's
    `from_config`) with seeded random weights on `device`, no file read: the random builds of the cost mode
    (`bench.cost`). Eager attention on the meta device: transformers' SDPA path reads the attention mask's values to
    decide whether it may skip the mask (`masking_utils._ignore_causal_mask_sdpa`), which a meta tensor has not; eager
    attention computes the same matrix products, the ones the cost mode counts. Elsewhere the library's default, as
    `from_pretrained` loads it."""
    kwargs = {"attn_implementation": "eager"} if device.type == "meta" else {}
    with seeded(0), torch.device(device):
        return build(config, **kwargs).eval().requires_grad_(False)


def context_length(config) -> int:
    """The positions a model reads (GPT-2's `n_positions`, Llama's `max_position_embeddings`)."""
    return getattr(config, "n_positions", None) or config.max_position_embeddings


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
    # transformers' DynamicCache crops every row to one length: SJD and Jacobi decode it one sequence at a time
    ragged_cache: ClassVar[bool] = False

    def __init__(self, name: str, network: torch.nn.Module, tokenizer, prompts: torch.Tensor, references: list[str],
                 new_tokens: int, info: dict, bos_id: int | None = None):
        if prompts.dim() != 2 or not (prompts.shape[1] or bos_id is not None):
            raise ValueError(f"{name}: prompts must be (n, P) token ids with P >= 1 (or empty with a BOS), got "
                             f"{tuple(prompts.shape)}")
        self.bos_id = bos_id  # what an empty prompt starts from (unconditional generation)
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

        if not cond.shape[1]:  # unconditional (an empty prompt, also another family's condition): from BOS alone
            cond = torch.full((len(cond), 1), self.bos_id, dtype=torch.long, device=cond.device)
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

    def select(self, state: HFState, rows: torch.Tensor) -> None:
        """Keep these rows (B',) in this order; a row may be kept more than once (SJD-PAC verifies each path of its
        draft tree as a row). Every row keeps the state's one length."""
        state.cache.batch_select_indices(rows)

    def decode(self, tokens: torch.Tensor) -> Texts:
        """The generated continuations (without their prompts), special tokens dropped; their ids ride along."""
        tokens = tokens.cpu()
        return Texts(self.tokenizer.batch_decode(tokens, skip_special_tokens=True), tokens)

    def encode(self, texts: list[str]) -> list[list[int]]:
        return self.tokenizer(texts, add_special_tokens=False)["input_ids"]

    def reference_texts(self) -> list[str]:
        return self.references

    # ---- as an evaluator of generated texts (`gen_ppl@...`, `mauve@...`) --------------------------------------------
    def tokenize(self, texts: list[str], max_length: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(ids, attention mask), (n, T) on the CPU: the texts with the tokenizer's own special tokens (GPT-2's: none;
        Llama-3's: a BOS), right-padded with its pad token or, without one, its EOS (as MDLM sets it,
        kuleshov-group/mdlm diffusion.py:131-135), cut to `max_length` tokens when given."""
        tok = self.tokenizer
        if tok.pad_token is None:
            tok.pad_token = tok.eos_token
        tok.padding_side = "right"
        enc = tok(texts, return_tensors="pt", padding=True, truncation=max_length is not None, max_length=max_length)
        return enc["input_ids"], enc["attention_mask"]

    def _batches(self, texts: list[str], batch: int):
        """`tokenize`d texts, `batch` at a time, cut to the model's context (a decoded text may re-tokenise into more
        tokens than were generated), an empty text read as the EOS, on the model's device."""
        device = self.prompts.device
        for i in range(0, len(texts), batch):
            chunk = [t or self.tokenizer.eos_token for t in texts[i : i + batch]]
            ids, mask = self.tokenize(chunk, context_length(self.network.config))
            yield {"input_ids": ids.to(device), "attention_mask": mask.to(device)}

    @torch.inference_mode()
    def window_nll(self, ids: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """-log p(token | the tokens before it in its window) of every token of `ids` (B, T), (B, T) float32 on the
        CPU. A row longer than the model's context is cut into windows of the context, each read alone, as MDLM's
        `compute_generative_perplexity` splits its rows (kuleshov-group/mdlm diffusion.py:550-557); a window's first
        token is context only: NaN. `mask` (B, T), the attention mask of right-padded rows; None, as SDTT calls its
        evaluator on equally long rows (jdeschena/sdtt run_eval.py:233): every token is real."""
        C, device = context_length(self.network.config), self.prompts.device
        out = torch.full(ids.shape, math.nan)
        for s in range(0, ids.shape[1], C):
            window = ids[:, s : s + C].to(device)  # (B, W)
            attention = None if mask is None else mask[:, s : s + C].to(device)
            logits = self.network(input_ids=window, attention_mask=attention).logits[:, :-1].float()  # (B, W-1, V)
            nll = F.cross_entropy(logits.transpose(1, 2), window[:, 1:], reduction="none")  # (B, W-1)
            out[:, s + 1 : s + window.shape[1]] = nll.cpu()
        return out

    @torch.inference_mode()
    def last_hidden_states(self, texts: list[str], batch: int = 16) -> torch.Tensor:
        """The last layer's hidden state at each text's last token, (n, d): MAUVE's features (mauve-text's
        `featurize_tokens_from_model` reads GPT-2's the same way)."""
        out = []
        for enc in self._batches(texts, batch):
            hidden = self.network(**enc, output_hidden_states=True).hidden_states[-1]  # (B, T, d)
            last = enc["attention_mask"].sum(1) - 1
            out.append(hidden[torch.arange(hidden.shape[0], device=hidden.device), last].float().cpu())
        return torch.cat(out)
