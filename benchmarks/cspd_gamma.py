"""CSpD (arXiv:2411.11925) on a digits pair (`digits-mar-c2i`, causal, or `digits-mar-masked-c2i`, MAR): acceptance and
speed-up against gamma and batch size, and a two-sample test of `exact` mode against the target alone.

Speed: for each batch size and gamma, CSpD and the target-alone sampler (the family's: `ar` or `mar`) take turns on the
same batches in one process (1 torch thread); reported are the acceptance rate alpha (accepted / verified drafts),
target and draft transformer passes per image, target/draft head chains per image, and the wall-clock ratio ar / CSpD.

Losslessness: `exact` samples and `ar` samples (different seeds) are compared by a permutation test on the MMD
(Gaussian kernel, median bandwidth) of the dataset classifier's features; its power is checked on arms that should be
told apart: the draft model alone, and `released` mode against its own target-alone arm.

    python benchmarks/cspd_gamma.py [--teacher digits-mar-c2i] [--gammas 1 2 4 8 16] [--batch-sizes 1 64]
                                    [--modes exact released] [--two-sample 360]
"""
from __future__ import annotations

import argparse
import time

import torch

from core.cache import Cache
from core.config import build_config
from core.registry import TEACHERS
from methods.cspd import CSpD
from metrics.features import embed, load_extractor


def _speed(teacher, cfg, batch: int, n: int) -> dict:
    cond = teacher.conditions(n, torch.Generator().manual_seed(0))
    method, sampling = CSpD(teacher, cfg), cfg.sampling
    g_m, g_r = torch.Generator().manual_seed(1), torch.Generator().manual_seed(1)
    own = teacher.family.sample  # the target alone
    method.sample(cond[:batch], generator=torch.Generator().manual_seed(9))  # warm-up, both arms
    own(teacher, cond[:batch], sampling, generator=torch.Generator().manual_seed(9))
    t_m = t_r = 0.0
    counts, ref_nfe = {}, 0
    for i in range(0, n, batch):
        c = cond[i : i + batch]
        t0 = time.perf_counter()
        out = method.sample(c, generator=g_m)
        t_m += time.perf_counter() - t0
        t0 = time.perf_counter()
        ref = own(teacher, c, sampling, generator=g_r)
        t_r += time.perf_counter() - t0
        for k, v in out.counters.items():
            counts[k] = counts.get(k, 0) + v
        ref_nfe += ref.counters["nfe"]
    return {"alpha": counts["drafts_accepted"] / max(1, counts["drafts_verified"]),
            "target_passes": counts["nfe"] / n, "ar_passes": ref_nfe / n, "draft_passes": counts["draft_nfe"] / n,
            "target_heads": counts["head_chains"] / n, "draft_heads": counts["draft_head_chains"] / n,
            "exhausted": counts.get("resample_exhausted", 0), "wall_speedup": t_r / t_m,
            "sec_per_image": t_m / n, "ar_sec_per_image": t_r / n}


def _mmd_permutation_test(x: torch.Tensor, y: torch.Tensor, perms: int = 500, seed: int = 0) -> tuple[float, float]:
    """Biased MMD^2 with a Gaussian kernel (median-distance bandwidth) and its permutation p-value."""
    z = torch.cat([x, y]).double()
    d2 = torch.cdist(z, z) ** 2
    k = torch.exp(-d2 / d2[d2 > 0].median())
    n = len(x)

    def mmd(idx):
        a, b = idx[:n], idx[n:]
        return k[a][:, a].mean() + k[b][:, b].mean() - 2 * k[a][:, b].mean()

    g = torch.Generator().manual_seed(seed)
    observed = mmd(torch.arange(len(z)))
    null = torch.stack([mmd(torch.randperm(len(z), generator=g)) for _ in range(perms)])
    return float(observed), float((1 + (null >= observed).sum()) / (1 + perms))


def _two_sample(teacher, n: int, cfg_scale: float, cache: Cache) -> list[tuple[str, float, float]]:
    extractor = load_extractor(None, teacher, cache=cache, device=torch.device("cpu"))
    cond = teacher.conditions(n, torch.Generator().manual_seed(0))

    def feats(samples):
        return embed(extractor, teacher.decode(samples.data), device=torch.device("cpu"))

    def arm(cfg, seed: int, model: str = "target"):
        g = torch.Generator().manual_seed(seed)
        if cfg is None:
            return feats(teacher.family.sample(teacher, cond, base.sampling, generator=g, model=model))
        return feats(CSpD(teacher, cfg).sample(cond, generator=g))

    config_cls = CSpD.config_class(teacher.family)
    base = build_config(config_cls, {"cfg": cfg_scale, "gamma": 4}, owner="cspd")
    released = build_config(config_cls, {"cfg": cfg_scale, "gamma": 4, "mode": "released", "final_noise": False},
                            owner="cspd")
    ar_a, ar_b = arm(None, 1), arm(None, 2)
    rows = [("ar vs ar (another seed): null", *_mmd_permutation_test(ar_a, ar_b)),
            ("exact vs ar", *_mmd_permutation_test(arm(base, 3), ar_a)),
            ("power: draft alone vs ar", *_mmd_permutation_test(arm(None, 4, model="draft"), ar_a))]
    base = released  # the released scheme against the target alone with MAR's deterministic last step
    rows.append(("power: released vs its ar", *_mmd_permutation_test(arm(released, 5), arm(None, 6))))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--teacher", default="digits-mar-c2i")
    ap.add_argument("--gammas", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 64])
    ap.add_argument("--modes", nargs="+", default=["exact", "released"])
    ap.add_argument("--images", type=int, default=0, help="images per setting (default: 8 at batch 1, else 2 batches)")
    ap.add_argument("--cfg", type=float, default=2.0)
    ap.add_argument("--two-sample", type=int, default=360, help="images per arm of the two-sample test (0: skip)")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    cache = Cache()
    teacher = TEACHERS.get(args.teacher).load(args.teacher, cache=cache, device=torch.device("cpu"))
    torch.set_num_threads(args.threads)
    print("| mode | batch | gamma | alpha | target passes / img (ar) | draft passes | target / draft head chains "
          "| exhausted | wall speed-up | s / img (ar) |\n|---|---|---|---|---|---|---|---|---|---|")
    for mode in args.modes:
        for batch in args.batch_sizes:
            n = args.images or (8 if batch == 1 else 2 * batch)
            for gamma in args.gammas:
                cfg = build_config(CSpD.config_class(teacher.family), {"cfg": args.cfg, "gamma": gamma, "mode": mode,
                                                "final_noise": mode == "exact"}, owner="cspd")
                r = _speed(teacher, cfg, batch, n)
                print(f"| {mode} | {batch} | {gamma} | {r['alpha']:.3f} "
                      f"| {r['target_passes']:.1f} ({r['ar_passes']:.0f}) | {r['draft_passes']:.1f} "
                      f"| {r['target_heads']:.1f} / {r['draft_heads']:.1f} | {r['exhausted']} "
                      f"| {r['wall_speedup']:.2f}x | {r['sec_per_image']:.3f} ({r['ar_sec_per_image']:.3f}) |",
                      flush=True)
    if args.two_sample:
        print(f"\nMMD permutation test on classifier features, {args.two_sample} images per arm, cfg {args.cfg}:")
        for name, stat, p in _two_sample(teacher, args.two_sample, args.cfg, cache):
            print(f"- {name}: MMD^2 {stat:.5f}, p = {p:.3f}")


if __name__ == "__main__":
    main()
