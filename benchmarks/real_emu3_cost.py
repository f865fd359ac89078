"""What Emu3-Gen (transformers' Emu3, 8.5 B) costs per decoding call at full width, without the weights: a 1-token AR
step against a W-token Jacobi/SJD window, mid-image (4096 image tokens cached after the prompt), CFG rows (2 per
image), side by side in one process.

The whole model (34 GB in float32) does not fit a 24 GB machine, so the script builds the official configuration
(`Emu3TextConfig` defaults: width 4096, 32 layers, 8 KV heads, vocabulary 184622) with `--layers` of its 32 decoder
layers, random weights, and times the decoder stack and the LM head apart; a full call is then
head + 32 / layers x stack. The cache is filled with random keys and values (their content does not change the cost).

    python benchmarks/real_emu3_cost.py [--layers 2] [--windows 4 16 32] [--threads 2] [--dtype float32]
"""
from __future__ import annotations

import argparse

import torch

from core.timing import cost_arguments, decoder_costs, print_cost_table

FULL_LAYERS = 32
CONTEXT = 40 + 4096  # a COCO prompt with the image prefix (~40 tokens) and half of the 8193 outputs


def main() -> None:
    from transformers import Emu3ForCausalLM, Emu3TextConfig

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--windows", type=int, nargs="+", default=[4, 16, 32])
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    args, device = cost_arguments(ap)
    dtype = getattr(torch, args.dtype)
    cfg = Emu3TextConfig(num_hidden_layers=args.layers)
    torch.manual_seed(0)
    model = Emu3ForCausalLM(cfg).to(device, dtype).eval()
    costs = decoder_costs(model.model, model.lm_head, cfg, layers=args.layers, full_layers=FULL_LAYERS,
                          context=CONTEXT, widths=args.windows, repeats=args.repeats, device=device, dtype=dtype)
    print(f"Emu3-Gen decoder ({FULL_LAYERS} layers extrapolated from {args.layers}; width {cfg.hidden_size}, "
          f"{cfg.num_attention_heads}/{cfg.num_key_value_heads} heads, vocabulary {cfg.vocab_size}), {args.device}, "
          f"{args.dtype}, {args.threads} threads, CFG rows 2, {CONTEXT} positions cached, median of {args.repeats}")
    print_cost_table(costs, args.layers)
    print(f"8193 AR steps at this cost ~ {8193 * costs[1][2] / 60:.1f} min per image; SJD's ~2.3x fewer steps "
          f"(paper, Fig. 10) pay off in wall time where a window costs less than 2.3 steps")


if __name__ == "__main__":
    main()
