"""Reports are a pure function of the MLflow store: exact cells, ± formatting, speed-up arithmetic, stable bytes."""
import statistics

import pytest
from mlflow.entities import Metric, Param, RunTag
from mlflow.tracking import MlflowClient

from cli import main
from core.names import HEADLINE_TAG
from reports import plots
from reports.plots import pareto_front, quality_points
from reports.tables import TrialRun

SJD_KNOBS = {"window": "16", "init": "random", "top_k": "0", "temperature": "1.0", "cfg": "1.0", "refine": "True"}
REF_KNOBS = {"top_k": "0", "temperature": "1.0", "cfg": "1.0", "greedy": "False"}


def log_trial(client, exp_id, method, seed, knobs, ms, ref_ms, nfe, fid=None, ref_fid=None, day=1, legacy=False,
              batch=None, extra_tags=None, extra_metrics=None, extra_params=None):
    """A trial run as the runner logs it (knobs under their own names, listed in a tag), or, `legacy`, as runs before
    that did (knobs as "params.<knob>")."""
    tags = {"accelbench.kind": "trial", "trial_key": f"{method}{seed}{sorted(knobs.items())}", "git_sha": "abc123",
            "torch_version": "2.14.1", "cpu": "Test CPU", "torch_threads": "1", "device": "cpu",
            "python": "3.11.7", "key_knobs": "window,init" if method == "sjd" else "window,greedy"}
    tags.update(extra_tags or {})
    if not legacy:
        tags["accelbench.knobs"] = ",".join(sorted(knobs))
    run = client.create_run(exp_id, start_time=1_790_000_000_000 + day * 86_400_000, tags=tags)
    params = {"teacher": "digits-ar-t2i", "method": method, "seed": seed, "reference": "ar", "n_samples": 100,
              **{f"params.{k}" if legacy else k: v for k, v in knobs.items()},
              **{f"ref.{k}": v for k, v in REF_KNOBS.items()}, **({"batch_size": batch} if batch else {}),
              **(extra_params or {})}
    metrics = {"sec_per_sample_median": ms / 1000, "ref/sec_per_sample_median": ref_ms / 1000,
               "nfe_per_sample": nfe, "ref/nfe_per_sample": 64.0, "speedup_wall": ref_ms / ms,
               "speedup_steps": 64.0 / nfe, "step_compression": 64.0 / nfe, **(extra_metrics or {})}
    if fid is not None:
        metrics.update({"fid.digits-cnn": fid, "ref/fid.digits-cnn": ref_fid})
        tags["higher_is_better.fid.digits-cnn"] = "false"
    client.log_batch(run.info.run_id, metrics=[Metric(k, v, 0, 0) for k, v in metrics.items()],
                     params=[Param(k, str(v)) for k, v in params.items()],
                     tags=[RunTag(k, v) for k, v in tags.items()])
    client.set_terminated(run.info.run_id, "FINISHED")
    return run.info.run_id


@pytest.fixture()
def store(fresh_store):
    uri = fresh_store
    client = MlflowClient(uri)
    exp = client.create_experiment("paper")
    # SJD W=16 over three seeds, with FID on both arms.
    log_trial(client, exp, "sjd", 0, SJD_KNOBS, ms=20.0, ref_ms=40.0, nfe=30.0, fid=2.0, ref_fid=2.5, day=1)
    log_trial(client, exp, "sjd", 1, SJD_KNOBS, ms=25.0, ref_ms=40.0, nfe=32.0, fid=3.0, ref_fid=2.5, day=2)
    log_trial(client, exp, "sjd", 2, SJD_KNOBS, ms=20.0, ref_ms=44.0, nfe=34.0, fid=4.0, ref_fid=2.8, day=3,
              legacy=True)  # a run of an older store reads the same
    # A Jacobi run without FID: its quality cell must be blank, never zero.
    jacobi = log_trial(client, exp, "jacobi", 0, {"window": "16", "greedy": "False", "top_k": "0",
                                                  "temperature": "1.0", "cfg": "1.0"}, ms=40.0, ref_ms=40.0, nfe=60.0,
                       day=2)
    client.set_tag(jacobi, "unavailable.hpsv2", "hpsv2: no checkpoint; set ACCELBENCH_HPSV2_CHECKPOINT")
    # A failed run and a teacher-training run are not part of the report.
    failed = client.create_run(exp, tags={"accelbench.kind": "trial"})
    client.set_terminated(failed.info.run_id, "FAILED")
    return uri


def report(store, out, *extra):
    assert main(["report", "--experiment", "paper", "--tracking-uri", store, "--out", str(out), *extra]) == 0
    return (out / "REPORT.md").read_text()


def row(text, first_cell):
    return next(line for line in text.splitlines() if line.startswith(f"| {first_cell} |"))


@pytest.mark.usefixtures("fresh_store")  # a copy of the migrated store at tmp_path/mlflow.db
def test_a_noisy_wall_speed_up_is_flagged_and_the_flops_speed_up_shown(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(uri)
    exp = client.create_experiment("paper")
    log_trial(client, exp, "sjd", 0, SJD_KNOBS, ms=20.0, ref_ms=40.0, nfe=32.0,
              extra_metrics={"speedup_wall_noisy": 1.0, "speedup_flops": 1.8})
    log_trial(client, exp, "jacobi", 0, {"window": "16", "greedy": "False"}, ms=40.0, ref_ms=40.0, nfe=60.0,
              extra_metrics={"speedup_wall_noisy": 0.0, "speedup_flops": 1.1}, extra_tags={HEADLINE_TAG: "true"})
    log_trial(client, exp, "sjd", 1, SJD_KNOBS, ms=20.0, ref_ms=40.0, nfe=32.0, day=2,
              extra_metrics={"speedup_wall_noisy": 1.0}, extra_tags={HEADLINE_TAG: "true"})
    text = report(uri, tmp_path / "out")
    headline = {m: [c.strip() for c in row(text, f"{m} | digits-ar-t2i").split("|")[1:-1]] for m in ("sjd", "jacobi")}
    assert headline["sjd"][5] == "2.00× ⚠" and headline["jacobi"][5] == "1.00×"
    sjd = [c.strip() for c in row(text, "sjd | window=16, init=random").split("|")[1:-1]]
    jacobi = [c.strip() for c in row(text, "jacobi | window=16").split("|")[1:-1]]
    assert sjd[8] == "2.00× ± 0.00 ⚠" and sjd[10] == "1.80×"
    assert jacobi[8] == "1.00×" and jacobi[10] == "1.10×"
    assert "⚠ after a wall speed-up" in text


def test_table_cells_and_arithmetic(store, tmp_path):
    text = report(store, tmp_path / "a")
    header = next(line for line in text.splitlines() if line.startswith("| method |"))
    assert "FID ↓ (digits-cnn)" in header and "speed-up wall ↑" in header
    sjd = [c.strip() for c in row(text, "sjd").split("|")[1:-1]]
    assert sjd[:6] == ["sjd", "window=16, init=random", "top_k=0, temperature=1.0, cfg=1.0, greedy=False", "1", "100",
                       "3"]
    assert sjd[6] == "32.0 ± 2.0"  # NFE mean and sample std of 30, 32, 34
    assert sjd[7] == "21.67 ± 2.89"  # ms / sample of 20, 25, 20
    assert sjd[8] == "1.93× ± 0.31"  # mean and std of the in-run ratios 40/20, 40/25, 44/20
    assert sjd[9] == "2.01× ± 0.13"  # of 64/30, 64/32, 64/34
    assert sjd[10] == ""  # these runs counted no FLOPs: no FLOPs speed-up
    assert sjd[11] == "3.00 ± 1.00"
    teacher = [c.strip() for c in row(text, "ar (teacher)").split("|")[1:-1]]
    # Seed 0 has two runs (sjd, jacobi); its timing comes from the first (jacobi), its FID from the one with FID.
    assert teacher[3:] == ["1", "100", "3", "64.0 ± 0.0", "41.33 ± 2.31", "1.00×", "1.00×", "1.00×", "2.60 ± 0.17"]
    jacobi = [c.strip() for c in row(text, "jacobi").split("|")[1:-1]]
    assert jacobi[3:] == ["1", "100", "1", "60.0", "40.00", "1.00×", "1.07×", "", ""]  # one seed: no ±; no FID
    assert "Blank cells: the metric was not computed" in text
    assert ("unavailable where it ran, so not computed: `hpsv2` (hpsv2: no checkpoint; set "
            "ACCELBENCH_HPSV2_CHECKPOINT)") in text and "HPSV2" not in header
    assert "runs: 4, dated 2026-09-22 to 2026-09-24 (UTC)" in text and "Test CPU" in text


def test_regeneration_is_byte_identical(store, tmp_path):
    assert report(store, tmp_path / "a") == report(store, tmp_path / "b")
    assert (tmp_path / "a" / "quality_vs_time_digits-ar-t2i.png").read_bytes() == \
        (tmp_path / "b" / "quality_vs_time_digits-ar-t2i.png").read_bytes()


def test_filter_selects_runs(store, tmp_path, capsys):
    text = report(store, tmp_path / "a", "--filter", "params.method = 'jacobi'")
    assert "| jacobi |" in text and "| sjd |" not in text
    assert main(["report", "--experiment", "paper", "--tracking-uri", store, "--out", str(tmp_path / "b"),
                 "--filter", "params.window ==="]) == 2
    err = capsys.readouterr().err
    assert "--filter 'params.window ===': Invalid clause(s)" in err and len(err.strip().splitlines()) == 1


def test_pareto_front():
    points = [(10, 5.0), (20, 3.0), (15, 6.0), (30, 3.5), (40, 1.0)]
    assert pareto_front(points, higher_is_better=False) == [(10, 5.0), (20, 3.0), (40, 1.0)]
    assert pareto_front(points, higher_is_better=True) == [(10, 5.0), (15, 6.0)]


def test_plot_points_keep_apart_runs_that_differ_in_a_non_key_knob():
    # DD-1 with the paper's split and with logits everywhere: one point each, as in the table, not their average
    def dd(seed, split, fid):
        knobs = {"steps": "1", "t2": "0", "ts": "0", "split": split, "cfg": "2.0"}
        metrics = {"sec_per_sample_median": 0.003, "fid": fid, "ref/sec_per_sample_median": 0.07, "ref/fid": 1.3}
        return TrialRun("digits-ar-c2i", "dd", seed, 360, knobs, {"cfg": "2.0"}, "ar", metrics,
                        {"higher_is_better.fid": "false"}, key_knobs=("steps", "t2", "ts"))

    runs = [dd(0, "64", 4.0), dd(1, "64", 4.2), dd(0, "-1", 1.9), dd(1, "-1", 1.7)]
    points = quality_points(runs, "fid")
    assert points.keys() == {"dd steps=1, t2=0, ts=0, split=64", "dd steps=1, t2=0, ts=0, split=-1", "ar (teacher)"}
    assert points["dd steps=1, t2=0, ts=0, split=64"] == pytest.approx((3.0, 4.1, 0.0, statistics.stdev([4.0, 4.2])))
    assert points["dd steps=1, t2=0, ts=0, split=-1"][:2] == pytest.approx((3.0, 1.8))
    assert points["ar (teacher)"] == pytest.approx((70.0, 1.3, 0.0, 0.0))


def test_plot_points_keep_apart_runs_that_differ_in_a_sampling_setting():
    """Greedy and sampling Jacobi share their method knobs; `greedy` is a sampling setting (the table's own column):
    two points, never their mean, and the teacher once per setting."""
    def jacobi(seed, greedy, fid, ref_fid):
        knobs = {"window": "16", "greedy": greedy, "cfg": "1.0"}
        metrics = {"sec_per_sample_median": 0.03, "fid": fid, "ref/sec_per_sample_median": 0.03, "ref/fid": ref_fid}
        return TrialRun("digits-ar-t2i", "jacobi", seed, 100, knobs, {"greedy": greedy, "cfg": "1.0"}, "ar", metrics,
                        {"higher_is_better.fid": "false"}, key_knobs=("window", "greedy"))

    runs = [jacobi(0, "True", 6.6, 6.6), jacobi(1, "True", 6.7, 6.7), jacobi(0, "False", 2.6, 2.5),
            jacobi(1, "False", 2.8, 2.4)]
    points = quality_points(runs, "fid")
    assert points.keys() == {"jacobi window=16, greedy=True", "jacobi window=16, greedy=False",
                             "ar (teacher, greedy=True)", "ar (teacher, greedy=False)"}
    assert points["jacobi window=16, greedy=False"][:2] == pytest.approx((30.0, 2.7))


def test_an_unknown_experiment_lists_the_ones_the_store_has(store, tmp_path, capsys):
    assert main(["report", "--tracking-uri", store, "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip()
    assert "no MLflow experiment 'accelbench'" in err and "it has: paper" in err and len(err.splitlines()) == 1


@pytest.mark.usefixtures("fresh_store")  # a copy of the migrated store at tmp_path/mlflow.db
def test_the_headline_has_a_row_per_paper_method_at_its_defaults(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(uri)
    exp = client.create_experiment("demo")
    for seed, (ms, fid) in enumerate([(20.0, 2.0), (22.0, 3.0)]):
        run = log_trial(client, exp, "sjd", seed, SJD_KNOBS, ms=ms, ref_ms=40.0, nfe=30.0, fid=fid, ref_fid=2.5)
        client.set_tag(run, "accelbench.headline", "true")
    log_trial(client, exp, "sjd", 0, {**SJD_KNOBS, "window": "4"}, ms=30.0, ref_ms=40.0, nfe=50.0)  # not default
    assert main(["report", "--experiment", "demo", "--tracking-uri", uri, "--out", str(tmp_path / "r")]) == 0
    text = (tmp_path / "r" / "REPORT.md").read_text()
    assert text.index("## Headline") < text.index("## digits-ar-t2i")
    headline = text[text.index("## Headline"):text.index("## digits-ar-t2i")]
    (row,) = [line for line in headline.splitlines() if line.startswith("| sjd |")]
    assert row == ("| sjd | digits-ar-t2i | window=16, init=random | 1 | 2 | 1.91× ± 0.13 | 2.13× ± 0.00 "
                   "| FID ↓ (digits-cnn) | 2.50 ± 0.71 | 2.50 ± 0.00 |")


@pytest.mark.usefixtures("fresh_store")  # a copy of the migrated store at tmp_path/mlflow.db
def test_a_paper_suites_numbers_stand_beside_the_measured_ones(tmp_path):
    """A run carrying the paper's numbers (tags `paper.*`, from a paper suite) gets "paper" and Δ columns beside the
    measured NFE and FID; a row without paper numbers shows "—", and so does the teacher row."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(uri)
    exp = client.create_experiment("paper-suite")
    paper = {"paper.fid": "2.5", "paper.nfe": "28", "paper.source": "SJD Table 1, row W=16"}
    for seed, fid in enumerate([2.0, 4.0]):
        log_trial(client, exp, "sjd", seed, SJD_KNOBS, ms=20.0, ref_ms=40.0, nfe=30.0, fid=fid, ref_fid=2.5,
                  extra_tags=paper)
    log_trial(client, exp, "jacobi", 0, {"window": "16", "greedy": "False"}, ms=40.0, ref_ms=40.0, nfe=60.0, fid=5.0,
              ref_fid=2.5)
    assert main(["report", "--experiment", "paper-suite", "--tracking-uri", uri, "--out", str(tmp_path / "r")]) == 0
    text = (tmp_path / "r" / "REPORT.md").read_text()
    header = [c.strip() for c in next(line for line in text.splitlines() if line.startswith("| method |")).split("|")]
    nfe, fid = header.index("NFE / sample ↓"), header.index("FID ↓ (digits-cnn)")
    assert header[nfe + 1: nfe + 3] == ["paper", "Δ"] and header[fid + 1: fid + 3] == ["paper", "Δ"]
    assert "paper" not in header[header.index("ms / sample ↓") + 1]  # no paper number for wall time: no column
    sjd = [c.strip() for c in row(text, "sjd").split("|")]
    assert sjd[nfe: nfe + 3] == ["30.0 ± 0.0", "28.0", "+2.0"] and sjd[fid: fid + 3] == ["3.00 ± 1.41", "2.50", "+0.50"]
    jacobi = [c.strip() for c in row(text, "jacobi").split("|")]
    assert jacobi[fid: fid + 3] == ["5.00", "—", "—"]
    teacher = [c.strip() for c in row(text, "ar (teacher)").split("|")]
    assert teacher[fid + 1: fid + 3] == ["—", "—"]


@pytest.mark.usefixtures("fresh_store")  # a copy of the migrated store at tmp_path/mlflow.db
def test_one_trial_against_two_paper_rows_is_two_rows_and_a_note_is_its_rows_footnote(tmp_path):
    """SJD's Anole C and D are one trial (the release's ISP draws at random there) against two paper rows: the table
    has a row for each with its own paper numbers, and D's `paper.note` is its footnote under the table."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(uri)
    exp = client.create_experiment("paper-suite")
    c = {"paper.nfe": "33", "paper.source": "Table 4 C"}
    d = {"paper.nfe": "32", "paper.source": "Table 4 D", "paper.note": "not the release's code"}
    for tags in (c, d):
        log_trial(client, exp, "sjd", 0, SJD_KNOBS, ms=20.0, ref_ms=40.0, nfe=30.0, extra_tags=tags)
    assert main(["report", "--experiment", "paper-suite", "--tracking-uri", uri, "--out", str(tmp_path / "r")]) == 0
    text = (tmp_path / "r" / "REPORT.md").read_text()
    nfe = [c.strip() for c in next(line for line in text.splitlines() if line.startswith("| method |")).split("|")]
    nfe = nfe.index("NFE / sample ↓")
    assert [c.strip() for c in row(text, "sjd").split("|")][nfe: nfe + 3] == ["30.0", "33.0", "-3.0"]
    assert [c.strip() for c in row(text, "sjd [1]").split("|")][nfe: nfe + 3] == ["30.0", "32.0", "-2.0"]
    assert "- [1] Table 4 D: not the release's code" in text.splitlines()


def test_tables_and_plots_never_compare_across_batch_sizes(tmp_path):
    """The teacher at batch 30 (from DD's runs) and at batch 1 (from SJD's) are two rows, each run's speed-up is
    against its own batch size's teacher, and the plot has a panel per batch size."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(uri)
    exp = client.create_experiment("mixed")
    log_trial(client, exp, "sjd", 0, SJD_KNOBS, ms=35.0, ref_ms=47.0, nfe=30.0, fid=2.0, ref_fid=2.5, batch=1)
    log_trial(client, exp, "dd", 0, {"steps": "1"}, ms=0.5, ref_ms=4.5, nfe=1.0, fid=3.0, ref_fid=2.4, batch=30)
    assert main(["report", "--experiment", "mixed", "--tracking-uri", uri, "--out", str(tmp_path / "r")]) == 0
    text = (tmp_path / "r" / "REPORT.md").read_text()
    teachers = [[c.strip() for c in line.split("|")[1:-1]] for line in text.splitlines()
                if line.startswith("| ar (teacher) |")]
    assert sorted((t[3], t[7]) for t in teachers) == [("1", "47.00"), ("30", "4.50")]
    assert [c.strip() for c in row(text, "sjd").split("|")[1:-1]][3] == "1"
    runs = [TrialRun.from_mlflow(r) for r in client.search_runs([exp])]
    assert {r.batch_size for r in runs} == {1, 30}
    assert quality_points([r for r in runs if r.batch_size == 1], "fid.digits-cnn")["ar (teacher)"][0] == 47.0


@pytest.fixture()
def drawn(monkeypatch):
    """file name -> per panel: (y label, legend label -> its data points) of every figure the report saves."""
    figures, save = {}, plots._save

    def spy(fig, out, name):
        def data(handle):  # an error-bar point's handle holds its data line
            return [tuple(xy) for xy in getattr(handle, "lines", [handle])[0].get_xydata()]

        figures[name] = [(ax.get_ylabel(), {h.get_label(): data(h) for h in ax.get_legend_handles_labels()[0]})
                         for ax in fig.axes]
        return save(fig, out, name)

    monkeypatch.setattr(plots, "_save", spy)
    return figures


@pytest.mark.usefixtures("fresh_store")  # a copy of the migrated store at tmp_path/mlflow.db
def test_the_quality_plot_judges_by_the_headline_metric_and_shows_every_arm(tmp_path, drawn):
    """SDTT on an MDLM logs entropy (higher is better) beside gen-PPL, the headline metric: on an entropy axis the
    student would look better than its teacher, which the tables say it is not. The extra arms (the teacher at the
    student's steps, the causal LM) are points of their own, told apart from the student's."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(uri)
    exp = client.create_experiment("paper")
    knobs = {"divergence": "kld", "rounds": "3", "student_steps": "0"}
    for seed, (ppl, ref_ppl) in enumerate([(2100.0, 1500.0), (2280.0, 1612.0)]):
        log_trial(client, exp, "sdtt", seed, knobs, ms=50.0, ref_ms=400.0, nfe=8.0, batch=16,
                  extra_params={"teacher": "wordnet-mdlm", "reference": "mdlm"},
                  extra_tags={"key_knobs": "divergence,rounds,student_steps", "accelbench.headline": "true",
                              "higher_is_better.gen_ppl.wordnet-gpt": "false", "higher_is_better.entropy": "true"},
                  extra_metrics={"gen_ppl.wordnet-gpt": ppl, "ref/gen_ppl.wordnet-gpt": ref_ppl,
                                 "entropy": 3.95, "ref/entropy": 3.90,
                                 "same_steps/nfe_per_sample": 8.0, "same_steps/sec_per_sample_median": 0.048,
                                 "same_steps/gen_ppl.wordnet-gpt": 1905.0, "same_steps/entropy": 3.93,
                                 "ar/nfe_per_sample": 64.0, "ar/sec_per_sample_median": 0.030,
                                 "ar/gen_ppl.wordnet-gpt": 60.0 + seed, "ar/entropy": 3.7})
    text = report(uri, tmp_path / "r")
    assert "| GEN_PPL ↓ (wordnet-gpt) | 2190.00 ± 127.28 | 1556.00 ± 79.20 |" in text  # the headline's metric
    ((ylabel, points),) = drawn["quality_vs_time_wordnet-mdlm.png"]
    assert ylabel == "gen_ppl.wordnet-gpt (lower is better)"
    sdtt = "sdtt divergence=kld, rounds=3, student_steps=0"
    assert {k: v for k, v in points.items() if k != "Pareto front"} == {
        "mdlm (teacher)": [(400.0, 1556.0)], sdtt: [(50.0, 2190.0)], f"{sdtt} ↳ same_steps": [(48.0, 1905.0)],
        f"{sdtt} ↳ ar": [(30.0, 60.5)]}


def test_an_acceptance_plot_needs_a_run_group_at_two_windows(store, tmp_path, drawn):
    """Every run of the store is at window 16: one dot per group, no trend, so no plot (nor a link to one)."""
    text = report(store, tmp_path / "a")
    assert "acceptance_digits-ar-t2i.png" not in drawn and "acceptance_digits-ar-t2i" not in text
    assert not (tmp_path / "a" / "acceptance_digits-ar-t2i.png").exists()
    client = MlflowClient(store)
    log_trial(client, client.get_experiment_by_name("paper").experiment_id, "sjd", 0, {**SJD_KNOBS, "window": "4"},
              ms=30.0, ref_ms=40.0, nfe=40.0)
    text = report(store, tmp_path / "b")
    ((_, lines),) = drawn["acceptance_digits-ar-t2i.png"]
    w16 = statistics.fmean([64 / 30, 64 / 32, 64 / 34])  # the three seeds at window 16
    assert lines["sjd init=random (vs window)"] == [(4.0, 1.6), (16.0, pytest.approx(w16))]
    assert "![acceptance_digits-ar-t2i](acceptance_digits-ar-t2i.png)" in text
