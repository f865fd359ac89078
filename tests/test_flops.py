"""FLOPs per sample (`bench.runner._count_flops`): torch's FlopCounterMode against hand counts of the matrix products,
the papers' convention (a multiply-add counted once), and a trial logging each arm's FLOPs and `speedup_flops`
without changing its samples."""
import contextlib

import pytest
import torch
from mlflow.tracking import MlflowClient
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

import cli
from bench import runner
from teachers.networks.dit import DiT, DiTConfig
from teachers.networks.gpt import GPT, GPTConfig
from teachers.pretrained.dit import xl2_config


def counted(fn, math_attention: bool = True) -> int:
    with torch.inference_mode(), FlopCounterMode(display=False) as counter:
        with sdpa_kernel(SDPBackend.MATH) if math_attention else contextlib.nullcontext():
            fn()
    return counter.get_total_flops()


def attention_flops(B: int, L: int, S: int, d: int) -> int:
    return 2 * (2 * B * L * S * d)  # scores q·k (B, H, L, S) over hd, then their product with v; H * hd = d


def gpt_hand_count(B: int, L: int, d: int, n_layer: int, vocab: int) -> int:
    """2·m·n·k per matrix product: per layer qkv, proj, the two MLP layers and attention's two batched products; the
    head. Embedding look-ups, norms, GELU, softmax and bias adds are not matrix products."""
    per_layer = 2 * B * L * d * (3 * d + d + 4 * d + 4 * d) + attention_flops(B, L, L, d)
    return n_layer * per_layer + 2 * B * L * d * vocab


def dit_hand_count(cfg: DiTConfig, B: int, freq: int = 256) -> int:
    """The patch-embedding convolution, the timestep MLP (freq -> d -> d), per block adaLN (d -> 6d, once per image),
    qkv, proj, attention, the MLP; the final adaLN (d -> 2d) and linear. The label embedding is a look-up."""
    d, L, p = cfg.hidden, cfg.tokens, cfg.patch
    embed = 2 * B * L * (cfg.channels * p * p) * d + 2 * B * (freq * d + d * d)
    block = 2 * B * d * 6 * d + 2 * B * L * d * (3 * d + d + 8 * d) + attention_flops(B, L, L, d)
    final = 2 * B * d * 2 * d + 2 * B * L * d * p * p * cfg.out_channels
    return embed + cfg.depth * block + final


def test_tiny_gpt_forward_is_counted_as_its_matmuls():
    cfg = GPTConfig(vocab_size=40, cond_vocab=11, cond_len=2, seq_len=14, n_layer=2, n_head=2, n_embd=32)
    net, B, L = GPT(cfg).eval(), 3, 16
    x = torch.randn(B, L, cfg.n_embd)
    hand = gpt_hand_count(B, L, cfg.n_embd, cfg.n_layer, cfg.vocab_size)
    assert counted(lambda: net.logits(net.trunk(x))) == hand
    # Broken variant, why the runner counts on the math kernel: the fused CPU attention kernel is not in the
    # counter's registry, so its products go uncounted.
    assert counted(lambda: net.logits(net.trunk(x)), math_attention=False) == hand - cfg.n_layer * attention_flops(
        B, L, L, cfg.n_embd)


def test_tiny_dit_forward_is_counted_as_its_matmuls():
    cfg = DiTConfig(image_size=8, channels=2, patch=2, hidden=32, depth=2, heads=2, learn_sigma=True)
    net, B = DiT(cfg).eval(), 3
    x, t, y = torch.randn(B, 2, 8, 8), torch.tensor([1, 500, 999]), torch.tensor([0, 3, 10])
    assert counted(lambda: net(x, t, y)) == dit_hand_count(cfg, B)
    assert counted(lambda: net(x[:1], t[:1], y[:1])) * B == dit_hand_count(cfg, B)  # linear in the batch


def test_dit_xl2_macs_are_the_papers_gflops():
    """ARD Table 1 / DiT Table 4: 118.6 GFLOPs a DiT-XL/2 forward at 256 px, a multiply-add counted once: the
    counter's FLOPs are twice that (shapes only: the network is built on the meta device)."""
    cfg = xl2_config(256)
    with torch.device("meta"):
        net = DiT(cfg)
        x = torch.zeros(1, cfg.channels, cfg.image_size, cfg.image_size)
        t = y = torch.zeros(1, dtype=torch.long)
    flops = counted(lambda: net(x, t, y))
    assert flops == dit_hand_count(cfg, 1)
    assert flops / 2 / 1e9 == pytest.approx(118.6, abs=0.05)


def test_trial_logs_each_arms_flops_and_speedup_without_changing_its_samples(tiny_recipe, tmp_path, monkeypatch):
    store = f"sqlite:///{tmp_path}/mlflow.db"
    args = ["run", "--tracking-uri", store, "--cache-dir", str(tmp_path / "cache"), "--warmup", "0", "--no-progress",
            "--teacher", "digits-dit-c2i", "--method", "ard", "--param", "steps=8", "--param", "n_traj=16",
            "--param", "train_steps=3", "--param", "batch=4", "--metric", "fid", "--n-samples", "6",
            "--batch-size", "4"]
    assert cli.main(args) == 0
    monkeypatch.setattr(runner, "_count_flops", lambda arms, *_: {name: {} for name in arms})
    assert cli.main(args) == 0
    client = MlflowClient(store)
    counted_run, plain = sorted(client.search_runs([client.get_experiment_by_name("accelbench").experiment_id]),
                                key=lambda r: r.info.start_time)
    m = counted_run.data.metrics
    for arm in ("", "ref/"):
        assert m[f"{arm}flops_per_sample"] > 0 and m[f"{arm}macs_per_sample"] == m[f"{arm}flops_per_sample"] / 2
    # ARD's 4 student steps against 8 DDIM steps of the teacher (2x fewer passes): a teacher pass runs both CFG
    # branches (cfg 1.5), the guidance-distilled student one, which also reads its history's keys and values
    assert m["speedup_flops"] == pytest.approx(m["ref/flops_per_sample"] / m["flops_per_sample"])
    assert m["speedup_steps"] == 2 and 3 < m["speedup_flops"] < 4
    assert "speedup_flops" not in plain.data.metrics and "flops_per_sample" not in plain.data.metrics
    hashes = {k: v for k, v in counted_run.data.tags.items() if k.startswith("samples_sha256.")}
    assert len(hashes) == 2 and hashes == {k: plain.data.tags[k] for k in hashes}
    assert m["fid.digits-cnn"] == plain.data.metrics["fid.digits-cnn"]
