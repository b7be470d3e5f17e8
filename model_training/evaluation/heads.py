"""Training the served MLP head (`service.core.modeling.TaskHead`) on frozen embeddings.

Only the head learns: the encoder's embeddings are computed once (and cached) and arrive here as arrays,
so head training cannot touch the encoder's weights. Each head trains with AdamW on a group-disjoint
training split and stops early on a validation split of other sites, keeping the best epoch's weights.
`cross_validate` repeats that on k group-disjoint folds and reports the test-fold metric's mean and std.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

import numpy as np
import torch
from torch import nn

from model_training.evaluation.metrics import EvaluationError, Metric, get_metric
from model_training.evaluation.tasks import Task, TaskSpec
from service.core.modeling import HeadSpec, TaskHead

# Given the indices of the training and the test pages, the features of each (for fixed embeddings a
# slice; for TF-IDF a vectoriser fit on the training pages only, so the test fold never leaks in).
FoldFeatures = Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]


@dataclass(frozen=True)
class HeadConfig:
    """Head size and training; 512 hidden units on 768-d embeddings is a ~0.4M-parameter head."""

    hidden: int = 512
    dropout: float = 0.1
    lr: float = 1e-3
    weight_decay: float = 0.01
    batch_size: int = 64
    max_epochs: int = 200
    patience: int = 15  # epochs without a better validation score before stopping
    # "metric": keep the epoch with the best validation task metric (ties: lower loss), which is what
    # the evaluation reports; "loss": the lowest validation loss. On small, imbalanced validation sets
    # the class-weighted loss bottoms out early, while the metric keeps improving.
    stop_on: str = "metric"
    val_fraction: float = 0.15  # of the training sites, held out for early stopping
    class_weighted: bool = True  # inverse-frequency class weights, since f1_macro weighs classes equally
    seed: int = 0

    def __post_init__(self) -> None:
        if self.stop_on not in ("metric", "loss"):
            raise EvaluationError(f"stop_on must be 'metric' or 'loss', got {self.stop_on!r}")
        # Each refusal names the option (the command-line flag is the field with '-' for '_'): the
        # whole dataclass repr had been printed, and a bad lr surfaced from torch only after embedding.
        for name in ("hidden", "batch_size", "max_epochs", "patience"):
            if getattr(self, name) < 1:
                raise EvaluationError(f"head {name} must be at least 1, got {getattr(self, name)}")
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise EvaluationError(f"head lr must be a positive number, got {self.lr}")
        if not (math.isfinite(self.weight_decay) and self.weight_decay >= 0):
            raise EvaluationError(f"head weight_decay must be >= 0, got {self.weight_decay}")
        if not 0 <= self.dropout < 1:
            raise EvaluationError(f"head dropout must be within [0, 1), got {self.dropout}")
        if not 0 < self.val_fraction < 1:
            raise EvaluationError(f"head val_fraction must be within (0, 1), got {self.val_fraction}")


@dataclass
class TrainedHead:
    head: TaskHead
    best_epoch: int
    epochs: int
    val_loss: float
    val_metric: float | None  # the task metric on the validation split at the best epoch


@dataclass(frozen=True)
class CVResult:
    metric: str
    mean: float
    std: float
    folds: list[float] = field(default_factory=list)


def head_spec(spec: TaskSpec, config: HeadConfig, metrics: dict[str, float] | None = None) -> HeadSpec:
    return HeadSpec(
        name=spec.name,
        kind=spec.kind,
        labels=list(spec.labels),
        hidden=config.hidden,
        metrics=dict(metrics or {}),
    )


def count_parameters(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def validation_split(groups: list[str], fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Indices (fit, val): `fraction` of the sites, at least one, go to validation."""
    unique = sorted(set(groups))
    if len(unique) < 2:
        raise EvaluationError("early stopping needs pages from at least two sites in the training folds")
    rng = np.random.default_rng(seed)
    n_val = min(len(unique) - 1, max(1, round(fraction * len(unique))))
    val_sites = set(rng.permutation(unique)[:n_val].tolist())
    is_val = np.asarray([g in val_sites for g in groups])
    return np.flatnonzero(~is_val), np.flatnonzero(is_val)


def _loss_fn(spec: HeadSpec, y_fit: np.ndarray, config: HeadConfig) -> nn.Module:
    if spec.kind == "regression":
        return nn.MSELoss()
    if not config.class_weighted:
        return nn.CrossEntropyLoss()
    counts = np.bincount(y_fit, minlength=spec.outputs).astype(np.float64)
    weights = len(y_fit) / (spec.outputs * np.maximum(counts, 1.0))
    return nn.CrossEntropyLoss(weight=torch.as_tensor(weights, dtype=torch.float32))


@contextmanager
def one_thread() -> Iterator[None]:
    """Run torch on one CPU thread, then restore the caller's setting.

    A head is too small to split across threads: on a busy machine extra threads only wait on each other
    (tens of times slower). One thread also fixes the float summation order, so a head's training and
    predictions do not depend on what set the process-wide thread count before (the Engine does).
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def train_head(
    spec: HeadSpec,
    x_fit: np.ndarray,
    y_fit: np.ndarray,
    x_val: np.ndarray,
    y_val: np.ndarray,
    config: HeadConfig = HeadConfig(),
    *,
    metric: str | None = None,
) -> TrainedHead:
    """Train a TaskHead on (x_fit, y_fit), keeping the weights of its best epoch on (x_val, y_val).

    The best epoch is by `metric` (a metric name) when `config.stop_on` is "metric", else by loss.

    Regression targets are standardised for training and the scale is folded back into the output layer,
    so the returned head predicts values in the task's own units.
    """
    if (
        x_fit.ndim != 2
        or len(x_fit) != len(y_fit)
        or len(x_val) != len(y_val)
        or min(len(x_fit), len(x_val)) == 0
    ):
        raise EvaluationError(
            f"head training needs non-empty fit and validation sets, got x {x_fit.shape} / y {y_fit.shape}, "
            f"x_val {x_val.shape} / y_val {y_val.shape}"
        )
    scorer = get_metric(metric) if metric is not None and config.stop_on == "metric" else None
    with one_thread():
        return _train_head(spec, x_fit, y_fit, x_val, y_val, config, scorer)


def _train_head(
    spec: HeadSpec,
    x_fit: np.ndarray,
    y_fit: np.ndarray,
    x_val: np.ndarray,
    y_val: np.ndarray,
    config: HeadConfig,
    scorer: Metric | None,
) -> TrainedHead:
    regression = spec.kind == "regression"
    mean, scale = (float(np.mean(y_fit)), float(np.std(y_fit)) or 1.0) if regression else (0.0, 1.0)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        head = TaskHead(spec, x_fit.shape[1], dropout=config.dropout)
        generator = torch.Generator().manual_seed(config.seed)
        xf = torch.as_tensor(x_fit, dtype=torch.float32)
        xv = torch.as_tensor(x_val, dtype=torch.float32)
        target_dtype = torch.float32 if regression else torch.long
        yf = torch.as_tensor((y_fit - mean) / scale if regression else y_fit, dtype=target_dtype)
        yv = torch.as_tensor((y_val - mean) / scale if regression else y_val, dtype=target_dtype)
        loss_fn = _loss_fn(spec, y_fit.astype(np.int64) if not regression else y_fit, config)
        optimizer = torch.optim.AdamW(head.parameters(), lr=config.lr, weight_decay=config.weight_decay)
        # The signed metric is higher-is-better (0 when stopping on loss); ties go to the lower loss.
        best_signed, best_loss, best_metric, best_epoch = -math.inf, math.inf, None, 0
        best_state = copy.deepcopy(head.state_dict())
        epoch = 0
        for epoch in range(1, config.max_epochs + 1):
            head.train()
            order = torch.randperm(len(xf), generator=generator)
            for start in range(0, len(order), config.batch_size):
                batch = order[start : start + config.batch_size]
                optimizer.zero_grad(set_to_none=True)
                loss_fn(head.logits(xf[batch]), yf[batch]).backward()
                optimizer.step()
            head.eval()
            with torch.no_grad():
                logits = head.logits(xv)
                val_loss = float(loss_fn(logits, yv))
            val_metric, signed = None, 0.0
            if scorer is not None:
                predicted = logits.numpy() * scale + mean if regression else logits.argmax(dim=-1).numpy()
                val_metric = scorer.fn(y_val, predicted)
                signed = val_metric if scorer.maximize else -val_metric
            tie = abs(signed - best_signed) <= 1e-9
            if signed > best_signed + 1e-9 or (tie and val_loss < best_loss - 1e-6):
                best_signed, best_loss, best_metric, best_epoch = signed, val_loss, val_metric, epoch
                best_state = copy.deepcopy(head.state_dict())
            elif epoch - best_epoch >= config.patience:
                break
    head.load_state_dict(best_state)
    if regression:
        with torch.no_grad():
            head.out.weight.mul_(scale)
            head.out.bias.mul_(scale).add_(mean)
    return TrainedHead(head.eval(), best_epoch, epoch, best_loss, best_metric)


def predict(head: TaskHead, x: np.ndarray) -> np.ndarray:
    """Class indices (argmax) or regression values for the rows of `x`."""
    with one_thread(), torch.no_grad():
        out = head(torch.as_tensor(x, dtype=torch.float32))
    if head.spec.kind == "classification":
        return np.asarray(out.argmax(dim=-1).numpy(), dtype=np.int64)
    return np.asarray(out.numpy(), dtype=np.float64)


def fixed_features(x: np.ndarray) -> FoldFeatures:
    """FoldFeatures for precomputed embeddings."""
    return lambda train, test: (x[train], x[test])


def _fit_with_early_stopping(
    task: Task, spec: HeadSpec, train: np.ndarray, x_train: np.ndarray, config: HeadConfig
) -> TrainedHead:
    fit, val = validation_split([task.groups[i] for i in train], config.val_fraction, config.seed)
    y = task.targets[train]
    return train_head(spec, x_train[fit], y[fit], x_train[val], y[val], config, metric=task.spec.metric)


def cross_validate(task: Task, features: FoldFeatures, config: HeadConfig = HeadConfig()) -> CVResult:
    """Train one head per fold on the other folds and score it on its fold: mean and std over folds."""
    metric = get_metric(task.spec.metric)
    spec = head_spec(task.spec, config)
    scores: list[float] = []
    for fold in range(task.num_folds):
        test = np.flatnonzero(task.folds == fold)
        train = np.flatnonzero(task.folds != fold)
        x_train, x_test = features(train, test)
        trained = _fit_with_early_stopping(
            task, spec, train, x_train, replace(config, seed=config.seed + fold)
        )
        scores.append(metric.fn(task.targets[test], predict(trained.head, x_test)))
    return CVResult(metric.name, float(np.mean(scores)), float(np.std(scores)), scores)


def train_final_head(
    task: Task, x: np.ndarray, config: HeadConfig = HeadConfig(), metrics: dict[str, float] | None = None
) -> tuple[HeadSpec, TaskHead]:
    """The head to serve, with `metrics`: trained as one fold's head is, on the whole task, so it fits on
    the pages of ~85% of the sites (1 - `val_fraction`) and stops early on the others'. Not every page:
    early stopping needs sites the head is not fit on."""
    spec = head_spec(task.spec, config, metrics)
    trained = _fit_with_early_stopping(task, spec, np.arange(len(task.ids)), x, config)
    return spec, trained.head
