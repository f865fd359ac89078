"""A real browser's view of `accelbench ui`: start it on a store, open the URLs it prints for an experiment (its runs
table, its comparison of two runs) in headless Chromium (Debian's `chromium`), and save a screenshot of each as
OUT_DIR/<experiment>-runs-table.png and OUT_DIR/<experiment>-compare.png; with --dom, the page as rendered beside
each (.html).

usage: python scripts/ui_screenshot.py --tracking-uri sqlite:///mlflow.db --experiment accelbench-default OUT_DIR
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--hide-scrollbars"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(url: str, ui: subprocess.Popen, log: Path, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while True:
        if ui.poll() is not None:
            raise SystemExit(f"`accelbench ui` exited ({ui.returncode}):\n{log.read_text()}")
        try:
            urllib.request.urlopen(url, timeout=2).read()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise SystemExit(f"the MLflow UI did not answer at {url} within {seconds:g} s")
            time.sleep(1)


def browse(chromium: str, args, url: str, action: str) -> str:
    """What headless Chromium prints doing `action` (--screenshot=FILE, --dump-dom) on `url` in a fresh profile."""
    with tempfile.TemporaryDirectory() as profile:
        return subprocess.run([chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--window-size={args.size}",
                               f"--virtual-time-budget={int(args.wait * 1000)}", action, url],
                              check=True, capture_output=True, text=True, timeout=300).stdout


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dir", type=Path, help="folder of the PNG files")
    ap.add_argument("--tracking-uri", default="sqlite:///mlflow.db")
    ap.add_argument("--experiment", default="accelbench-default")
    ap.add_argument("--compare", nargs=2, metavar="RUN_ID", help="passed to `accelbench ui`")
    ap.add_argument("--size", default="2400,1300", help="window size W,H (MLflow's assistant panel takes ~500 px)")
    ap.add_argument("--wait", type=float, default=60.0, help="seconds of virtual time each page gets to render")
    ap.add_argument("--dom", action="store_true", help="also save each page's rendered HTML")
    args = ap.parse_args()
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        raise SystemExit("no chromium on PATH (Debian: apt-get install chromium)")
    args.out_dir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "ui.log"
        with open(log, "w") as out:
            ui = subprocess.Popen([sys.executable, "-m", "cli", "ui", "--tracking-uri", args.tracking_uri,
                                   "--port", str(port), *(["--compare", *args.compare] if args.compare else [])],
                                  stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            wait_for(f"http://127.0.0.1:{port}/", ui, log, 180)
            # what `accelbench ui` printed: "  <experiment>, runs table: URL" and "  <experiment>, compare ...: URL"
            urls = re.findall(rf"^  {re.escape(args.experiment)}, (runs table|compare)[^\n]*: (http\S+)$",
                              log.read_text(), re.M)
            if not urls:
                raise SystemExit(f"`accelbench ui` printed no URL for {args.experiment!r}:\n{log.read_text()}")
            for view, url in urls:
                stem = args.out_dir / f"{args.experiment}-{view.replace(' ', '-')}"
                browse(chromium, args, url, f"--screenshot={stem}.png")
                if args.dom:
                    Path(f"{stem}.html").write_text(browse(chromium, args, url, "--dump-dom"))
                print(f"{url} -> {stem}.png")
        finally:  # the whole group: `mlflow ui` leaves its uvicorn server running when it is ended alone
            os.killpg(ui.pid, signal.SIGTERM)
            ui.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
