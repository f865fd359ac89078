"""What VAR costs per scale at full size, without the weights (random ones): each of the 10 next-scale passes of the
teacher's sampler with its KV cache, CFG rows (2 per image), against one pass over all 680 token positions (what a
one-step Distilled Decoding student of the same size costs), side by side in one process.

    python benchmarks/real_var_cost.py [--depth 16] [--threads 2] [--repeats 3] [--device cpu]
"""
from __future__ import annotations

import argparse

import torch

from core.timing import cost_arguments, median_seconds
from teachers.networks.var import VAR, VARConfig


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--depth", type=int, default=16, choices=[16, 20, 24, 30])
    args, device = cost_arguments(ap)
    cfg = VARConfig(depth=args.depth)
    torch.manual_seed(0)
    net = VAR(cfg).to(device).eval()
    labels = torch.tensor([1, cfg.num_classes], device=device)  # a class and the null class: CFG rows
    cond = net.class_emb(labels)
    inputs = [net.first_input(cond)] + [torch.randn(2, pn * pn, cfg.width, device=device) for pn in cfg.patch_nums[1:]]

    def sampler():  # the 10 scales, each attending to the cached earlier ones
        caches = [{} for _ in net.blocks]
        for x in inputs:
            net.step(x, cond, caches)

    def scale(si):
        def run():
            caches = [{} for _ in net.blocks]
            for x in inputs[:si]:  # the earlier scales' keys and values (not timed apart: measured as a difference)
                net.step(x, cond, caches)
        return run

    x_all = torch.randn(2, cfg.L, cfg.width, device=device)

    def one_pass():  # every position at once, no mask: a one-step student's forward
        caches = [{} for _ in net.blocks]
        net.step(x_all, cond, caches)

    with torch.inference_mode():
        prefix = [median_seconds(scale(si), args.repeats, device) if si else 0.0
                  for si in range(len(cfg.patch_nums) + 1)]
        total = median_seconds(sampler, args.repeats, device)
        full = median_seconds(one_pass, args.repeats, device)
    n_params = sum(p.numel() for p in net.parameters())
    print(f"VAR-d{args.depth} ({n_params / 1e6:.1f} M parameters), {cfg.L} tokens in {len(cfg.patch_nums)} scales, "
          f"{args.device}, {args.threads} threads, CFG rows 2, median of {args.repeats}")
    print("| call | seconds |\n|---|---|")
    for si, pn in enumerate(cfg.patch_nums):
        print(f"| scale {si + 1} ({pn}x{pn} tokens, cache of the earlier ones) | {prefix[si + 1] - prefix[si]:.4f} |")
    print(f"| the teacher's 10-scale sampler (transformer only) | {total:.4f} |")
    print(f"| one pass over all {cfg.L} positions (a one-step DD student) | {full:.4f} |")
    print(f"the 10 scale passes cost {total / full:.2f}x one full pass")


if __name__ == "__main__":
    main()
