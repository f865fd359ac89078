"""ARD (arXiv:2504.11295) and its DiT teacher family on an untrained tiny DiT: the KV-cached sampler against the
teacher-forced pass, the special cases N = 0 (step distillation) and S = 1 (KD), knots, FLOPs and DDIM."""
import pytest
import torch

from core.cache import Cache
from core.config import build_config
from core.errors import UserError
from methods.ard import ARD, KD, ARDConfig, StepDistill, knot_states, time_labels
from methods.ard_student import ARDStudent
from teachers.families import ode_diffusion
from tests.fakes import NO_CHECKPOINTS, make_config, tiny_dit_teacher


def _student(teacher, S=3, N=2, mask="M4", time_embed="adaln_tokenwise"):
    torch.manual_seed(0)
    s = ARDStudent(teacher.network, S, N, mask, time_embed, [999.0, 600.0, 300.0][:S] if S <= 3 else
                   [999 * (S - k) / S for k in range(S)]).eval()
    for p in s.parameters():  # break the symmetry of the copied heads and the teacher init
        p.data.add_(0.05 * torch.randn_like(p))
    return s


@pytest.mark.parametrize("mask", ["M1", "M2", "M3", "M4"])
@pytest.mark.parametrize("N", [0, 1, 3])
@pytest.mark.parametrize("time_embed", ["adaln_tokenwise", "additive"])
def test_kv_cached_sampler_equals_the_teacher_forced_pass(mask, N, time_embed):
    teacher = tiny_dit_teacher()
    student = _student(teacher, S=3, N=N, mask=mask, time_embed=time_embed)
    g = torch.Generator().manual_seed(1)
    inputs, y = torch.randn(5, 3, 1, 8, 8, generator=g), torch.randint(10, (5,), generator=g)
    with torch.no_grad():
        forced = student(inputs, y)
        cached = student.rollout(inputs[:, 0], y, inputs=inputs)
    assert (forced - cached).abs().max() < 1e-5


def test_history_changes_the_output_only_where_the_mask_lets_it():
    student = _student(tiny_dit_teacher(), S=3, N=2, mask="M3")  # step 2 sees the noise and itself, not step 1
    g = torch.Generator().manual_seed(2)
    a, y = torch.randn(2, 3, 1, 8, 8, generator=g), torch.randint(10, (2,), generator=g)
    b = a.clone()
    b[:, 1] += 1.0
    c = a.clone()
    c[:, 0] += 1.0
    with torch.no_grad():
        oa, ob, oc = student(a, y), student(b, y), student(c, y)
    assert torch.equal(oa[:, 2], ob[:, 2]) and not torch.allclose(oa[:, 2], oc[:, 2])
    assert torch.equal(oa[:, 0], ob[:, 0])  # causal: input 1 never reaches output 0


def test_n_zero_is_step_distillation_on_the_same_code_path(tmp_path):
    teacher = tiny_dit_teacher()
    g = torch.Generator().manual_seed(3)
    inputs, y = torch.randn(4, 3, 1, 8, 8, generator=g), torch.randint(10, (4,), generator=g)
    with torch.no_grad():
        no_history = _student(teacher, N=0, mask="M4")(inputs, y)
        block_diagonal = _student(teacher, N=3, mask="M1")(inputs, y)
    assert torch.equal(no_history, block_diagonal)  # same weights (same seed), same computation
    # The registered baseline is ARD with N = 0: trained and sampled, it gives ARD(N = 0)'s numbers exactly.
    knobs = dict(steps=4, student_steps=2, n_traj=16, train_steps=3, batch=4)
    cond = teacher.conditions(3, torch.Generator().manual_seed(0))
    outs = []
    for method in (StepDistill(teacher, make_config(StepDistill.Config, **knobs)),
                   ARD(teacher, make_config(ARDConfig, history_layers=0, mask="M1", **knobs))):
        method.fit(cache=Cache(tmp_path), checkpoints=NO_CHECKPOINTS)
        outs.append(method.sample(cond, generator=torch.Generator().manual_seed(4)).data)
    assert torch.equal(outs[0], outs[1])
    with pytest.raises(UserError, match="history_layers"):
        build_config(StepDistill.Config, {"history_layers": 1}, owner="step-distill")


def test_one_step_is_kd_the_teacher_network_plus_one_head():
    teacher = tiny_dit_teacher()
    student = ARDStudent(teacher.network, 1, 0, "M4", "adaln_tokenwise", [999.0]).eval()
    x, y = torch.randn(3, 1, 8, 8), torch.tensor([0, 4, 9])
    with torch.no_grad():
        assert torch.allclose(student.rollout(x, y)[:, 0], teacher.network(x, torch.full((3,), 999), y), atol=1e-6)
    assert len(student.heads) == 1 and KD.Config().student_steps == 1


def test_knots_and_time_labels():
    assert knot_states("uniform", 25, 4) == [0, 6, 12, 18, 25]  # DiT timesteps 999, 749, 500, 250
    ts = ode_diffusion.ddim_timesteps(25)  # the timestep of each state before its step; the last state is the sample
    # the released loaders' DDIM loop indices 15, 10, 5 (4 steps) and 10 (2 steps): 999 -> 624 -> 416 -> 208 -> 0
    assert [ts[j] for j in knot_states("released", 25, 4)[:-1]] == [999, 624, 416, 208]
    assert [ts[j] for j in knot_states("released", 25, 2)[:-1]] == [999, 416]
    assert knot_states("released", 25, 4) == [0, 9, 14, 19, 25]
    assert time_labels("uniform", 25, 4) == [999.0, 749.0, 500.0, 250.0]
    assert time_labels("released", 25, 4) == [999.0, 749.25, 499.5, 249.75]
    assert knot_states("uniform", 25, 1) == [0, 25]
    with pytest.raises(UserError, match="knots"):
        knot_states("released", 25, 3)
    with pytest.raises(UserError, match="knots"):
        knot_states("uniform", 3, 3)  # two knots on one teacher state


def test_extra_flops_are_the_history_attention_and_nothing_else(tmp_path):
    teacher = tiny_dit_teacher()
    base = dict(steps=4, student_steps=3, n_traj=8, train_steps=1, batch=2)
    flops = {}
    for N, mask in ((0, "M1"), (2, "M4"), (2, "M3")):
        method = ARD(teacher, make_config(ARDConfig, history_layers=N, mask=mask, **base))
        flops[(N, mask)] = method.fit(cache=Cache(tmp_path), checkpoints=NO_CHECKPOINTS)
    assert flops[(0, "M1")]["extra_flops_vs_teacher_step"] == 0.0  # step distillation costs a teacher forward
    L, d = teacher.network.cfg.tokens, teacher.network.cfg.hidden
    for (N, mask), visible_blocks in (((2, "M4"), 0 + 1 + 2), ((2, "M3"), 0 + 1 + 1)):
        extra = (flops[(N, mask)]["student_gflops_per_step"] - flops[(0, "M1")]["student_gflops_per_step"]) * 1e9
        # QK^T and AV over the extra keys: 2 products x 2 FLOPs per MAC x L x L x d per layer and history block
        assert extra * 3 == pytest.approx(N * 2 * 2 * L * L * d * visible_blocks)


def test_ddim_trajectory_and_reference_sampler():
    teacher = tiny_dit_teacher()
    cond = teacher.conditions(4, torch.Generator().manual_seed(0))
    x_T = torch.randn(4, 1, 8, 8, generator=torch.Generator().manual_seed(1))
    tr = ode_diffusion.ddim(lambda x, t: teacher.eps(x, t, cond, cfg=1.5), x_T, 5)
    assert tr.states.shape == (6, 4, 1, 8, 8) and tr.x0_preds.shape == (5, 4, 1, 8, 8)
    assert tr.timesteps == [999, 749, 500, 250, 0] and torch.equal(tr.states[0], x_T)
    assert torch.allclose(tr.states[-1], tr.x0_preds[-1])  # the last step lands on its own x0-prediction
    s = ode_diffusion.SamplingConfig(steps=5, cfg=1.5)
    out = ode_diffusion.sample_ddim(teacher, cond, s, generator=torch.Generator().manual_seed(1))
    assert torch.equal(out.data, tr.states[-1]) and out.counters["nfe"] == 4 * 5  # deterministic given the noise


def test_discriminator_finetune_runs_and_its_adaptive_weight_is_the_gradient_ratio(tmp_path):
    from methods.ard_gan import Discriminator, adaptive_weight

    teacher = tiny_dit_teacher()
    disc = Discriminator(teacher.network)
    x, y = torch.randn(3, 1, 8, 8), torch.tensor([1, 2, 3])
    assert disc(x, y).shape == (3, teacher.network.cfg.depth * teacher.network.cfg.tokens)
    assert not any(p.requires_grad for p in disc.teacher.parameters())  # the teacher stays frozen
    w = torch.randn(4, requires_grad=True)
    loss_r, loss_g = (w * 2).sum(), (w * 0.5).sum()  # gradients 2 and 0.5 per entry: norms 4 and 1
    assert adaptive_weight(loss_r, loss_g, w, 10.0).item() == pytest.approx(10 * 4 / (1 + 1e-4))
    knobs = dict(steps=4, student_steps=2, n_traj=16, train_steps=2, batch=4)
    plain = ARD(teacher, make_config(ARDConfig, **knobs))
    gan = ARD(teacher, make_config(ARDConfig, gan_steps=2, gan_warmup=1, **knobs))
    info = gan.fit(cache=Cache(tmp_path), checkpoints=NO_CHECKPOINTS)
    plain.fit(cache=Cache(tmp_path), checkpoints=NO_CHECKPOINTS)
    assert {"gan_loss_r", "gan_loss_g", "gan_loss_d", "gan_weight"} <= set(info) and info["gan_weight"] > 0
    assert not torch.equal(gan.student.heads[-1].linear.weight, plain.student.heads[-1].linear.weight)
