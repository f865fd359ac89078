"""The Trial: everything that determines one benchmark result, and nothing else."""
from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Mapping

from core.config import read_yaml_mapping
from core.errors import UserError
from core.precision import DTYPES

MAX_COUNT = 2**31 - 1  # samples, batch, repeats: torch takes sizes as C integers; a count above this is a typo
# torch.Generator.manual_seed takes at most 2**64 - 1, and the runner seeds the warm-up with seed + 1_000_003: a seed
# below 2**63 leaves that room
MAX_SEED = 2**63 - 1


@dataclass(frozen=True)
class Trial:
    teacher: str
    method: str
    params: Mapping[str, Any] = field(default_factory=dict)
    metrics: tuple[str, ...] = ()
    n_samples: int = 64
    batch_size: int = 1
    seed: int = 0
    device: str = "auto"
    metric_repeats: int = 1  # seeds over which stochastic metrics (KID subsets, IS splits) are repeated
    # The arms' numerics (`core.precision`): they change the samples, so they are part of the trial.
    dtype: str = "fp32"  # fp32, bf16 or fp16 (autocast)
    tf32: bool = False  # TF32 matmuls on CUDA
    compile: bool = False  # torch.compile the networks' blocks
    # Settings of the teacher beyond its name (`LocalFilesTeacher.params`: a prompt file, a decoding mode), e.g.
    # {prompts: PartiPrompts.tsv}; files are resolved against the checkpoints folder.
    teacher_params: Mapping[str, Any] = field(default_factory=dict)
    # The batch the latency protocol times at (`core.latency`), apart from the quality batch: the batch a paper
    # timed at. 0: `speedup_wall` from the timed quality batches themselves.
    latency_batch: int = 0

    def __post_init__(self):
        for name in ("n_samples", "batch_size", "metric_repeats"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise UserError(f"trial: {name} must be a positive integer, got {value!r}")
            if value > MAX_COUNT:
                raise UserError(f"trial: {name} must be at most 2**31 - 1 = {MAX_COUNT}, got {value}")
        if not isinstance(self.latency_batch, int) or isinstance(self.latency_batch, bool) or \
                not 0 <= self.latency_batch <= MAX_COUNT:
            raise UserError(f"trial: latency_batch must be an integer from 0 (time the quality batches) to "
                            f"{MAX_COUNT}, got {self.latency_batch!r}")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool) or self.seed < 0:
            raise UserError(f"trial: seed must be a non-negative integer, got {self.seed!r}")
        if self.seed > MAX_SEED:
            raise UserError(f"trial: seed must be at most 2**63 - 1 = {MAX_SEED}, got {self.seed}")
        if self.dtype not in DTYPES:
            raise UserError(f"trial: dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        for name in ("tf32", "compile"):
            if not isinstance(getattr(self, name), bool):
                raise UserError(f"trial: {name} must be true or false, got {getattr(self, name)!r}")
        object.__setattr__(self, "params", dict(self.params))
        object.__setattr__(self, "teacher_params", dict(self.teacher_params))
        object.__setattr__(self, "metrics", tuple(self.metrics))

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["metrics"] = list(self.metrics)
        d["params"] = dict(sorted(self.params.items()))
        if self.teacher_params:
            d["teacher_params"] = dict(sorted(self.teacher_params.items()))
        else:  # so that a trial setting none keeps the key it had before teachers took settings
            del d["teacher_params"]
        if not self.latency_batch:  # likewise before the latency protocol
            del d["latency_batch"]
        return d

    def key(self) -> str:
        """Stable content hash; identical for identical (resolved) trials across processes and machines."""
        blob = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"), default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def to_yaml(self) -> str:
        import yaml

        return yaml.safe_dump(self.to_dict(), sort_keys=True)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> "Trial":
        if not isinstance(data, Mapping):
            raise UserError(f"trial: expected a mapping, got {type(data).__name__}")
        valid = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - valid)
        if unknown:
            raise UserError(f"trial: unknown field {unknown[0]!r}; valid: {', '.join(sorted(valid))}")
        for required in ("teacher", "method"):
            if required not in data:
                raise UserError(f"trial: missing field {required!r}")
        kwargs = dict(data)
        if not isinstance(kwargs.get("params", {}), Mapping):
            raise UserError("trial: params must be a mapping of knob -> value")
        if not isinstance(kwargs.get("teacher_params", {}), Mapping):
            raise UserError("trial: teacher_params must be a mapping of name -> value")
        metrics = kwargs.get("metrics", ())
        if isinstance(metrics, str) or not all(isinstance(m, str) for m in metrics):
            raise UserError("trial: metrics must be a list of metric names")
        return cls(**kwargs)

    @classmethod
    def from_yaml(cls, path: str) -> "Trial":
        return cls.from_mapping(read_yaml_mapping(path, "trial file"))
