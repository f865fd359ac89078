"""`make gpu-bench`: the cost mode's latency of every paper suite's rows on this device, at full size with random
weights, under the latency protocol at each row's timed batch (`latency_batch`) and precision; each timed arm's
per-pass cost written for the dry run (`bench/costs/<device kind>.recorded.yaml`, a kind per machine and precision)
and a markdown table of our latencies beside the papers' latencies and GFLOPs (`results/gpu-bench/<machine>.md`).

It runs on a GPU box lent for minutes, which has Python, torch and PyYAML and nothing else of ours (no numpy, no
metric library, no MLflow, no store): the suites are planned without their metrics (the cost mode scores nothing, and
a metric's check would ask for its weights), and nothing on the cost path imports more (tests/test_gpu_bench.py runs
this script in an interpreter that can import nothing else).

What a lent box's minutes buy, and what a killed run keeps:
- the rows run in the order of the papers' latency tables: ARD Table 1, DD Table 1, SDTT §4.4 against GPT-2 (Fig.
  22), SJD's rows (Fig. 10, Tables 1-5), then the other suites' rows in their files' order;
- an arm is timed once (`bench.cost.time_arms_once`): a later row with the same arm (ARD's DDIM-25 reference in ten
  rows, MDLM's 1024 steps in SDTT's, GPT-2 in every SDTT row with an `ar` arm, a `ddim` row's method arm that is its
  reference arm) reads its latency back instead of timing it again (marked ° in the table). The price: such an arm
  is not interleaved with the later row's other arms, so a drift of the machine between the two rows (clocks,
  temperature, a neighbour) lands in that row's speed-up, where interleaving spreads it over both arms; the protocol's
  CV still flags an arm noisy within its own calls;
- a row that raises (out of memory, a file the random build still reads, a bug) is listed in the table with its
  one-line error, and the rows after it run;
- a row whose `fit` trains also times one training iteration (`bench.cost.time_training`: float32, the paper's
  global batch, halved while it runs out of memory), once per teacher and kind of iteration (ARD's seven kinds), and
  records it for the dry run's training price; in the table, "training iteration" among the other arms, in ms per
  sample of its batch;
- the table and the recorded costs are written after every row;
- no row starts once the time budget (`--budget`, 8 minutes) is spent; the rows not reached are listed.
Rows whose teacher has no full-size random build, lm-eval rows, and rows that repeat a setting already timed are
skipped. FLOPs and parameters are counted by `accelbench suite FILE --cost` on any machine (they do not depend on the
device).

Expected time on an H100-class GPU, from the papers' own latencies (seconds an image at batch 1, the rows'
`latency_batch`) times the protocol's calls: a timed arm of t seconds a call makes 3 warm-up and max(5, 0.5 s / t)
timed calls, 8 t when t >= 0.1 s and about 0.5 s + 3 t below.
- ARD Table 1 (H100; DiT-XL/2 with CFG, 19.7 ms a step): DDIM-250 8 x 4.935 = 39.5 s (its method arm is its
  reference arm: timed once), DDIM-25 8 x 0.494 = 3.9 s (read back by the ten student rows), DDIM-4 (3 + 7) x 0.079 =
  0.8 s, DDIM-2 (3 + 13) x 0.039 = 0.6 s, the ten students (17-68 ms a call) about 0.65 s each = 6.5 s: 51 s.
- DD Table 1 (A100; a batch-1 step is launch-bound, an H100 no slower): LlamaGen-L AR 8 x 5.01 = 40 s, LlamaGen-B AR
  (not given: at most L's) 40 s, skip-106 8 x 2.94 = 23.5 s, skip-156 8 x 1.95 = 15.6 s, VAR-d16 AR 8 x 0.133 =
  1.1 s and d20, d24 (not given) about 1.5 s each, skip-1 and skip-2 (0.113, 0.098 s) 0.9 s each, the two onestep*
  (table lookups) 0.5 s each, the ten DD rows (21-43 ms) 0.6 s each: 132 s.
- ARD's seven kinds of training iteration (no paper latency: from FLOPs): an iteration is S x 119 GMACs a sample
  forward, about 3x that with the backward, over the global batch (S x batch = 256 in every row): 183 TFLOPs, 2.7 s
  at an H100's 67 float32 TFLOPS (training runs without TF32), 8 calls each: about 22 s a kind, 150 s, more where a
  batch runs out of memory and is halved (its activations at batch 64 exceed 80 GB).
So the two tables take 183 s of timed calls and ARD's trainings about 150 s, 5.5 minutes, plus planning the suites
(seconds) and building each of their 35 rows' networks at random on the GPU (about a second a row, not measured on an
H100): about 7 minutes.
SDTT and SJD give no latency in seconds (Fig. 22 is a plot, SJD's tables give ratios), so the rest is not derived:
on a bare box the rows whose networks are transformers models (SDTT's GPT-2 arm, Emu3, Lumina-mGPT, Anole) fail in
seconds with "No module named 'transformers'", and LlamaGen-T2I's AR rows draw 256 or 1,024 tokens an image at batch
1. A run lasts the budget plus the row under way when it is spent; every suite's rows would take hours.

    python benchmarks/gpu_bench.py [--suites suites/papers/*.yaml] [--budget 480] [--out results/gpu-bench]
"""
from __future__ import annotations

import argparse
import gc
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.cost import ArmCost, Record, record_costs, time_arms_once, time_training  # noqa: E402
from bench.dryrun import COSTS, device_machine, positions  # noqa: E402
from bench.plan import Plan, run_name  # noqa: E402
from bench.suite import load_suite  # noqa: E402
from core import files  # noqa: E402
from core.cache import Cache  # noqa: E402
from core.latency import LatencyProtocol  # noqa: E402

# the papers' latency tables first (ARD Table 1, DD Table 1, SDTT §4.4 against GPT-2, SJD's AR rows), then the rest
FIRST = ("ard-table1", "dd-table1", "sdtt-fig22", "sjd-fig10-tables1-5")


@dataclass
class Row:
    """One setting of a suite to time: its plan, then its arms' latencies or what it raised."""

    suite: str
    plan: Plan
    arms: dict[str, ArmCost] | None = None  # timed
    error: str | None = None  # or what it raised, in one line
    train_error: str | None = None  # what timing its training's iteration raised, in one line


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--suites", nargs="+", type=Path, default=sorted((ROOT / "suites" / "papers").glob("*.yaml")))
    ap.add_argument("--budget", type=float, default=480.0, help="seconds; no row starts after (default 480 = 8 min)")
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "gpu-bench")
    ap.add_argument("--costs", type=Path, default=COSTS, help="where the per-pass costs are recorded")
    ap.add_argument("--cache-dir", type=Path, default=ROOT / ".cache-gpu-bench", help="for a zoo teacher's files")
    # the protocol's floors, smaller than a trial's so that the papers' latency tables fit the budget on one GPU
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--min-count", type=int, default=5)
    ap.add_argument("--min-seconds", type=float, default=0.5)
    args = ap.parse_args()
    protocol = LatencyProtocol(warmup=args.warmup, min_count=args.min_count, min_seconds=args.min_seconds)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    machine, start = device_machine(device), time.monotonic()
    record = Record(args.costs, shlex.join(["python", "benchmarks/gpu_bench.py", *sys.argv[1:]]))
    rows, skipped = plan_rows(args.suites)
    path = args.out / f"{machine}.md"
    args.out.mkdir(parents=True, exist_ok=True)

    def write(reached: int, final: bool) -> None:
        path.write_text(table(rows, reached, skipped, device, protocol, time.monotonic() - start, final))

    timed: dict = {}  # every arm's latency, once per setting (`time_arms_once`)
    trained: dict = {}  # every training iteration's (`time_training`), once per teacher and kind
    cache, reached = Cache(args.cache_dir), 0
    write(reached, final=False)
    for row in rows:
        if time.monotonic() - start > args.budget:
            break
        try:
            arms = time_arms_once(row.plan, protocol, timed, cache=cache)
            record_costs(row.plan, arms, record)
            row.arms = arms
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # one row's failure (out of memory, a file, a bug) leaves the others to run
            row.error = one_line(exc)
        finally:
            gc.collect()  # the row's networks, before the next row's are built
            if device.type == "cuda":
                torch.cuda.empty_cache()
        if row.arms is not None and (training := row.plan.method_cls.training(
                row.plan.config, row.plan.teacher_cls.family, positions(row.plan) or 0)) is not None:
            try:  # its own failure (a batch that does not fit even halved) keeps the row's sampling latencies
                key = (row.plan.trial.teacher, training.kind)  # one iteration's cost, whatever else the row sets
                if key not in trained:
                    trained[key] = time_training(row.plan, protocol, cache=cache)
                    record_costs(row.plan, {"train": trained[key]}, record)
                row.arms["train"] = trained[key]
            except KeyboardInterrupt:
                raise
            except BaseException as exc:
                row.train_error = one_line(exc)
            finally:
                gc.collect()
                if device.type == "cuda":
                    torch.cuda.empty_cache()
        reached += 1
        write(reached, final=False)
        print(f"{row.suite}: {run_name(row.plan)}: " + (f"failed: {row.error}" if row.error else ", ".join(
            f"{name} {ms(a, ' ms')}" for name, a in row.arms.items())), flush=True)
    write(reached, final=True)
    print(f"table: {path}\ncosts: {args.costs}/{machine}-<dtype>.recorded.yaml")


def plan_rows(paths: list[Path]) -> tuple[list[Row], list[str]]:
    """Every suite's rows to time, in the papers' latency tables' order (`FIRST`), each setting once; and what was
    left out: a suite that did not load (its one-line error), lm-eval rows, teachers with no full-size random build."""
    rows, seen, skipped, no_random = [], set(), [], set()
    for path in paths:
        try:
            with files.audit():  # nothing is read: the teachers are built at random
                suite = load_suite(str(path), checkpoints=ROOT / "checkpoints", fields={"metrics": []})
        except KeyboardInterrupt:
            raise
        except BaseException as exc:
            skipped.append(f"{path.stem}: not loaded ({one_line(exc)})")
            continue
        for p in suite.plans:
            t = p.trial
            pretrained = getattr(p.teacher_cls, "checkpoints", None) is not None  # a zoo teacher has its own files
            if pretrained and getattr(p.teacher_cls, "random", None) is None:
                no_random.add(t.teacher)
            if p.tasks or t.teacher in no_random:
                continue
            key = (t.teacher, repr(sorted(t.teacher_params.items())), t.method, repr(p.config), t.latency_batch,
                   t.dtype, t.tf32, t.compile)
            if key not in seen:
                seen.add(key)
                rows.append(Row(path.stem, p))
    if no_random:
        skipped.append(f"no full-size random build: {', '.join(sorted(no_random))}")
    order = {stem: i for i, stem in enumerate(FIRST)}
    return sorted(rows, key=lambda r: order.get(r.suite, len(FIRST))), skipped


def one_line(exc: BaseException) -> str:
    """`Type: first line of the message`, short, with no character that would break a markdown table's row."""
    first = (str(exc).strip().splitlines() or [""])[0]
    return f"{type(exc).__name__}: {first}"[:200].replace("|", "/")


def table(rows: list[Row], reached: int, skipped: list[str], device, protocol: LatencyProtocol, seconds: float,
          final: bool) -> str:
    """The markdown table of the rows before `reached` (timed or failed), the papers' numbers beside them, and the
    rows not reached: written before every row, so a killed run leaves what it measured."""
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    when = f"{seconds / 60:.1f} min" if final else f"{seconds / 60:.1f} min so far: running, or killed"
    lines = [f"# Latency on {name} (`make gpu-bench`, {when})", "",
             f"Full size, random weights, each row's precision and timed batch; the latency protocol with "
             f"{protocol.warmup} warm-up calls and at least {protocol.min_count} timed calls and "
             f"{protocol.min_seconds} s per arm, arms interleaved. ms per sample: the median call over its batch; "
             f"⚠: CV above {protocol.cv_bound:g} %; °: the arm's timing from an earlier row or another arm of the "
             "row (the same sampler and settings), not interleaved with this row's. The papers' GFLOPs count a "
             "multiply-add once; ours are in the cost mode's COST.md.", "",
             "| suite | row | batch | ms / sample (p90, CV) | teacher arm ms | speed-up | other arms ms | paper ms | "
             "paper speed-up | paper GFLOPs |", "|---|---|---|---|---|---|---|---|---|---|"]
    for row in rows[:reached]:
        paper = row.plan.paper
        papers = (("%.3g" % (1000 * paper["latency"]) if "latency" in paper else "—") + " | "
                  + (f"{paper['speedup_wall']:g}×" if "speedup_wall" in paper else "—") + " | "
                  + (f"{paper['gflops']:g}" if "gflops" in paper else "—"))
        if row.arms is None:
            lines.append(f"| {row.suite} | {run_name(row.plan)} | {row.plan.trial.latency_batch or 1} | "
                         f"failed: {row.error} | — | — | — | {papers} |")
            continue
        m, r = row.arms["method"], row.arms["ref"]
        ours, ref = m.latency.median / m.latency.batch, r.latency.median / r.latency.batch
        flag = " ⚠" if m.latency.noisy or r.latency.noisy else ""
        others = ", ".join([*(f"{'training iteration' if n == 'train' else n} {ms(a)}" for n, a in row.arms.items()
                              if n not in ("method", "ref")),
                            *([f"training iteration failed: {row.train_error}"] if row.train_error else [])]) or "—"
        lines.append(f"| {row.suite} | {run_name(row.plan)} | {m.latency.batch} | {ms(m)} "
                     f"({1000 * m.latency.p90 / m.latency.batch:.3g}, {m.latency.cv:.1f} %){flag} | {ms(r)} | "
                     f"{ref / ours:.2f}× | {others} | {papers} |")
    if reached < len(rows):
        why = "within the budget" if final else "yet"
        lines += ["", f"Not reached {why} ({len(rows) - reached} rows): "
                  + "; ".join(f"{r.suite}: {run_name(r.plan)}" for r in rows[reached:]) + "."]
    if skipped:
        lines += ["", "Not timed: " + "; ".join(skipped) + "."]
    return "\n".join(lines) + "\n"


def ms(a: ArmCost, unit: str = "") -> str:
    """An arm's median ms per sample (a training iteration's: per sample of its batch), ° when its timing is another
    arm's (`time_arms_once`)."""
    own = a.how == "timed" or a.how.startswith("timed: one ")  # `time_training`'s
    return f"{1000 * a.latency.median / a.latency.batch:.3g}{unit}" + ("" if own else " °")


if __name__ == "__main__":
    main()
