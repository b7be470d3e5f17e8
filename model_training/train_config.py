"""The resolved configuration of one pretraining run: a TOML file plus command-line overrides.

One flat set of keys; the TOML may group them under tables (`[optim]`, `[loss]`, ...) for reading,
the table names are not part of the key. The resolved config is saved with every checkpoint, so a
served model says exactly how it was trained.
"""

from __future__ import annotations

import tomllib
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from model_training.data import DataError
from model_training.objectives import DEFAULT_LOSS_WEIGHTS

# Learning rates worth knowing: the paper fine-tunes a pretrained ModernBERT at 2.5e-5; ModernBERT's
# own from-scratch pretraining peaked at 8e-4. Our runs start from random weights, hence the default.
PAPER_LR = 2.5e-5
MODERNBERT_LR = 8e-4


@dataclass
class TrainConfig:
    # data
    shards: str = "runs/shards"
    teacher: str = "runs/teacher"
    out: str = "runs/pretrain"
    name: str = "htmllm"
    # model
    preset: str = "mini"
    pooling: str = "cls"
    max_length: int = 4096
    attn_implementation: str = "sdpa"
    # optimisation: AdamW, trapezoidal schedule
    lr: float = MODERNBERT_LR
    weight_decay: float = 0.01
    beta1: float = 0.9
    beta2: float = 0.98
    eps: float = 1e-6
    grad_clip: float = 1.0
    batch_size: int = 16  # documents per micro-batch per process
    grad_accum: int = 1  # micro-batches per optimizer step
    max_steps: int = 0  # 0: derived from `epochs`
    epochs: float = 1.0
    warmup_frac: float = 0.1
    cooldown_frac: float = 0.2
    # objectives
    mask_prob: float = 0.3
    temperature: float = 0.1
    distil_rank: int = 256
    loss_weights: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_LOSS_WEIGHTS))
    random_coefficients: bool = True
    # run
    seed: int = 0
    device: str = "auto"  # "auto" | "cpu" | "cuda"
    precision: str = "auto"  # "auto" (bf16 autocast on CUDA, fp32 on CPU) | "fp32" | "bf16"
    threads: int = 0  # torch intra-op threads on CPU; 0 keeps torch's default
    log_every: int = 10
    eval_every: int = 100  # 0: only at the end
    checkpoint_every: int = 200  # 0: only at the end
    keep_checkpoints: int = 2
    eval_batch_size: int = 32
    export_dtype: str = "float32"  # dtype of the final served checkpoint ("float16" halves it)
    tensorboard: bool = True
    progress: bool = True

    def __post_init__(self) -> None:
        positive = ("max_length", "batch_size", "grad_accum", "distil_rank", "log_every", "eval_batch_size")
        for name in positive:
            if getattr(self, name) < 1:
                raise DataError(f"config: {name} must be at least 1, got {getattr(self, name)}")
        if self.lr <= 0:
            raise DataError(f"config: lr must be positive, got {self.lr}")
        fractions = (self.warmup_frac, self.cooldown_frac)
        if min(fractions) < 0 or sum(fractions) > 1:
            raise DataError("config: warmup_frac and cooldown_frac must be >= 0 and sum to at most 1")
        if self.max_steps < 0 or self.epochs <= 0:
            raise DataError("config: max_steps must be >= 0 and epochs > 0")
        if self.device not in ("auto", "cpu", "cuda"):
            raise DataError(f"config: device must be auto, cpu or cuda, got {self.device!r}")
        if self.precision not in ("auto", "fp32", "bf16"):
            raise DataError(f"config: precision must be auto, fp32 or bf16, got {self.precision!r}")
        if self.export_dtype not in ("float32", "float16", "bfloat16"):
            raise DataError(
                f"config: export_dtype must be float32, float16 or bfloat16, got {self.export_dtype!r}"
            )
        unknown = set(self.loss_weights) - set(DEFAULT_LOSS_WEIGHTS)
        if unknown:
            raise DataError(f"config: unknown losses in loss_weights: {sorted(unknown)}")
        self.loss_weights = {**DEFAULT_LOSS_WEIGHTS, **{k: float(v) for k, v in self.loss_weights.items()}}

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise DataError(f"config: unknown keys {unknown}")
        return cls(**data)


def _flatten(data: dict[str, Any], origin: str) -> dict[str, Any]:
    """Merge one level of TOML tables into the top level (except `loss_weights`, a real mapping)."""
    flat: dict[str, Any] = {}
    for key, value in data.items():
        items = value.items() if isinstance(value, dict) and key != "loss_weights" else [(key, value)]
        for inner, inner_value in items:
            if inner in flat:
                raise DataError(f"{origin}: key {inner!r} is set twice")
            flat[inner] = inner_value
    return flat


def load_config(path: str | Path | None, overrides: dict[str, Any] | None = None) -> TrainConfig:
    """A TrainConfig from a TOML file (relative paths resolved from the working directory) + overrides."""
    data: dict[str, Any] = {}
    if path is not None:
        file = Path(path)
        if not file.is_file():
            raise DataError(f"config file {file} does not exist")
        try:
            data = _flatten(tomllib.loads(file.read_text(encoding="utf-8")), str(file))
        except tomllib.TOMLDecodeError as exc:
            raise DataError(f"{file} is not valid TOML: {exc}") from exc
    data.update({k: v for k, v in (overrides or {}).items() if v is not None})
    try:
        return TrainConfig.from_dict(data)
    except TypeError as exc:
        raise DataError(f"config: {exc}") from exc
