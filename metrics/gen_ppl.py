"""Generative perplexity: how likely an evaluator LM finds the generated samples (MDLM, arXiv:2406.07524; SDTT,
arXiv:2410.21035 §4 "Generative perplexity": GPT-2 large, Llama-3 8B at scale), always reported with the evaluator in
its key and next to the unigram entropy (`metrics.text_entropy`).

A Hugging Face causal-LM evaluator scores under one of two released protocols, a named choice written after the
evaluator (`gen_ppl@hf:gpt2-large:mdlm`) and the last part of the key (`gen_ppl.gpt2-large.mdlm`):
- `sdtt` (the default): SDTT's `uncond_eval` (jdeschena/sdtt 9172b86, src/sdtt/run_eval.py:192-275). When the
  evaluator reads the teacher's tokenizer (GPT-2 large on MDLM-OWT's GPT-2 tokens), the sampled token ids themselves
  are scored, not a re-tokenisation of their text (run_eval.py:227-238): an end-of-text token stays where it was
  sampled and is scored like any other, nothing is prepended, so a sample's first token is context only and every
  later one is predicted from all before it (1023 predictions of a 1024-token sample); batches of 8 equally long
  rows (src/sdtt/configs/config.yaml:117) without padding or attention mask, in float32 (run_eval.py:214). With
  another tokenizer (SDTT's Llama-3 8B, run_eval.py:148-161): the decoded text, cleaned up (below), without its
  end-of-text tokens (the teacher's special tokens: GPT-2's only one is `<|endoftext|>`, which SDTT removes),
  stripped, tokenised by the evaluator with its own special tokens (Llama-3's BOS: then every token of the text is
  scored). Either way gen-PPL = exp(mean over samples of each sample's mean NLL) (run_eval.py:238, 254-258).
- `mdlm`: MDLM's `compute_generative_perplexity` (kuleshov-group/mdlm c112c52, diffusion.py:514-573), which always
  re-tokenises: the samples decoded with their end-of-text tokens kept (diffusion.py:426; a teacher whose texts carry no
  ids, a tiny one, gives them as it decodes them) and cleaned up (below), tokenised by the evaluator, cut to the
  teacher's sequence length (`max_length` = the model's length, diffusion.py:532-533) and right-padded with its EOS
  (diffusion.py:131-135) to the longest text of the update (of the sampled batch in MDLM, diffusion.py:505), with an
  attention mask; scored 8 rows at a time (configs/config.yaml:51) in windows of the evaluator's context (1024 for
  GPT-2, diffusion.py:504, 550-557), each window read alone, its first token context only; a target counts unless it is
  an end-of-text token other than the first of its window (diffusion.py:567-573: later EOS and the padding are left out,
  the tokens after an EOS are still scored, and a text with no EOS that is not the longest has its first padding EOS
  scored); gen-PPL = exp(total NLL / counted tokens), pooled over every sample (its `Perplexity`, diffusion.py:58-65,
  572). Not copied: MDLM drops the samples after the last whole batch of 8 (diffusion.py:548); every sample is scored
  here.

Both re-tokenise the text of the sampler's `batch_decode` (MDLM diffusion.py:426 and main.py:111; SDTT
run_eval.py:148) under the transformers both pin, 4.38.2 (mdlm requirements.yaml:33, sdtt requirements.txt:23), which
cleans up tokenization spaces after decoding: `clean_up_tokenization` (4.38.2 tokenization_utils_base.py:3829-3851:
" ." -> ".", " ?", " !", " ,", " ' " -> "'", " n't", " 'm", " 's", " 've", " 're", in that order), on by default
(:1592, applied by tokenization_utils_fast.py:627-634) and left on by GPT-2's tokenizer (SDTT's author reports it of
`AutoTokenizer.from_pretrained("gpt2")` under 4.38.2: huggingface/transformers#31884). transformers 5 skips it for BPE
tokenizers, so it is applied here to every text the evaluator re-tokenises (`CausalLMEvaluator.decoded`): a
teacher's decode without it, or the texts of a teacher that keeps no ids (a tiny one) as its decode gives them. In
`sdtt` the end-of-text tokens are removed after the cleanup, as run_eval.py:151 does.

Departures, the same in both: a sample longer than the evaluator's context (never in SDTT: 1024 tokens under GPT-2's
1024 positions) is read in windows of the context as MDLM's code reads it, not refused; SDTT's AR samples keep the
BOS they were generated from (src/sdtt/core/ar.py:113-118), so their first generated token is scored given it, while
an AR teacher's unconditional samples here (`hf:<folder>`, SDTT's AR arm on `mdlm-owt`) are the generated tokens
alone, the first of them context only (1 of 1023 predictions).

On a teacher of a prompted protocol (`mdlm-owt-prompted`: SDTT's conditional samples, a 50-token WebText prompt and 50
new tokens) the perplexity is the paper's conditional one, of the continuation, "prompt excluded" (SDTT App. A, Fig.
18(c); §4.1 compares the students with GPT-2 nucleus on it, Fig. 18), its key the protocol's after the evaluator's
("gen_ppl.gpt2-large.sdtt.webtext-prompted"). Every arm's sample is its prompt followed by its continuation
(`metrics.base.prompt_length`: the MDLM arms in-paint the prompt, SDTT's `ar` arm returns it before its new tokens, as
the release's samplers return them): the evaluator reads the whole sequence and only the continuation's tokens are
scored, each given the prompt and the continuation before it (50 predictions of a 100-token sample; the first one given
the 50 prompt tokens). Under SDTT's protocol with the teacher's tokenizer those are the sampled ids; under another
tokenizer the prompt and the continuation are decoded and tokenised apart (`CausalLMEvaluator._sdtt_continuations`). The
release has no code for this perplexity (its run_eval.py:192-275 scores unconditional samples only) and MDLM's protocol
has no prompt: `:mdlm` is refused on such a teacher. Scoring the whole 100 tokens (49 of the 99 predictions real
WebText) or a continuation without its prompt (a context-free start) measures neither the paper's quantity nor anything
a comparison of arms needs, so neither is kept as a mode.

Evaluators:
- `gen_ppl` / `gen_ppl@smollm2` (key "gen_ppl.smollm2-135m-instruct-q4", `sdtt`; "...-q4.mdlm" after `:mdlm`; the
  key predates the protocols and sweeps name it): SmolLM2-135M-Instruct, Q4_1 dequantised to float32 (the registered
  teacher `smollm2-135m-instruct`, `teachers.pretrained.smollm2`);
- `gen_ppl@hf:<folder>` (key "gen_ppl.<folder's name>.<protocol>", e.g. "gen_ppl.gpt2-large.sdtt", SDTT's evaluator
  and protocol): any Hugging Face causal LM in a local folder (the teacher `hf:<folder>`,
  `teachers.pretrained.hf_folder`), in float32;
- `gen_ppl@tiny` (key "gen_ppl.<teacher.companion_lm>"): the causal LM trained on the teacher's own corpus and
  tokenizer (seconds instead of minutes), one protocol of its own: it reads a BOS, so every token is scored, and
  newlines are its EOS separators again; a real teacher's companion is a folder (GPT-2 for MDLM-OWT: `sdtt`).
"""
from __future__ import annotations

import math
from pathlib import Path

import torch

from core.errors import UserError
from metrics.base import Metric, prompt_length
from teachers import load_teacher
from teachers.pretrained import hf_folder, smollm2
from teachers.pretrained.hf_causal_lm import context_length

SMOLLM2 = "smollm2-135m-instruct"  # the registered teacher the evaluator is
EVALUATORS = ("smollm2", "tiny", "hf:<folder>")
PROTOCOLS = ("sdtt", "mdlm")
# Rows per forward pass: SDTT's eval.ppl_with_ar.batch_size (jdeschena/sdtt src/sdtt/configs/config.yaml:117) and
# MDLM's eval.perplexity_batch_size (kuleshov-group/mdlm configs/config.yaml:51) are both 8; it changes nothing but
# float rounding (MDLM pads a whole update, not a batch)
BATCH = 8


def parse(extractor: str | None) -> tuple[str, str | None]:
    """`<evaluator>[:<protocol>]` -> (evaluator, protocol or None); `hf:mdlm` is the folder `mdlm`."""
    choice = extractor or "smollm2"
    head, _, tail = choice.rpartition(":")
    if tail in PROTOCOLS and (head in EVALUATORS or hf_folder.is_folder_name(head)):
        return head, tail
    return choice, None


def same_tokenizer(teacher, tokenizer) -> bool:
    """Whether the teacher's token ids are the evaluator's (the same vocabulary: MDLM-OWT's GPT-2 tokens under GPT-2
    large), so that SDTT's protocol scores them directly."""
    own = getattr(teacher, "tokenizer", None)
    return callable(getattr(own, "get_vocab", None)) and own.get_vocab() == tokenizer.get_vocab()


def _without(text: str, specials) -> str:
    """`text` with every special token's string removed (SDTT's `text.replace("<|endoftext|>", "")`, GPT-2's one)."""
    for special in specials:
        text = text.replace(special, "")
    return text


def sum_and_count(nll: torch.Tensor, scored: torch.Tensor) -> torch.Tensor:
    """(B, T) NLLs and the (B, T) bool mask of those that count -> (B, 2): each row's summed NLL and count."""
    return torch.stack([torch.where(scored, nll, 0.0).sum(1), scored.sum(1).float()], 1)


class CausalLMEvaluator:
    """A registered Hugging Face causal-LM teacher (`teachers.pretrained.hf_causal_lm`) as the evaluator, under a
    protocol of `PROTOCOLS`."""

    def __init__(self, teacher_name: str, protocol: str, teacher, cache, device, checkpoints: Path):
        self.lm = load_teacher(teacher_name, cache=cache, device=device, checkpoints=checkpoints)
        self.teacher, self.protocol = teacher, protocol
        keep = teacher_name == SMOLLM2 and protocol == "sdtt"  # the key sweeps already name
        self.name = self.lm.evaluator_name if keep else f"{self.lm.evaluator_name}.{protocol}"
        self.pooled = protocol == "mdlm"  # a mean over tokens, not over samples' means
        self.shared = same_tokenizer(teacher, self.lm.tokenizer)

    def scores(self, texts: list[str], prompt: int = 0) -> torch.Tensor:
        """(B, 2): each sample's summed NLL and scored tokens. `texts` may carry their token ids (`Texts.tokens`).
        `prompt`: the P ids every sample begins with under a prompted protocol (`metrics.base.prompt_length`), read
        as context and never scored: each continuation token is scored given its prompt and the continuation before
        it (SDTT App. A, Fig. 18: the conditional perplexity, "prompt excluded"; the module's docstring)."""
        tokens = getattr(texts, "tokens", None)
        if self.protocol == "mdlm":  # never on a prompted protocol (`GenPPL.check_teacher`)
            return self._mdlm(texts, tokens)
        if not self.shared:
            specials = getattr(getattr(self.teacher, "tokenizer", None), "all_special_tokens", ())
            if prompt:
                return self._sdtt_continuations(tokens, prompt, specials)
            return self._sdtt_texts([_without(t, specials).strip() for t in self.decoded(texts, tokens)])
        if tokens is None:
            raise ValueError(f"gen_ppl.{self.name}: SDTT's protocol scores the teacher's token ids, and these texts "
                             f"carry none (a teacher's `decode` returns them as core.samples.Texts)")
        out = []
        for i in range(0, len(tokens), BATCH):
            nll = self.lm.window_nll(tokens[i : i + BATCH])  # (b, N)
            continuation = torch.arange(nll.shape[1]) >= prompt  # the prompt's tokens: context only
            out.append(sum_and_count(nll, ~nll.isnan() & continuation))
        return torch.cat(out)

    def _sdtt_continuations(self, tokens: torch.Tensor, prompt: int, specials) -> torch.Tensor:
        """SDTT's text path (run_eval.py:148-161) with each prompt as context, for an evaluator of another tokenizer:
        the prompt's ids and the continuation's decoded apart (`decoded`), their special tokens removed, the prompt
        left-stripped and tokenised with the evaluator's special tokens (Llama-3's BOS), the continuation
        right-stripped and tokenised without, so that no evaluator token spans both; the continuation's tokens alone
        are scored, after the prompt's. The release scores unconditional samples only (Fig. 18's conditional
        perplexity has no code there), so the split is ours."""
        tok = self.lm.tokenizer
        heads = tok([_without(t, specials).lstrip() for t in self.decoded([], tokens[:, :prompt])])["input_ids"]
        tails = tok([_without(t, specials).rstrip() for t in self.decoded([], tokens[:, prompt:])],
                    add_special_tokens=False)["input_ids"]
        out = []
        for i in range(0, len(heads), BATCH):
            rows = [h + t for h, t in zip(heads[i : i + BATCH], tails[i : i + BATCH])]
            ids = torch.zeros(len(rows), max(map(len, rows)), dtype=torch.long)  # right padding: masked, not scored
            mask, scored = torch.zeros_like(ids), torch.zeros(ids.shape, dtype=torch.bool)
            for r, (head, row) in enumerate(zip(heads[i : i + BATCH], rows)):
                ids[r, : len(row)], mask[r, : len(row)] = torch.tensor(row, dtype=torch.long), 1
                scored[r, len(head) : len(row)] = True
            nll = self.lm.window_nll(ids, mask)
            out.append(sum_and_count(nll, scored & ~nll.isnan()))
        return torch.cat(out)

    def _sdtt_texts(self, texts: list[str]) -> torch.Tensor:
        # SDTT reads one text at a time (run_eval.py:151-161); right padding with an attention mask gives the same
        # NLLs up to float rounding
        out = []
        for i in range(0, len(texts), BATCH):
            ids, mask = self.lm.tokenize(texts[i : i + BATCH])  # (b, T)
            nll = self.lm.window_nll(ids, mask)
            out.append(sum_and_count(nll, mask.bool() & ~nll.isnan()))
        return torch.cat(out)

    def decoded(self, texts: list[str], tokens: torch.Tensor | None) -> list[str]:
        """The texts the released code re-tokenises: the teacher's decode of `tokens` with its special tokens kept
        (diffusion.py:426, run_eval.py:148), or `texts` where there are no ids, then 4.38's cleanup (module doc)."""
        from transformers import PreTrainedTokenizerBase

        tok = getattr(self.teacher, "tokenizer", None)
        if tokens is not None and callable(getattr(tok, "batch_decode", None)):
            texts = tok.batch_decode(tokens, clean_up_tokenization_spaces=False)  # not twice where 5 still cleans
        # the base class's method: 4.38.2's list in its order, still in transformers 5 (a subclass may override it,
        # as CLVP's does, so the evaluator's own method is not called)
        return [PreTrainedTokenizerBase.clean_up_tokenization(self.lm.tokenizer, t) for t in texts]

    def _mdlm(self, texts: list[str], tokens: torch.Tensor | None) -> torch.Tensor:
        texts = self.decoded(texts, tokens)
        ids, mask = self.lm.tokenize(texts, max_length=self.teacher.seq_len)  # (n, T), padded all at once
        eos, C = self.lm.tokenizer.eos_token_id, context_length(self.lm.network.config)
        out = []
        for i in range(0, len(ids), BATCH):
            rows = ids[i : i + BATCH]  # (b, T)
            nll = self.lm.window_nll(rows, mask[i : i + BATCH])
            is_eos = rows == eos
            first_eos = torch.cat([w.cumsum(1) == 1 for w in is_eos.split(C, dim=1)], 1)  # per window
            # the attention mask is not read, as in MDLM: padding is left out only as EOS (the pad of GPT-2, Llama-2
            # and SmolLM2); a tokenizer with a pad token of its own would have its padding scored
            out.append(sum_and_count(nll, (first_eos | ~is_eos) & ~nll.isnan()))
        return torch.cat(out)


class CompanionEvaluator:
    def __init__(self, teacher, cache, device, checkpoints: Path, batch: int = 64):
        self.name = teacher.companion_lm
        self.lm = load_teacher(self.name, cache=cache, device=device, checkpoints=checkpoints)
        self.device, self.batch = device, batch
        self.pooled = False

    def _ids(self, text: str) -> list[int]:
        tok = self.lm.tokenizer
        pieces = tok.encode(text.split("\n"))
        ids = [t for k, p in enumerate(pieces) for t in ([tok.eos_id] if k else []) + p]
        return ids[: self.lm.seq_len]  # the model's context

    def scores(self, texts: list[str]) -> torch.Tensor:
        out = []
        for i in range(0, len(texts), self.batch):
            rows = [self._ids(t) for t in texts[i : i + self.batch]]
            T = max(1, max(map(len, rows)))
            ids = torch.zeros(len(rows), T, dtype=torch.long)
            mask = torch.zeros(len(rows), T)
            for r, row in enumerate(rows):
                ids[r, : len(row)], mask[r, : len(row)] = torch.tensor(row, dtype=torch.long), 1.0
            nll = self.lm.token_nll(ids.to(self.device)).cpu()  # (B, T); causal: padding after a row changes nothing
            out.append(torch.stack([(nll * mask).sum(1), mask.sum(1)], 1))
        return torch.cat(out)


def evaluator(extractor: str | None, teacher, cache, device, checkpoints: Path):
    choice, protocol = parse(extractor)
    if choice == "tiny" and not hf_folder.is_folder_name(teacher.companion_lm):
        return CompanionEvaluator(teacher, cache, device, checkpoints)
    if choice == "tiny":  # a real teacher's companion: GPT-2 for MDLM-OWT
        choice = teacher.companion_lm
    return CausalLMEvaluator(SMOLLM2 if choice == "smollm2" else choice, protocol or "sdtt", teacher, cache, device,
                             checkpoints)


class GenPPL(Metric):
    """exp(mean next-token NLL) of generated texts under an evaluator LM (SmolLM2-135M by default), SDTT's protocol
    or MDLM's."""

    name = "gen_ppl"
    higher_is_better = False
    modality = "text"

    @classmethod
    def check(cls, extractor: str | None, checkpoints: Path) -> str | None:
        choice, protocol = parse(extractor)
        if choice not in EVALUATORS and not hf_folder.is_folder_name(choice):
            raise UserError(f"metric 'gen_ppl': unknown evaluator {choice!r}; valid: {', '.join(EVALUATORS)}, each "
                            f"but tiny optionally followed by a protocol, one of :{', :'.join(PROTOCOLS)}")
        if choice == "tiny" and protocol:
            raise UserError(f"metric 'gen_ppl@tiny' takes no protocol (the corpus' LM has one); for "
                            f"{protocol.upper()}'s, name a folder: gen_ppl@hf:<folder>:{protocol}")
        if hf_folder.is_folder_name(choice):
            hf_folder.check(choice, checkpoints)
        if choice == "smollm2":
            reason = smollm2.unavailable()
            return f"gen_ppl: {reason}" if reason else None
        return None

    @classmethod
    def check_teacher(cls, teacher: str, teacher_cls, extractor: str | None, checkpoints: Path) -> None:
        """MDLM's protocol scores whole unconditional samples (diffusion.py:514-573): refused on a prompted protocol,
        whose perplexity is of each continuation after its prompt."""
        protocol = getattr(teacher_cls, "protocol", None)
        if protocol and parse(extractor)[1] == "mdlm":
            raise UserError(f"metric gen_ppl@{extractor}: MDLM's protocol scores whole unconditional samples; teacher "
                            f"{teacher!r}'s prompted protocol ({protocol}) scores each continuation after its prompt, "
                            f"under SDTT's: gen_ppl@{extractor.removesuffix(':mdlm')}")

    def __init__(self, teacher, *, cache, device, checkpoints, extractor=None):
        super().__init__(teacher, cache=cache, device=device, checkpoints=checkpoints)
        self.evaluator = evaluator(extractor, teacher, cache, device, checkpoints)
        # a prompted protocol's perplexity is of the continuations (e.g. "gen_ppl.gpt2-large.sdtt.webtext-prompted"),
        # named apart from the whole samples' as MAUVE's and self-BLEU's keys are
        protocol = getattr(teacher, "protocol", None)
        self.extractor = self.evaluator.name + (f".{protocol}" if protocol else "")
        self._scores: list[torch.Tensor] = []

    def update(self, texts: list[str], cond) -> None:
        """`texts`: B decoded samples; a teacher of Hugging Face tokens decodes into `core.samples.Texts`, which keep
        their ids for SDTT's protocol. On a prompted protocol each begins with its prompt (`cond`), scored as context
        only."""
        prompt = prompt_length(f"{self.name}.{self.extractor}", self.teacher, texts, cond)
        # the tiny teachers, whose companion LM is `CompanionEvaluator`, have no prompted protocol
        self._scores.append(self.evaluator.scores(texts, prompt) if prompt else self.evaluator.scores(texts))

    def compute(self, seed: int = 0) -> dict[str, float]:
        if not self._scores:
            raise ValueError(f"{self.name}: compute() before any update()")
        scores = torch.cat(self._scores)  # (N, 2): summed NLL, scored tokens
        scores = scores[scores[:, 1] > 0]
        if not len(scores):
            raise ValueError(f"{self.name}: no sample long enough to score")
        if self.evaluator.pooled:
            nll = scores[:, 0].double().sum() / scores[:, 1].double().sum()
        else:
            nll = (scores[:, 0] / scores[:, 1]).double().mean()
        return {f"{self.name}.{self.extractor}": math.exp(nll.item())}

    def reset(self) -> None:
        self._scores.clear()
