"""Names that cross layers: the MLflow metric keys and run tags the harness writes and the suites, studies, CLI and
reports read back. Spelled here once, in the foundation, so that every layer imports the same string.

An arm other than the method's carries its arm as a prefix (`ref/sec_per_sample_median`).
"""
from __future__ import annotations

# an arm's speed (`core.timing`, `bench.runner`)
SEC_PER_SAMPLE = "sec_per_sample_median"
NFE_PER_SAMPLE = "nfe_per_sample"
# an arm's arithmetic per sample (`bench.runner`): torch's FlopCounterMode counts a multiply-add as 2 FLOPs; the
# papers' "GFLOPs" (DiT's 118.6 for a DiT-XL/2 forward, ARD Table 1) count it once, as `macs_per_sample` does
FLOPS_PER_SAMPLE = "flops_per_sample"
MACS_PER_SAMPLE = "macs_per_sample"
# the method against the reference arm
SPEEDUP_WALL = "speedup_wall"
SPEEDUP_STEPS = "speedup_steps"
SPEEDUP_FLOPS = "speedup_flops"
SPEEDUPS = {SPEEDUP_WALL: SEC_PER_SAMPLE, SPEEDUP_STEPS: NFE_PER_SAMPLE, SPEEDUP_FLOPS: FLOPS_PER_SAMPLE}
"""Each speed-up is the reference arm's value of its per-arm metric over the method's."""

KIND_TAG = "accelbench.kind"  # what a run is: one of the kinds below
TRIAL, STUDY, TRAINING, LAMBADA = "trial", "study", "training", "lambada"
KNOBS_TAG = "accelbench.knobs"  # the trial's knobs, comma-separated, logged as params under their own names
HEADLINE_TAG = "accelbench.headline"  # "true" on a paper method's run at its default key knobs
