"""`accelbench ui`: the URLs it prints open MLflow saved views (experiment tags) of the headline columns and of two runs
compared, since MLflow's URLs carry no columns or charts; and, where Chromium is at hand, what a browser shows of
them (scripts/ui_screenshot.py)."""
import json
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import psutil
import pytest
from mlflow.tracking import MlflowClient

import cli
import cli.store
from bench.tracking import VIEW_TAG, Tracker
from cli.serve import answers, serve
from core.names import KIND_TAG, TRIAL

ROOT = Path(__file__).resolve().parent.parent
WALL = 1.2345678901234567  # every digit shown, not MLflow's `1.23456789…`


def trial(tracker, method, teacher, quality):
    """A trial's run as the runner logs it, with what the views read: params, speed-ups, quality metrics (both
    arms) and their direction tags."""
    with tracker.run(f"{method} {teacher}", {KIND_TAG: TRIAL}) as log:
        log.log(params={"method": method, "teacher": teacher}, metrics={
                    "speedup_wall": WALL, "speedup_steps": 2.0, **{k: 3.0 for q in quality for k in (q, f"ref/{q}")}},
                tags={f"higher_is_better.{q}": str(q.startswith("mauve")).lower() for q in quality})
    return log.run_id


@pytest.fixture()
def runs(fresh_store):
    """A store of three trials, newest last: two on one image teacher (FID the headline, KID not), one on a text
    teacher (gen-PPL the headline, MAUVE not)."""
    store = fresh_store
    tracker = Tracker(store, "accelbench")
    return store, [trial(tracker, "sjd", "digits-ar-t2i", ["fid.digits-cnn", "kid.digits-cnn"]),
                   trial(tracker, "jacobi", "digits-ar-t2i", ["fid.digits-cnn"]),
                   trial(tracker, "sdtt", "wordnet-mdlm", ["gen_ppl.wordnet-gpt", "mauve.minilm-l6"])]


def ui(store, capsys, monkeypatch, *args) -> dict[str, str]:
    """{"runs table" or "compare": URL} as `accelbench ui` prints them, the server not started."""
    monkeypatch.setattr(cli.store, "serve", lambda *args: 0)
    assert cli.main(["ui", "--tracking-uri", store, "--port", "5999", *args]) == 0
    return dict(re.findall(r"^  accelbench, (runs table|compare)[^\n]*: (\S+)$", capsys.readouterr().out, re.M))


def view(store, url) -> dict:
    """The state of the saved view the URL opens."""
    query = parse_qs(urlsplit(url).fragment.split("?", 1)[1])
    (key,) = query["viewStateShareKey"]
    experiment = MlflowClient(store).get_experiment_by_name("accelbench")
    return json.loads(json.loads(experiment.tags[VIEW_TAG + key])["state"]) | {"query": query}


def test_ui_urls_open_the_headline_columns_and_two_runs_compared(runs, capsys, monkeypatch):
    store, (sjd, jacobi, sdtt) = runs
    urls = ui(store, capsys, monkeypatch)
    assert urls["runs table"].startswith("http://127.0.0.1:5999/#/experiments/")
    table = view(store, urls["runs table"])
    assert table["query"]["workflowType"] == ["machine_learning"] and "compareRunsMode" not in table["query"]
    headline = ["speedup_wall", "speedup_steps", "fid.digits-cnn", "gen_ppl.wordnet-gpt", "ref/fid.digits-cnn",
                "ref/gen_ppl.wordnet-gpt"]
    assert table["selectedColumns"] == ["params.`method`", "params.`teacher`", *(f"metrics.`{k}`" for k in headline)]
    assert table["columnOrder"][0] == "attributes.`Run Name`" and table["columnWidths"]["metrics.`speedup_wall`"] >= 150
    # the newest two trials on one teacher, side by side as charts: a bar chart of each headline number, then a
    # table of all that differs
    compare = view(store, urls["compare"])
    assert compare["query"]["compareRunsMode"] == ["CHART"]
    assert set(re.findall(r"'(\w+)'", compare["searchFilter"])) == {sjd, jacobi}
    bars = [c["metricKey"] for c in compare["compareRunCharts"] if c["type"] == "BAR"]
    assert bars == [*headline[:3], "ref/fid.digits-cnn"] and compare["compareRunCharts"][-1]["type"] == "DIFFERENCE"
    assert [s["name"] for s in compare["compareRunSections"]] == ["Headline numbers",
                                                                 "Every knob and metric that differs"]
    # two runs of one's choice, of different teachers: both headline qualities
    compare = view(store, ui(store, capsys, monkeypatch, "--compare", sdtt, sjd)["compare"])
    assert set(re.findall(r"'(\w+)'", compare["searchFilter"])) == {sdtt, sjd}
    assert [c["metricKey"] for c in compare["compareRunCharts"] if c["type"] == "BAR"] == headline


def test_ui_refuses_a_run_to_compare_it_cannot_find_in_one_line(runs, capsys, monkeypatch):
    store, (sjd, _, _) = runs
    monkeypatch.setattr(cli.store, "serve", lambda *args: pytest.fail("the server started"))
    assert cli.main(["ui", "--tracking-uri", store, "--compare", sjd, "f" * 32]) == 2
    assert f"--compare: Run with id={'f' * 32} not found" in capsys.readouterr().err


@pytest.mark.skipif(shutil.which("chromium") is None,
                    reason="no chromium on PATH (Debian: apt-get install chromium): what the MLflow UI renders of the "
                           "views is not checked")
def test_a_browser_shows_the_headline_columns_and_two_runs_compared(runs, tmp_path):
    store, _ = runs
    subprocess.run([sys.executable, "scripts/ui_screenshot.py", "--tracking-uri", store, "--experiment", "accelbench",
                    "--dom", str(tmp_path / "shots")], cwd=ROOT, check=True, timeout=600)

    def text(view):
        return re.sub(r"<[^>]+>", " ", (tmp_path / "shots" / f"accelbench-{view}.html").read_text())

    table = text("runs-table")
    for shown in ("method", "teacher", "speedup_wall", "speedup_steps", "fid.digits-cnn", "ref/fid.digits-cnn",
                  "gen_ppl.wordnet-gpt", "ref/gen_ppl.wordnet-gpt", "jacobi", "wordnet-mdlm", str(WALL)):
        assert shown in table, shown
    compare = text("compare")
    for shown in ("Headline numbers", "speedup_wall", "ref/fid.digits-cnn", "What differs", "sjd digits-ar-t2i",
                  "jacobi digits-ar-t2i"):
        assert shown in compare, shown
    assert "sdtt wordnet-mdlm" not in compare


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_stopping_ui_stops_its_whole_server_and_frees_the_port(runs, tmp_path, sig):
    """`kill PID` (or Ctrl-C) on `accelbench ui` stops MLflow's server and its uvicorn worker too: nothing is left on
    the port and no process of the tree survives."""
    store, _ = runs
    port, log = free_port(), tmp_path / "ui.log"
    with log.open("w") as out:
        # SIGINT at its default, as in a terminal's foreground job: a suite started in the background (`nohup`, `&` in
        # a script) ignores SIGINT, and a child inherits that (Python then installs no KeyboardInterrupt), as it should
        proc = subprocess.Popen([sys.executable, "-m", "cli", "ui", "--tracking-uri", store, "--port", str(port)],
                                cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 60
        while not answers("127.0.0.1", port):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-2000:]
            time.sleep(0.2)
        tree = psutil.Process(proc.pid).children(recursive=True)
        assert tree, "the server runs in child processes"
        proc.send_signal(sig)
        assert proc.wait(30) == {signal.SIGTERM: 128 + signal.SIGTERM, signal.SIGINT: 130}[sig]
    finally:
        if proc.poll() is None:
            proc.kill()
    assert not answers("127.0.0.1", port), "the port is still served after the command ended"
    alive = [p for p in tree if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert not alive, f"left running: {[p.cmdline() for p in alive]}"


def test_ui_on_a_taken_port_exits_non_zero_in_one_line(runs, capsys, monkeypatch):
    store, _ = runs
    monkeypatch.setattr(cli.store, "serve", lambda *args: pytest.fail("the server started"))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert cli.main(["ui", "--tracking-uri", store, "--port", str(port)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"cannot serve on 127.0.0.1:{port}" in err and "--port" in err


def test_a_server_that_exits_before_serving_is_an_error_in_one_line(capsys):
    code = serve([sys.executable, "-c", "print('address already in use')"], {}, "127.0.0.1", free_port(), "the server")
    assert code == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "the server exited with code 0 before it served" in err
