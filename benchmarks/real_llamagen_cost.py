"""What a LlamaGen class-to-image GPT costs per decoding call at full size, without the weights (random ones): a
1-token AR step against a W-token Jacobi/SJD window at the middle of the image, and one Distilled Decoding pass over
every token against the AR steps it replaces; CFG batches (2 rows per image) throughout, side by side in one process.

    python benchmarks/real_llamagen_cost.py [--size GPT-XL] [--image-size 384] [--windows 4 16 32] [--threads 2]
"""
from __future__ import annotations

import argparse
import torch

from core.timing import cost_arguments, median_seconds
from teachers.networks.llamagen import SIZES, LlamaGenGPT, size_config


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="GPT-XL", choices=sorted(SIZES))
    ap.add_argument("--image-size", type=int, default=384)
    ap.add_argument("--windows", type=int, nargs="+", default=[4, 16, 32])
    args, device = cost_arguments(ap)
    cfg = size_config(args.size, (args.image_size // 16) ** 2)
    torch.manual_seed(0)
    net = LlamaGenGPT(cfg).to(device).eval()
    cond = torch.zeros(1, 1, dtype=torch.long, device=device)
    tokens = torch.randint(cfg.vocab_size, (1, cfg.seq_len), device=device)
    half = cfg.seq_len // 2

    with torch.inference_mode():
        state, _ = net.start(cond, cfg=2.0, null_id=cfg.num_classes)
        net.extend_guided(state, tokens[:, :half])  # the image half decoded: the cache holds 1 + half positions

        def step(width):
            def run():
                net.extend_guided(state, tokens[:, half : half + width])
                state.cache.truncate(1 + half)  # roll back, as SJD does with rejected drafts
            return run

        costs = {w: median_seconds(step(w), args.repeats, device) for w in [1, *args.windows]}
        full = median_seconds(lambda: net(torch.cat([cond, cond]), torch.cat([tokens, tokens])), args.repeats, device)
    n_params = sum(p.numel() for p in net.parameters())
    print(f"LlamaGen {args.size} at {args.image_size} px ({cfg.seq_len} tokens, {n_params / 1e6:.1f} M parameters), "
          f"{args.device}, {args.threads} threads, CFG batch 2, median of {args.repeats}")
    print("| call | seconds | vs a 1-token step |\n|---|---|---|")
    for w, s in costs.items():
        print(f"| {w}-token {'step' if w == 1 else 'window'} at position {half} | {s:.4f} | {s / costs[1]:.2f}x |")
    print(f"| one pass over all {cfg.seq_len} tokens (a DD step) | {full:.4f} | {full / costs[1]:.2f}x |")
    print(f"{cfg.seq_len} AR steps at the mid-image cost ~ {cfg.seq_len * costs[1]:.1f} s: one DD pass is "
          f"{cfg.seq_len * costs[1] / full:.1f}x cheaper")


if __name__ == "__main__":
    main()
