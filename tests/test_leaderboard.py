"""LEADERBOARD.md (`reports.leaderboard`): on a hand-made store, the settings within the quality tolerance rank by
wall speed-up and the others follow; the default tolerance is twice the teacher arm's spread over seeds; each row
carries its method's lossless verdict; a Pareto plot per teacher."""
import pytest
from mlflow.tracking import MlflowClient

from cli import main
from reports import leaderboard
from tests.test_reports import log_trial

# teacher arm FID over three seeds: 3.0, 3.2, 2.8 (std 0.2, so the default tolerance is 0.4)
REF_FID = {0: 3.0, 1: 3.2, 2: 2.8}
SETTINGS = [  # (method, knobs, ms per sample, FID drift from the teacher arm): the teacher arm takes 40 ms
    ("sjd", {"window": 16, "init": "random", "verify": "exact"}, 20.0, 0.0),  # 2x, no drift
    ("jacobi", {"window": 4, "greedy": False}, 80 / 3, 0.3),  # 1.5x, inside the tolerance
    ("gsd", {"window": 16, "p_gap": 0.15, "distance": 0.5}, 10.0, 3.0),  # 4x, far outside it
]


@pytest.fixture()
def store(fresh_store):
    client = MlflowClient(fresh_store)
    exp = client.create_experiment("board")
    for method, knobs, ms, drift in SETTINGS:
        for seed, ref in REF_FID.items():
            log_trial(client, exp, method, seed, knobs, ms=ms, ref_ms=40.0, nfe=32.0, fid=ref + drift, ref_fid=ref)
    return fresh_store


def ranking(text: str) -> list[tuple[str, str]]:
    """(rank, method) of each row of the one teacher's leaderboard."""
    return [(cells[1].strip(), cells[2].strip()) for line in text.splitlines()
            if line.startswith("| ") and not line.startswith("| rank") for cells in [line.split("|")]]


def check_board(text: str) -> None:
    """The ranking rule: within the tolerance by wall speed-up (SJD 2x before Jacobi 1.5x), beyond it unranked and
    after them, however fast (GSD 4x)."""
    assert ranking(text) == [("1", "sjd"), ("2", "jacobi"), ("—", "gsd")], ranking(text)


def test_settings_within_the_tolerance_rank_by_wall_speed_up_and_the_others_follow(store, tmp_path, capsys):
    assert main(["report", "--tracking-uri", store, "--experiment", "board", "--out", str(tmp_path / "r")]) == 0
    text = (tmp_path / "r" / "LEADERBOARD.md").read_text()
    check_board(text)
    assert "Tolerance on the drift: 0.4: 2 × the teacher arm's std over seeds" in text
    rows = {line.split("|")[2].strip(): line for line in text.splitlines() if line.startswith("| ")}
    assert "certified: tests/test_sjd.py" in rows["sjd"] and rows["gsd"].rstrip(" |").endswith(
        "lossy: TV 0.03-0.22 as its group widens (at its defaults 6 codes form no group: exact)")
    assert "| 32.0 ± 0.0 | 2.00× ± 0.00 | 2.00× ± 0.00 |  | 3.00 ± 0.20 | 3.00 ± 0.20 | 0.00 ± 0.00 |" in rows["sjd"]
    assert (tmp_path / "r" / "leaderboard_digits-ar-t2i.png").stat().st_size > 0
    assert "## Leaderboards (LEADERBOARD.md)" in (tmp_path / "r" / "REPORT.md").read_text()


def test_a_given_tolerance_takes_the_fast_lossy_setting_in(store, tmp_path):
    assert main(["report", "--tracking-uri", store, "--experiment", "board", "--out", str(tmp_path / "r"),
                 "--tolerance", "5"]) == 0
    text = (tmp_path / "r" / "LEADERBOARD.md").read_text()
    assert ranking(text) == [("1", "gsd"), ("2", "sjd"), ("3", "jacobi")]
    assert "Tolerance on the drift: 5, as given" in text


def test_ranking_by_raw_speed_up_is_caught(store, tmp_path, monkeypatch):
    """The broken variant: a leaderboard sorted by wall speed-up alone puts the lossy GSD first."""
    monkeypatch.setattr(leaderboard, "ranked", lambda items, tolerance: sorted(items, key=lambda e: -e.wall))
    assert main(["report", "--tracking-uri", store, "--experiment", "board", "--out", str(tmp_path / "r")]) == 0
    with pytest.raises(AssertionError):
        check_board((tmp_path / "r" / "LEADERBOARD.md").read_text())


def test_an_unregistered_method_is_unchecked():
    assert leaderboard.verdict("not-a-method", {}) == "unchecked"
