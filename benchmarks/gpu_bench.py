"""`make gpu-bench`: the cost mode's latency of every paper suite's rows on this device, at full size with random
weights, under the latency protocol at each row's timed batch (`latency_batch`) and precision; each timed arm's
per-pass cost written for the dry run (`bench/costs/<device kind>.recorded.yaml`) and a markdown table of our
latencies beside the papers' latencies and GFLOPs (`results/gpu-bench/<device kind>.md`).

It needs torch and PyYAML only (no MLflow: a GPU box lent for minutes has neither our venv nor a store), and stops
starting rows when its time budget is spent, listing the rows it did not reach. Rows whose teacher has no full-size
random build, or that repeat a setting already timed, are skipped. FLOPs and parameters are counted by
`accelbench suite FILE --cost` on any machine (they do not depend on the device).

    python benchmarks/gpu_bench.py [--suites suites/papers/*.yaml] [--budget 480] [--out results/gpu-bench]
"""
from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.cost import Record, record_costs, time_arms  # noqa: E402
from bench.dryrun import COSTS, device_kind  # noqa: E402
from bench.plan import run_name  # noqa: E402
from bench.suite import load_suite  # noqa: E402
from core import files  # noqa: E402
from core.cache import Cache  # noqa: E402
from core.latency import LatencyProtocol  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--suites", nargs="+", type=Path, default=sorted((ROOT / "suites" / "papers").glob("*.yaml")))
    ap.add_argument("--budget", type=float, default=480.0, help="seconds; no row starts after (default 480 = 8 min)")
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "gpu-bench")
    ap.add_argument("--costs", type=Path, default=COSTS, help="where the per-pass costs are recorded")
    ap.add_argument("--cache-dir", type=Path, default=ROOT / ".cache-gpu-bench", help="for a zoo teacher's files")
    # the protocol's floors, smaller than a trial's so that every paper's rows fit the budget on one GPU
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--min-count", type=int, default=5)
    ap.add_argument("--min-seconds", type=float, default=0.5)
    args = ap.parse_args()
    protocol = LatencyProtocol(warmup=args.warmup, min_count=args.min_count, min_seconds=args.min_seconds)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    kind, start = device_kind(device), time.monotonic()
    record = Record(args.costs, shlex.join(["python", "benchmarks/gpu_bench.py", *sys.argv[1:]]))
    rows, seen, skipped = [], set(), []
    for suite_path in args.suites:
        with files.audit():  # nothing is read: the teachers are built at random
            suite = load_suite(str(suite_path), checkpoints=ROOT / "checkpoints")
        for p in suite.plans:
            pretrained = getattr(p.teacher_cls, "checkpoints", None) is not None  # a zoo teacher has its own files
            if p.tasks or (pretrained and getattr(p.teacher_cls, "random", None) is None):
                continue
            key = (p.trial.teacher, p.trial.method, repr(p.config), p.trial.latency_batch, p.trial.dtype)
            if key in seen:
                continue
            seen.add(key)
            if time.monotonic() - start > args.budget:
                skipped.append(f"{suite_path.stem}: {run_name(p)}")
                continue
            arms = time_arms(p, protocol, cache=Cache(args.cache_dir))
            record_costs(p, arms, record)
            rows.append((suite_path.stem, p, arms))
            print(f"{suite_path.stem}: {run_name(p)}: " + ", ".join(
                f"{name} {1000 * a.latency.median / a.latency.batch:.2f} ms" for name, a in arms.items()), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{kind}.md"
    path.write_text(table(rows, skipped, device, protocol, time.monotonic() - start))
    print(f"table: {path}\ncosts: {args.costs / f'{kind}.recorded.yaml'}")


def table(rows, skipped, device, protocol: LatencyProtocol, seconds: float) -> str:
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    lines = [f"# Latency on {name} (`make gpu-bench`, {seconds / 60:.1f} min)", "",
             f"Full size, random weights, each row's precision and timed batch; the latency protocol with "
             f"{protocol.warmup} warm-up calls and at least {protocol.min_count} timed calls and "
             f"{protocol.min_seconds} s per arm, arms interleaved. ms per sample: the median call over its batch; "
             f"⚠: CV above {protocol.cv_bound:g} %. The "
             "papers' GFLOPs count a multiply-add once; ours are in the cost mode's COST.md.", "",
             "| suite | row | batch | ms / sample (p90, CV) | teacher arm ms | speed-up | paper ms | paper speed-up | "
             "paper GFLOPs |", "|---|---|---|---|---|---|---|---|---|"]
    for suite, p, arms in rows:
        m, r = arms["method"].latency, arms["ref"].latency
        ours, ref = m.median / m.batch, r.median / r.batch
        paper = p.paper
        flag = " ⚠" if m.noisy or r.noisy else ""
        lines.append(
            f"| {suite} | {run_name(p)} | {m.batch} | {1000 * ours:.3g} ({1000 * m.p90 / m.batch:.3g}, {m.cv:.1f} %)"
            f"{flag} | {1000 * ref:.3g} | {ref / ours:.2f}× | "
            + (f"{1000 * paper['latency']:.3g}" if "latency" in paper else "—") + " | "
            + (f"{paper['speedup_wall']:g}×" if "speedup_wall" in paper else "—") + " | "
            + (f"{paper['gflops']:g}" if "gflops" in paper else "—") + " |")
    if skipped:
        lines += ["", f"Not reached within the budget ({len(skipped)} rows): " + "; ".join(skipped) + "."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
