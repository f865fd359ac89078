"""LAMBADA-style last-word accuracy and perplexity through lm-eval (EleutherAI harness 0.4.13), the downstream check of
SDTT (arXiv:2410.21035 §4.1; docs/methods/sdtt.md), on a local task from held-out passages of the teacher's corpus.

`lambada_openai` needs the hub; the local task has the same definition (context = the text up to its last space,
target = " " + last word, metrics `acc` and `perplexity`) over test-split documents of at least `MIN_WORDS` words.
It runs as a task of the runner (`bench.runner.execute`, the `accelbench lambada` command): planned, budgeted and
logged like any trial. The harness scores three kinds of model:
- `MDLMHarnessLM`: a masked-diffusion denoiser (a teacher's or an SDTT student's). As the paper evaluates it,
  `is_greedy` is single-pass decoding: every target token masked, one forward pass, correct only if every token's
  argmax is right; the log-likelihood is the NELBO bound over the target given the context, averaged over
  `ELBO_SAMPLES` antithetic t.
- `CausalHarnessLM`: our tiny causal LMs (teacher forcing, greedy = every target token is the argmax).
- lm-eval's own `HFLM` on a Hugging Face causal LM teacher (SmolLM2-135M-Instruct; `hf_lm`).
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from lm_eval.api.model import LM

from teachers.families import masked_diffusion as md
from teachers.pretrained.hf_causal_lm import HFCausalLMTeacher

MIN_WORDS = 6
ELBO_SAMPLES = 32
TASK = "accelbench_lambada"
TASK_YAML = """task: {task}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {jsonl}
output_type: loglikelihood
test_split: test
doc_to_text: "{{{{text.split(' ')[:-1]|join(' ')}}}}"
doc_to_target: "{{{{' '+text.split(' ')[-1]}}}}"
metric_list:
  - {{metric: perplexity, aggregation: perplexity, higher_is_better: false}}
  - {{metric: acc, aggregation: mean, higher_is_better: true}}
metadata: {{version: 1.0}}
"""


def write_task(documents: list[str], folder: Path, n: int) -> Path:
    """The local task (YAML + JSONL) over the first `n` documents of at least MIN_WORDS words; returns the folder."""
    passages = [" ".join(d.split()) for d in documents if len(d.split()) >= MIN_WORDS][:n]
    if not passages:
        raise ValueError(f"no document of at least {MIN_WORDS} words for the LAMBADA-style task")
    folder.mkdir(parents=True, exist_ok=True)
    jsonl = folder / f"{TASK}.jsonl"
    jsonl.write_text("".join(json.dumps({"text": p}) + "\n" for p in passages))
    (folder / f"{TASK}.yaml").write_text(TASK_YAML.format(task=TASK, jsonl=jsonl.resolve()))
    return folder


def evaluate(lm, task_dir: Path) -> dict[str, float]:
    """Run the local task with lm-eval: {"acc": ..., "perplexity": ...}."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    tm = TaskManager(include_path=str(task_dir), include_defaults=False)  # indexing the 14k built-in tasks takes 30 s
    res = lm_eval.simple_evaluate(model=lm, tasks=[TASK], task_manager=tm, bootstrap_iters=0)["results"][TASK]
    return {"acc": float(res["acc,none"]), "perplexity": float(res["perplexity,none"])}


class _TokenLM(LM):
    """Requests -> token ids of (context, continuation) under our tokenizer, cut to the model's context length."""

    def __init__(self, tokenizer, seq_len: int):
        super().__init__()
        self.tokenizer, self.seq_len = tokenizer, seq_len

    def _pair(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        ctx, cont = self.tokenizer.encode([context, continuation])
        cont = cont[: self.seq_len - 1]
        return ctx[-(self.seq_len - len(cont)):] if len(ctx) + len(cont) > self.seq_len else ctx, cont

    def loglikelihood(self, requests):
        return [self._score(*self._pair(*r.args)) for r in requests]

    def loglikelihood_rolling(self, requests):
        raise NotImplementedError("the LAMBADA-style task needs loglikelihood only")

    def generate_until(self, requests):
        raise NotImplementedError("the LAMBADA-style task needs loglikelihood only")


class MDLMHarnessLM(_TokenLM):
    def __init__(self, denoise, tokenizer, seq_len: int, mask_id: int, device: torch.device, seed: int = 0):
        super().__init__(tokenizer, seq_len)
        self.denoise, self.mask_id, self.torch_device, self.seed = denoise, mask_id, device, seed

    @torch.inference_mode()
    def _score(self, ctx: list[int], cont: list[int]) -> tuple[float, bool]:
        x = torch.tensor(ctx + cont, device=self.torch_device)[None]  # (1, T)
        target = torch.zeros_like(x, dtype=torch.bool)
        target[:, len(ctx):] = True
        one_pass = self.denoise(torch.where(target, self.mask_id, x))  # (1, T, V+1)
        greedy = bool((one_pass[target].argmax(-1) == x[target]).all())
        g = torch.Generator(self.torch_device).manual_seed(self.seed)
        t = md.antithetic_times(ELBO_SAMPLES, g, self.torch_device)  # (S,)
        xs = x.expand(ELBO_SAMPLES, -1)
        masked = (torch.rand(xs.shape, generator=g, device=self.torch_device) < md.mask_prob(t)[:, None]) & target
        z = torch.where(masked, self.mask_id, xs)
        nll = -self.denoise(z).gather(-1, xs[..., None]).squeeze(-1)  # (S, T)
        return -((nll * masked).sum(1) / t).mean().item(), greedy


class CausalHarnessLM(_TokenLM):
    """An unconditional AR-token teacher of ours (BOS, then the text), scored with its KV cache."""

    def __init__(self, lm, device: torch.device):
        super().__init__(lm.tokenizer, lm.seq_len)
        self.lm, self.torch_device = lm, device

    @torch.inference_mode()
    def _score(self, ctx: list[int], cont: list[int]) -> tuple[float, bool]:
        x = torch.tensor(ctx + cont, device=self.torch_device)[None]
        state, first = self.lm.start(torch.zeros(1, 0, dtype=torch.long, device=self.torch_device), cfg=1.0)
        logits = torch.cat([first[:, None], self.lm.extend(state, x[:, :-1])], 1) if x.shape[1] > 1 else first[:, None]
        logp = logits.log_softmax(-1)[0, len(ctx):]  # (len(cont), V)
        tokens = x[0, len(ctx):]
        return logp.gather(-1, tokens[:, None]).sum().item(), bool((logp.argmax(-1) == tokens).all())


def hf_lm(model, tokenizer):
    """lm-eval's own Hugging Face backend on an in-memory model (SmolLM2)."""
    from lm_eval.models.huggingface import HFLM

    return HFLM(pretrained=model, tokenizer=tokenizer, batch_size=16)


def lambada(teacher, method, *, cache, n: int, folder: Path, device: torch.device) -> dict[str, float]:
    """The task over `n` test documents of `teacher`'s corpus, scored for the fitted method's model: a
    masked-diffusion method with `denoise` (an SDTT student), else the teacher itself."""
    task = write_task(teacher.test_documents(cache), folder, n)
    if teacher.family is md.FAMILY:
        denoise = getattr(method, "denoise", teacher.denoise)
        lm = MDLMHarnessLM(denoise, teacher.tokenizer, teacher.seq_len, teacher.mask_id, device)
    elif isinstance(teacher, HFCausalLMTeacher):
        lm = hf_lm(teacher.network, teacher.tokenizer)
    else:
        lm = CausalHarnessLM(teacher, device)
    return evaluate(lm, task)
