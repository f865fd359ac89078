"""What CSpD's real pair costs per call at full size, without the weights (random ones): MAR-H's or MAR-L's (the
target's, `--target`) and MAR-B's (the draft's) encoder-decoder pass over 256 tokens at a mid-generation step (128
known), CFG rows 2 per image, and each one's DiffLoss head chain for one token at MAR's 100 steps, side by side in
one process; then what a round of gamma tokens costs in each CSpD mode against gamma steps of the target alone (heads
included):
- the target alone: gamma (pass + head);
- `released`: gamma draft (pass + head) + 1 target pass (prefix only) + gamma target heads;
- `exact` / `paper`: gamma draft (pass + head) + 1 target pass over gamma + 1 known sets + gamma target heads.

    python benchmarks/real_mar_cost.py [--target mar_huge|mar_large] [--gammas 4 8 16 32] [--threads 2] [--repeats 3]
        [--device cpu]
"""
from __future__ import annotations

import argparse

import torch

from core.timing import cost_arguments, median_seconds
from teachers.families import masked_ar
from teachers.families.continuous_ar import TokenNoise
from teachers.networks.mar import MAR
from teachers.pretrained.mar import MARH

# the released checkpoints' DiffLoss (width, depth): LTH14/mar README's commands (--diffloss_w, --diffloss_d)
HEADS = {"mar_huge": (1536, 12), "mar_large": (1280, 8), "mar_base": (1024, 6)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="mar_huge", choices=["mar_huge", "mar_large"])
    ap.add_argument("--gammas", type=int, nargs="+", default=[4, 8, 16, 32])
    args, device = cost_arguments(ap)
    torch.manual_seed(0)
    s = masked_ar.SamplingConfig(steps=100, cfg=3.2, final_noise=False)  # MAR-H's evaluation settings
    cost, n_params = {}, {}
    for name in (args.target, "mar_base"):
        w, d = HEADS[name]
        net = MAR(MARH.config(name, w, d)).to(device).eval()
        n_params[name] = sum(p.numel() for p in net.parameters())
        model = masked_ar.NetworkModel(net)
        N, D = net.cfg.seq_len, net.cfg.token_dim
        cond, tokens = torch.tensor([[1]], device=device), torch.randn(1, N, D, device=device)
        known = torch.zeros(1, N, dtype=torch.bool, device=device)
        known[:, : N // 2] = True
        z = model.condition(tokens, known, cond, guided=True)[:, 0]  # (1, branches, d)
        noise = TokenNoise.draw(1, 1, D, s.steps, torch.Generator(device=device).manual_seed(0), device)

        def passes(rows):
            return lambda: model.condition(tokens.expand(rows, -1, -1), known.expand(rows, -1), cond.expand(rows, -1),
                                           guided=True)

        cost[name, "pass"] = median_seconds(passes(1), args.repeats, device)
        cost[name, "head"] = median_seconds(lambda: model.denoise(z, noise.x_T[:, 0], noise.eps[:, 0], s, s.cfg),
                                            args.repeats, device)
        for g in args.gammas:
            if name == args.target:
                cost[name, "sets", g] = median_seconds(passes(g + 1), args.repeats, device)
    H, B = args.target, "mar_base"
    print(f"{H} ({n_params[H] / 1e6:.1f} M) / MAR-B ({n_params[B] / 1e6:.1f} M) with random weights, 256 tokens, "
          f"{args.device}, {args.threads} threads, CFG rows 2, batch 1, head 100 steps, median of {args.repeats}")
    print(f"| call | {H} s | MAR-B s |\n|---|---|---|")
    print(f"| encoder-decoder pass (128 of 256 known) | {cost[H, 'pass']:.4f} | {cost[B, 'pass']:.4f} |")
    print(f"| head chain, one token, 100 steps | {cost[H, 'head']:.4f} | {cost[B, 'head']:.4f} |")
    step = {m: cost[m, "pass"] + cost[m, "head"] for m in (H, B)}
    print(f"c = draft / target step (pass + head): {step[B] / step[H]:.3f}")
    print("\n| gamma | target pass over gamma+1 known sets s | round speed-up `released` | round speed-up `exact`, all "
          "accepted |\n|---|---|---|---|")
    for g in args.gammas:
        alone, draft = g * step[H], g * step[B]
        released = draft + cost[H, "pass"] + g * cost[H, "head"]
        exact = draft + cost[H, "sets", g] + (g + 1) * cost[H, "head"]
        print(f"| {g} | {cost[H, 'sets', g]:.3f} | {alone / released:.2f}x | {(alone + step[H]) / exact:.2f}x |")


if __name__ == "__main__":
    main()
