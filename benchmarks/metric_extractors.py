"""Cost of the image-metric extractors: reference statistics (cold and cached) and scoring 1,000 samples.

For each extractor (the dataset classifier, the FID Inception-v3 when installed, the small CLIP) on each dataset
present, in one process: the time to build the reference features of the test split from an empty cache, to load
them again from the cache, and to score N generated images (here: train-split images standing in for samples) with
FID (+ KID / precision / recall for the image extractors, CLIP score for CLIP).

    python benchmarks/metric_extractors.py [--n 1000] [--threads 1] [--datasets digits fashion-mnist]
"""
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import torch

from core.cache import Cache
from core.errors import UserError
from core.registry import METRICS
from teachers.data.images import caption_table, load_image_dataset

SIZES = {"digits": 16, "fashion-mnist": 28}  # the registered teachers' image sizes


def _timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def _teacher(dataset: str) -> SimpleNamespace:
    """What a metric reads from a teacher: the dataset, the image size and the caption of each condition."""
    captions = [row[0] for row in caption_table(dataset)]
    return SimpleNamespace(dataset_name=dataset, image_size=SIZES[dataset],
                           captions=lambda cond: [captions[int(c)] for c in cond.view(-1)])


def bench(dataset: str, spec: str, n: int, cache: Cache, checkpoints: Path) -> dict:
    name, _, extractor = spec.partition("@")
    cls = METRICS.get(name)
    reason = cls.check(extractor or None, checkpoints)
    if reason:
        return {"metric": spec, "dataset": dataset, "skipped": reason}
    teacher = _teacher(dataset)
    train = load_image_dataset(dataset, "train", teacher.image_size)
    idx = torch.randperm(len(train.labels), generator=torch.Generator().manual_seed(0))[:n]
    images, labels = train.images[idx], train.labels[idx]
    cpu = torch.device("cpu")
    metric, build = _timed(lambda: cls(teacher, cache=cache, device=cpu, checkpoints=checkpoints,
                                           extractor=extractor or None))
    # Image metrics compute their reference lazily (KID, P/R) or in __init__ (FID); touch it either way.
    _, reference = _timed(lambda: getattr(metric, "reference", None))
    _, cached = _timed(lambda: cls(teacher, cache=cache, device=cpu, checkpoints=checkpoints,
                                           extractor=extractor or None))

    def score():
        metric.reset()
        for b in range(0, n, 256):
            metric.update(images[b:b + 256], labels[b:b + 256])
        return metric.compute()

    values, scoring = _timed(score)
    return {"metric": spec, "dataset": dataset, "extractor": metric.extractor, "build_s": build + reference,
            "cached_build_s": cached, "score_s": scoring, "n": n, "values": values}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--datasets", nargs="+", default=list(SIZES))
    ap.add_argument("--metrics", nargs="+", default=["fid", "kid", "precision", "fid@inception", "clip"])
    ap.add_argument("--checkpoints", type=Path, default=Path("checkpoints"), help="folder of the metrics' files")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        cache = Cache(tmp)  # empty: the first build of each extractor and reference is timed cold
        for dataset in args.datasets:
            for spec in args.metrics:
                try:
                    r = bench(dataset, spec, args.n, cache, args.checkpoints)
                except UserError as exc:
                    r = {"metric": spec, "dataset": dataset, "skipped": str(exc)}
                if "skipped" in r:
                    print(f"{dataset:14} {spec:15} skipped: {r['skipped']}")
                    continue
                vals = ", ".join(f"{k}={v:.4g}" for k, v in r["values"].items())
                print(f"{dataset:14} {spec:15} extractor+reference {r['build_s']:7.1f} s "
                      f"(cached {r['cached_build_s']:5.2f} s)  score {r['n']} images {r['score_s']:7.2f} s  [{vals}]",
                      flush=True)


if __name__ == "__main__":
    main()
