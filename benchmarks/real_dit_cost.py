"""What the DiT-XL/2 teacher and its ARD student cost per step at full size, without the weights (random ones): FLOPs
and the median time of a DDIM teacher step (one CFG-batched forward pass, the reference arm's unit) and of an ARD
student step (its S-step rollout divided by S, KV history included), side by side in one process.

    python benchmarks/real_dit_cost.py [--image-size 256] [--device cpu] [--threads 2] [--repeats 3]
"""
from __future__ import annotations

import argparse
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from core.timing import cost_arguments, median_seconds
from methods.ard import ARDConfig, time_labels
from methods.ard_student import ARDStudent
from teachers.networks.dit import DiT
from teachers.pretrained.dit import xl2_config


def flops(fn) -> float:
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:  # fused kernels are not counted
        fn()
    return counter.get_total_flops()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--image-size", type=int, default=256)
    args, device = cost_arguments(ap)
    cfg = xl2_config(args.image_size)
    torch.manual_seed(0)
    teacher = DiT(cfg).to(device).eval().requires_grad_(False)
    a = ARDConfig()  # the paper's student: 4 steps, history in the lower layers, mask M4, from 25 teacher steps
    student = ARDStudent(teacher, a.student_steps, a.history_layers, a.mask, a.time_embed,
                         time_labels(a.knots, a.sampling.steps, a.student_steps)).to(device).eval()
    x = torch.randn(1, cfg.channels, cfg.image_size, cfg.image_size, device=device)
    y, t = torch.zeros(1, dtype=torch.long, device=device), torch.full((1,), 500, device=device)

    def teacher_step():  # DDIM with CFG: conditional and unconditional halves in one batch
        teacher(torch.cat([x, x]), torch.cat([t, t]), torch.cat([y, torch.full_like(y, cfg.n_classes)]))

    def student_rollout():
        student.rollout(x, y)

    with torch.inference_mode():
        f_teacher, f_student = flops(teacher_step), flops(student_rollout) / a.student_steps
        s_teacher = median_seconds(teacher_step, args.repeats, device)
        s_student = median_seconds(student_rollout, args.repeats, device) / a.student_steps
    n_params = sum(p.numel() for p in teacher.parameters())
    print(f"DiT-XL/2 at {args.image_size} px ({cfg.tokens} tokens, {n_params / 1e6:.1f} M parameters), "
          f"{args.device}, {args.threads} threads, median of {args.repeats}")
    print("| step | GFLOPs | seconds |\n|---|---|---|")
    print(f"| teacher DDIM step (CFG, batch 2) | {f_teacher / 1e9:.1f} | {s_teacher:.3f} |")
    print(f"| ARD student step (batch 1, mean of {a.student_steps}) | {f_student / 1e9:.1f} | {s_student:.3f} |")
    print(f"25 teacher steps / {a.student_steps} student steps: {25 * f_teacher / (a.student_steps * f_student):.1f}x "
          f"fewer FLOPs, {25 * s_teacher / (a.student_steps * s_student):.1f}x less time")


if __name__ == "__main__":
    main()
