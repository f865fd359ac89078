"""End to end through the CLI into a temporary SQLite MLflow store, and bad input that must fail cleanly."""
import json
import shutil

import pytest
import yaml
from mlflow.tracking import MlflowClient

import cli
from core.registry import METHODS
from methods.teacher_samplers import ARSampler
from teachers.families import masked_diffusion
from tests.fakes import listed_entries


@pytest.fixture()
def store(fresh_store):
    """A new MLflow store at tmp_path/mlflow.db, a copy of the session's migrated one (conftest)."""
    return fresh_store


def run_cli(store, cache_dir, *args):
    return cli.main(["run", "--tracking-uri", store, "--cache-dir", str(cache_dir), "--warmup", "1",
                     "--no-progress", *args])


def all_runs(store):
    client = MlflowClient(store)
    ids = [e.experiment_id for e in client.search_experiments()]
    return client.search_runs(ids) if ids else []


def test_sjd_trial_end_to_end(tiny_recipe, store, new_cache, capsys):
    code = run_cli(store, new_cache, "--teacher", "digits-ar-t2i", "--method", "sjd", "--param", "window=4",
                   "--metric", "fid", "--metric", "kid", "--metric-repeats", "3", "--n-samples", "6", "--seed", "3")
    assert code == 0
    out = capsys.readouterr().out
    assert "| sjd |" in out and store in out
    client = MlflowClient(store)
    (run,) = client.search_runs([client.get_experiment_by_name("accelbench").experiment_id])
    assert run.info.status == "FINISHED"
    assert f"\nrun id: {run.info.run_id} (experiment 'accelbench';" in out  # what `ui --compare` takes
    m, p, tags = run.data.metrics, run.data.params, run.data.tags
    for key in ("speedup_wall", "speedup_steps", "sec_per_sample_median", "sec_per_sample_p90",
                "sec_per_batch_median", "samples_per_sec", "nfe_per_sample", "step_compression",
                "acceptance_rate", "fid.digits-cnn", "ref/fid.digits-cnn", "ref/sec_per_sample_median",
                "kid.digits-cnn", "kid.digits-cnn.std", "kid.digits-cnn.seed_std", "ref/kid.digits-cnn.seed_std"):
        assert key in m, key
    assert "fid.digits-cnn.seed_std" not in m  # FID is a function of the images: nothing to repeat
    assert m["kid.digits-cnn.seed_std"] > 0 and p["metric_repeats"] == "3"
    assert {t for t in run.data.tags if t.startswith("higher_is_better.")} == {
        "higher_is_better.fid.digits-cnn", "higher_is_better.kid.digits-cnn"}
    assert m["ref/nfe_per_sample"] == 64 and m["nfe_per_sample"] <= 64
    assert m["speedup_steps"] == pytest.approx(m["ref/nfe_per_sample"] / m["nfe_per_sample"])
    assert m["speedup_wall"] == pytest.approx(m["ref/sec_per_sample_median"] / m["sec_per_sample_median"])
    assert p["window"] == "4" and p["n_samples"] == "6" and p["seed"] == "3" and p["reference"] == "ar"
    # What the MLflow UI shows: the runs table (a model-development experiment, described), runs named by their key
    # knobs, knobs filterable by their own names, the evaluation data as a dataset input.
    exp = client.get_experiment_by_name("accelbench")
    assert exp.tags["mlflow.experimentKind"] == "custom_model_development" and "speedup_wall" in exp.tags[
        "mlflow.note.content"]
    assert run.info.run_name == "sjd[window=4,init=random,verify=exact] digits-ar-t2i s3"
    from cli.store import table_state, ui_views  # what `accelbench ui` prints (tests/test_ui.py), on a real trial

    table, training = ui_views(store, "http://ui")  # one trial: no two to compare; the teacher's training: no view
    assert table.endswith(f"/#/experiments/{exp.experiment_id}/runs?viewStateShareKey=accelbench-runs&"
                          f"workflowType=machine_learning") and "viewStateShareKey" not in training
    state = json.loads(client.get_experiment(exp.experiment_id).tags["mlflow.sharedViewState.accelbench-runs"])["state"]
    assert json.loads(state) == table_state(["speedup_wall", "speedup_steps", "fid.digits-cnn", "ref/fid.digits-cnn"])
    assert [r.info.run_id for r in client.search_runs([exp.experiment_id], "params.window = '4'")] == [run.info.run_id]
    (dataset,) = run.inputs.dataset_inputs
    assert dataset.dataset.name == "digits-test-16px" and dataset.tags[0].value == "evaluation"
    for tag in ("trial_key", "git_sha", "torch_version", "mlflow_version", "cpu", "torch_threads", "device"):
        assert tags.get(tag), tag
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"samples.png", "ref_samples.png", "trial.yaml"} <= artifacts
    trial = yaml.safe_load(open(client.download_artifacts(run.info.run_id, "trial.yaml")))
    assert trial["params"]["window"] == 4 and trial["method"] == "sjd"
    training = client.get_experiment_by_name("accelbench-training")  # the fresh cache made it train the teacher
    (trained,) = client.search_runs([training.experiment_id])
    assert trained.data.params["steps"] == "30" and "test_nll_per_token" in trained.data.metrics


def test_sjd_on_the_real_smollm2_end_to_end(store, cache, capsys, monkeypatch):
    """SJD on a real pretrained text LM through the same CLI: the AR-token family is one for images and text. The
    continuations are 8 tokens instead of the teacher's 64, two of SJD's windows of 4 (its window moves on at least
    once): an eighth of the drawing and of the FLOP count on the reference sample, which were most of the trial."""
    from teachers.pretrained import smollm2

    if smollm2.unavailable():
        pytest.skip(smollm2.unavailable())
    monkeypatch.setattr(smollm2, "NEW_TOKENS", 8)
    code = run_cli(store, cache.root, "--teacher", "smollm2-135m-instruct", "--method", "sjd", "--param", "window=4",
                   "--metric", "gen_ppl", "--n-samples", "1", "--warmup", "0")
    assert code == 0, capsys.readouterr().err
    client = MlflowClient(store)
    (run,) = client.search_runs([client.get_experiment_by_name("accelbench").experiment_id])
    m, p = run.data.metrics, run.data.params
    assert p["reference"] == "ar" and p["ref.top_p"] == "1.0" and run.data.tags["family"] == "ar-token"
    assert m["ref/nfe_per_sample"] == 8 and m["ref/step_compression"] == 1 and 1 <= m["step_compression"] <= 4
    for key in ("acceptance_rate", "speedup_wall", "gen_ppl.smollm2-135m-instruct-q4",
                "ref/gen_ppl.smollm2-135m-instruct-q4"):
        assert key in m, key
    assert "samples.txt" in {a.path for a in client.list_artifacts(run.info.run_id)}


def test_cspd_trial_end_to_end(tiny_recipe, store, new_cache):
    code = run_cli(store, new_cache, "--teacher", "digits-mar-c2i", "--method", "cspd", "--param", "gamma=3",
                   "--param", "steps=4", "--param", "cfg=2.0", "--metric", "fid", "--n-samples", "6",
                   "--batch-size", "3")
    assert code == 0
    client = MlflowClient(store)
    (run,) = client.search_runs([client.get_experiment_by_name("accelbench").experiment_id])
    m, p = run.data.metrics, run.data.params
    assert run.info.status == "FINISHED" and p["mode"] == "exact" and p["ref.final_noise"] == "True"
    for key in ("acceptance_rate", "draft_nfe_per_sample", "head_chains_per_sample", "resample_tries_per_sample",
                "resample_exhausted_per_sample", "fid.digits-cnn", "ref/fid.digits-cnn", "speedup_steps"):
        assert key in m, key
    assert m["ref/nfe_per_sample"] == 64 and m["nfe_per_sample"] <= 64 and 0 <= m["acceptance_rate"] <= 1
    (trained,) = client.search_runs([client.get_experiment_by_name("accelbench-training").experiment_id])
    assert {"target_test_loss", "draft_test_loss", "target_n_params"} <= set(trained.data.metrics)


def test_ard_trial_end_to_end(tiny_recipe, store, new_cache):
    code = run_cli(store, new_cache, "--teacher", "digits-dit-c2i", "--method", "ard", "--param", "steps=8",
                   "--param", "n_traj=16", "--param", "train_steps=3", "--param", "batch=4", "--metric", "fid",
                   "--n-samples", "6", "--batch-size", "3")
    assert code == 0
    client = MlflowClient(store)
    (run,) = client.search_runs([client.get_experiment_by_name("accelbench").experiment_id])
    m, p = run.data.metrics, run.data.params
    assert run.info.status == "FINISHED" and p["reference"] == "ddim" and p["ref.steps"] == "8"
    assert m["nfe_per_sample"] == 4 and m["ref/nfe_per_sample"] == 8 and m["speedup_steps"] == 2
    for key in ("fid.digits-cnn", "ref/fid.digits-cnn", "fit/extra_flops_vs_teacher_step", "fit/coupling_mse",
                "fit/teacher_forced_mse", "fit/student_gflops_per_step"):
        assert key in m, key
    assert m["fit/extra_flops_vs_teacher_step"] > 0  # N = 1 reads the history
    # FLOPs per sample of both arms, counted on the first sample: 4 student steps against 8 teacher steps
    assert m["gflops_per_sample"] > 0 and 1 < m["speedup_flops"] == m["ref/gflops_per_sample"] / m["gflops_per_sample"]
    assert m["gmacs_per_sample"] == m["gflops_per_sample"] / 2
    assert {"sec_per_sample_cv_pct", "sec_per_pass_cv_pct", "ref/sec_per_pass_cv_pct", "speedup_wall_noisy"} <= set(m)


def test_sdtt_trial_end_to_end_with_its_baseline_arms(tiny_recipe, store, tmp_path):
    code = run_cli(store, tmp_path / "cache", "--teacher", "wordnet-mdlm", "--method", "sdtt", "--param", "steps=8",
                   "--param", "rounds=2", "--param", "iters_per_round=3", "--param", "batch=4",
                   "--metric", "gen_ppl@tiny", "--metric", "entropy", "--metric", "self_bleu",
                   "--n-samples", "6", "--batch-size", "3")
    assert code == 0
    client = MlflowClient(store)
    (run,) = client.search_runs([client.get_experiment_by_name("accelbench").experiment_id])
    m, p = run.data.metrics, run.data.params
    assert run.info.status == "FINISHED" and p["reference"] == "mdlm" and p["ref.steps"] == "8"
    assert m["nfe_per_sample"] in (2, 3) and m["ref/nfe_per_sample"] in (8, 9)  # (+ the noise-removal pass)
    assert m["same_steps/nfe_per_sample"] in (2, 3) and m["ar/nfe_per_sample"] == 16  # one pass per token
    for arm in ("", "ref/", "same_steps/", "ar/"):
        for key in ("gen_ppl.wordnet-gpt", "entropy.tokens", "sec_per_sample_median"):
            assert arm + key in m, arm + key
    assert m["fit/round2_teacher_steps"] == 4 and "fit/round1_loss_end" in m
    # the companion LM (the "ar" arm and gen_ppl@tiny) was trained inside the trial: logged like the teacher
    training = client.get_experiment_by_name("accelbench-training")
    trained = {r.info.run_name for r in client.search_runs([training.experiment_id])}
    assert trained == {"train:wordnet-mdlm", "train:wordnet-gpt"}
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"samples.txt", "ref_samples.txt", "same_steps_samples.txt", "ar_samples.txt"} <= artifacts
    text = open(client.download_artifacts(run.info.run_id, "samples.txt")).read()
    assert len(text.split("\n\n")) >= 6 - 1  # six samples (a sample may decode to nothing but newlines)
    assert cli.main(["report", "--experiment", "accelbench", "--tracking-uri", store, "--out",
                     str(tmp_path / "report")]) == 0
    report = (tmp_path / "report" / "REPORT.md").read_text()
    rows = {line.split(" | ")[0]: line for line in report.splitlines() if line.startswith("| ")}
    assert {"| mdlm (teacher)", "| sdtt", "| ↳ same_steps", "| ↳ ar"} <= set(rows)
    ar_speedup = m["ref/sec_per_sample_median"] / m["ar/sec_per_sample_median"]
    assert f"{ar_speedup:.2f}×" in rows["| ↳ ar"] and f"{m['ar/gen_ppl.wordnet-gpt']:.2f}" in rows["| ↳ ar"]


def test_lambada_scores_an_sdtt_student_and_the_teacher_through_lm_eval(tiny_recipe, store, tmp_path, capsys):
    args = ["lambada", "--tracking-uri", store, "--cache-dir", str(tmp_path / "cache"), "--teacher", "wordnet-mdlm",
            "--n", "20"]
    assert cli.main(args) == 0
    assert cli.main([*args, "--method", "sdtt", "--param", "steps=8", "--param", "rounds=1", "--param",
                     "iters_per_round=2", "--param", "batch=4"]) == 0
    assert "sdtt on the LAMBADA-style task of wordnet-mdlm" in capsys.readouterr().out
    runs = [r for r in all_runs(store) if r.data.tags.get("accelbench.kind") == "lambada"]
    assert sorted(r.data.params["method"] for r in runs) == ["mdlm", "sdtt"]  # no --method: the teacher itself
    assert all(r.info.status == "FINISHED" and r.data.params["n_samples"] == "20" for r in runs)
    for r in runs:
        assert 0 <= r.data.metrics["lambada.acc"] <= 1 and r.data.metrics["lambada.perplexity"] > 1
    assert cli.main([*args[:-4], "--teacher", "digits-ar-c2i"]) == 2


def test_every_image_metric_is_logged_under_its_extractor(tiny_recipe, store, cache, capsys, monkeypatch):
    monkeypatch.delenv("ACCELBENCH_HPSV2_CHECKPOINT", raising=False)
    metrics = ("fid", "kid", "is", "precision", "recall", "clip", "hpsv2")
    assert run_cli(store, cache.root, "--teacher", "digits-ar-t2i", "--method", "jacobi", "--param", "window=4",
                   "--n-samples", "8", *(a for m in metrics for a in ("--metric", m))) == 0
    assert "not computed: hpsv2: no checkpoint; set ACCELBENCH_HPSV2_CHECKPOINT" in capsys.readouterr().err
    (run,) = [r for r in all_runs(store) if r.data.tags.get("accelbench.kind") == "trial"]
    m, tags = run.data.metrics, run.data.tags
    for key in ("fid.digits-cnn", "kid.digits-cnn", "is.digits-cnn", "precision.digits-cnn", "recall.digits-cnn",
                "clip.digits-clip"):
        lower_is_better = key.startswith(("fid", "kid"))
        assert key in m and f"ref/{key}" in m, key
        assert tags[f"higher_is_better.{key}"] == ("false" if lower_is_better else "true"), key
    assert not any(k.split("/")[-1].startswith("hpsv2") for k in m)  # a tag, never a number
    assert tags["unavailable.hpsv2"].startswith("hpsv2: no checkpoint")


def test_trial_yaml_file_gives_the_same_trial_key(tiny_recipe, store, cache, tmp_path):
    spec = {"teacher": "digits-ar-t2i", "method": "jacobi", "params": {"window": 3, "greedy": True},
            "n_samples": 2, "seed": 1}
    path = tmp_path / "trial.yaml"
    path.write_text(yaml.safe_dump(spec))
    assert run_cli(store, cache.root, str(path)) == 0
    assert run_cli(store, cache.root, "--teacher", "digits-ar-t2i", "--method", "jacobi", "--param", "window=3",
                   "--param", "greedy=true", "--n-samples", "2", "--seed", "1") == 0
    keys = {r.data.tags["trial_key"] for r in all_runs(store) if r.data.tags.get("accelbench.kind") == "trial"}
    assert len(keys) == 1


class OtherFamilyMethod(ARSampler):
    """A method for a family no registered teacher belongs to."""

    families = (masked_diffusion.FAMILY,)


@pytest.mark.parametrize("args, message", [
    (["--teacher", "nope", "--method", "sjd"],
     "unknown teacher 'nope'; valid: anole-7b, digits-ar-c2i, digits-ar-t2i, digits-dit-c2i"),
    (["--teacher", "digits-ar-t2i", "--method", "nope"],
     "unknown method 'nope'; valid: ar, ard, code, cspd, dd, ddim, gsd, jacobi"),
    (["--teacher", "digits-ar-t2i", "--method", "sjd", "--metric", "nope"],
     "unknown metric 'nope'; valid: clip, entropy"),
    (["--teacher", "wordnet-mdlm", "--method", "mdlm", "--metric", "fid"],
     "metric 'fid' scores image samples; teacher 'wordnet-mdlm' generates text; valid metrics: entropy, gen_ppl"),
    (["--teacher", "wordnet-mdlm", "--method", "sdtt", "--param", "divergence=kl"], "'divergence' must be one of kld"),
    (["--teacher", "wordnet-mdlm", "--method", "sdtt", "--param", "steps=12"], "must be divisible by"),
    (["--teacher", "digits-ar-t2i", "--method", "other"], "accepts: masked-diffusion-lm"),
    (["--teacher", "digits-ar-t2i", "--method", "sjd", "--param", "windw=4"], "unknown knob 'windw'; valid:"),
    (["--teacher", "digits-ar-t2i", "--method", "sjd", "--param", "window=big"], "'window' must be an integer"),
    (["--teacher", "digits-ar-t2i", "--method", "sjd", "--param", "window=0"], "window must be >= 1"),
    (["--teacher", "digits-ar-t2i", "--method", "sjd", "--param", "init=diagonal"], "'init' must be one of random"),
    (["--teacher", "digits-ar-t2i", "--method", "sjd", "--n-samples", "0"], "n_samples must be a positive integer"),
    (["--teacher", "smollm2-135m-instruct", "--method", "sjd", "--batch-size", "4"],
     "keeps one cache length for every row of a batch: decode it with SJD or Jacobi at batch_size 1, got 4"),
    (["--teacher", "digits-ar-t2i", "--method", "sjd", "--param", "window"], "--param expects KEY=VALUE"),
    (["--teacher", "digits-ar-t2i", "--method", "sjd", "--threads", "0"], "--threads >= 1"),
    (["--teacher", "digits-ar-t2i", "--method", "sjd", "--metric", "fid@vgg"],
     "metric 'fid': unknown extractor 'vgg'; valid: cnn, inception"),
    (["--teacher", "digits-ar-t2i", "--method", "sjd", "--metric", "is@inception"],
     "the inception score reads Inception-v3's class logits"),
    (["--teacher", "digits-ar-t2i", "--method", "sjd", "--metric", "kid@"], "name an extractor after '@'"),
    (["--teacher", "digits-ar-t2i", "--method", "sjd", "--metric-repeats", "0"],
     "metric_repeats must be a positive integer"),
])
def test_bad_input_is_one_clear_line_and_no_run(args, message, store, cache, capsys, monkeypatch):
    monkeypatch.setitem(METHODS._entries, "other", OtherFamilyMethod)
    assert run_cli(store, cache.root, *args) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1 and "Traceback" not in err
    assert all(r.info.status != "RUNNING" for r in all_runs(store))


def test_bad_files_devices_numbers_and_folders_are_one_line_before_any_work(tmp_path, capsys):
    """The class of bad input, not four cases: every file the CLI reads, every folder it writes, every device string,
    every float knob: one line, exit 2, nothing trained, cached or logged."""
    import torch

    store = f"sqlite:///{tmp_path}/store/mlflow.db"
    (tmp_path / "store").mkdir()
    binary = tmp_path / "trial.yaml"
    binary.write_bytes(b"teacher: digits-ar-t2i\nmethod: \xff\xfe sjd\n")
    (tmp_path / "a-file").write_text("not a database")
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    cases = [
        ([str(binary)], "not UTF-8 text"),
        (["--teacher", "digits-ar-t2i", "--method", "sjd", "--device", "cuda:99"], "cuda:99"),
        (["--teacher", "digits-ar-t2i", "--method", "sjd", "--device", "tpu"], "unknown device 'tpu'"),
        (["--teacher", "digits-ar-t2i", "--method", "sjd", "--param", "temperature=inf"], "(finite), got 'inf'"),
        (["--teacher", "digits-ar-t2i", "--method", "sjd", "--param", "cfg=nan"], "(finite), got 'nan'"),
        (["--teacher", "digits-ar-t2i", "--method", "sjd", "--cache-dir", str(tmp_path / "a-file" / "cache")],
         "cache directory (--cache-dir)"),
        (["--teacher", "digits-ar-t2i", "--method", "sjd", "--time-budget", "nan"], "must be finite and >= 0"),
        (["--teacher", "digits-ar-t2i", "--method", "sjd", "--param", "window=16", "--param", "window=4"],
         "--param window is given twice ('16' and '4')"),
        (["--teacher", "digits-ar-t2i", "--method", "sjd", "--metric", "fid", "--n-samples", "1"],
         "metric 'fid' needs at least 2 samples per arm, got n_samples 1"),
        (["--teacher", "digits-ar-t2i", "--method", "sjd", "--tracking-uri", "foo://bar"], "unknown scheme 'foo'"),
        (["--teacher", "digits-ar-t2i", "--method", "sjd", "--tracking-uri", f"sqlite:///{tmp_path}/a-file"],
         "a-file is not a SQLite database"),
        (["--teacher", "digits-ar-t2i", "--method", "sjd", "--cache-dir", str(tmp_path / "loop" / "c")],
         "Symlink loop"),
        (["--teacher", "digits-ar-t2i", "--method", "sjd", "--memory-budget", "inf"], "must be finite and >= 0"),
    ]
    if not torch.cuda.is_available():
        cases.append((["--teacher", "digits-ar-t2i", "--method", "sjd", "--device", "cuda"], "has no CUDA device"))
    for args, message in cases:
        extra = [] if "--cache-dir" in args else ["--cache-dir", str(tmp_path / "cache")]
        assert cli.main(["run", "--tracking-uri", store, "--no-progress", *extra, *args]) == 2, args
        err = capsys.readouterr().err.strip()
        assert message in err and len(err.splitlines()) == 1 and "Traceback" not in err, (args, err)
    suite = tmp_path / "suite.yaml"
    suite.write_text("experiment: x\ntrials: [{teacher: digits-ar-t2i, method: sjd}]\n")
    assert cli.main(["suite", str(suite), "--tracking-uri", store, "--cache-dir", str(tmp_path / "cache"),
                     "--out", str(tmp_path / "a-file" / "report")]) == 2
    assert "report directory (--out)" in capsys.readouterr().err
    suite.write_text("experiment: x\nseeds: [0, 0]\ntrials: [{teacher: digits-ar-t2i, method: sjd}]\n")
    assert cli.main(["suite", str(suite), "--tracking-uri", store, "--cache-dir", str(tmp_path / "cache")]) == 2
    assert "'seeds' repeats a seed: [0, 0]" in capsys.readouterr().err
    suite.write_text("experiment: x\ntrials: [{teacher: digits-ar-t2i, method: sjd}, {teacher: digits-ar-t2i, "
                     "method: sjd, params: {window: 16}}]\n")  # 16 is the default: the same trial
    assert cli.main(["suite", str(suite), "--tracking-uri", store, "--cache-dir", str(tmp_path / "cache")]) == 2
    assert "trial 1 is trial 0 again (the same trial key)" in capsys.readouterr().err
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ACCELBENCH_ZOO", str(tmp_path / "nonexistent"))
        assert cli.main(["run", "--teacher", "digits-ar-t2i", "--method", "sjd", "--tracking-uri", store,
                         "--cache-dir", str(tmp_path / "cache")]) == 2
        assert "no model zoo there (no manifest.json)" in capsys.readouterr().err
    assert not list((tmp_path / "cache").rglob("*.pt")) and not any((tmp_path / "store").iterdir())  # no work done


def test_validation_happens_before_any_work(tmp_path, capsys):
    store = f"sqlite:///{tmp_path}/mlflow.db"
    for bad in (["--param", "x=1"], ["--threads", "0"], ["--n-samples", "-3"]):
        assert run_cli(store, tmp_path, "--teacher", "digits-ar-t2i", "--method", "sjd", *bad) == 2
    assert not any(tmp_path.iterdir())  # nothing trained, nothing cached, no store created


@pytest.mark.parametrize("exc, status", [(RuntimeError("boom"), "FAILED"), (KeyboardInterrupt(), "KILLED")])
def test_a_run_that_dies_is_not_left_running(exc, status, tiny_recipe, store, cache, monkeypatch):
    def explode(self, cond, *, generator):
        raise exc

    monkeypatch.setattr(METHODS.get("sjd"), "sample", explode)
    if isinstance(exc, KeyboardInterrupt):
        assert run_cli(store, cache.root, "--teacher", "digits-ar-t2i", "--method", "sjd", "--n-samples", "2") == 130
    else:
        with pytest.raises(RuntimeError):
            run_cli(store, cache.root, "--teacher", "digits-ar-t2i", "--method", "sjd", "--n-samples", "2")
    trials = [r for r in all_runs(store) if r.data.tags.get("accelbench.kind") == "trial"]
    assert [r.info.status for r in trials] == [status]


def test_list_shows_every_entry_with_families(capsys):
    assert cli.main(["list"]) == 0
    out = capsys.readouterr().out
    for name in ("digits-ar-c2i", "digits-ar-t2i", "fashion-ar-c2i", "ar", "jacobi", "sjd", "dd", "onestep*",
                 "skip-n", "fid", "clip", "hpsv2"):
        assert name in out
    assert "families: ar-token" in out and "[masked-diffusion-lm, text]" in out
    assert "hf:<folder>" in out and "[multiscale-vq, image]" in out
    # every method's own knobs with their defaults (the released students' knobs among them); a family's own
    # sampler has only the sampling settings
    knobs = {name: text.split("knobs:")[1] for name, text in listed_entries(out).items() if "knobs:" in text}
    assert "window=16" in knobs["sjd"] and "student=''" in knobs["dd"] and "student=''" in knobs["sdtt"]
    assert "ar" not in knobs
    # within 120 columns, each description whole: wrapped at spaces, not cut at its docstring's first line break
    assert max(len(line) for line in out.splitlines()) <= 120
    assert " ".join(METHODS.get("sjd").__doc__.split("\n\n")[0].split()) in " ".join(out.split())


def test_a_sqlite_stores_artifacts_go_beside_its_file(tmp_path, monkeypatch, migrated_store_file):
    """Not into the working directory, as MLflow's default would put them (`./mlruns`)."""
    from mlflow.tracking import MlflowClient

    from bench.tracking import Tracker

    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path}/sub/store.db"
    (tmp_path / "sub").mkdir()
    shutil.copyfile(migrated_store_file, tmp_path / "sub" / "store.db")  # a new store, its tables made
    tracker = Tracker(uri, "artifacts")
    location = MlflowClient(uri).get_experiment(tracker.experiment_id).artifact_location
    assert location == (tmp_path / "sub" / "mlruns").as_uri()


def test_fit_keeps_the_process_threads_and_sampling_uses_the_option(tiny_recipe, store, cache, monkeypatch):
    import torch

    seen = {"fit": [], "sample": []}
    sjd = METHODS.get("sjd")
    sample = sjd.sample

    def fit(self, *, cache, checkpoints):
        seen["fit"].append(torch.get_num_threads())
        return {}

    def recording_sample(self, cond, *, generator):
        seen["sample"].append(torch.get_num_threads())
        return sample(self, cond, generator=generator)

    monkeypatch.setattr(sjd, "fit", fit)
    monkeypatch.setattr(sjd, "sample", recording_sample)
    torch.set_num_threads(2)  # the session fixture restores its own setting afterwards
    try:
        assert run_cli(store, cache.root, "--teacher", "digits-ar-t2i", "--method", "sjd", "--n-samples", "2",
                       "--threads", "1") == 0
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(1)
    assert seen["fit"] == [2] and set(seen["sample"]) == {1}


def test_no_progress_reaches_the_teachers_training_loop(tiny_recipe, store, tmp_path, monkeypatch):
    """--no-progress hides the bar of a teacher trained inside the trial too. tqdm is silenced in the tests
    (TQDM_DISABLE), so the switch is read off the bars' arguments. The teacher is trained twice, so it is the DiT, the
    quickest of the tiny recipes to train (0.2 s of CPU against digits-ar-t2i's 7.7 s, measured)."""
    import tqdm

    bars, real = [], tqdm.tqdm  # `core.training` imports it when it trains (the cost path imports no tqdm)
    monkeypatch.setattr(tqdm, "tqdm", lambda it=None, **kw: bars.append((kw.get("desc"), kw.get("disable"))) or real(
        it, **{k: v for k, v in kw.items() if k != "desc"}))
    trial = ["--teacher", "digits-dit-c2i", "--method", "ddim", "--param", "steps=2", "--n-samples", "2"]
    assert run_cli(store, tmp_path / "quiet", *trial) == 0
    assert cli.main(["run", "--tracking-uri", store, "--cache-dir", str(tmp_path / "shown"), "--warmup", "0",
                     *trial]) == 0
    trained = [bar for bar in bars if str(bar[0]).startswith("training teacher")]
    assert trained == [("training teacher digits-dit-c2i", True), ("training teacher digits-dit-c2i", False)]


def test_no_progress_reaches_the_libraries_bars():
    """transformers' own bars (its "Loading weights" when a metric loads MiniLM or SmolLM2) follow --no-progress
    inside `library_bars`, and are as they were after it."""
    from transformers.utils import logging as hf_logging

    from core.training import library_bars, progress_bars

    before = hf_logging.is_progress_bar_enabled()
    with progress_bars(False), library_bars():
        assert not hf_logging.is_progress_bar_enabled()
    with progress_bars(True), library_bars():
        assert hf_logging.is_progress_bar_enabled()
    assert hf_logging.is_progress_bar_enabled() == before


def test_the_checkpoints_folder_is_handed_down_not_read_from_the_environment(tmp_path, capsys, monkeypatch):
    """`$ACCELBENCH_CHECKPOINTS` is the default of `--checkpoints` and nothing else: `plan` reads the folder it is
    given, and the option wins over the variable."""
    from bench.plan import plan
    from core.errors import UserError
    from core.trial import Trial
    from tests.fakes import refused_by_the_cli

    monkeypatch.setenv("ACCELBENCH_CHECKPOINTS", str(tmp_path / "from-env"))
    with pytest.raises(UserError) as exc:
        plan(Trial("dit-xl-2-256", "ddim"), checkpoints=tmp_path / "given")
    assert f"missing {tmp_path}/given/DiT-XL-2-256x256.pt" in str(exc.value) and "from-env" not in str(exc.value)
    store = ["--tracking-uri", f"sqlite:///{tmp_path}/mlflow.db"]
    err = refused_by_the_cli(capsys, "run", "--teacher", "dit-xl-2-256", "--method", "ddim", *store,
                             "--checkpoints", str(tmp_path / "option"))
    assert f"missing {tmp_path}/option/DiT-XL-2-256x256.pt" in err
    err = refused_by_the_cli(capsys, "run", "--teacher", "dit-xl-2-256", "--method", "ddim", *store)
    assert f"missing {tmp_path}/from-env/DiT-XL-2-256x256.pt" in err


def test_a_latency_batch_times_the_arms_under_the_protocol_apart_from_the_quality_batches(tiny_recipe, store, tmp_path):
    code = run_cli(store, tmp_path / "cache", "--teacher", "digits-dit-c2i", "--method", "ddim", "--param", "steps=4",
                   "--n-samples", "4", "--batch-size", "4", "--latency-batch", "2", "--latency-warmup", "1",
                   "--latency-min-count", "3", "--latency-min-seconds", "0")
    assert code == 0
    (run,) = [r for r in all_runs(store) if r.data.tags.get("accelbench.kind") == "trial"]
    m = run.data.metrics
    assert m["latency_batch"] == 2 and m["ref/latency_batch"] == 2 and m["latency_count"] >= 3
    # the wall speed-up is the protocol's, not the quality batches'
    assert m["speedup_wall"] == m["ref/latency_per_sample_median"] / m["latency_per_sample_median"]
    assert run.data.params["latency_batch"] == "2"
