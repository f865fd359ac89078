"""LAMBADA and the downstream multiple-choice tasks through lm-eval (`metrics.lambada`): lm-eval's own task definitions
on local data files, our MDLM adapter against SDTT's released LAMBADA evaluation re-derived from its own formulas, the
causal wrappers, the `lambada` command on a released-format SDTT student and the paper suite end to end."""
from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from lm_eval.api.model import LM

from cli import main
from metrics import lambada
from metrics.lambada import evaluate, hf_lm, write_official_task, write_task
from metrics import lambada_models
from metrics.lambada_models import CausalHarnessLM, MDLMHarnessLM
from teachers import load_teacher
from teachers.families import masked_diffusion as md
from teachers.pretrained import smollm2
from teachers.data.text import load_documents
from tests.fakes import NO_CHECKPOINTS, CharTokenizer, refused_by_the_cli, write_sdtt_checkpoints, write_sdtt_student

ROOT = Path(__file__).resolve().parent.parent
DATA = Path(__file__).parent / "fixtures" / lambada.DATA  # the checkpoints layout's folder (its MAKING.md)
STUDENT = Path(__file__).parent / "fixtures" / "sdtt" / "baselines_kld_step_70000"  # the official class's own file
SUITE = ROOT / "suites" / "papers" / "sdtt-lambada-downstream.yaml"
DOCS = ["the quick brown fox jumps over the lazy dog", "too short here", "a b c d e f g h",
        "one two three four five six"]
MC = ("arc_easy", "arc_challenge", "hellaswag", "mathqa", "piqa", "winogrande")


def rows(task: str) -> list[dict]:
    return [json.loads(line) for line in lambada.data_file(task, DATA.parent).read_text().splitlines()]


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    return write_task(DOCS, tmp_path_factory.mktemp("lambada"), n=10)


@pytest.fixture(scope="module")
def official(tmp_path_factory):
    """lm-eval's own seven tasks on the fixture files (in the layout <checkpoints>/lm-eval/<task>.<split>.jsonl)."""
    folder = tmp_path_factory.mktemp("official")
    for name in lambada.TASKS:
        write_official_task(name, lambada.data_file(name, DATA.parent), folder)
    return folder


def test_the_task_table_is_lm_evals_own_definition():
    """Split, dataset and metrics of every task as lm-eval 0.4.13's YAML (its `include`s followed) has them."""
    import lm_eval
    from lm_eval.tasks._yaml_loader import load_yaml

    for name, t in lambada.TASKS.items():
        c = load_yaml(Path(lm_eval.__file__).parent / "tasks" / t.yaml, resolve_func=False)
        assert c["task"] == name and c.get("num_fewshot", 0) == 0
        assert t.split == (c.get("test_split") or c["validation_split"])
        dataset = c["dataset_path"] + (f" ({c['dataset_name']})" if c.get("dataset_name") else "")
        assert t.dataset == dataset
        assert t.metrics == tuple(m["metric"] for m in c["metric_list"])


def test_corpus_task_keeps_long_enough_passages(task):
    texts = [json.loads(line)["text"] for line in (task / "accelbench_lambada.jsonl").read_text().splitlines()]
    assert texts == [DOCS[0], DOCS[2], DOCS[3]]


class UniformLM:
    """A causal LM whose next-token distribution is uniform over 27 ids: every target token has log-prob -log 27."""

    tokenizer, seq_len, V = CharTokenizer(27), 64, 27

    def encode(self, texts):
        return self.tokenizer.encode(texts)

    def start(self, cond, *, cfg):
        return None, torch.zeros(len(cond), self.V)

    def extend(self, state, tokens):
        return torch.zeros(*tokens.shape, self.V)


def test_causal_wrapper_through_lm_eval_gives_the_exact_perplexity(task, official):
    """Perplexity = exp(log 27 x mean letters of the last word) (CharTokenizer: one token per letter), on our corpus
    task and on lm-eval's own lambada_openai read from its local file."""
    lm = CausalHarnessLM(UniformLM(), torch.device("cpu"))
    for folder, name, texts in ((task, lambada.CORPUS, [DOCS[0], DOCS[2], DOCS[3]]),
                                (official, "lambada_openai", [r["text"] for r in rows("lambada_openai")])):
        out = evaluate(lm, folder, [name])
        key = "lambada" if name == lambada.CORPUS else name
        letters = [len(t.split()[-1]) for t in texts]
        # float32 log-probs: log 27 to 1e-7, times ~6 letters in the exponent
        assert out[f"{key}.perplexity"] == pytest.approx(math.exp(math.log(27) * sum(letters) / len(texts)), rel=1e-5)
        assert out[f"{key}.acc"] == 0.0  # the argmax of a uniform row is id 0 = "a": no last word is all a's
        assert out[f"{key}.documents"] == len(texts)


class GoldLM(LM):
    """Knows the fixtures' gold answers (all distinct): log-likelihood 0 for the gold choice, -1 for the others, or the
    reverse (`wrong`). A choice is a continuation, or for WinoGrande's partial scoring the end of the context."""

    def __init__(self, wrong: bool = False):
        super().__init__()
        self.wrong = wrong
        self.gold = set()
        for r in rows("arc_easy") + rows("arc_challenge"):
            self.gold.add(r["choices"]["text"][r["choices"]["label"].index(r["answerKey"])])
        self.gold |= {r["endings"][int(r["label"])] for r in rows("hellaswag")}
        self.gold |= {r["options"].split(f"{r['correct']} ) ")[1].split(" ,")[0] for r in rows("mathqa")}
        self.gold |= {[r["sol1"], r["sol2"]][r["label"]] for r in rows("piqa")}
        self.gold |= {r[f"option{r['answer']}"] for r in rows("winogrande")}

    def loglikelihood(self, requests, disable_tqdm=False):
        def right(context, continuation):
            return continuation.strip() in self.gold or any(context.endswith(g) for g in self.gold)

        return [(-float(right(*r.args) == self.wrong), False) for r in requests]

    def loglikelihood_rolling(self, requests, disable_tqdm=False):
        raise NotImplementedError

    def generate_until(self, requests, disable_tqdm=False):
        raise NotImplementedError


def test_lm_evals_own_multiple_choice_definitions_read_the_local_files(official):
    """Right on every document only if each task's own doc_to_text / doc_to_choice / doc_to_target (ARC's labels,
    HellaSwag's preprocessing, MathQA's option parsing, WinoGrande's partial contexts) read our files; the LM that
    prefers the wrong choices is right on none."""
    right, wrong = evaluate(GoldLM(), official, MC), evaluate(GoldLM(wrong=True), official, MC)
    for name in MC:
        assert right[f"{name}.documents"] == len(rows(name)) == 2
        for metric in lambada.TASKS[name].metrics:
            assert right[f"{name}.{metric}"] == 1.0 and wrong[f"{name}.{metric}"] == 0.0, (name, metric)
    assert evaluate(GoldLM(), official, ["hellaswag"], limit=1)["hellaswag.documents"] == 1


# --- the masked-diffusion adapter against SDTT's released LAMBADA evaluation --------------------------------------

MASK = 50  # the fixture student's: 50 tokens and MASK


@pytest.fixture(scope="module")
def student():
    """The SDTT student the official class wrote (tests/fixtures/sdtt), its SUBS denoiser."""
    from methods import sdtt_released

    release = sdtt_released.read(STUDENT)
    net = release.network(release.network_config())
    return lambda z: md.subs(net(z), z, MASK)


def release_eval(denoise, prefix: torch.Tensor, suffix: torch.Tensor, seed: int, *, restore_eos: bool = True,
                 weight: bool = True) -> tuple[float, bool]:
    """One LAMBADA example as jdeschena/sdtt (9172b86) scores it, written from its own formulas rather than ours:
    `eval_lambada`'s single pass (core/distill/multi_round_sdtt.py:789-804: every suffix token but the EOS masked,
    argmax over all but the MASK column) and `eval_suffix_nll` (:698-745: `_sample_t`'s antithetic linspace times,
    the log-linear noise's sigma, `q_xt`'s mask against 1 - exp(-sigma), prefix and EOS restored, the weight
    dsigma / expm1(sigma)), drawn from one generator in the release's order. `prefix` holds the BOS, `suffix` the EOS.
    `restore_eos` / `weight` off: broken variants."""
    suffix_mask = suffix.clone()
    suffix_mask[:-1] = MASK
    greedy = denoise(torch.cat([prefix, suffix_mask])[None])[0, :, :-1].argmax(-1)
    correct = bool((greedy[-len(suffix):-1] == suffix[:-1]).all())
    n, eps, eps_t = lambada_models.ELBO_SAMPLES, 1e-3, 1e-5
    g = torch.Generator().manual_seed(seed)
    t = (1 - eps_t) * ((torch.rand(1, generator=g) + torch.linspace(0, 1, n + 1)[:-1]) % 1) + eps_t
    sigma, dsigma = -torch.log1p(-(1 - eps) * t), (1 - eps) / (1 - (1 - eps) * t)
    full = torch.cat([prefix, suffix]).repeat(n, 1)
    xt = torch.where(torch.rand(full.shape, generator=g) < (1 - torch.exp(-sigma))[:, None], MASK, full)
    xt[:, :len(prefix)] = full[:, :len(prefix)]
    if restore_eos:
        xt[:, -1] = full[:, -1]
    loss = -denoise(xt).log_softmax(-1).gather(-1, full[..., None])[..., 0]
    loss = torch.where(xt == MASK, loss, 0.0) * ((dsigma / torch.expm1(sigma))[:, None] if weight else 1.0)
    return -float(loss.sum(-1).mean()), correct


def test_the_mdlm_adapter_is_the_released_lambada_evaluation(student):
    """Log-likelihood and single-pass correctness of ours equal the release's on the official-format student, for a
    few (context, continuation) pairs; the broken variants (EOS masked and scored, no 1/t weight) differ."""
    tok = CharTokenizer(MASK)
    bos = eos = tok.eos_id
    lm = MDLMHarnessLM(student, tok.encode, bos, eos, 12, MASK, torch.device("cpu"), seed=3)
    pairs = [("ab cd", " efg"), ("the cat", " sat"), ("x", " yz"), ("hello", " world")]
    for context, continuation in pairs:
        ctx, cont = tok.encode([context, continuation])
        prefix, suffix = torch.tensor([bos, *ctx]), torch.tensor([*cont, eos])
        ours, greedy = lm._score(context, continuation)
        ref, correct = release_eval(student, prefix, suffix, seed=3)
        assert ours == pytest.approx(ref, rel=1e-5) and greedy == correct
        for broken in (dict(restore_eos=False), dict(weight=False)):
            assert abs(release_eval(student, prefix, suffix, seed=3, **broken)[0] - ours) > 1e-3 * abs(ours)


def test_the_mdlm_adapter_frames_and_cuts_as_the_release(student):
    """BOS + context + continuation + EOS; a context too long for the model loses its oldest tokens, not the BOS; an
    oracle that knows the framed text decodes the word in one pass, with log-likelihood 0."""
    tok = CharTokenizer(MASK)
    lm = MDLMHarnessLM(student, tok.encode, 47, 48, 12, MASK, torch.device("cpu"))
    x, target = lm.frame("abcdefghijkl", " mn")
    assert x.tolist() == [[47, *range(4, 12), 12, 13, 48]] and target.tolist() == [[False] * 9 + [True] * 2 + [False]]

    def oracle(z):
        truth = x.expand(len(z), -1)
        return torch.log_softmax(torch.full((*z.shape, MASK + 1), -30.0).scatter(-1, truth[..., None], 30.0), -1)

    lm.denoise = oracle
    ll, greedy = lm._score("abcdefghijkl", " mn")
    assert greedy and -1e-6 < ll <= 0


def test_smollm2_runs_the_same_task_through_lm_eval_hf_backend(tmp_path, cache):
    if smollm2.unavailable():
        pytest.skip(smollm2.unavailable())
    task = write_task(load_documents("wordnet")[:2000:20], tmp_path, n=40)
    lm = load_teacher("smollm2-135m-instruct", cache=cache, device=torch.device("cpu"), checkpoints=NO_CHECKPOINTS)
    out = evaluate(hf_lm(lm.network, lm.tokenizer), task)
    assert 0 < out["lambada.acc"] <= 1 and 1 < out["lambada.perplexity"] < 1e4


# --- the command and the paper suite on tiny files in the official layouts ----------------------------------------


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """The tiny MDLM-OWT and GPT-2 (tests.fakes), a released-format round-7 KLD student and the task data."""
    folder = tmp_path_factory.mktemp("checkpoints")
    write_sdtt_checkpoints(folder)
    write_sdtt_student(folder, "baselines_kld_step_70000")
    shutil.copytree(DATA, folder / lambada.DATA)
    return folder


@pytest.mark.usefixtures("fresh_store")  # a copy of the migrated store at tmp_path/mlflow.db
def test_lambada_scores_a_released_student_on_lm_evals_own_tasks(checkpoints, tmp_path, capsys):
    from mlflow.tracking import MlflowClient

    store = f"sqlite:///{tmp_path}/mlflow.db"
    tasks = [a for t in lambada.TASKS for a in ("--task", t)]
    common = ["lambada", "--teacher", "mdlm-owt", "--checkpoints", str(checkpoints), "--tracking-uri", store,
              "--cache-dir", str(tmp_path / "cache"), "--no-progress", *tasks]
    assert main([*common, "--method", "sdtt", "--param", "student=baselines_kld_step_70000"]) == 0
    assert "sdtt on lm-eval's arc_easy on mdlm-owt (2 documents): acc " in capsys.readouterr().out
    client = MlflowClient(store)
    (run,) = client.search_runs([client.get_experiment_by_name("accelbench").experiment_id])
    m, tags = run.data.metrics, run.data.tags
    assert tags["accelbench.kind"] == "lambada" and tags["lm_eval.tasks"] == ",".join(lambada.TASKS)
    assert run.data.params["student"] == "baselines_kld_step_70000" and run.data.params["divergence"] == "kld"
    for name in lambada.TASKS:
        assert m[f"{name}.documents"] == len(rows(name))
        for metric in lambada.TASKS[name].metrics:
            assert tags[f"higher_is_better.{name}.{metric}"] == str(metric != "perplexity").lower()
            assert (m[f"{name}.{metric}"] > 1) if metric == "perplexity" else (0 <= m[f"{name}.{metric}"] <= 1)
    # a missing data file: one line naming it and the option, before anything is loaded
    (checkpoints / lambada.DATA / "piqa.validation.jsonl").rename(tmp_path / "piqa.jsonl")
    try:
        err = refused_by_the_cli(capsys, *common)
    finally:
        (tmp_path / "piqa.jsonl").rename(checkpoints / lambada.DATA / "piqa.validation.jsonl")
    assert f"missing {checkpoints / lambada.DATA / 'piqa.validation.jsonl'}" in err and "--checkpoints" in err
    assert "unknown task 'lambada'; valid: corpus, lambada_openai" in refused_by_the_cli(capsys, *common, "--task",
                                                                                          "lambada")
    assert "has none: name lm-eval's own tasks" in refused_by_the_cli(capsys, *common[:-len(tasks)], "--task", "corpus")


def test_a_suite_row_refuses_a_paper_key_its_tasks_do_not_log(tmp_path, capsys):
    path = tmp_path / "suite.yaml"
    path.write_text(yaml.safe_dump({"experiment": "p", "trials": [
        {"teacher": "mdlm-owt", "method": "mdlm", "tasks": ["arc_easy"],
         "paper": {"arc_easy.accuracy": 0.4, "source": "T1"}}]}))
    err = refused_by_the_cli(capsys, "suite", str(path), "--dry-run")
    assert "trial 0: unknown paper key 'arc_easy.accuracy'; valid: source, arc_easy.acc, arc_easy.acc_norm" in err


@pytest.mark.usefixtures("fresh_store")  # a copy of the migrated store at tmp_path/mlflow.db
def test_the_paper_suite_runs_end_to_end_into_the_lm_eval_table(checkpoints, tmp_path, capsys):
    """GPT-2 (lm-eval's own HF backend), the teacher and the KLD student of the paper suite, 2 documents per task, into
    MLflow and a report whose lm-eval table carries Table 1's numbers and Δ; a second pass finds them finished."""
    suite = yaml.safe_load(SUITE.read_text())
    suite["trials"] = suite["trials"][:3]
    tiny = tmp_path / SUITE.name
    tiny.write_text(yaml.safe_dump(suite))
    args = ["suite", str(tiny), "--n-samples", "2", "--dtype", "fp32", "--checkpoints", str(checkpoints),
            "--tracking-uri", f"sqlite:///{tmp_path}/mlflow.db", "--cache-dir", str(tmp_path / "cache"), "--out",
            str(tmp_path / "report"), "--no-progress"]
    assert main(args) == 0
    assert "ran 3 trials, 0 already finished" in capsys.readouterr().out
    text = (tmp_path / "report" / "REPORT.md").read_text()
    table = text.split("## lm-eval tasks")[1].split("\n\n")[2].splitlines()
    head = table[0].split(" | ")
    assert head[:5] == ["| teacher", "method", "knobs", "n", "seeds"]
    col = head.index("ARC_EASY ↑ (acc)")
    assert head[col + 1: col + 3] == ["paper", "Δ"] and "LAMBADA_OPENAI ↓ (perplexity)" in head
    cells = {row.split(" | ")[1]: row.split(" | ") for row in table[2:]}
    assert set(cells) == {"ar", "mdlm", "sdtt"}
    for method, paper in (("ar", 0.4381), ("mdlm", 0.4091), ("sdtt", 0.4057)):
        ours = float(cells[method][col])
        assert cells[method][col + 1] == f"{paper:.4f}" and cells[method][col + 2] == f"{ours - paper:+.4f}"
    assert main(args) == 0 and "ran 0 trials, 3 already finished" in capsys.readouterr().out
