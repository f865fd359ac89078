"""`ard`: Autoregressive Distillation of a diffusion transformer (Kim et al., arXiv:2504.11295), with its baselines
`step-distill` (N = 0, mask M1: the same code path) and `kd` (S = 1).

Pipeline (the paper's Sec. 3 and App. B, and the released train_ARD.py / sample_ARD.py):
1. trajectories: the teacher's DDIM (eta = 0) with K steps and CFG from balanced classes, all K + 1 states and the K
   x_0-predictions kept, cached by (teacher, K, CFG, count, seed); the S + 1 knots are picked from them: `uniform`
   (the paper's tau_s = T s / S, the DDIM states nearest to it) or `released` (the released code's states, S = 2 or
   4: the last steps span K / 5 teacher steps each, the first what is left: 999 -> 624 -> 416 -> 208 -> 0 at K = 25);
2. training (Eq. 6): the student (`methods.ard_student`) predicts input k+1 from inputs 0..k, teacher-forced in one
   pass; inputs after the noise and the targets are the teacher's x_0-predictions at the knots (`x0hat`, the paper's
   ImageNet default) or the states themselves (`xt`); the last target is the teacher's sample. MSE averaged over
   the S steps, AdamW (wd 0), gradient clip 1, EMA; cached;
3. optionally (`gan_steps` > 0) the R+D discriminator fine-tune (`methods.ard_gan`);
4. sampling: S steps from noise with a KV cache in the lower N blocks, no CFG (distilled in).
`fit` also logs the coupling error (the student's sample against the teacher's K-step sample from the same noise,
held-out noises) and the FLOPs of a student step against a teacher forward, both measured.
"""
from __future__ import annotations

import dataclasses
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from core import distributed
from core.cache import Cache, keyed
from core.config import config_dict
from core.errors import UserError
from core.rng import seeded
from core.samples import Samples
from core.shards import Field, Shards
from core.training import ema_update, optimizer_step, warmup_cosine
from methods.ard_gan import GAN_VERSION, finetune
from methods.ard_student import MASKS, TIME_EMBEDS, ARDStudent
from methods.base import Method, Passes, Training
from teachers.families import ode_diffusion

STUDENT_VERSION = 1  # bump when training code changes what a config produces
# in `released` students' keys; 2: the states before DDIM loop indices 15/10/5 (were one step late)
RELEASED_KNOTS_VERSION = 2
HELD_OUT = 256  # noises for the coupling error


@dataclass(frozen=True)
class ARDConfig:
    sampling: ode_diffusion.SamplingConfig = ode_diffusion.SamplingConfig()  # steps K, cfg: the trajectories' sampler
    student_steps: int = 4  # S
    history_layers: int = 1  # N: lower blocks that read the history (0 = step distillation)
    mask: str = "M4"
    knots: str = "uniform"  # or "released"
    target: str = "x0hat"  # or "xt"
    time_embed: str = "adaln_tokenwise"  # or "additive"
    n_traj: int = 4000
    train_steps: int = 2000
    batch: int = 64
    lr: float = 1e-3
    ema: float = 0.999
    train_seed: int = 0  # of the trajectories' noise and of training
    # R+D (`methods.ard_gan`): discriminator fine-tune steps after the regression, 0 = off (the paper's default)
    gan_steps: int = 0
    gan_weight: float = 10.0  # ld, the multiplier of the adaptive weight
    gan_warmup: int = 0  # first R+D steps with weight 0 (the released code: 3000)
    disc_lr: float = 1e-3
    # Train the student with DDP over the ranks torchrun started (`core.distributed`), as the released train_ARD.py
    # does (DiT's train.py: `--global-batch-size` split over the ranks): each rank takes its share of every global
    # batch of `batch` pairs and the ranks average their gradients, so the student is the one-process student up to
    # the order of float sums, and shares its cache key. False: rank 0 trains alone while the others wait.
    ddp: bool = False

    def __post_init__(self):
        choices = {"mask": MASKS, "knots": ("uniform", "released"), "target": ("x0hat", "xt"),
                   "time_embed": TIME_EMBEDS}
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {', '.join(allowed)}, got {getattr(self, name)!r}")
        if not 1 <= self.student_steps <= self.sampling.steps:
            raise ValueError(f"student_steps must be in [1, steps={self.sampling.steps}], got {self.student_steps}")
        for name in ("history_layers", "n_traj", "train_steps", "batch", "gan_steps", "gan_warmup"):
            low = 1 if name in ("n_traj", "train_steps", "batch") else 0
            if getattr(self, name) < low:
                raise ValueError(f"{name} must be >= {low}, got {getattr(self, name)}")
        if self.ddp and self.gan_steps:
            raise ValueError("ddp trains the regression stage only: use gan_steps=0 with ddp=true")
        if not (self.lr > 0 and self.disc_lr > 0 and self.gan_weight >= 0 and 0 <= self.ema < 1):
            raise ValueError(f"need lr, disc_lr > 0, gan_weight >= 0 and 0 <= ema < 1, got {self.lr}, {self.disc_lr}, "
                             f"{self.gan_weight}, {self.ema}")


def knot_states(knots: str, K: int, S: int) -> list[int]:
    """Indices into a trajectory's states (steps taken) of the S + 1 knots, noise first."""
    if knots == "uniform":
        inner = [round((K - 1) * s / S) for s in range(1, S)]  # the DDIM state whose timestep is nearest T (S-s)/S
    else:  # the released loaders: DDIM loop indices {15, 10, 5} (4 steps) and {10} (2 steps) of 25, i.e. multiples of
        # K/5. Loop index m is the state before the step at timestep ts[K - 1 - m] (m = K is the noise): state K-1-m.
        if S not in (1, 2, 4):
            raise UserError(f"ard: knots 'released' exist for 1, 2 or 4 student steps (the released code's), got {S}")
        d = K // 5
        inner = [K - 1 - m * d for m in {1: [], 2: [2], 4: [3, 2, 1]}[S]]
    out = [0, *inner, K]
    if sorted(set(out)) != out:
        raise UserError(f"ard: knots {knots!r} need more teacher steps than {K} for {S} student steps: {out}")
    return out


def time_labels(knots: str, K: int, S: int) -> list[float]:
    """The timestep each input is labelled with: the knot's own (uniform), or the released code's T (S - k) / S."""
    if knots == "released":
        return [999 * (S - k) / S for k in range(S)]
    ts = ode_diffusion.ddim_timesteps(K)
    return [float(ts[j]) for j in knot_states(knots, K, S)[:-1]]


SHARD = 500  # trajectories per shard file and per DDIM call: 209 MB of float16 at DiT-XL/2's K = 25 (4x32x32 latents)


class Trajectories:
    """n DDIM trajectories of the teacher on disk (`core.shards`): each one's class, its K + 1 states and its K
    x0-predictions (float16), read a batch at a time, so that `fit` needs memory for a batch however many there are
    (the paper's 2.56 M trajectories are ~1 TB)."""

    def __init__(self, shards: Shards):
        self.shards, self.n = shards, shards.n

    def pairs(self, idx: torch.Tensor, knots: list[int], target: str) -> tuple[torch.Tensor, ...]:
        """Student inputs and targets (len(idx), S, C, H, W) of trajectories `idx`, and their classes (len(idx),):
        input 0 is the noise, input k the knot's x0-prediction or state, target k the next input, the last target
        the teacher's sample. Only the knots' rows are read."""
        mids = self.shards.read("x0_preds" if target == "x0hat" else "states", idx, knots[1:-1]).float()
        ends = self.shards.read("states", idx, [knots[0], knots[-1]]).float()  # the noise and the teacher's sample
        return (torch.cat([ends[:, :1], mids], 1), torch.cat([mids, ends[:, 1:]], 1),
                self.shards.read("cond", idx)[:, 0])

    def all_pairs(self, knots: list[int], target: str) -> tuple[torch.Tensor, ...]:
        return self.pairs(torch.arange(self.n), knots, target)


def trajectories(teacher, s: ode_diffusion.SamplingConfig, n: int, seed: int, *, cache: Cache,
                 world: distributed.World = distributed.World()) -> Trajectories:
    """n DDIM trajectories of the teacher on balanced classes, cached by (teacher, sampler, n, seed) as shards
    written as they are made (a killed generation resumes at its first missing shard), shard j by rank j mod N of
    `world`."""
    shards = Shards.in_cache(cache.root, "ard-trajectories", keyed(teacher, dataclasses.asdict(s), n, seed),
                             {"cond": Field((1,), torch.int64),
                              "states": Field((s.steps + 1, *teacher.image_shape), torch.float16),
                              "x0_preds": Field((s.steps, *teacher.image_shape), torch.float16)}, n, SHARD)
    device = teacher.network.pos_embed.device
    g = torch.Generator(device).manual_seed(seed)
    for j, (start, stop) in enumerate(shards.ranges()):
        # one noise stream, drawn in full by every rank: the trajectories do not depend on the ranks (nor, on the
        # CPU, on the shard size: the earlier one-call draw of all n gave the same noise)
        x_T = torch.randn(stop - start, *teacher.image_shape, generator=g, device=device)
        if j % world.size != world.rank or shards.has(j):
            continue
        cond = (torch.arange(start, stop, device=device) % teacher.n_classes)[:, None]  # balanced classes
        tr = ode_diffusion.ddim(lambda x, t: teacher.eps(x, t, cond, cfg=s.cfg), x_T, s.steps)
        shards.write(j, {"cond": cond.cpu(), "states": tr.states.transpose(0, 1).half(),
                         "x0_preds": tr.x0_preds.transpose(0, 1).half()})
    world.barrier()
    if shards.missing():
        raise RuntimeError(f"{shards.folder}: shards {shards.missing()[:5]} are missing after generation")
    return Trajectories(shards)


class ARD(Method):
    """Autoregressive distillation: each student step sees the whole student trajectory so far (arXiv:2504.11295)."""

    headline = True
    families = (ode_diffusion.FAMILY,)
    modalities = ("image",)
    Config = ARDConfig
    key_knobs = ("student_steps", "history_layers", "mask")

    @classmethod
    def passes(cls, config: ARDConfig, family, length: int) -> dict[str, Passes]:
        return {"method": Passes({"student_step": config.student_steps})}

    def __init__(self, teacher, config: ARDConfig):
        super().__init__(teacher, config)
        c, depth = config, teacher.network.cfg.depth
        if c.history_layers > depth:
            raise UserError(f"ard: history_layers must be <= the teacher's depth {depth}, got {c.history_layers}")
        if c.gan_steps and not hasattr(teacher, "real_images"):  # e.g. DiT-XL/2: ImageNet latents are not at hand
            raise UserError(f"ard: the R+D fine-tune (gan_steps={c.gan_steps}) needs the teacher's real images, and "
                            f"teacher {teacher.name} names no dataset; use gan_steps=0")
        self.knots = knot_states(c.knots, c.sampling.steps, c.student_steps)
        self.student: ARDStudent | None = None

    def _new_student(self) -> ARDStudent:
        c = self.config
        return ARDStudent(self.teacher.network, c.student_steps, c.history_layers, c.mask, c.time_embed,
                          time_labels(c.knots, c.sampling.steps, c.student_steps))

    def fit(self, *, cache: Cache, checkpoints: Path) -> dict[str, float]:
        """The student, cached; its training trajectories are generated (or loaded) only when it has to be trained.
        The held-out trajectories (seconds to generate) give the coupling error every time."""
        c = self.config
        gan = ("gan_steps", "gan_weight", "gan_warmup", "disc_lr")  # without R+D they change nothing
        knobs = {k: v for k, v in config_dict(c).items() if (c.gan_steps or k not in gan) and k != "ddp"}
        if c.gan_steps:
            knobs["gan_version"] = GAN_VERSION
        if c.knots == "released":
            knobs["released_knots_version"] = RELEASED_KNOTS_VERSION
        key = keyed(self.teacher, knobs, STUDENT_VERSION)
        blob, cached = distributed.get_or_build(cache, "ard-students", key, lambda: self._train(cache), together=c.ddp)
        held = trajectories(self.teacher, c.sampling, HELD_OUT, c.train_seed + 1, cache=cache)
        inputs, targets, y = held.all_pairs(self.knots, c.target)
        self.student = self._new_student()
        self.student.load_state_dict(blob["state_dict"])
        self.student.eval().requires_grad_(False)
        device = self.teacher.network.pos_embed.device
        inputs, targets, y = inputs.to(device), targets.to(device), y.to(device)
        with torch.inference_mode():
            free = self.student.rollout(inputs[:, 0], y)[:, -1]
            forced = self.student(inputs, y)  # with the teacher's history: Fig. 6b's other end
        return {**{k: float(v) for k, v in blob["info"].items()},
                "student_cached": float(cached), "coupling_mse": F.mse_loss(free, targets[:, -1]).item(),
                "teacher_forced_mse": F.mse_loss(forced, targets).item(), **self._flops()}

    @classmethod
    def generates(cls, config: ARDConfig, family, length: int) -> tuple[str, int, Passes]:
        """The teacher's trajectories: `n_traj` for training and the held-out ones, each a run of its sampler."""
        return "trajectories", config.n_traj + HELD_OUT, Passes(family.passes(config.sampling, length))

    def stand_in(self) -> None:
        with seeded(0), torch.device(next(self.teacher.network.parameters()).device):
            self.student = self._new_student().eval().requires_grad_(False)

    @classmethod
    def trains_on_every_rank(cls, config: ARDConfig) -> bool:
        return config.ddp

    def _train(self, cache: Cache) -> dict:
        """Eq. 6 on the teacher's device; with `ddp`, this rank's share of each global batch, gradients averaged over
        the ranks (every rank draws the same global batch indices from the same generator)."""
        c, t0 = self.config, time.perf_counter()
        world = distributed.world() if c.ddp else distributed.World()
        if c.batch % world.size:
            raise UserError(f"ard: batch {c.batch} (the global batch) must divide over the {world.size} ranks")
        trajs = trajectories(self.teacher, c.sampling, c.n_traj, c.train_seed, cache=cache, world=world)
        traj_seconds, device = time.perf_counter() - t0, self.teacher.network.pos_embed.device

        def batch(idx: torch.Tensor) -> tuple[torch.Tensor, ...]:
            """Inputs, targets and classes of trajectories `idx`, read from disk onto the teacher's device."""
            return tuple(t.to(device) for t in trajs.pairs(idx.cpu(), self.knots, c.target))

        g = torch.Generator(device).manual_seed(c.train_seed)
        student, ema, iteration = self._trainer(world)
        for k in range(c.train_steps):
            loss = iteration(k, *batch(torch.randint(trajs.n, (c.batch,), generator=g, device=device)
                                       [world.rank :: world.size]))
        info = {"trajectory_seconds": traj_seconds, "train_loss": loss.item(),
                "n_params": sum(p.numel() for p in student.parameters())}
        if c.gan_steps:
            real, labels = self.teacher.real_images("train")
            info |= finetune(student, self.teacher.network, trajs.n, batch, real.to(device), labels.to(device),
                             steps=c.gan_steps, batch=c.batch, lr=c.lr, disc_lr=c.disc_lr, scale=c.gan_weight,
                             warmup=c.gan_warmup, generator=g, seed=c.train_seed,
                             on_step=lambda k: ema_update(ema, student, c.ema, c.train_steps + k))
        info["train_seconds"] = time.perf_counter() - t0
        return {"state_dict": {k: v.cpu() for k, v in ema.state_dict().items()}, "info": info}

    def _trainer(self, world: distributed.World):
        """The student (seeded by `train_seed`), its EMA and the iteration of Eq. 6 on a batch: (student, ema,
        iteration(k, inputs, targets, classes) -> loss)."""
        c = self.config
        with seeded(c.train_seed):
            student = self._new_student()
        ema = self._new_student().requires_grad_(False)
        ema.load_state_dict(student.state_dict())
        opt = torch.optim.AdamW(student.parameters(), lr=c.lr, weight_decay=0.0)
        sched = warmup_cosine(opt, c.train_steps)
        net = world.data_parallel(student)

        def iteration(k: int, inputs: torch.Tensor, targets: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            loss = F.mse_loss(net(inputs, y), targets)  # Eq. 6, averaged over the S steps
            optimizer_step(loss, opt, sched, student.parameters())
            ema_update(ema, student, c.ema, k)
            return loss

        return student, ema, iteration

    @classmethod
    def training(cls, config: ARDConfig, family, length: int) -> Training:
        """`train_steps` iterations of `batch` trajectories; a step's cost is set by the student's steps S (S x the
        teacher's tokens in one teacher-forced pass) and the N layers that read the history. The R+D fine-tune
        (`gan_steps`) is not in it: its discriminator reads real images no full-size teacher here has."""
        S = config.student_steps  # one step reads no history: N does not matter
        return Training(config.train_steps, config.batch, f"train ard S={S}" + (
            f" N={config.history_layers}" if S > 1 else ""))

    def train_step(self, batch: int, generator: torch.Generator):
        c, shape = self.config, self.teacher.image_shape
        device = self.teacher.network.pos_embed.device
        _, _, iteration = self._trainer(distributed.World())
        inputs, targets = (torch.randn(batch, c.student_steps, *shape, generator=generator).to(device)
                           for _ in range(2))  # (B, S, C, H, W): noise and knots, the knots' successors
        y = torch.randint(self.teacher.n_classes, (batch,), generator=generator).to(device)
        return lambda: iteration(0, inputs, targets, y)

    def _flops(self) -> dict[str, float]:
        """FLOPs of one image: a student step (mean over the S steps, KV cache included) and a teacher forward."""
        t, shape = self.teacher, self.teacher.image_shape
        device = t.network.pos_embed.device
        x, y = torch.zeros(1, *shape, device=device), torch.zeros(1, dtype=torch.long, device=device)
        with torch.inference_mode(), sdpa_kernel(SDPBackend.MATH):  # the fused kernels are not counted
            with FlopCounterMode(display=False) as student:
                self.student.rollout(x, y)
            with FlopCounterMode(display=False) as teacher:
                t.network(x, torch.zeros(1, dtype=torch.long, device=device), y)
        per_step = student.get_total_flops() / self.config.student_steps
        return {"student_gflops_per_step": per_step / 1e9,
                "teacher_gflops_per_forward": teacher.get_total_flops() / 1e9,
                "extra_flops_vs_teacher_step": per_step / teacher.get_total_flops() - 1}

    @torch.inference_mode()
    def sample(self, cond: torch.Tensor, *, generator: torch.Generator) -> Samples:
        if self.student is None:
            raise RuntimeError("ard: call fit() before sample()")
        x_T = torch.randn(len(cond), *self.teacher.image_shape, generator=generator, device=cond.device)
        x = self.student.rollout(x_T, cond[:, 0])[:, -1]
        return Samples(x, cond, Counter(nfe=len(cond) * self.config.student_steps, tokens=len(cond)))


@dataclass(frozen=True)
class StepDistillConfig(ARDConfig):
    history_layers: int = 0
    mask: str = "M1"

    def __post_init__(self):
        super().__post_init__()
        if self.history_layers != 0:
            raise ValueError(f"step-distill reads no history: history_layers must be 0, got {self.history_layers}")


class StepDistill(ARD):
    """Step distillation (ARD with N = 0: each step sees only its own input), ARD's baseline (arXiv:2504.11295)."""

    headline = False  # ARD's baseline
    Config = StepDistillConfig
    key_knobs = ("student_steps",)


@dataclass(frozen=True)
class KDConfig(ARDConfig):
    student_steps: int = 1

    def __post_init__(self):
        super().__post_init__()
        if self.student_steps != 1:
            raise ValueError(f"kd maps noise to the sample in one step: student_steps must be 1, got "
                             f"{self.student_steps}")


class KD(ARD):
    """Knowledge distillation (ARD with S = 1: noise -> the teacher's sample in one step), ARD's baseline."""

    headline = False  # ARD's baseline
    Config = KDConfig
    key_knobs = ()
