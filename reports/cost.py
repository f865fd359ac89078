"""The cost table (`accelbench suite FILE --cost`, `bench.cost`): each row's parameters, GFLOPs, NFE and latency per
sample beside the paper's, from the experiment's cost runs alone.

GFLOPs are shown in both conventions: the papers', a multiply-add counted once (fvcore's; DiT's 118.6 a forward, ARD
Table 1), i.e. GMACs, and the hardware one, a multiply and an add (torch's FlopCounterMode, which the cost mode counts
with: twice the GMACs). `speed-up FLOPs` is the reference arm's FLOPs over the method's, a speed-up that no
machine's noise moves.
"""
from __future__ import annotations

from core.names import NFE_PER_SAMPLE, SKIPPED_TAG
from core.paper import COST_KEYS
from reports.tables import TrialRun, natural, shown_knobs

LATENCY = "latency_per_sample_median"
TRAIN_LABEL = "training iteration (ms / sample / iteration)"


def _count(n: float | None) -> str:
    """A parameter count as the papers print it: 98.3M, 310M, 1.03B (three significant digits)."""
    if n is None:
        return "—"
    return f"{n / 1e9:.3g}B" if n >= 1e9 else f"{n / 1e6:.3g}M"


def _num(x: float | None, digits: int = 1) -> str:
    return "—" if x is None else f"{x:,.{digits}f}"


def _delta(ours: float | None, paper: float | None) -> str:
    if ours is None or paper is None or paper == 0:
        return "—"
    return f"{100 * (ours / paper - 1):+.2f} %"


def _latency(m: dict, prefix: str = "") -> str:
    if prefix + LATENCY not in m:
        return "—"
    noisy = " ⚠ noisy" if m.get(prefix + "latency_noisy") else ""
    return (f"{1000 * m[prefix + LATENCY]:.3g} (p90 {1000 * m[prefix + 'latency_per_sample_p90']:.3g}, CV "
            f"{m[prefix + 'latency_cv_pct']:.1f} %, batch {m[prefix + 'latency_batch']:.0f}){noisy}")


def cost_table(runs: list[TrialRun]) -> list[str]:
    """A row per cost run (the latest of each setting), the method arm's figures beside the paper's and the reference
    arm's FLOPs and latency as speed-ups; below it a row per extra arm of the run (SDTT's GPT-2 and same-steps
    arms), its own figures against the same reference arm, and one for the training's iteration where it was timed
    (`bench.cost.time_training`: its latency is seconds per sample per iteration)."""
    latest: dict = {}
    for r in sorted(runs, key=lambda r: r.start_time_ms):
        latest[(r.teacher, r.method, tuple(sorted(r.knobs.items())), r.seed)] = r
    head = ["teacher", "method", "knobs", "NFE", "paper NFE", "params", "paper params", "Δ params", "GFLOPs (MACs)",
            "GFLOPs (2 per MAC)", "paper GFLOPs", "Δ GFLOPs", "speed-up FLOPs", "latency ms / sample", "paper ms",
            "how counted"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for key in sorted(latest, key=lambda k: natural(str(k))):
        r = latest[key]
        m, paper = r.metrics, r.paper
        ref_gmacs = m.get("ref/gmacs_per_sample")
        extra = sorted({k.split("/")[0] for k in m if k.endswith(("/gmacs_per_sample", "/" + LATENCY))} - {"ref"})
        for arm in ["", *extra]:
            prefix, mine = (f"{arm}/", {}) if arm else ("", paper)
            gmacs = m.get(prefix + "gmacs_per_sample")
            how = r.tags.get(f"cost.how.{arm or 'method'}", "") or (
                f"not counted: {r.tags.get(SKIPPED_TAG, 'no arm was counted')}")
            lines.append("| " + " | ".join([
                r.teacher, f"{r.method}: {TRAIN_LABEL if arm == 'train' else arm + ' arm'}" if arm else r.method,
                shown_knobs(r, list(latest.values())),
                _num(m.get(prefix + NFE_PER_SAMPLE), 1), _num(mine.get("nfe"), 0) if "nfe" in mine else "—",
                _count(m.get(prefix + COST_KEYS["params"])), _count(mine.get("params")),
                _delta(m.get(prefix + COST_KEYS["params"]), mine.get("params")),
                _num(gmacs), _num(None if gmacs is None else 2 * gmacs), _num(mine.get("gflops")),
                _delta(gmacs, mine.get("gflops")), f"{ref_gmacs / gmacs:.2f}×" if gmacs and ref_gmacs else "—",
                _latency(m, prefix), "—" if mine.get("latency") is None else f"{1000 * mine['latency']:.3g}",
                how]) + " |")
    return lines


def cost_markdown(runs: list[TrialRun], title: str) -> str:
    devices = sorted({r.tags.get("gpu") or r.tags.get("device", "unknown") for r in runs})
    return "\n".join([
        f"# {title}", "", "What each row costs at full size with seeded random weights (`accelbench suite FILE "
        "--cost`): a forward pass costs the same whatever the weights. NFE and FLOPs per sample are counted on one "
        "sample (torch's FlopCounterMode); GFLOPs (MACs) count a multiply-add once, as the papers do, GFLOPs (2 per "
        "MAC) as hardware counts them (a multiply and an add), and the paper's column and Δ are in the papers' "
        "convention; "
        "params are those the method's networks read while sampling; Δ is ours over the paper's, in %. "
        "speed-up FLOPs: the teacher's reference sampler over the method. Latency (where measured): the latency "
        "protocol (core/latency.py) on " + ", ".join(devices) + "; ⚠ noisy: its CV exceeds the protocol's bound.",
        "", *cost_table(runs), *_nfe_footnote(runs), ""])


def _nfe_footnote(runs: list[TrialRun]) -> list[str]:
    """How NFE is counted where a paper counts it otherwise: MDLM's sampler ends with a noise-removal pass after its
    last step (`teachers.families.masked_diffusion`), which SDTT's step counts (its figures' x axes) leave out."""
    if not any(r.tags.get("family") == "masked-diffusion-lm" for r in runs):
        return []
    return ["", "NFE counts every forward pass of the network. On the masked-diffusion rows that includes MDLM's "
            "noise-removal pass after the last step, so a row of n steps counts n + 1 (16 steps: 17); the papers' NFE "
            "there (SDTT's step counts) are the steps alone."]

