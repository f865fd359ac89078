"""A user extends AccelBench from outside the project: a new method and a new teacher in a plugin module named by
ACCELBENCH_PLUGINS, run through `accelbench run` into MLflow, with no project file touched."""
import os
import subprocess
import sys
import textwrap

from mlflow.tracking import MlflowClient

PLUGIN = textwrap.dedent('''
    """A user's plugin: a variant of SJD and a teacher wrapping a tiny network, registered from outside the project."""
    from dataclasses import dataclass

    import torch

    from core.registry import METHODS, TEACHERS
    from core.rng import seeded
    from methods.sjd import SJD, SJDConfig
    from teachers.families import ar_token
    from teachers.networks.gpt import GPT, GPTConfig


    @dataclass(frozen=True)
    class LeftConfig(SJDConfig):
        init: str = "repeat-left"


    @METHODS.register("sjd-left")
    class SJDLeft(SJD):
        """SJD whose new drafts repeat their left neighbour unless told otherwise."""

        Config = LeftConfig


    @TEACHERS.register("letters-lm")
    class LettersLM:
        """An untrained causal transformer over six letters: unconditional, 8 tokens after a BOS."""

        family = ar_token.FAMILY
        modality = "text"
        supports_cfg = False
        ragged_cache = False  # one cache length for the batch: SJD decodes it one sequence at a time

        @classmethod
        def key(cls):
            return "letters-lm-v1".ljust(20, "0")

        @classmethod
        def load(cls, name, *, cache, device):
            with seeded(0):
                network = GPT(GPTConfig(vocab_size=6, cond_vocab=1, cond_len=1, seq_len=8, n_layer=1, n_head=2,
                                        n_embd=16))
            return cls(network.to(device).eval())

        def __init__(self, network):
            self.network, self.seq_len, self.vocab_size, self.grid = network, 8, 6, (8,)

        def conditions(self, n, generator):
            return torch.zeros(n, 0, dtype=torch.long, device=generator.device)

        def start(self, cond, *, cfg):
            return self.network.start(torch.zeros(len(cond), 1, dtype=torch.long, device=cond.device), cfg=cfg,
                                      null_id=0)

        def extend(self, state, tokens):
            return self.network.extend_guided(state, tokens)

        def rollback(self, state, length):
            state.cache.truncate(state.cond_len + length)

        def decode(self, tokens):
            return ["".join("abcdef"[i] for i in row) for row in tokens.tolist()]

        def encode(self, texts):  # what the text metrics re-tokenise samples with
            return [["abcdef".index(c) for c in text] for text in texts]
''')


def test_a_plugin_method_and_teacher_run_through_the_cli(tmp_path, fresh_store):
    (tmp_path / "letters_plugin.py").write_text(PLUGIN)
    env = {**os.environ, "ACCELBENCH_PLUGINS": "letters_plugin", "PYTHONPATH": str(tmp_path)}
    store = fresh_store

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "cli", *args], cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=300)

    listed = cli("list")
    assert "letters-lm" in listed.stdout and "sjd-left" in listed.stdout, listed.stderr
    for method in ("sjd-left", "ar"):  # the plugin method, and a built-in one on the plugin teacher
        out = cli("run", "--teacher", "letters-lm", "--method", method, "--n-samples", "3", "--metric", "entropy",
                  "--tracking-uri", store, "--cache-dir", str(tmp_path / "cache"), "--warmup", "0", "--no-progress")
        assert out.returncode == 0, out.stderr
    client = MlflowClient(store)
    runs = client.search_runs([client.get_experiment_by_name("accelbench").experiment_id])
    assert sorted(r.data.params["method"] for r in runs) == ["ar", "sjd-left"]
    assert all(r.info.status == "FINISHED" and "entropy.tokens" in r.data.metrics for r in runs)
    (sjd_left,) = [r for r in runs if r.data.params["method"] == "sjd-left"]
    assert sjd_left.data.params["init"] == "repeat-left" and sjd_left.data.params["reference"] == "ar"
    assert sjd_left.data.metrics["ref/nfe_per_sample"] == 8 and sjd_left.data.metrics["nfe_per_sample"] <= 8
