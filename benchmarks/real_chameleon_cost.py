"""What Lumina-mGPT 7B / Anole 7B (transformers' Chameleon, 7 B; SJD, arXiv:2410.01699) cost per decoding call at full
width, without the weights: a 1-token AR step against a W-token Jacobi/SJD window, mid-image (the prompt and half of
the image's tokens cached), CFG rows (2 per image), side by side in one process.

The script builds the official configuration (`ChameleonConfig` defaults: width 4096, 32 layers, 32/32 heads, MLP
11008, vocabulary 65536, QK LayerNorm) with `--layers` of its 32 decoder layers, random weights, and times the decoder
stack (`model.model`) and the LM head apart; a full call is then head + 32 / layers x stack. Logits are taken as
lm_head(decoder hidden states), as the teacher does, since transformers' Chameleon forward masks the image-token
logits. The VQ image encoder is never called and is dropped. The cache is filled with random keys and values (their
content does not change the cost).

    python benchmarks/real_chameleon_cost.py [--layers 2] [--windows 4 16 32] [--size 768] [--threads 2]
        [--dtype float32]
"""
from __future__ import annotations

import argparse

import torch

from core.timing import cost_arguments, decoder_costs, print_cost_table

FULL_LAYERS = 32
PROMPT = 40  # a COCO prompt with Lumina-mGPT's resolution and image-start prefix


def image_tokens(size: int) -> int:
    """Lumina-mGPT's output length at `size` px: 3 leading tokens, h rows of w codes each closed by an end-of-line
    token (16 px per code), 2 closing tokens."""
    h = w = size // 16
    return 3 + h * (w + 1) + 2


def main() -> None:
    from transformers import ChameleonConfig, ChameleonForConditionalGeneration

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--windows", type=int, nargs="+", default=[4, 16, 32])
    ap.add_argument("--size", type=int, default=768, choices=[512, 768, 1024])
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    args, device = cost_arguments(ap)
    dtype = getattr(torch, args.dtype)
    outputs = image_tokens(args.size)
    context = PROMPT + outputs // 2  # mid-image: the prompt and half of the outputs
    cfg = ChameleonConfig(num_hidden_layers=args.layers, vocabulary_map={})  # the image-token map is never read
    torch.manual_seed(0)
    with torch.device(device):  # random init on the target device, in the target dtype
        model = ChameleonForConditionalGeneration._from_config(cfg, dtype=dtype).eval()
    model.model.vqmodel = None
    costs = decoder_costs(model.model, model.lm_head, cfg, layers=args.layers, full_layers=FULL_LAYERS,
                          context=context, widths=args.windows, repeats=args.repeats, device=device, dtype=dtype)
    print(f"Lumina-mGPT 7B / Anole 7B decoder ({FULL_LAYERS} layers extrapolated from {args.layers}; width "
          f"{cfg.hidden_size}, {cfg.num_attention_heads}/{cfg.num_key_value_heads} heads, vocabulary "
          f"{cfg.vocab_size}), {args.size} px ({outputs} outputs), {args.device}, {args.dtype}, {args.threads} "
          f"threads, CFG rows 2, {context} positions cached, median of {args.repeats}")
    print_cost_table(costs, args.layers)
    print(f"{outputs} AR steps at this cost ~ {outputs * costs[1][2] / 60:.1f} min per image; SJD's 2.22x fewer steps "
          f"(paper, Table 1, Lumina-mGPT on COCO) pay off in wall time where a window costs less than 2.22 steps")


if __name__ == "__main__":
    main()
