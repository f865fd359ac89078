"""What SDTT's setting costs at full size, without the weights: one MDLM-OWT denoiser step (169.6 M parameters, all 1024
tokens at once) against GPT-2 small (124 M) generating the same 1024 tokens with its KV cache, batch 1, side by side
in one process; and the step count at which an MDLM sample costs what the AR sample does.

    python benchmarks/real_mdlm_cost.py [--length 1024] [--threads 2] [--repeats 3] [--device cpu]
"""
from __future__ import annotations

import argparse
import time

import torch

from core.timing import cost_arguments, median_seconds
from teachers.networks.mdlm_dit import MDLMDiT, MDLMDiTConfig


def main() -> None:
    from transformers import DynamicCache, GPT2Config, GPT2LMHeadModel

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--length", type=int, default=1024)
    args, device = cost_arguments(ap)
    L = args.length
    torch.manual_seed(0)
    mdlm = MDLMDiT(MDLMDiTConfig(length=L)).to(device).eval()
    gpt2 = GPT2LMHeadModel(GPT2Config(n_positions=max(1024, L + 1))).to(device).eval()
    z = torch.full((1, L), mdlm.cfg.vocab_size - 1, device=device)  # all MASK: the first step

    def ar_sample():  # L tokens after BOS, one cached forward each, greedy (the draw is not what is timed)
        cache, ids = DynamicCache(), torch.full((1, 1), 50256, device=device)
        for _ in range(L):
            logits = gpt2(input_ids=ids, past_key_values=cache, use_cache=True).logits[:, -1]
            ids = logits.argmax(-1, keepdim=True)

    with torch.inference_mode():
        step = median_seconds(lambda: mdlm(z), args.repeats, device)
        ar_sample()  # warm-up
        times = []
        for _ in range(max(1, args.repeats // 3)):
            t0 = time.perf_counter()
            ar_sample()
            if device.type == "cuda":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
    ar = sorted(times)[len(times) // 2]
    n_mdlm = sum(p.numel() for p in mdlm.parameters()) / 1e6
    n_gpt2 = sum(p.numel() for p in gpt2.parameters()) / 1e6
    print(f"MDLM-OWT ({n_mdlm:.1f} M) vs GPT-2 ({n_gpt2:.1f} M), {L} tokens, batch 1, {args.device}, {args.threads} "
          f"threads, random weights")
    print("| call | seconds |\n|---|---|")
    print(f"| one MDLM step ({L} tokens) | {step:.3f} |")
    print(f"| GPT-2, {L} tokens with the KV cache | {ar:.3f} ({ar / L * 1e3:.1f} ms per token) |")
    print(f"an MDLM sample of T steps costs T x {step:.3f} s: it matches the AR sample at T = {ar / step:.1f} steps "
          f"(SDTT's students sample in 16-64)")


if __name__ == "__main__":
    main()
