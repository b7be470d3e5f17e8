"""The resolved configuration of one pretraining run: a TOML file plus command-line overrides.

One flat set of keys; the TOML may group them under tables (`[optim]`, `[loss]`, ...) for reading,
the table names are not part of the key. The resolved config is saved with every checkpoint, so a
served model says exactly how it was trained.
"""

from __future__ import annotations

import math
import tomllib
import types
import typing
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from model_training.data import DataError
from model_training.objectives import DEFAULT_LOSS_WEIGHTS
from service.core.checkpoint_format import model_name_problem
from service.core.modeling import POOLINGS, PRESETS

# Learning rates worth knowing: the paper fine-tunes a pretrained ModernBERT at 2.5e-5; ModernBERT's
# own from-scratch pretraining peaked at 8e-4. Our runs start from random weights, hence the default.
PAPER_LR = 2.5e-5
MODERNBERT_LR = 8e-4
MIN_MAX_LENGTH = 8  # as `htmllm data prepare`: [CLS], [SEP] and a few tokens of the page
# The contrastive logits are cosines / temperature: at 1e-40 they overflow to inf and the loss is NaN
# from the first step; well before that, 1/temperature scales the gradients past anything AdamW's
# warm-up absorbs. 1e-3 (logits up to 1000) is far below any temperature used in practice.
MIN_TEMPERATURE = 1e-3
DEFAULT_TEACHER_DIR = "runs/teacher"  # read where neither the config nor --teacher sets `teacher`
ATTN_IMPLEMENTATIONS = ("sdpa", "eager", "flash_attention_2", "flash_attention_3", "flex_attention")


@dataclass
class TrainConfig:
    # data
    shards: str = "runs/shards"
    # None: not set by the config nor --teacher (`teacher_dir` is then DEFAULT_TEACHER_DIR). Kept apart
    # from a path the user gave, even the default's: a run without distillation says that a teacher it
    # was given is not read, and only then (`run_data`).
    teacher: str | None = None
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
        # Everything is checked here, before any data is read or any model built: a typo in a TOML
        # file must cost a message, not a traceback minutes into a run (or a run of NaN losses).
        _check_types(self)
        problem = model_name_problem(self.name)
        if problem is not None:
            raise DataError(f"config: name {self.name[:60]!r}: {problem}")
        positive = ("max_length", "batch_size", "grad_accum", "distil_rank", "log_every", "eval_batch_size")
        for name in positive:
            if getattr(self, name) < 1:
                raise DataError(f"config: {name} must be at least 1, got {getattr(self, name)}")
        if self.max_length < MIN_MAX_LENGTH:
            raise DataError(f"config: max_length must be at least {MIN_MAX_LENGTH}, got {self.max_length}")
        # keep_checkpoints 0 would delete the checkpoint `latest` names as soon as it is written.
        non_negative = ("max_steps", "eval_every", "checkpoint_every", "threads", "seed")
        for name in (*non_negative, "keep_checkpoints"):
            minimum = 1 if name == "keep_checkpoints" else 0
            if getattr(self, name) < minimum:
                raise DataError(f"config: {name} must be at least {minimum}, got {getattr(self, name)}")
        for name in ("lr", "eps", "temperature", "epochs"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise DataError(f"config: {name} must be a finite positive number, got {value}")
        if self.temperature < MIN_TEMPERATURE:
            raise DataError(
                f"config: temperature must be at least {MIN_TEMPERATURE} (0.05 to 0.1 is usual), "
                f"got {self.temperature}"
            )
        for name in ("weight_decay", "grad_clip"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise DataError(f"config: {name} must be a finite number >= 0, got {value}")
        for name in ("beta1", "beta2"):
            if not 0 <= getattr(self, name) < 1:
                raise DataError(f"config: {name} must be in [0, 1), got {getattr(self, name)}")
        if not 0 < self.mask_prob < 1:
            raise DataError(f"config: mask_prob must be in (0, 1), got {self.mask_prob}")
        fractions = (self.warmup_frac, self.cooldown_frac)
        # nan compares false both ways: it passed, and the first step's schedule raised ValueError.
        if not all(math.isfinite(f) for f in fractions) or min(fractions) < 0 or sum(fractions) > 1:
            raise DataError(
                "config: warmup_frac and cooldown_frac must be finite, >= 0 and sum to at most 1, got "
                f"{self.warmup_frac} and {self.cooldown_frac}"
            )
        choices = {
            "preset": tuple(PRESETS),
            "pooling": POOLINGS,
            "attn_implementation": ATTN_IMPLEMENTATIONS,
            "device": ("auto", "cpu", "cuda"),
            "precision": ("auto", "fp32", "bf16"),
            "export_dtype": ("float32", "float16", "bfloat16"),
        }
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise DataError(
                    f"config: {name} must be one of {', '.join(allowed)}, got {getattr(self, name)!r}"
                )
        unknown = set(self.loss_weights) - set(DEFAULT_LOSS_WEIGHTS)
        if unknown:
            raise DataError(f"config: unknown losses in loss_weights: {sorted(unknown)}")
        weights = {**DEFAULT_LOSS_WEIGHTS, **self.loss_weights}
        for name, value in weights.items():
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                raise DataError(f"config: loss_weights.{name} must be a finite number, got {value!r}")
            if value < 0:
                raise DataError(f"config: loss_weights.{name} must be >= 0, got {value}")
        if not any(weights.values()):
            raise DataError("config: loss_weights are all zero: nothing to train")
        self.loss_weights = {k: float(v) for k, v in weights.items()}

    @property
    def teacher_dir(self) -> str:
        """The directory a distilling run reads its teacher vectors from: `teacher`, else the default."""
        return DEFAULT_TEACHER_DIR if self.teacher is None else self.teacher

    @property
    def distils(self) -> bool:
        """Whether the run trains the distillation objective (and so reads teacher vectors)."""
        return self.loss_weights.get("distil", 0.0) > 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def record(self) -> dict[str, Any]:
        """The config as a checkpoint records it (`training.config`): `teacher` is the directory the
        vectors were read from, null for a run without distillation, which reads none (the default
        path, or a --teacher given anyway, stood there beside `training.teacher: null`)."""
        return {**self.to_dict(), "teacher": self.teacher_dir if self.distils else None}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise DataError(f"config: unknown keys {unknown}")
        return cls(**data)


def _check_types(config: TrainConfig) -> None:
    """Each value has its field's type: an int where an int is meant (16.0 or true is not a batch size),
    a number where a float is, a string, a boolean, a table."""
    hints = typing.get_type_hints(TrainConfig)
    for f in fields(config):
        value, hint = getattr(config, f.name), hints[f.name]
        optional = [arg for arg in typing.get_args(hint) if arg is not type(None)]
        if isinstance(hint, types.UnionType) and len(optional) == 1:  # `X | None`: unset, or an X
            if value is None:
                continue
            hint = optional[0]
        expected = typing.get_origin(hint) or hint
        if expected is float:
            ok = isinstance(value, int | float) and not isinstance(value, bool)
            if ok:
                setattr(config, f.name, float(value))
        elif expected is int:
            ok = isinstance(value, int) and not isinstance(value, bool)
        elif expected is dict:
            ok = isinstance(value, dict)
        else:
            ok = isinstance(value, expected)
        if not ok:
            name = getattr(expected, "__name__", str(expected))
            raise DataError(f"config: {f.name} must be of type {name}, got {value!r}")


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
        if file.is_dir():
            raise DataError(f"config file {file} is a directory, not a TOML file")
        if not file.is_file():
            raise DataError(f"config file {file} does not exist")
        try:
            text = file.read_text(encoding="utf-8")
        except UnicodeDecodeError as exc:  # TOML is UTF-8 by definition
            raise DataError(
                f"{file} is not valid TOML: not UTF-8 text ({exc.reason} at byte {exc.start})"
            ) from exc
        except OSError as exc:  # permission denied, I/O error
            raise DataError(f"config file {file} cannot be read: {exc.strerror or exc}") from exc
        try:
            data = _flatten(tomllib.loads(text), str(file))
        except tomllib.TOMLDecodeError as exc:
            raise DataError(f"{file} is not valid TOML: {exc}") from exc
    data.update({k: v for k, v in (overrides or {}).items() if v is not None})
    try:
        return TrainConfig.from_dict(data)
    except TypeError as exc:
        raise DataError(f"config: {exc}") from exc
