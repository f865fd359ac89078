"""Latency statistics from per-batch wall times (the harness times; methods never do)."""
from __future__ import annotations

import argparse
import statistics
import time
from contextlib import contextmanager

import torch

from core.latency import percentile
from core.names import SEC_PER_SAMPLE


@contextmanager
def stopwatch(device: torch.device, out: list[float]):
    """Append the wall time of the block to `out`, waiting for queued device work on both ends."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    yield
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    out.append(time.perf_counter() - t0)


def cost_arguments(ap: argparse.ArgumentParser) -> tuple[argparse.Namespace, torch.device]:
    """The options every full-size cost script shares (--device, --threads, --repeats) added and parsed; torch's
    thread count set. Returns the parsed arguments and the device."""
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    return args, torch.device(args.device)


def decoder_costs(stack, head, config, *, layers: int, full_layers: int, context: int, widths: list[int],
                  repeats: int, device: torch.device, dtype: torch.dtype, rows: int = 2
                  ) -> dict[int, tuple[float, float, float]]:
    """What a transformers decoder costs per call at full width, for a 1-token step and each W-token window: `stack`
    (the base model, `layers` of its `full_layers` decoder layers) and `head` (the LM head) timed apart over a
    `DynamicCache` holding `context` positions of random keys and values (their content does not change the cost),
    `rows` rows (CFG: 2 per image), each call rolled back as SJD rolls back rejected drafts.
    Returns {width: (stack seconds, head seconds, full model seconds = head + full_layers / layers x stack)}."""
    from transformers import DynamicCache

    kv, dim = config.num_key_value_heads, config.hidden_size // config.num_attention_heads
    with torch.inference_mode():
        cache = DynamicCache()
        for layer in range(layers):
            k = torch.randn(rows, kv, context, dim, device=device, dtype=dtype)
            cache.update(k, torch.randn_like(k), layer)

        def step(width):
            ids = torch.randint(config.vocab_size, (rows, width), device=device)
            mask = torch.ones(rows, context + width, dtype=torch.long, device=device)
            positions = torch.arange(context, context + width, device=device).expand(rows, -1)

            def run():
                stack(input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=cache,
                      use_cache=True)
                cache.crop(-width)
            return run

        def lm_head(width):
            h = torch.randn(rows, width, config.hidden_size, device=device, dtype=dtype)
            return lambda: head(h)

        costs = {}
        for w in [1, *widths]:
            s, hd = median_seconds(step(w), repeats, device), median_seconds(lm_head(w), repeats, device)
            costs[w] = (s, hd, hd + full_layers / layers * s)
    return costs


def print_cost_table(costs: dict[int, tuple[float, float, float]], layers: int) -> None:
    """`decoder_costs` as a markdown table, each call against the 1-token step."""
    print(f"| call | {layers} layers s | LM head s | full model s (est.) | vs a 1-token step |\n|---|---|---|---|---|")
    for w, (s, hd, full) in costs.items():
        print(f"| {w}-token {'step' if w == 1 else 'window'} | {s:.4f} | {hd:.4f} | {full:.3f} | "
              f"{full / costs[1][2]:.2f}x |")


def median_seconds(fn, repeats: int, device: torch.device) -> float:
    """The median wall time of `fn()` over `repeats` calls after one warm-up call (the benchmark scripts')."""
    fn()
    times: list[float] = []
    for _ in range(repeats):
        with stopwatch(device, times):
            fn()
    return statistics.median(times)


def latency_stats(batch_seconds: list[float], batch_sizes: list[int],
                  ranks: list[int] | None = None) -> dict[str, float]:
    """An arm's speed from its batches' wall times. With several ranks (`ranks[i]` drew batch i, in parallel with the
    others): the per-sample and per-batch medians are the median of each rank's own median, the throughput is the
    ranks' throughputs summed (`samples_per_sec`) and each rank's (`samples_per_sec_rank<r>`); p90s pool every batch."""
    # plain floats, not numpy: bench.runner calls this on import, and the cost path (`make gpu-bench`) imports it
    t = [float(s) for s in batch_seconds]
    per_sample = [s / n for s, n in zip(t, batch_sizes)]  # the last batch may be smaller
    owner = [0] * len(t) if ranks is None else [int(r) for r in ranks]
    by_rank = {r: [i for i, o in enumerate(owner) if o == r] for r in sorted(set(owner))}
    throughput = {r: sum(float(batch_sizes[i]) for i in ix) / sum(t[i] for i in ix) for r, ix in by_rank.items()}
    stats = {
        "sec_per_batch_median": statistics.median([statistics.median([t[i] for i in ix]) for ix in by_rank.values()]),
        "sec_per_batch_p90": percentile(t, 90),
        SEC_PER_SAMPLE: statistics.median([statistics.median([per_sample[i] for i in ix]) for ix in by_rank.values()]),
        "sec_per_sample_p90": percentile(per_sample, 90),
        "samples_per_sec": sum(throughput.values()),
    }
    if len(by_rank) > 1:
        stats.update({f"samples_per_sec_rank{r}": v for r, v in throughput.items()})
    return stats
