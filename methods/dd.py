"""`dd`: Distilled Decoding (Liu et al., arXiv:2412.17153, ICLR 2025): an AR image model distilled into 1-2 steps.

Pipeline (docs/methods/dd.md):
1. pairs (Alg. 1, `methods.dd_pairs`): the teacher with the per-token flow-matching map turns noise (eps_1..eps_n)
   into tokens (q_1..q_n) deterministically;
2. training (Alg. 2): a student initialised from the teacher (`methods.dd_student`) maps X_t = (q_<t, eps_>=t) to
   all of (q_1..q_n) for t in {1, t2}; loss = ce_weight * cross-entropy(logits head) + MSE(embedding head, codebook
   vector). The paper's LPIPS term is replaced by this MSE: our tokenizer's code vectors are pixel patches, so the
   squared error in code space is exactly the squared pixel error of the decoded image (an L2 stand-in for LPIPS,
   which needs VGG weights we do not have offline). AdamW (0.9, 0.95), EMA of the weights;
3. sampling (Alg. 3): 1 step from pure noise, or 2 steps (the second re-inserts the ORIGINAL noise after the first
   t2 - 1 predicted tokens); with `ts` > 0, "pre-trained-ts-t2" (Alg. 4): the teacher re-generates tokens ts..t2-1
   of the first step's output by ordinary sampling before the second step, reading the kept prefix in one pass
   (Table 2 counts 2 + t2 - ts steps; `_teacher_segment` says where ours differs). Positions before `split` read the
   logits head, the rest the embedding head (App. B: logits are good early in the sequence, embeddings late).
Pairs and students are cached by everything that determines them.

On a VAR teacher (`multiscale_vq`, the paper's VAR-d16/20/24-DD) a step is a scale: t, t2, ts and split count scales,
the pairs map every token of a scale at once, and the student is `dd_student.VARDDStudent`.

With `student=<file>` nothing is trained: DD's released student (VAR-d16/20/24-DD, LlamaGen-B/L-DD;
`methods.dd_released`) samples through the same steps, with the released commands' t2 and split by default.

Precision (`student_dtype`, docs/methods/dd.md "Precision"): the student's steps, their nearest-code projection
included, compute in float32 whatever the trial's dtype, as the release runs its students
(microsoft/distilled_decoding 3b95d33: LlamaGen/autoregressive/sample/eval_fewstep.py:64 and eval_combine_sample.py:66
move the student with `.to(device)`, the `precision` parsed at :54 / :56 never applied to it; VAR/sample.py:50-72 and
VAR/combine_sample.py:50-83 neither cast nor autocast), TF32 on CUDA (eval_fewstep.py:8-10; VAR/utils/arg_util.py:127,
applied at :257: the trial's `tf32`). The teacher's part of an arm (pre-trained-ts-t2's segment) and the reference
arm run in the trial's dtype: bfloat16 weights for LlamaGen's (eval_combine_sample.py:98), float32 for VAR's
(VAR/combine_sample.py:64-74). `student_dtype=bf16` (or fp16) is the low-precision student of a trial run at
`--dtype bf16` before this knob existed.
"""
from __future__ import annotations

import dataclasses
import itertools
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.optim.swa_utils import AveragedModel

from core import distributed, precision
from core.cache import CHECKPOINTS_ENV, Cache, keyed
from core.errors import UserError
from core.rng import seeded
from core.samples import Samples
from core.training import ema_decay, optimizer_step, warmup_cosine
from methods import dd_released
from methods.base import Method, Passes, Training
from methods.dd_pairs import PairKnobs, generate_pairs, rollout
from methods.dd_student import DDStudent, VARDDStudent
from teachers.families import ar_token, multiscale_vq
from teachers.families.ar_token import draw

STUDENT_VERSION = 2  # bump when training code changes what a config produces
T2_FRACTION = 81 / 256  # the paper's LlamaGen intermediate timestep, as a fraction of the sequence
# The paper leaves the logits/embedding split open (the released LlamaGen-L-DD 1-step model splits at 130 of 256
# tokens). Measured on digits-ar-c2i (sweeps/specs/dd-split.yaml, 3 seeds x 360 samples, teacher FID 1.40): DD-1 FID
# 4.00 with logits everywhere, 3.07 with embeddings everywhere, lowest at n/2 (1.89; 1.98 at 5n/8, 2.17 at 3n/8).
SPLIT_FRACTION = 0.5
# VAR: the paper's 2-step set {1, 6} of 10 scales reads 5 known scales, 55 of 680 tokens; t2 defaults to the step
# whose known tokens are the nearest fraction. The released VAR-DD splits at 4 to 9 of 10 scales; the default is
# half the scales, measured on digits-var-c2i (suites/var.yaml, 3 seeds x 300, teacher FID 2.11): DD-1 FID 2.23 at
# split 2 of 4, 2.34 with embeddings everywhere (0), 9.44 with logits everywhere (4).
VAR_T2_TOKENS = 55 / 680


def refuse_greedy(s, method: str) -> None:
    if getattr(s, "greedy", False):
        raise ValueError(f"greedy must be false: {method} learns from teacher samples drawn from noise")


@dataclass(frozen=True)
class DDConfig(PairKnobs):
    sampling: ar_token.SamplingConfig = ar_token.SamplingConfig()  # the teacher's, for the pairs and the reference
    steps: int = 1  # DD steps: 1 (from pure noise) or 2 ({1, t2})
    t2: int = 0  # intermediate timestep (1-based: t2 - 1 tokens known); 0 = round(81/256 * n), the paper's ratio
    ts: int = 0  # > 0: pre-trained-ts-t2, the teacher re-generates tokens ts..t2-1 between the two steps (Alg. 4)
    split: int = -1  # positions < split read the logits head, the rest the embedding head; -1 = SPLIT_FRACTION * n
    # A released DD student (`methods.dd_released`: VAR-d16/20/24, LlamaGen-B/L) in the checkpoints folder, e.g.
    # var-d16.pth, in place of training one; t2 and split then default to the released commands'. Empty: train ours.
    student: str = ""
    # The dtype the student's steps compute in, whatever the trial's: fp32, as the release runs every DD student
    # (eval_fewstep.py:64, eval_combine_sample.py:66, VAR/sample.py:50-72; the module's docstring)
    student_dtype: str = "fp32"
    # training (Alg. 2); the pairs (Alg. 1) are the PairKnobs: n_pairs, solver, solver_steps, train_seed
    train_steps: int = 2000  # pairs + training: 11.6 min on 2 cores for digits-ar-c2i (3000 steps: over 15 min)
    batch: int = 128
    lr: float = 1e-3
    ce_weight: float = 0.1  # the paper's 0.1 CE against 1.0 for the embedding term
    ema: float = 0.999
    # The student's own dropout (the teacher trained with 0.1). Off, measured on digits-ar-c2i after 1000 steps:
    # DD-1 FID 2.07 vs 2.37 (split 32, 3 seeds) and each step 1.4x faster on 2 threads.
    dropout: float = 0.0
    # Data-parallel training over the ranks of a torchrun trial (`core.distributed`): each rank takes its share of
    # every global batch of `batch` (the paper's is 512, its App. hyperparameters; its training code is unreleased,
    # so how it spread that batch over GPUs is not known), gradients averaged; the loss is the one-process loss of the
    # global batch, so the student does not depend on the rank count (up to float rounding): not part of its key.
    ddp: bool = False

    def __post_init__(self):
        super().__post_init__()
        refuse_greedy(self.sampling, "dd")
        if self.steps not in (1, 2):
            raise ValueError(f"steps must be 1 or 2, got {self.steps}")
        if self.student_dtype not in precision.DTYPES:
            raise ValueError(f"student_dtype must be one of {', '.join(precision.DTYPES)}, got {self.student_dtype!r}")
        if self.ts and (self.steps != 2 or self.ts < 1):
            raise ValueError(f"ts > 0 (pre-trained-ts-t2) needs steps=2 and ts >= 1, got steps={self.steps}, "
                             f"ts={self.ts}")
        if self.t2 < 0 or self.ts < 0 or self.split < -1:
            raise ValueError(f"t2 and ts must be >= 0 and split >= -1, got {self.t2}, {self.ts}, {self.split}")
        for name in ("train_steps", "batch"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not (self.lr > 0 and self.ce_weight >= 0 and 0 <= self.ema < 1 and 0 <= self.dropout < 1):
            raise ValueError(f"need lr > 0, ce_weight >= 0, 0 <= ema < 1, 0 <= dropout < 1; got {self.lr}, "
                             f"{self.ce_weight}, {self.ema}, {self.dropout}")


@dataclass(frozen=True)
class VARDDConfig(DDConfig):
    """DD on a VAR teacher: the same knobs, steps counted in scales, over VAR's sampling settings."""

    sampling: multiscale_vq.SamplingConfig = multiscale_vq.SamplingConfig()


# with the pairs: everything that determines the student
TRAIN_KNOBS = ("t2", "ce_weight", "train_steps", "batch", "lr", "ema", "dropout", "train_seed")


def _ema_with_warmup(decay: float):
    """AveragedModel's update with `core.training.ema_decay`."""
    def avg(averaged: torch.Tensor, current: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        d = ema_decay(decay, int(k))
        return d * averaged + (1 - d) * current

    return avg


class DD(Method):
    """Distilled Decoding (arXiv:2412.17153): a student (ours, or the released one: student=<file>) in 1-2 steps."""

    headline = True
    families = (ar_token.FAMILY, multiscale_vq.FAMILY)
    modalities = ("image",)  # flows into the tokenizer's code vectors
    Config = DDConfig
    key_knobs = ("steps", "t2", "ts")
    needs = ("network", "codebook")  # the student is built from the network and flows into the code vectors

    @classmethod
    def config_class(cls, family) -> type:
        return VARDDConfig if family is multiscale_vq.FAMILY else DDConfig

    def __init__(self, teacher, config: DDConfig):
        super().__init__(teacher, config)
        self.var = teacher.family is multiscale_vq.FAMILY
        # known[t - 1]: the data tokens of X_t (t - 1 steps known); a step is a token, or a scale on VAR
        self.known = [0, *itertools.accumulate(p * p for p in teacher.patch_nums)] if self.var else list(
            range(teacher.seq_len + 1))
        n, unit = len(self.known) - 1, "scales" if self.var else "tokens"
        if config.student and (reason := dd_released.unsupported(teacher)):
            raise UserError(f"dd: student={config.student!r}: {reason}")
        default_t2 = (min(range(2, n + 1), key=lambda t: abs(self.known[t - 1] / teacher.seq_len - VAR_T2_TOKENS))
                      if self.var else max(2, round(T2_FRACTION * n)))
        default_split = round(SPLIT_FRACTION * n)
        if config.student and (released := dd_released.released_defaults(teacher)):
            default_t2, default_split = released
        self.t2 = config.t2 or default_t2
        if not 2 <= self.t2 <= n:
            raise UserError(f"dd: t2 must be in [2, {n}] for a teacher of {n} {unit}, got {self.t2}")
        if config.ts and not config.ts < self.t2:
            raise UserError(f"dd: ts must be < t2 = {self.t2}, got {config.ts}")
        split = default_split if config.split == -1 else config.split
        if split > n:
            raise UserError(f"dd: split must be in [0, {n}] (-1: {SPLIT_FRACTION} * n) for a teacher of {n} {unit}, "
                            f"got {split}")
        self.split = self.known[split]  # in tokens
        self.student: DDStudent | VARDDStudent | dd_released.ReleasedStudent | None = None

    @classmethod
    def passes(cls, config: DDConfig, family, length: int) -> dict[str, Passes]:
        """DD's steps are student passes over every position ("full"); pre-trained-ts-t2 adds the teacher's passes
        (`teacher_passes`). A dry run knows the teacher's length only: a VAR t2 left at 0 is taken as the paper's 6 of
        10 scales scaled to `length` (the default reads the scales' sizes: 2 of 4 on tiny-var, as this gives)."""
        var = family is multiscale_vq.FAMILY
        if not config.ts:
            return {"method": Passes({"full": config.steps})}
        t2 = config.t2 or (max(2, round(0.6 * length)) if var else max(2, round(T2_FRACTION * length)))
        return {"method": Passes({"full": 1 + (config.ts > 1), "step": teacher_passes(config.ts, t2)})}

    @classmethod
    def trains(cls, config: DDConfig) -> bool:
        return not config.student

    @classmethod
    def required_files(cls, config: DDConfig, checkpoints: Path) -> dict[Path, str]:
        if not config.student:
            return {}
        path = checkpoints / config.student
        return {path: f"missing {path}: place a released DD student (Hugging Face microsoft/distilled_decoding: "
                      f"VAR-DD/var-d16.pth ... var-d24.pth, LlamaGen-DD/llamagen-B.pt, llamagen-L.pt) in "
                      f"{path.parent}, or name its folder with --checkpoints or {CHECKPOINTS_ENV}"}

    def caveats(self) -> dict[str, str]:
        out = {}
        if self.config.student:
            out["dd_released_decode"] = ("the released sampler decodes the embedding head's raw vectors past the "
                                         "split; ours, their nearest codes")
            if self.config.steps == 2 and self.split < self.known[self.t2 - 1]:
                out["dd_released_carry"] = ("split < t2 - 1: the released second step reads the first step's raw "
                                            "embeddings at known positions past the split; ours, their nearest codes")
        if self.var and self.config.ts > 1:
            out["dd_prefix_pass"] = ("the teacher reads the kept scales in one pass under VAR's block-causal mask; the "
                                     "released pass has no mask (earlier scales also see later ones)")
        return out

    def _new_student(self, dropout: float = 0.0) -> DDStudent | VARDDStudent:
        return (VARDDStudent if self.var else DDStudent)(self.teacher.network, self.teacher.codebook, dropout)

    def fit(self, *, cache: Cache, checkpoints: Path) -> dict[str, float]:
        """The student, cached; the pairs are generated (or loaded) only when it has to be trained. A released
        student is read from its file in `checkpoints` instead."""
        cfg = self.config
        if cfg.student:
            self.student = dd_released.load(checkpoints / cfg.student, self.teacher)
            return {"n_params": float(sum(p.numel() for p in self.student.parameters())), "student_released": 1.0}
        knobs = {k: getattr(cfg, k) for k in TRAIN_KNOBS} | {"t2": self.t2}
        key = keyed(self.teacher, dataclasses.asdict(cfg.sampling), dataclasses.asdict(cfg.pairs), knobs,
                    STUDENT_VERSION)
        blob, cached = distributed.get_or_build(cache, "dd-students", key, lambda: self._train(cache),
                                                together=cfg.ddp)
        with seeded(cfg.train_seed):  # the fresh init is replaced by the trained weights; leave the global RNG alone
            self.student = self._new_student()
        self.student.load_state_dict(blob["state_dict"])
        self.student.eval().requires_grad_(False)
        return {**{k: float(v) for k, v in blob["info"].items()}, "student_cached": float(cached)}

    @classmethod
    def trains_on_every_rank(cls, config: DDConfig) -> bool:
        return config.ddp and not config.student

    @classmethod
    def generates(cls, config: DDConfig, family, length: int) -> tuple[str, int, Passes] | None:
        """The (noise, teacher sample) pairs, each a run of the teacher's sampler; none for a released student."""
        return None if config.student else ("pairs", config.n_pairs, Passes(family.passes(config.sampling, length)))

    def stand_in(self) -> None:
        """The released student's architecture (`student` set) or ours, at the teacher's size."""
        if self.config.student:
            self.student = dd_released.at_random(self.teacher)
            return
        with seeded(0), torch.device(next(self.teacher.network.parameters()).device):
            self.student = self._new_student().eval().requires_grad_(False)

    def _train(self, cache: Cache) -> dict:
        """Algorithm 2 on the teacher's device (the pairs' tokens stay on the CPU and their noise on disk,
        `dd_pairs.pair_noise`; each batch is moved). With `ddp`, this
        rank's share of each global batch (every rank draws the same batch from the same generator), gradients
        averaged over the ranks; each loss term is this share's sum over the global batch's count of its terms,
        times the ranks (which DDP's average divides out): the one-process mean of the global batch."""
        cfg, t0 = self.config, time.perf_counter()
        world = distributed.world() if cfg.ddp else distributed.World()
        if cfg.batch % world.size:
            raise UserError(f"dd: batch {cfg.batch} (the global batch) must divide over the {world.size} ranks")
        pairs = generate_pairs(self.teacher, cfg.sampling, cfg.pairs, cache=cache, noise=True, world=world)
        pairs_info = {f"pairs_{k}": float(v) for k, v in pairs.info.items()} | {
            "pairs_load_seconds": time.perf_counter() - t0}
        t0 = time.perf_counter()
        device = self.teacher.codebook.device
        g = torch.Generator(device).manual_seed(cfg.train_seed)
        tokens, noise, cond = pairs.tokens.long(), pairs.noise, pairs.cond
        with seeded(cfg.train_seed):  # dropout and new-module init draw from the global generators
            student, ema, known_at, iteration = self._trainer(world)
            mine = slice(world.rank, None, world.size)
            for _ in range(cfg.train_steps):
                idx = torch.randint(len(tokens), (cfg.batch,), generator=g, device=device).cpu()
                known = known_at[torch.randint(len(known_at), (cfg.batch,), generator=g, device=device)]
                share = (tokens.shape[1] * cfg.batch - known.sum()) / world.size  # the global batch's targets, per rank
                idx, known = idx[mine], known[mine]
                ce, mse = iteration(cond[idx].to(device), tokens[idx].to(device),  # (B / ranks, n)
                                    noise.read("noise", idx).to(device), known, share)  # the noise from disk
        info = {**pairs_info, "train_seconds": time.perf_counter() - t0, "train_ce": ce.item(),
                "train_mse": mse.item(), "n_params": sum(p.numel() for p in student.parameters() if p.requires_grad)}
        return {"state_dict": {k: v.cpu() for k, v in ema.module.state_dict().items()}, "info": info}

    def _trainer(self, world: distributed.World):
        """The student (under the caller's seed), its EMA, the known counts of the trained set {1, t2} and the
        iteration of Algorithm 2 on a batch: (student, ema, known_at, iteration(cond, tokens, noise, known, share) ->
        (ce, mse)); `share` is the global batch's count of targets per rank, each loss term's divisor."""
        cfg, device = self.config, self.teacher.codebook.device
        student = self._new_student(cfg.dropout)
        ema = AveragedModel(student, avg_fn=_ema_with_warmup(cfg.ema), use_buffers=True)
        params = [p for p in student.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(params, lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.0)
        sched = warmup_cosine(opt, cfg.train_steps)
        known_at = torch.tensor([0, self.known[self.t2 - 1]], device=device)  # (L = 2)
        net, C = world.data_parallel(student), student.codebook.shape[1]

        def iteration(cond, batch, noise, known, share) -> tuple[torch.Tensor, torch.Tensor]:
            x, is_data = student.inputs(batch, noise, known)
            logits, emb = net(cond, x, is_data)
            target = ~is_data  # the copied prefix carries no loss (Eq. 6 makes it exact)
            ce = F.cross_entropy(logits[target], batch[target], reduction="sum") / share
            mse = F.mse_loss(emb[target], student.codebook[batch[target]], reduction="sum") / (share * C)
            optimizer_step(cfg.ce_weight * ce + mse, opt, sched, params)
            ema.update_parameters(student)
            return ce, mse

        return student, ema, known_at, iteration

    @classmethod
    def training(cls, config: DDConfig, family, length: int) -> Training | None:
        """`train_steps` iterations of `batch` pairs, each a student pass over every position and its backward (the
        same whatever t2 and the split); none for a released student."""
        return None if config.student else Training(config.train_steps, config.batch, "train dd")

    def train_step(self, batch: int, generator: torch.Generator):
        cfg, t, device = self.config, self.teacher, self.teacher.codebook.device
        with seeded(cfg.train_seed):
            student, _, known_at, iteration = self._trainer(distributed.World())
        B, n, C = batch, t.seq_len, student.codebook.shape[1]
        cond = t.conditions(B, generator).to(device)
        tokens = torch.randint(t.vocab_size, (B, n), generator=generator).to(device)
        noise = torch.randn(B, n, C, generator=generator).to(device)
        known = known_at[torch.arange(B, device=device) % 2]  # half from noise, half from t2: the trained set
        share = n * B - known.sum()
        return lambda: iteration(cond, tokens, noise, known, share)

    @torch.inference_mode()
    def sample(self, cond: torch.Tensor, *, generator: torch.Generator) -> Samples:
        if self.student is None:
            raise RuntimeError("dd: call fit() before sample()")
        cfg, student = self.config, self.student
        B, n, C = len(cond), self.teacher.seq_len, student.codebook.shape[1]
        noise = torch.randn(B, n, C, generator=generator, device=cond.device)  # X_1, kept for every step
        tokens = torch.zeros(B, n, dtype=torch.long, device=cond.device)
        passes = 0
        if cfg.ts != 1:  # Alg. 4 with ts = 1 starts with the teacher: no first DD step
            tokens, passes = self._step(cond, tokens, noise, 0), 1
        if cfg.ts:
            passes += self._teacher_segment(cond, tokens, generator)
        if cfg.steps == 2:
            tokens, passes = self._step(cond, tokens, noise, self.known[self.t2 - 1]), passes + 1
        return Samples(tokens, cond, Counter(nfe=B * passes, tokens=B * n))

    def _step(self, cond: torch.Tensor, tokens: torch.Tensor, noise: torch.Tensor, known: int) -> torch.Tensor:
        """One student step (Alg. 3) in `student_dtype`, inside the trial's autocast: a bfloat16 trial would round the
        student's embeddings and flip their nearest codes, which the release computes in float32."""
        with precision.autocast(cond.device, self.config.student_dtype):
            return self.student.predict(cond, tokens, noise, known, self.split)

    def _teacher_segment(self, cond: torch.Tensor, tokens: torch.Tensor, generator: torch.Generator) -> int:
        """Steps ts..t2-1 (1-based) re-sampled by the teacher after the DD prefix, in place; returns forward passes.

        Tokens: the condition and the prefix read in one pass, which gives token ts's logits, then one pass per
        further token: t2 - ts passes, as the released runner prefills the class token and the prefix together
        (microsoft/distilled_decoding LlamaGen/autoregressive/models/generate.py `intermediate_generate`), Table 2's
        2 + t2 - ts steps with DD's two.
        """
        ts, t2 = self.config.ts, self.t2
        if self.var:
            return self._teacher_scales(cond, tokens, generator)
        tokens[:, ts - 1 : t2 - 1] = rollout(self.teacher, cond, self.config.sampling, t2 - ts,
                                             lambda i, probs: draw(probs, generator), prefix=tokens[:, : ts - 1])
        return teacher_passes(ts, t2)

    def _teacher_scales(self, cond: torch.Tensor, tokens: torch.Tensor, generator: torch.Generator) -> int:
        """`_teacher_segment` on VAR: one pass reads the condition and scales 1..ts-1 (`start`'s prefix, under VAR's
        block-causal mask) and gives scale ts's logits, then one pass per further scale drawn: t2 - ts passes, the
        paper's count (Table 2: pre-trained-ts-t2 is 2 + t2 - ts steps with DD's two; pre-trained-1-t2 is t2)."""
        t, s, K, ts = self.teacher, self.config.sampling, len(self.teacher.patch_nums), self.config.ts
        state, logits = t.start(cond, cfg=s.cfg != 0, prefix=tokens[:, : self.known[ts - 1]])
        for si in range(ts - 1, self.t2 - 1):
            scale = slice(self.known[si], self.known[si + 1])
            tokens[:, scale] = draw(multiscale_vq.process(
                multiscale_vq.guide(logits, len(cond), s.cfg, si, K), s), generator)
            if si + 1 < self.t2 - 1:
                logits = t.next_scale(state, tokens[:, scale])
        return teacher_passes(ts, self.t2)


def teacher_passes(ts: int, t2: int) -> int:
    """The teacher's forward passes in pre-trained-ts-t2 (`DD._teacher_segment`): the kept prefix read in the pass
    that gives token (or scale) ts, then one per further one drawn."""
    return t2 - ts
