"""Each SJD-style method's law against the teacher's, on an enumerable table model: certified or refuted.

    python benchmarks/lossless_audit.py [--draws 20000] [--seed 0]

The table model (`tests/fakes.py` TableAR: every prefix its own random next-token law, CFG 1.5) has 81 sequences of
4 tokens over 3 codes, 216 of 3 over 6 for the lossy rules (whose groups and neighbourhoods need more codes), or 64 of
6 binary tokens for SJD-PAC's components (a tree and a main path after it need a window of 5); ZipAR's rows run on
the untrained GPT of `tests/fakes.py` over 3 rows of 2 binary tokens (64 images), their floor ZipAR at a window of the
row length, which is AR decoding. Each
method draws `--draws` sequences; the table gives the chi-square p-value against the exact law (rare sequences
pooled, `tests/test_sjd.py`), and the total-variation distance of the empirical law from the exact one beside SJD's at
the same draws, the noise floor of that estimate (SJD is exact: its TV is sampling error alone). A lossy setting's
TV above the floor is its distortion; the knob rows show how it grows with the relaxation.
"""
from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from pathlib import Path

import torch
from scipy.stats import chisquare

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the table model and the pooling are the tests'

from core.config import build_config  # noqa: E402
from core.registry import METHODS  # noqa: E402
from tests.fakes import TableAR, tiny_gpt_teacher  # noqa: E402
from tests.test_sjd import COND, POOL, exact_law, pooled  # noqa: E402

EXACT = [  # (label, method, knobs) on the 3-code table
    ("sjd", "sjd", {"window": 3}),
    ("scd gumbel exact", "scd", {"window": 3, "ar_tail": 2, "mode": "exact"}),
    ("scd gumbel released", "scd", {"window": 3, "ar_tail": 2, "mode": "released"}),
    ("scd maximal exact", "scd", {"window": 4, "init": "repeat-left", "coupling": "maximal", "mode": "exact"}),
    ("scd maximal released", "scd", {"window": 4, "init": "repeat-left", "coupling": "maximal"}),
    ("sjd-pac drafting exact", "sjd-pac", {"window": 4, "tree_width": 2, "tree_depth": 2, "continuation": False,
                                          "mode": "exact"}),
    ("sjd-pac drafting released", "sjd-pac", {"window": 4, "tree_width": 2, "tree_depth": 2, "continuation": False}),
]
LOSSY = [  # on the 6-code table: the defaults, then the relaxation knob
    ("gsd defaults", "gsd", {"window": 3}),
    *((f"gsd below=above=2 p_gap={g}", "gsd", {"window": 3, "below": 2, "above": 2, "p_gap": g, "distance": 4.0})
      for g in (0.05, 0.15, 0.3, 1.0)),
    ("lantern defaults (k 1000, delta 0.1)", "sjd", {"window": 3, "verify": "lantern"}),
    *((f"lantern k=3 delta={d}", "sjd", {"window": 3, "verify": "lantern", "lantern_k": 3, "lantern_delta": d})
      for d in (0.05, 0.1, 0.2, 0.4)),
    *((f"lantern++ k=3 lambda={lam}", "sjd", {"window": 3, "verify": "lantern", "lantern_k": 3,
                                              "lantern_lambda": lam}) for lam in (2.0, 5.0)),
]
PAC = [  # on six binary tokens, where a window of 5 leaves a main path after the tree for continuation to act on
    *((f"sjd-pac {part} {mode}", "sjd-pac", {"window": 5, **knobs, "mode": mode})
      for part, knobs in (("drafting", {"tree_width": 2, "tree_depth": 2, "continuation": False}),
                          ("continuation", {"tree_width": 1, "tree_depth": 1}),
                          ("both", {"tree_width": 2, "tree_depth": 2})) for mode in ("exact", "released")),
]


ZIPAR = [  # on the untrained GPT over 3 rows of 2 binary tokens at temperature 4 (its laws are near one-hot at 1)
    ("zipar window 2 (the row: AR)", "zipar", {"window": 2, "temperature": 4.0}),
    ("zipar window 1", "zipar", {"window": 1, "temperature": 4.0}),
]
GPT_COND = torch.tensor([[7, 7]])


def audit(teacher, name: str, knobs: dict, draws: int, seed: int) -> tuple[float, float, float]:
    """(chi-square p, TV of the empirical law from the exact one, seconds)."""
    cls = METHODS.get(name)
    method = cls(teacher, build_config(cls.Config, {"cfg": 1.5, **knobs}, owner=name))
    table = isinstance(teacher, TableAR)
    cond = COND if table else GPT_COND
    exact = (teacher.exact_distribution(method.config.sampling) if table
             else exact_law(teacher, cond, method.config.sampling))
    g, t0 = torch.Generator().manual_seed(seed), time.perf_counter()
    counts = Counter(tuple(method.sample(cond, generator=g).data[0].tolist()) for _ in range(draws))
    seconds = time.perf_counter() - t0
    tv = 0.5 * sum(abs(counts[k] / draws - exact.get(k, 0.0)) for k in set(exact) | set(counts))
    if any(exact.get(k, 0.0) == 0.0 for k in counts):
        return 0.0, tv, seconds
    return float(chisquare(*pooled(exact, counts, draws, POOL)).pvalue), tv, seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--draws", type=int, default=20000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"{args.draws} draws per row, seed {args.seed}\n")
    print("| table | method | chi-square p | TV from the exact law | SJD's TV (noise floor) | s |")
    print("|---|---|---:|---:|---:|---:|")
    tables = [(f"{codes}^{length}", TableAR(vocab=codes, seq_len=length, grid=(length,)), rows,
               ("sjd", {"window": 3})) for codes, length, rows in ((3, 4, EXACT), (6, 3, LOSSY), (2, 6, PAC))]
    tables.append(("2^(3x2) GPT", tiny_gpt_teacher(vocab=2, grid=(3, 2)), ZIPAR, ZIPAR[0][1:]))
    for label_t, teacher, rows, exact in tables:
        _, floor, _ = audit(teacher, *exact, args.draws, args.seed + 1)
        for label, name, knobs in rows:
            p, tv, seconds = audit(teacher, name, knobs, args.draws, args.seed)
            print(f"| {label_t} | {label} | {p:.3g} | {tv:.4f} | {floor:.4f} | {seconds:.0f} |", flush=True)


if __name__ == "__main__":
    main()
