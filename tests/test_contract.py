"""One contract test over every registry entry: teachers, methods and metrics."""
import dataclasses

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from core import precision
from core.cache import Cache
from core.config import build_config, knobs
from core.errors import UserError
from teachers import teacher_class
from core.registry import METHODS, METRICS, TEACHERS
from core.samples import Samples
from bench.plan import RUN_FIELDS
from methods.base import Method, TeacherSampler
from teachers.families import ar_token, continuous_ar, masked_ar, masked_diffusion, multiscale_vq, ode_diffusion
from tests.fakes import (NO_CHECKPOINTS, LinearGaussianAR, LinearGaussianMasked, TableAR, tiny_dit_teacher,
                         tiny_emu3_teacher,
                         tiny_gpt2_folder_teacher, tiny_gpt_teacher, tiny_hf_lm_teacher, tiny_llamagen_teacher,
                         tiny_mar_teacher, tiny_masked_mar_teacher, tiny_mdlm_owt_teacher, tiny_mdlm_teacher,
                         tiny_official_dit_teacher, tiny_official_mar_teacher, tiny_text_gpt_teacher, tiny_var_teacher)
from tests.fakes_chameleon import tiny_chameleon_teacher
from tests.fakes_llamagen_t2i import tiny_llamagen_t2i_teacher

FAMILIES = (ar_token.FAMILY, continuous_ar.FAMILY, ode_diffusion.FAMILY, masked_diffusion.FAMILY,
            multiscale_vq.FAMILY, masked_ar.FAMILY)
FAKES = {ar_token.FAMILY: [TableAR, tiny_gpt_teacher, tiny_text_gpt_teacher, tiny_hf_lm_teacher, tiny_llamagen_teacher,
                         tiny_emu3_teacher, tiny_chameleon_teacher, tiny_llamagen_t2i_teacher,
                         tiny_gpt2_folder_teacher],
         continuous_ar.FAMILY: [LinearGaussianAR, tiny_mar_teacher],
         ode_diffusion.FAMILY: [tiny_dit_teacher, tiny_official_dit_teacher],
         masked_diffusion.FAMILY: [tiny_mdlm_teacher, tiny_mdlm_owt_teacher],
         multiscale_vq.FAMILY: [tiny_var_teacher],
         masked_ar.FAMILY: [LinearGaussianMasked, tiny_masked_mar_teacher, tiny_official_mar_teacher]}
NFE_KINDS = ("step", "window", "full", "student_step", "refiner_step", "lookup")  # what NFE counters count
SEQUENCE_FAMILIES = (ar_token.FAMILY, masked_diffusion.FAMILY, multiscale_vq.FAMILY)  # samples are (B, N) token ids
# Knobs that make a distillation method's `fit` take seconds on a fake teacher (defaults are for real teachers).
FAST_FIT = {"dd": {"n_pairs": 64, "train_steps": 5, "batch": 8, "solver_steps": 2},
            "onestep*": {"n_pairs": 64}, "skip-n": {"n_pairs": 64},
            **{m: {"steps": 8, "n_traj": 16, "train_steps": 2, "batch": 4} for m in ("ard", "step-distill", "kd")},
            "sdtt": {"steps": 8, "rounds": 1, "iters_per_round": 2, "batch": 4, "ar_arm": False},
            "code": {"draft_steps": 2}}  # (the release's 8 of VAR's 10 scales; the fakes have 4)


@pytest.mark.parametrize("name", TEACHERS.names())
def test_teacher_entry(name):
    cls = teacher_class(name, NO_CHECKPOINTS)
    assert cls.__doc__ and cls.family in FAKES, "every family needs a fake teacher in tests/fakes.py"
    assert cls.modality in ("image", "text")
    assert cls.key() == cls.key() and len(cls.key()) == 20
    missing = getattr(cls, "unavailable", lambda: None)()
    assert missing is None or (isinstance(missing, str) and "\n" not in missing)


@pytest.mark.parametrize("family", FAMILIES, ids=str)
def test_family_contract(family):
    """A family names its sampling config and its own sampler, registered as a method that accepts the family."""
    assert dataclasses.is_dataclass(family.SamplingConfig) and family.SamplingConfig.__dataclass_params__.frozen
    sampler = METHODS.get(family.sampler)
    assert issubclass(sampler, TeacherSampler) and family in sampler.families
    for make in FAKES[family]:
        teacher = make()
        s = family.SamplingConfig()
        cond = teacher.conditions(2, torch.Generator().manual_seed(0))
        out = family.sample(teacher, cond, s, generator=torch.Generator().manual_seed(1))
        assert isinstance(out, Samples) and len(out.data) == 2
        with precision.autocast(torch.device("cpu"), "bf16"):  # `--dtype bf16` on the CPU
            low = family.sample(teacher, cond, s, generator=torch.Generator().manual_seed(1))
        assert low.data.shape == out.data.shape and low.data.is_floating_point() == out.data.is_floating_point()
        assert low.data.float().isfinite().all() and low.counters.keys() == out.counters.keys()


@pytest.mark.parametrize("name", METHODS.names())
def test_method_entry(name, tmp_path):
    cls = METHODS.get(name)
    assert cls.__doc__ and cls.families and set(cls.modalities) <= {"image", "text"}
    if cls.fit is not Method.fit:  # what `fit` trains or reads, the cost mode stands in for
        assert cls.stand_in is not Method.stand_in, f"{cls.__name__} overrides fit but not stand_in"
    declared = {k for family in cls.families for k in knobs(cls.config_class(family))}
    assert set(cls.key_knobs) <= declared, "key knobs must be knobs (of at least one family's config)"
    for family in cls.families:
        config_cls = cls.config_class(family)
        cfg = config_cls()  # defaults are valid
        assert dataclasses.is_dataclass(cfg) and config_cls.__dataclass_params__.frozen
        assert isinstance(cls.sampling_of(cfg), family.SamplingConfig)  # what the reference arm samples with
        # no knob declared twice (a method knob named like a sampling setting) nor named like a trial field
        assert not set(knobs(config_cls)) & RUN_FIELDS
        with pytest.raises(UserError, match="no_such_knob"):
            build_config(config_cls, {"no_such_knob": 1}, owner=name)
        fast = build_config(config_cls, FAST_FIT.get(name, {}), owner=name)
        for make in FAKES[family]:
            teacher = make()
            if teacher.modality not in cls.modalities:
                continue  # an image-only method on a text fake
            if any(not hasattr(teacher, a) for a in cls.needs):  # e.g. DD's student needs a network: refused
                with pytest.raises(UserError, match="reads the teacher's"):
                    cls(teacher, fast)
                continue
            cond = teacher.conditions(1, torch.Generator().manual_seed(0))
            method = cls(teacher, fast)
            fit_info = method.fit(cache=Cache(tmp_path), checkpoints=NO_CHECKPOINTS)
            assert all(isinstance(v, float) for v in fit_info.values())
            runs = [method.sample(cond, generator=torch.Generator().manual_seed(5)) for _ in range(2)]
            out = runs[0]
            assert isinstance(out, Samples)
            if family in SEQUENCE_FAMILIES:
                assert out.data.shape == (1, teacher.seq_len) and out.data.dtype == torch.long
                drawn = out.data[out.data != multiscale_vq.SKIPPED] if family == multiscale_vq.FAMILY else out.data
                assert 0 <= drawn.min() and out.data.max() < teacher.vocab_size  # (skip-scales marks what it skips)
            elif family in (continuous_ar.FAMILY, masked_ar.FAMILY):
                assert out.data.shape == (1, teacher.seq_len, teacher.token_dim) and out.data.isfinite().all()
            else:
                assert out.data.shape == (1, *teacher.image_shape) and out.data.isfinite().all()
            steps = cls.sampling_of(fast).steps if family in (masked_diffusion.FAMILY, ode_diffusion.FAMILY) else 0
            if family == masked_diffusion.FAMILY:  # at most one pass per step, and the noise-removal pass
                assert 1 <= out.counters["nfe"] <= steps + 1 and out.counters["tokens"] == teacher.seq_len
            elif family != ode_diffusion.FAMILY:  # a sequence: at most one pass per token
                assert 1 <= out.counters["nfe"] <= teacher.seq_len and out.counters["tokens"] == teacher.seq_len
            else:  # an image: at most one pass per teacher step
                assert 1 <= out.counters["nfe"] <= steps and out.counters["tokens"] == 1
            assert torch.equal(runs[0].data, runs[1].data) and runs[0].counters == runs[1].counters
            with precision.autocast(torch.device("cpu"), "bf16"):  # `--dtype bf16` on the CPU
                low = method.sample(cond, generator=torch.Generator().manual_seed(5))
            assert low.data.shape == out.data.shape and low.data.is_floating_point() == out.data.is_floating_point()
            assert low.data.float().isfinite().all()  # (the runner spools floating samples in float32)
            # the cost mode's stand-in (random weights where `fit` trains or reads) samples without a fit
            standing = cls(teacher, fast)
            standing.stand_in()
            assert standing.sample(cond, generator=torch.Generator().manual_seed(5)).data.shape == out.data.shape
            # a declared training is what the cost mode times: an iteration of it runs at any batch size
            if (training := cls.training(fast, family, 0)) is not None:
                assert cls.trains(fast) and training.iterations >= 1 and training.batch >= 1
                assert training.kind.startswith("train ")
                step = standing.train_step(2, torch.Generator().manual_seed(0))
                step()
                with FlopCounterMode(display=False) as counter:  # an iteration computes (a no-op would count 0)
                    step()
                assert counter.get_total_flops() > 0
            else:
                assert cls.train_step is Method.train_step, f"{cls.__name__} times a training it does not declare"
            # What a dry run plans is what the method counts: its declared passes bound (or equal) its NFE.
            length = len(teacher.patch_nums) if family == multiscale_vq.FAMILY else getattr(teacher, "seq_len", 0)
            planned = cls.passes(fast, family, length)["method"]
            declared = sum(n for kind, n in planned.counts.items() if kind in NFE_KINDS)
            if planned.at_most or family == masked_diffusion.FAMILY:  # MDLM's noise-removal pass may not run
                assert out.counters["nfe"] <= declared
            else:
                assert out.counters["nfe"] == declared, (planned, out.counters)


@pytest.mark.parametrize("name", METRICS.names())
def test_metric_entry(name, cache):
    cls = METRICS.get(name)
    assert cls.__doc__ and isinstance(cls.higher_is_better, bool) and isinstance(cls.stochastic, bool)
    unavailable = cls.check(None, NO_CHECKPOINTS)
    if unavailable is not None:  # e.g. a checkpoint this machine does not have: one line saying what is missing
        assert isinstance(unavailable, str) and unavailable.startswith(name) and "\n" not in unavailable
        return
    assert cls.modality in ("image", "text")
    if cls.modality == "image":
        teacher = tiny_gpt_teacher()
        teacher.dataset_name, teacher.image_size = "digits", 16
        samples = torch.rand(8, 1, 16, 16, generator=torch.Generator().manual_seed(0))
    else:
        teacher = tiny_mdlm_teacher()
        samples = teacher.decode(teacher.training_chunks(None)[:8])
    cond = teacher.conditions(8, torch.Generator().manual_seed(0))
    metric = cls(teacher, cache=cache, device=torch.device("cpu"),
                 checkpoints=NO_CHECKPOINTS)  # the session's: extractors are built once
    metric.update(samples, cond)
    values = metric.compute(seed=0)
    assert values and all(k.startswith(name + ".") for k in values)
    assert all(isinstance(v, float) for v in values.values())
    assert metric.compute(seed=0) == values  # a function of the images and the seed
    metric.reset()
    with pytest.raises(ValueError):
        metric.compute()
