"""SDTT's released students (Deschenaux & Gulcehre, arXiv:2410.21035; code jdeschena/sdtt at 9172b86, weights on the
Hugging Face repo jdeschena/sdtt) as the student of `sdtt` (`--param student=<folder>`): read, checked, loaded.

The release keeps one model per git revision of jdeschena/sdtt; `load_small_student(loss, round)` reads revision
`baselines_<loss>_step_<10000 round>` (loss kld, mse or tvd; round 1..7: the students distilled from MDLM-OWT,
core/distill/multi_round_sdtt.py). Download a revision into a folder of the checkpoints folder named like it, e.g.
`baselines_kld_step_70000/`; it holds what `MultiRoundSDTT.push_to_hub` writes (push_to_hub.py):
- `config.json`: the training run's whole Hydra config (`OmegaConf.to_container`): `model` (`type: ddit-orig`,
  `hidden_size`, `cond_dim`, `length`, `n_blocks`, `n_heads`, `dropout`), `parameterization` (`distill_mode`,
  `num_distill_steps`, `orig_num_sampling_steps`, `grow_dt_every`), `time_conditioning`, `tokenizer.name` (gpt2:
  the vocabulary is the tokenizer's 50257 tokens and MASK, so it is read from the weights here);
- `model.safetensors`: the `MultiRoundSDTT` module's state dict: `backbone.` and the keys of `models/dit_orig.py`'s
  `DIT`, which is MDLM's DiT line for line (the teacher sits in a list, so it is not saved; the noise schedule holds
  no tensors). Dropping `backbone.` maps them one to one onto `teachers.networks.mdlm_dit.MDLMDiT`, loaded strictly
  (tests/fixtures/sdtt/MAKING.md: a golden fixture made with the official classes).
Round r's student was saved when round r + 1 began, at step 10000 r (`_student_to_teacher`), so it is distilled for
`orig_num_sampling_steps / num_distill_steps^r` steps (1024 / 2^r: 8 after round 7). The revision name is the only
record of the round: a folder named otherwise takes its round from the `rounds` knob.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from core.cache import CHECKPOINTS_ENV
from core.errors import UserError
from teachers.families.masked_diffusion import MDLMDiT, MDLMDiTConfig
from core.checkpoints import mismatch, read_config, read_safetensors, safetensors_errors

PREFIX = "backbone."  # of every key of a released student (MultiRoundSDTT.backbone)
# `distill_mode` in the release's config -> the divergence `sdtt` names it (the code's "tvd" is `_tvd`, the L1
# distance of log-probabilities: our `tvd-log`; the paper's Eq. 10 is `tvd`)
DIVERGENCES = {"kl-bwd": "kld", "kl-fwd": "kld-fwd", "mse": "mse", "tvd": "tvd-log"}
NETWORK = "ddit-orig"  # models/loading_utils.py: the DiT that MDLMDiT reproduces
MDLM_OWT = "kuleshov-group/mdlm-owt"
STEP = re.compile(r"_step_(\d+)$")  # the revisions' names end in the training step of the checkpoint


@dataclass(frozen=True)
class Release:
    """What a released student's folder says about itself."""

    folder: Path
    divergence: str | None  # in `sdtt`'s names; None: not read
    distill_steps: int  # m/k
    first_steps: int  # T_0 of round 1 (`orig_num_sampling_steps`, 1024)
    round: int | None  # from the folder's (revision's) name; None when it does not say
    model: dict  # config.json's `model`
    # `parameterization.checkpoint_path`, the round-1 teacher: MDLM-OWT's Hugging Face name for the `baselines_*`
    # students (the README's distillation command keeps the default); a local .ckpt for the `scaling_*` ones
    teacher: str = MDLM_OWT

    @property
    def files(self) -> tuple[Path, Path]:
        return self.folder / "config.json", self.folder / "model.safetensors"

    def network_config(self) -> MDLMDiTConfig:
        """The DiT of config.json over the vocabulary of the weights (config.json names only the tokenizer), read
        from the file's header."""
        from safetensors import safe_open

        with safetensors_errors(self.files[1]), safe_open(self.files[1], "pt") as f:
            key = PREFIX + "vocab_embed.embedding"
            if key not in f.keys():
                raise UserError(f"sdtt student {self.folder}: {self.files[1].name} has no {key}")
            vocab = f.get_slice(key).get_shape()[0]
        m = self.model
        return MDLMDiTConfig(vocab_size=vocab, hidden_size=m["hidden_size"], cond_dim=m["cond_dim"],
                             length=m["length"], n_blocks=m["n_blocks"], n_heads=m["n_heads"],
                             dropout=m.get("dropout", 0.1))

    def network(self, cfg: MDLMDiTConfig) -> MDLMDiT:
        """The student's DiT: keys one to one after `backbone.`, loaded strictly; a misfit file is one line."""
        config, weights = self.files
        state = read_safetensors(weights)
        stray = sorted(k for k in state if not k.startswith(PREFIX))
        if stray:
            raise UserError(f"sdtt student {self.folder}: {weights.name} has keys outside {PREFIX!r}, e.g. {stray[0]}")
        state = {k.removeprefix(PREFIX): v for k, v in state.items()}
        try:
            return MDLMDiT.from_state_dict(cfg, state).eval().requires_grad_(False)
        except RuntimeError as exc:
            raise UserError(f"sdtt student {self.folder}: {weights.name} does not fit {config.name}: "
                            f"{mismatch(exc)}") from None


def required_files(folder: Path) -> dict[Path, str]:
    """The two files of the student in `folder` -> the line that refuses a trial without them (naming the file and
    --checkpoints)."""
    return {path: f"missing {path}: download a revision of jdeschena/sdtt (e.g. baselines_kld_step_70000) into "
                  f"{folder}, or name its parent with --checkpoints or {CHECKPOINTS_ENV}"
            for path in (folder / "config.json", folder / "model.safetensors")}


def read(folder: Path) -> Release:
    """The student in `folder` (a folder of the checkpoints folder); a missing file or a config that is not a
    released MDLM-OWT student's is one line."""
    for path, missing in required_files(folder).items():
        if not path.is_file():
            raise UserError(missing)
    c = read_config(folder)
    p, m = (c.get(k) if isinstance(c.get(k), dict) else {} for k in ("parameterization", "model"))
    shape = ("hidden_size", "cond_dim", "length", "n_blocks", "n_heads")
    if m.get("type") != NETWORK or p.get("distill_mode") not in DIVERGENCES or not all(k in m for k in shape):
        raise UserError(f"{folder / 'config.json'}: not a released SDTT student: expected model.type {NETWORK!r} "
                        f"(got {m.get('type')!r}) with {', '.join(shape)}, and parameterization.distill_mode one of "
                        f"{', '.join(DIVERGENCES)} (got {p.get('distill_mode')!r})")
    if c.get("time_conditioning", False):
        raise UserError(f"{folder / 'config.json'}: time_conditioning is true; sdtt's students ignore the time "
                        f"(the released ones have it false)")
    return Release(folder, DIVERGENCES[p["distill_mode"]], p.get("num_distill_steps", 2),
                   p.get("orig_num_sampling_steps", 1024), _round(folder.name, p.get("grow_dt_every", 10_000)), m,
                   p.get("checkpoint_path", MDLM_OWT))


def describe(folder: Path) -> Release:
    """`read`, or without the files (a dry run lists them; a real run is refused by `required_files`) what the
    folder's name says: its round, the released configs' m/k = 2 and T_0 = 1024 (configs/parameterization/
    multi-round-sdtt.yaml), no divergence."""
    if all(path.is_file() for path in required_files(folder)):
        return read(folder)
    return Release(folder, None, 2, 1024, _round(folder.name, 10_000), {})


def _round(name: str, per_round: int) -> int | None:
    """The round of a revision `..._step_<N>`: round r's student was saved at step `per_round` r; a mid-round step
    or another name: None."""
    hit = STEP.search(name)
    step = int(hit[1]) if hit else 0
    return step // per_round if step and step % per_round == 0 else None


def check_teacher(release: Release, cfg: MDLMDiTConfig, teacher) -> None:
    """The student must read and write what the teacher does: vocabulary, context length, width (and the rest of the
    DiT's shape); otherwise one line naming the folder and the first difference."""
    theirs = getattr(teacher, "network", None)
    name = getattr(teacher, "name", type(teacher).__name__)
    if not isinstance(theirs, MDLMDiT):
        raise UserError(f"sdtt student {release.folder}: a released student is an MDLM DiT; teacher {name!r}'s "
                        f"network is a {type(theirs).__name__}")
    for field in ("vocab_size", "length", "hidden_size", "n_blocks", "n_heads", "cond_dim"):
        mine, yours = getattr(cfg, field), getattr(theirs.cfg, field)
        if mine != yours:
            raise UserError(f"sdtt student {release.folder}: its {field} is {mine}, teacher {name!r}'s is {yours}")


def load(release: Release, teacher) -> MDLMDiT:
    """The student's network on the teacher's device, checked against the teacher before its weights are read."""
    cfg = release.network_config()
    check_teacher(release, cfg, teacher)
    return release.network(cfg).to(next(teacher.network.parameters()).device)
