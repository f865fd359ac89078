"""Names that cross layers: the MLflow metric keys and run tags the harness writes and the suites, studies, CLI and
reports read back. Spelled here once, in the foundation, so that every layer imports the same string.

An arm other than the method's carries its arm as a prefix (`ref/sec_per_sample_median`).
"""
from __future__ import annotations

# an arm's speed (`core.timing`, `bench.runner`)
SEC_PER_SAMPLE = "sec_per_sample_median"
NFE_PER_SAMPLE = "nfe_per_sample"
# the method against the reference arm
SPEEDUP_WALL = "speedup_wall"
SPEEDUP_STEPS = "speedup_steps"
SPEEDUP_FLOPS = "speedup_flops"  # the reference arm's FLOPs per sample over the method's (`bench.cost`)

KIND_TAG = "accelbench.kind"  # what a run is: one of the kinds below
TRIAL, STUDY, TRAINING, LAMBADA, COST = "trial", "study", "training", "lambada", "cost"
SKIPPED_TAG = "cost.skipped"  # on a cost run: why its row was not counted (COST.md lists it with the reason)
KNOBS_TAG = "accelbench.knobs"  # the trial's knobs, comma-separated, logged as params under their own names
HEADLINE_TAG = "accelbench.headline"  # "true" on a paper method's run at its default key knobs
