"""`sdtt`: Self-Distillation Through Time (Deschenaux & Gulcehre, arXiv:2410.21035, ICLR 2025) for MDLM teachers.

One student step is trained to match `distill_steps` (m/k = 2) ancestral steps of the teacher; rounds halve the step
count, each round's student becoming the next round's teacher (paper §3, Algorithms 1-2, Eq. 7):
- targets, Algorithm 1 (`teacher_targets`): from z_t, run the teacher for m/k ancestral steps of size Delta at times
  t_i = max(t - i Delta, 1e-5); every token unmasked at step i takes that step's teacher log-probs as its target,
  tokens still masked at the end take the last step's;
- a round, Algorithm 2 (`SDTT._round`): x_0 from the training chunks, antithetic t, z_t = mask(x_0), the student's
  single SUBS prediction against the targets on z_t's masked positions under the divergence; AdamW (0.9, 0.999, no
  weight decay), clip 1.0, warm-up then constant lr, EMA of the weights (not reset between rounds);
- rounds (Eq. 7): round r distils T_r = steps / 2^r teacher steps (Delta_r = (1 - 1e-5) / T_r) into T_r / 2; between
  rounds the teacher becomes the student's current (non-EMA) weights and the optimiser carries on, as the released
  code does. Sampling uses the EMA weights.
Every round's student is cached (keyed by everything that determines it), so a trial with `rounds = 3` reuses the
round-2 student of an earlier trial and the students of every round can be evaluated.

`student=<folder>` takes one of SDTT's released students instead (`methods.sdtt_released`: a revision of the Hugging
Face repo jdeschena/sdtt, e.g. `baselines_kld_step_70000`, the reverse-KL student after round 7): nothing is
trained, and `divergence`, `distill_steps` and `rounds` are the release's, so the run's parameters say which student
it was. It samples with the released sampler (core/sampling/ancestral.py `MultiRoundSDTT.sample`), which is the
family's ancestral sampler: the same log-linear move chances, the same final argmax over real tokens when masks
remain, no nucleus, no cache (`cache` stays the teacher's setting: the same samples, fewer passes).

Every arm draws each step's tokens the same way, the family's `draw` setting (`md.DRAWS`): the reference arm samples
with `sampling`, the student and the same-step arm with `student_sampling`, a copy of it. The paper suites draw as the
released code does, by a float32 exponential race (`released-fp32`); `exact` (float64) is the named mode of SDTT's
App. A float64 runs. Drawing the student one way and the teacher the other would bias the comparison: the float32
race lowers gen-PPL (Zheng et al. 2024a; SDTT App. A). The distillation targets (`teacher_targets`) draw exactly.
"""
from __future__ import annotations

import copy
import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

import torch
import torch.nn.functional as F

from core import distributed
from core.cache import Cache, keyed
from core.config import config_dict
from core.errors import UserError
from core.rng import seeded
from core.samples import Samples
from core.training import ema_update, optimizer_step
from methods import sdtt_released as released
from methods.base import Method, Passes, TeacherSampler, Training
from teachers import load_teacher, teacher_class
from teachers.families import ar_token
from teachers.families import masked_diffusion as md

Divergence = Literal["kld", "kld-fwd", "mse", "tvd", "tvd-log"]
STUDENT_VERSION = 1  # bump when training code changes what a config produces
RANK_SEED_STRIDE = 7919  # rank k of a `ddp` round draws from seed + k * this (rank 0: the one-process seed)


def divergence(student: torch.Tensor, target: torch.Tensor, kind: Divergence) -> torch.Tensor:
    """Mean over tokens of delta(student || target), both (N, K) log-probs (paper App. B, Eqs. 9-11):
    - kld: reverse KL, sum p_s (log p_s - log p_t) — the paper's choice (F.kl_div as in the released code);
    - kld-fwd: forward KL, sum p_t (log p_t - log p_s) (in the code, not reported);
    - mse: mean over the K entries of (log p_s - log p_t)^2 (Eq. 11, F.mse_loss as in the code);
    - tvd: 1/2 sum |p_s - p_t| (Eq. 10);
    - tvd-log: sum |log p_s - log p_t|, the released code's `_tvd` (no 1/2, log space).
    """
    if kind == "kld":
        return F.kl_div(target, student, log_target=True, reduction="batchmean")
    if kind == "kld-fwd":
        return F.kl_div(student, target, log_target=True, reduction="batchmean")
    if kind == "mse":
        return F.mse_loss(student, target)
    if kind == "tvd":
        return 0.5 * (student.exp() - target.exp()).abs().sum(-1).mean()
    if kind == "tvd-log":
        return (student - target).abs().sum(-1).mean()
    raise ValueError(f"unknown divergence {kind!r}")


@torch.no_grad()
def teacher_targets(denoise, z: torch.Tensor, t: torch.Tensor, delta: float, n_steps: int, mask_id: int,
                    generator: torch.Generator | None) -> torch.Tensor:
    """Algorithm 1: the teacher's log-probs (B, L, K) that produced each token of z (B, L) over `n_steps` ancestral
    steps of size `delta` from times t (B,); tokens never unmasked get the last step's log-probs."""
    target = None
    for i in range(n_steps):
        t_i = (t - i * delta).clamp(min=md.SAMPLING_EPS)
        logp = denoise(z)
        target = torch.zeros_like(logp) if target is None else target
        z_new = md.reverse_step(logp, z, t_i, (t_i - delta).clamp(min=0.0), mask_id, generator)
        changed = z_new != z
        target[changed] = logp[changed]
        z = z_new
    still = z == mask_id
    target[still] = logp[still]
    return target


@dataclass(frozen=True)
class SDTTConfig:
    # `steps` (a sampling setting) is the teacher's step count T_0: the reference arm samples with it and round 1
    # distils it into T_0 / 2. The student samples with `student_steps` (0 = T_0 / 2^rounds) and the same `cache`.
    sampling: md.SamplingConfig = md.SamplingConfig(steps=64)
    student_steps: int = 0
    rounds: int = 3
    distill_steps: int = 2  # m/k: teacher steps per student step
    divergence: Divergence = "kld"
    # The paper trains 10k iterations of batch 128 per round on GPUs. A batch-32 iteration of the wordnet MDLM
    # (teacher targets included) takes ~0.56 s on 2 threads, ~0.71 s on 1: 3 rounds of 500 fit in 14-18 min.
    iters_per_round: int = 500
    batch: int = 32
    lr: float = 3e-4
    lr_warmup: int = 50  # iterations of linear learning-rate warm-up
    ema: float = 0.999
    train_seed: int = 0
    # the causal LM with a KV cache, trained on the same chunks, sampled in the same run as the "ar" arm
    ar_arm: bool = True
    ar_top_p: float = 1.0
    # Data-parallel distillation over the ranks of a torchrun trial (`core.distributed`), as the released code trains
    # (Lightning DDP, a global batch of 128 over its devices): each rank draws its own share of every global batch of
    # `batch` (its own chunks, times and teacher steps), gradients averaged. The student then depends on the rank
    # count, which its cache key holds (above one rank).
    ddp: bool = False
    # A released student: a folder of the checkpoints folder holding one revision of jdeschena/sdtt; empty: distil.
    student: str = ""
    release: ClassVar[Any] = None  # the student's `sdtt_released.Release` (read, or told by the folder's name)

    def __post_init__(self):
        for name in ("rounds", "iters_per_round", "batch"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.distill_steps < 2:
            raise ValueError(f"distill_steps must be >= 2, got {self.distill_steps}")
        if not self.student and self.sampling.steps % self.distill_steps ** self.rounds:
            raise ValueError(f"steps={self.sampling.steps} must be divisible by distill_steps^rounds = "
                             f"{self.distill_steps ** self.rounds}")
        if self.student_steps < 0 or self.lr_warmup < 0:
            raise ValueError(f"student_steps and lr_warmup must be >= 0, got {self.student_steps}, {self.lr_warmup}")
        if not (self.lr > 0 and 0 <= self.ema < 1 and 0 < self.ar_top_p <= 1):
            raise ValueError(f"need lr > 0, 0 <= ema < 1, 0 < ar_top_p <= 1; got {self.lr}, {self.ema}, "
                             f"{self.ar_top_p}")

    def _take_release(self, release: "released.Release") -> None:
        """The release's divergence, m/k and round (its folder's name) replace the knobs' defaults; a knob set to
        something else contradicts the student, in one line. What the release does not say, the knob keeps."""
        fields = {f.name: f.default for f in dataclasses.fields(self)}
        for name, value in (("divergence", release.divergence), ("distill_steps", release.distill_steps),
                            ("rounds", release.round)):
            if value is None:
                continue
            if getattr(self, name) not in (fields[name], value):
                raise ValueError(f"student {self.student!r} has {name}={value} (its release); got "
                                 f"{name}={getattr(self, name)}")
            object.__setattr__(self, name, value)
        object.__setattr__(self, "release", release)

    @property
    def student_sampling(self) -> md.SamplingConfig:
        """The student's sampler: `student_steps` (0 = T_0 / (m/k)^rounds, T_0 the release's first step count for a
        released student: 1024 / 2^7 = 8 after round 7) with the teacher's other settings (`cache`, `draw`)."""
        t0 = self.release.first_steps if self.student else self.sampling.steps
        steps = self.student_steps or t0 // self.distill_steps ** self.rounds
        return dataclasses.replace(self.sampling, steps=steps)


TRAIN_KNOBS = ("steps", "distill_steps", "divergence", "iters_per_round", "batch", "lr", "lr_warmup", "ema",
               "train_seed")


class SDTT(Method):
    """Iterated self-distillation of an MDLM, or a released SDTT student (`student=<folder>`), sampled in few steps.

    The round-`rounds` student samples with T_0 / (m/k)^rounds steps."""

    headline = True
    families = (md.FAMILY,)
    modalities = ("text",)
    Config = SDTTConfig
    key_knobs = ("divergence", "rounds", "student_steps", "student")

    def __init__(self, teacher, config: SDTTConfig):
        super().__init__(teacher, config)
        self.student: torch.nn.Module | None = None
        self.release: released.Release | None = None  # a released student's, read by `fit`

    @classmethod
    def passes(cls, config: SDTTConfig, family, length: int) -> dict[str, Passes]:
        """The student's steps are passes of the teacher's network ("step"); the teacher at the student's step count;
        the AR arm's causal LM, a token at a time with its KV cache ("ar_token")."""
        steps = Passes(family.passes(config.student_sampling, length))
        return {"method": steps, "same_steps": steps, **({"ar": Passes({"ar_token": length})} if config.ar_arm else {})}

    @classmethod
    def trains(cls, config: SDTTConfig) -> bool:
        return not config.student

    @classmethod
    def required_files(cls, config: SDTTConfig, checkpoints: Path) -> dict[Path, str]:
        return released.required_files(checkpoints / config.student) if config.student else {}

    @classmethod
    def with_files(cls, config: SDTTConfig, checkpoints: Path) -> SDTTConfig:
        """A released student's divergence, m/k and round in place of the knobs' defaults (`_take_release`): read
        from its folder in `checkpoints`, or told by the folder's name while its files are missing."""
        if not config.student:
            return config
        config = dataclasses.replace(config)
        config._take_release(released.describe(checkpoints / config.student))
        return config

    # ---- training -------------------------------------------------------------------------------------------
    def fit(self, *, cache: Cache, checkpoints: Path) -> dict[str, float]:
        """The last round's EMA weights (what sampling uses) are an entry of their own ("sdtt-ema", a quarter of a
        round's full state, the one the model zoo ships); the rounds' full states are built and cached only when it
        is missing. A released student is loaded, checked against the teacher, and nothing is trained."""
        cfg = self.config
        if cfg.student:
            self.release = released.read(checkpoints / cfg.student)
            self.student = released.load(self.release, self.teacher)
            return {"student_sampling_steps": float(cfg.student_sampling.steps)}
        knobs = {k: v for k, v in config_dict(cfg).items() if k in TRAIN_KNOBS}
        ranks = distributed.world().size if cfg.ddp else 1
        if ranks > 1:
            knobs["ranks"] = ranks
        key = keyed(self.teacher, knobs, cfg.rounds, STUDENT_VERSION)
        blob, cached = distributed.get_or_build(cache, "sdtt-ema", key, lambda: self._rounds(knobs, cache),
                                                together=cfg.ddp)
        self.student = copy.deepcopy(self.teacher.network)
        self.student.load_state_dict(blob["ema"])
        self.student.eval().requires_grad_(False)
        return {**blob["info"], "student_cached": float(cached)}

    @classmethod
    def trains_on_every_rank(cls, config: SDTTConfig) -> bool:
        return config.ddp and not config.student

    def _rounds(self, knobs: dict, cache: Cache) -> dict:
        """Rounds 1..R, each round's full state (student, EMA, optimiser) cached, so that a longer run reuses them."""
        info, state = {}, None  # {"student", "ema", "opt"} state dicts after the last round
        for r in range(1, self.config.rounds + 1):  # the builder runs before `state` is reassigned
            state, _ = distributed.get_or_build(cache, "sdtt-students", keyed(self.teacher, knobs, r, STUDENT_VERSION),
                                                lambda: self._round(r, state, cache), together=self.config.ddp)
            info.update({f"round{r}_{k}": float(v) for k, v in state["info"].items()})
        return {"ema": state["ema"], "info": info}

    def _round(self, r: int, prev: dict | None, cache: Cache) -> dict:
        """Round r: `iters_per_round` steps of Algorithm 2; with `ddp`, this rank's share of each global batch,
        drawn from its own generator (rank 0's is the one-process generator), gradients averaged over the ranks."""
        cfg, t0 = self.config, time.perf_counter()
        world = distributed.world() if cfg.ddp else distributed.World()
        if cfg.batch % world.size:
            raise UserError(f"sdtt: batch {cfg.batch} (the global batch) must divide over the {world.size} ranks")
        batch, seed = cfg.batch // world.size, cfg.train_seed * 1000 + r + RANK_SEED_STRIDE * world.rank
        T = cfg.sampling.steps // cfg.distill_steps ** (r - 1)
        data = self.teacher.training_chunks(cache)  # on the teacher's device, where everything below runs
        g = torch.Generator(data.device).manual_seed(seed)
        with seeded(seed):  # dropout draws from the global generators
            student = copy.deepcopy(self.teacher.network).train().requires_grad_(True)
            ema = copy.deepcopy(self.teacher.network).requires_grad_(False)
            opt = torch.optim.AdamW(student.parameters(), lr=cfg.lr, betas=(0.9, 0.999), weight_decay=0.0)
            if prev is not None:  # the previous student is the new teacher; optimiser and EMA carry on
                student.load_state_dict(prev["student"])
                ema.load_state_dict(prev["ema"])
                opt.load_state_dict(prev["opt"])
            step0 = (r - 1) * cfg.iters_per_round
            sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (step0 + s + 1) / max(1, cfg.lr_warmup)))
            iteration = self._iteration(student, ema, opt, sched, T, world)
            losses = []
            for i in range(cfg.iters_per_round):
                x = data[torch.randint(len(data), (batch,), generator=g, device=data.device)]
                if (loss := iteration(x, g, step0 + i)) is not None:
                    losses.append(loss.item())
        k = max(1, len(losses) // 10)  # first and last tenth of the round
        info = {"loss_start": sum(losses[:k]) / k, "loss_end": sum(losses[-k:]) / k, "teacher_steps": T,
                "seconds": time.perf_counter() - t0}
        return {"student": _cpu(student.state_dict()), "ema": _cpu(ema.state_dict()), "opt": _cpu(opt.state_dict()),
                "info": info}

    def _iteration(self, student, ema, opt, sched, T: int, world: distributed.World):
        """Algorithm 2's iteration in a round whose teacher takes T steps (the student as it starts the round is that
        teacher): iteration(x, g, k) -> the loss on chunks x (B, L) drawing from g at global step k, None where nothing
        was masked (one process skips that batch)."""
        cfg, mask_id, delta = self.config, self.teacher.mask_id, (1 - md.SAMPLING_EPS) / T
        teacher = copy.deepcopy(student).eval().requires_grad_(False)
        net = world.data_parallel(student)

        def iteration(x: torch.Tensor, g: torch.Generator, k: int) -> torch.Tensor | None:
            t = md.antithetic_times(len(x), g, x.device)
            z = md.corrupt(x, t, mask_id, g)
            target = teacher_targets(lambda v: md.subs(teacher(v), v, mask_id), z, t, delta, cfg.distill_steps,
                                     mask_id, g)
            masked = z == mask_id
            if not masked.any() and world.size == 1:
                return None
            logp = md.subs(net(z), z, mask_id)
            # a rank with nothing masked still joins the step (DDP averages every rank's gradients): a zero loss
            loss = divergence(logp[masked], target[masked], cfg.divergence) if masked.any() else logp.sum() * 0.0
            optimizer_step(loss, opt, sched, student.parameters())
            ema_update(ema, student, cfg.ema, k)
            return loss

        return iteration

    @classmethod
    def training(cls, config: SDTTConfig, family, length: int) -> Training | None:
        """`rounds` x `iters_per_round` iterations of `batch` chunks, each the teacher's `distill_steps` passes (no
        gradient) for the targets, then a student pass and its backward; none for a released student."""
        if config.student:
            return None
        return Training(config.rounds * config.iters_per_round, config.batch,
                        f"train sdtt m={config.distill_steps}")

    def train_step(self, batch: int, generator: torch.Generator):
        cfg, net = self.config, self.teacher.network
        device = next(net.parameters()).device
        student = copy.deepcopy(net).train().requires_grad_(True)
        ema = copy.deepcopy(net).requires_grad_(False)
        opt = torch.optim.AdamW(student.parameters(), lr=cfg.lr, betas=(0.9, 0.999), weight_decay=0.0)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
        iteration = self._iteration(student, ema, opt, sched, cfg.sampling.steps, distributed.World())
        x = torch.randint(self.teacher.mask_id, (batch, self.teacher.seq_len), generator=generator).to(device)
        g = torch.Generator(device).manual_seed(int(torch.randint(2 ** 31, (1,), generator=generator)))
        return lambda: iteration(x, g, 0)

    def stand_in(self) -> None:
        """The student is the teacher's network (a released student too: `sdtt_released.load` checks it is)."""
        self.student = copy.deepcopy(self.teacher.network)

    # ---- sampling -------------------------------------------------------------------------------------------
    def denoise(self, z: torch.Tensor) -> torch.Tensor:
        with torch.inference_mode():
            return md.subs(self.student(z), z, self.teacher.mask_id)

    def sample(self, cond: torch.Tensor, *, generator: torch.Generator) -> Samples:
        if self.student is None:
            raise RuntimeError("sdtt: call fit() before sample()")
        return md.sample_ancestral(self.denoise, cond, self.teacher.seq_len, self.teacher.mask_id,
                                   self.config.student_sampling, generator=generator)

    def caveats(self) -> dict[str, str]:
        if not self.config.student:
            return {}
        out = {"sdtt_released_weights": "the released files hold the checkpoint's raw weights (push_to_hub.py loads "
                                        "its state_dict); the paper samples with the EMA (from_ema: True)"}
        if self.config.sampling.draw == "exact":
            out["sdtt_draw"] = ("every arm draws with the family's exact float64 sampler, as SDTT's App. A; the "
                                "paper's main runs race in float32 (draw=released-fp32)")
        if self.release is not None and self.release.teacher != released.MDLM_OWT:
            out["sdtt_released_teacher"] = f"the student was distilled from {self.release.teacher}, not MDLM-OWT"
        return out

    def extra_arms(self, *, cache: Cache, device: torch.device, checkpoints: Path,
                   random: bool = False) -> dict[str, Method]:
        """The teacher at the student's step count ("same_steps") and, with `ar_arm`, the corpus' causal LM with its
        KV cache ("ar") at the same length and batch size, each its own family's sampler; the LM's samples hold the
        prompt it continued (`AfterPrompt`), as the MDLM arms' do. `random`: the LM's full-size random build (GPT-2
        for MDLM-OWT: §4.4's latency baseline, counted and timed by the cost mode)."""
        cfg = self.config
        arms = {"same_steps": TeacherSampler(self.teacher, cfg.student_sampling)}
        if cfg.ar_arm:
            name = self.teacher.companion_lm
            lm_cls = teacher_class(name, checkpoints)
            lm = copy.copy(lm_cls.random(name, device) if random and getattr(lm_cls, "random", None) else
                           load_teacher(name, cache=cache, device=device, checkpoints=checkpoints))
            # as many new tokens as the MDLM arms generate after their prompts, within the LM's positions (1023 for
            # GPT-2 after its BOS against MDLM-OWT's 1024; 50 after a 50-token prompt in `mdlm-owt-prompted`)
            n = min(lm.seq_len, self.teacher.seq_len - getattr(self.teacher, "prompt_tokens", 0))
            lm.seq_len, lm.grid = n, (n,)
            arms["ar"] = AfterPrompt(lm, ar_token.SamplingConfig(top_p=cfg.ar_top_p))
        return arms


class AfterPrompt(TeacherSampler):
    """A causal LM's own sampler whose samples are the prompt it continued followed by its new tokens, as the release's
    AR sampler returns them (jdeschena/sdtt 9172b86 src/sdtt/core/ar.py:100-104, 136: `input_ids` starts as the
    prefix and each new token is appended) and as the MDLM arms' samples hold their in-painted prompt
    (`md.sample_ancestral`): under SDTT's conditional protocol every arm's text metrics then read the prompt the same
    way, as gen-PPL's context and in MAUVE's features (`metrics.base.prompt_length`). An unconditional teacher's prompt
    is empty: the new tokens alone."""

    def sample(self, cond: torch.Tensor, *, generator: torch.Generator) -> Samples:
        out = super().sample(cond, generator=generator)
        return Samples(torch.cat([cond, out.data], 1), cond, out.counters)


def _cpu(state):
    """A state dict (an optimiser's included) with every tensor on the CPU: cache entries are device-free."""
    if torch.is_tensor(state):
        return state.cpu()
    if isinstance(state, dict):
        return {k: _cpu(v) for k, v in state.items()}
    if isinstance(state, list):
        return [_cpu(v) for v in state]
    return state
