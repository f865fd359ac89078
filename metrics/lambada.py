"""LAMBADA and the downstream multiple-choice tasks through lm-eval (EleutherAI harness 0.4.13), SDTT's downstream
evaluation (arXiv:2410.21035 §4 "Downstream performance", Figs. 2/10/11/17 and App. A Table 1; docs/methods/sdtt.md).

Two kinds of task, one code path (task YAMLs in a folder, `lm_eval.simple_evaluate` over it):
- lm-eval's OWN task definitions (`TASKS`: `lambada_openai` and the six of Table 1), their data read from a local copy
  of the split lm-eval scores, `<checkpoints>/lm-eval/<task>.<split>.jsonl` (JSON lines in the Hugging Face dataset's
  own fields, as `datasets.Dataset.to_json` writes them). Each task is a YAML that `include`s lm-eval's own and
  replaces only where the data comes from (`dataset_path: json`, `dataset_kwargs.data_files`) and which splits exist
  (the scored one alone: the tasks run 0-shot, their definitions' default), so nothing reaches the hub;
- `corpus`: a LAMBADA-format task written from the held-out documents of a tiny teacher's own corpus (context = the
  text up to its last space, target = " " + its last word, `lambada_openai`'s definition), for teachers with no
  LAMBADA of their own.
It runs as a task of the runner (`bench.runner.run_lambada`: `accelbench lambada`, a suite's lm-eval rows): planned,
budgeted and logged like a trial. Metric keys: `<task>.<metric>` (`arc_easy.acc`, `lambada_openai.perplexity`;
`lambada.<metric>` for `corpus`), and `<task>.documents`, the documents scored.

The harness scores three kinds of model (`harness_lm`; ours in `metrics.lambada_models`):
- `MDLMHarnessLM`: a masked-diffusion denoiser (a teacher's or an SDTT student's), as SDTT's release scores LAMBADA
  (jdeschena/sdtt at 9172b86, src/sdtt/core/distill/multi_round_sdtt.py:698-846, `_eval_suffix_nll_generators`,
  `eval_suffix_nll`, `eval_lambada`): BOS + context and continuation + EOS, each encoded alone; `is_greedy` =
  single-pass decoding (every continuation token masked, one forward pass, right only if every argmax is); the
  log-likelihood = -NELBO bound of the continuation given the context, `lambada_models.ELBO_SAMPLES` antithetic t.
  The release has no code for the multiple-choice tasks and the paper does not say how it scored them; each choice
  gets the same bound (docs/methods/sdtt.md, "Downstream tasks").
- `CausalHarnessLM`: our tiny causal LMs (teacher forcing from their BOS, greedy = every target token is the argmax).
- lm-eval's own `HFLM` on a Hugging Face causal LM teacher (`hf:gpt2`, SmolLM2; `hf_lm`).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from core import files
from core.cache import CHECKPOINTS_ENV
from core.errors import UserError
from teachers.families import masked_diffusion as md
from teachers.pretrained.hf_causal_lm import HFCausalLMTeacher

MIN_WORDS = 6
CORPUS = "corpus"  # the LAMBADA-format task from the teacher's own corpus
TASK = "accelbench_lambada"  # its name in lm-eval
CORPUS_KEY = "lambada"  # its metric keys' prefix
DATA = "lm-eval"  # the folder of the checkpoints folder that holds the tasks' data
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


@dataclass(frozen=True)
class Task:
    """One of lm-eval's own tasks, as lm-eval 0.4.13 defines it (tests/test_lambada.py checks it against the YAML)."""

    yaml: str  # its definition, under lm_eval/tasks/
    dataset: str  # the Hugging Face dataset (and config) the definition reads
    split: str  # the split lm-eval scores: the definition's test_split, else its validation_split
    metrics: tuple[str, ...]  # its metric_list


TASKS = {  # SDTT §4: LAMBADA as `lambada_openai` (the release's EleutherAI/lambada_openai) and App. A Table 1's six
    "lambada_openai": Task("lambada/lambada_openai.yaml", "EleutherAI/lambada_openai (default)", "test",
                           ("perplexity", "acc")),
    "arc_easy": Task("arc/arc_easy.yaml", "allenai/ai2_arc (ARC-Easy)", "test", ("acc", "acc_norm")),
    "arc_challenge": Task("arc/arc_challenge.yaml", "allenai/ai2_arc (ARC-Challenge)", "test", ("acc", "acc_norm")),
    "hellaswag": Task("hellaswag/hellaswag.yaml", "Rowan/hellaswag", "validation", ("acc", "acc_norm")),
    "mathqa": Task("mathqa/mathqa.yaml", "regisss/math_qa", "test", ("acc", "acc_norm")),
    "piqa": Task("piqa/piqa.yaml", "baber/piqa", "validation", ("acc", "acc_norm")),
    "winogrande": Task("winogrande/default.yaml", "allenai/winogrande (winogrande_xl)", "validation", ("acc",)),
}
HIGHER_IS_BETTER = {"acc": True, "acc_norm": True, "perplexity": False}


def _metrics(task: str) -> tuple[str, ...]:
    return ("perplexity", "acc") if task == CORPUS else TASKS[task].metrics


def _prefix(task: str) -> str:
    return CORPUS_KEY if task == CORPUS else task


def check_tasks(tasks) -> tuple[str, ...]:
    """The task names, validated: a non-empty list of distinct valid names, else one line listing the valid ones."""
    valid = ", ".join([CORPUS, *TASKS])
    if isinstance(tasks, str) or not isinstance(tasks, (list, tuple)) or not tasks:
        raise UserError(f"tasks must be a non-empty list of task names ({valid}), got {tasks!r}")
    for task in tasks:
        if task != CORPUS and task not in TASKS:
            raise UserError(f"unknown task {task!r}; valid: {valid}")
    if len(set(tasks)) < len(tasks):
        raise UserError(f"tasks must be distinct, got {', '.join(tasks)}")
    return tuple(tasks)


def directions(tasks) -> dict[str, bool]:
    """The metric key of every task's metrics -> whether higher is better (the paper keys a suite's row may carry)."""
    return {f"{_prefix(t)}.{m}": HIGHER_IS_BETTER[m] for t in check_tasks(tasks) for m in _metrics(t)}


def data_file(task: str, checkpoints: Path) -> Path:
    """Where the local copy of `task`'s scored split is read: `<checkpoints>/lm-eval/<task>.<split>.jsonl`."""
    return checkpoints / DATA / f"{task}.{TASKS[task].split}.jsonl"


def check(tasks, teacher: str, teacher_cls, metrics: tuple[str, ...], checkpoints: Path) -> tuple[str, ...]:
    """A plan scored on lm-eval `tasks` (`bench.plan`): its teacher generates text, it asks for no sample metric, the
    corpus task has a corpus to read, and every official task's data file is there (a dry run lists them); each refusal
    is one line."""
    tasks = check_tasks(tasks)
    if teacher_cls.modality != "text":
        raise UserError(f"lm-eval tasks need a text teacher, got {teacher!r} ({teacher_cls.family}, "
                        f"{teacher_cls.modality})")
    if metrics:
        raise UserError(f"a trial scored on lm-eval tasks samples nothing: drop its metrics ({', '.join(metrics)})")
    if CORPUS in tasks and not hasattr(teacher_cls, "test_documents"):
        raise UserError(f"task {CORPUS!r} writes its passages from the teacher's own corpus; teacher {teacher!r} has "
                        f"none: name lm-eval's own tasks ({', '.join(TASKS)})")
    for task in tasks:
        if task != CORPUS:
            path, t = data_file(task, checkpoints), TASKS[task]
            files.require(path, f"missing {path}: lm-eval's {task} scores the {t.split} split of {t.dataset}, read "
                                f"from this file (JSON lines in the dataset's own fields, e.g. datasets' "
                                f"Dataset.to_json); or name its parent with --checkpoints or {CHECKPOINTS_ENV}")
    return tasks


def write_task(documents: list[str], folder: Path, n: int) -> Path:
    """The corpus task (YAML + JSONL) over the first `n` documents of at least MIN_WORDS words; returns the folder."""
    passages = [" ".join(d.split()) for d in documents if len(d.split()) >= MIN_WORDS][:n]
    if not passages:
        raise UserError(f"no document of at least {MIN_WORDS} words for the LAMBADA-format corpus task")
    folder.mkdir(parents=True, exist_ok=True)
    jsonl = folder / f"{TASK}.jsonl"
    jsonl.write_text("".join(json.dumps({"text": p}) + "\n" for p in passages))
    (folder / f"{TASK}.yaml").write_text(TASK_YAML.format(task=TASK, jsonl=jsonl.resolve()))
    return folder


def write_official_task(task: str, data: Path, folder: Path) -> Path:
    """lm-eval's own `task` on the local file `data` (its scored split): a YAML that includes lm-eval's definition
    and replaces where its data comes from and which splits exist, nothing else. Returns the folder."""
    import lm_eval

    t = TASKS[task]
    splits = {"training_split": None, "validation_split": None, "test_split": None, f"{t.split}_split": t.split}
    config = {"include": str(Path(lm_eval.__file__).parent / "tasks" / t.yaml), "task": task,
              "dataset_path": "json", "dataset_name": None,
              "dataset_kwargs": {"data_files": {t.split: str(data.resolve())}}, **splits}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{task}.yaml").write_text(json.dumps(config))  # JSON is YAML
    return folder


def evaluate(lm, task_dir: Path, tasks=(CORPUS,), limit: int | None = None) -> dict[str, float]:
    """Run `tasks` (their YAMLs in `task_dir`) with lm-eval, 0-shot, at most `limit` documents each: {metric key:
    value}, and `<task>.documents`. Nothing is seeded globally (lm-eval's defaults would seed random, numpy and
    torch); a 0-shot task draws nothing."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    names = {t: TASK if t == CORPUS else t for t in check_tasks(tasks)}
    tm = TaskManager(include_path=str(task_dir), include_defaults=False)  # indexing the 14k built-in tasks takes 30 s
    out = lm_eval.simple_evaluate(model=lm, tasks=list(names.values()), task_manager=tm, limit=limit,
                                  bootstrap_iters=0, log_samples=False, random_seed=None, numpy_random_seed=None,
                                  torch_random_seed=None)
    values = {}
    for task, name in names.items():
        values.update({f"{_prefix(task)}.{m}": float(out["results"][name][f"{m},none"]) for m in _metrics(task)})
        values[f"{_prefix(task)}.documents"] = float(out["n-samples"][name]["effective"])
    return values


def hf_lm(model, tokenizer):
    """lm-eval's own Hugging Face backend on an in-memory model (GPT-2, SmolLM2)."""
    from lm_eval.models.huggingface import HFLM

    return HFLM(pretrained=model, tokenizer=tokenizer, batch_size=16)


def harness_lm(teacher, method, device: torch.device, progress: bool = True):
    """The model lm-eval scores: a masked-diffusion method's `denoise` (an SDTT student) or teacher's, a Hugging Face
    causal LM through lm-eval's own backend, else our causal LM (`progress`: their bar over the requests)."""
    from metrics.lambada_models import CausalHarnessLM, MDLMHarnessLM

    if teacher.family is md.FAMILY:
        tok = teacher.tokenizer
        # a Hugging Face tokenizer's BOS and EOS (GPT-2: both <|endoftext|>), or ours, whose EOS separates documents
        bos, eos = (tok.bos_token_id, tok.eos_token_id) if hasattr(tok, "eos_token_id") else (tok.eos_id, tok.eos_id)
        # mdlm-owt-prompted samples 100 tokens of a 1024-token model: the model's length bounds the context
        length = getattr(teacher, "model_length", teacher.seq_len)
        return MDLMHarnessLM(getattr(method, "denoise", teacher.denoise), teacher.encode, bos, eos, length,
                             teacher.mask_id, device, progress=progress)
    if isinstance(teacher, HFCausalLMTeacher):
        return hf_lm(teacher.network, teacher.tokenizer)
    return CausalHarnessLM(teacher, device, progress)


def run_tasks(teacher, method, *, tasks, cache, n: int, folder: Path, device: torch.device, checkpoints: Path,
              progress: bool = True) -> dict[str, float]:
    """`tasks` (checked by `check`) at most `n` documents each, their YAMLs written to `folder`, scored for the fitted
    method's model (`harness_lm`)."""
    for task in tasks:
        if task == CORPUS:
            write_task(teacher.test_documents(cache), folder, n)
        else:
            write_official_task(task, data_file(task, checkpoints), folder)
    return evaluate(harness_lm(teacher, method, device, progress), folder, tasks, limit=n)
