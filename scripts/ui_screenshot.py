"""A real browser's view of `accelbench ui`: start the MLflow UI on a store, open an experiment's page in headless
Chromium (Debian's `chromium`), and save a screenshot of what it shows first (it should be the runs table).

usage: python scripts/ui_screenshot.py --tracking-uri sqlite:///mlflow.db --experiment accelbench-default out.png
"""
from __future__ import annotations

import argparse
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--hide-scrollbars"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(url: str, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while True:
        try:
            urllib.request.urlopen(url, timeout=2).read()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise SystemExit(f"the MLflow UI did not answer at {url} within {seconds:g} s")
            time.sleep(1)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", help="PNG file to write")
    ap.add_argument("--tracking-uri", default="sqlite:///mlflow.db")
    ap.add_argument("--experiment", default="accelbench-default")
    ap.add_argument("--size", default="1600,1000", help="window size W,H")
    ap.add_argument("--wait", type=float, default=20.0, help="seconds of virtual time the page gets to render")
    args = ap.parse_args()
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        raise SystemExit("no chromium on PATH (Debian: apt-get install chromium)")
    from bench.tracking import runs_table_urls

    port = free_port()
    if args.experiment not in dict(runs_table_urls(args.tracking_uri, "")):
        raise SystemExit(f"no AccelBench experiment {args.experiment!r} in {args.tracking_uri}")
    ui = subprocess.Popen([sys.executable, "-m", "cli", "ui", "--tracking-uri", args.tracking_uri,
                           "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(f"http://127.0.0.1:{port}/", 180)
        url = dict(runs_table_urls(args.tracking_uri, f"http://127.0.0.1:{port}"))[args.experiment]
        with tempfile.TemporaryDirectory() as profile:
            subprocess.run([chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--window-size={args.size}",
                            f"--virtual-time-budget={int(args.wait * 1000)}", f"--screenshot={args.out}", url],
                           check=True, capture_output=True, timeout=300)
        print(f"{url} -> {args.out}")
    finally:
        ui.terminate()
        ui.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
