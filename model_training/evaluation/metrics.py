"""Task metrics and the Normalized Metric Mean (NMM) that aggregates them against a random baseline.

Each task reports one metric; NMM puts every task on a common scale by comparing it with the same head
trained on random embeddings (what the head learns from label frequencies alone):
C_t = (M_t - R_t) / (1 - R_t) where higher is better (1 is perfect, 0 is no better than random), and
C_t = 1 - M_t / R_t where lower is better (RMSE: 1 is a perfect fit, 0 is the random baseline's error).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

from service.core.errors import ErrorCode, HtmllmError


class EvaluationError(HtmllmError):
    """An evaluation that cannot be run or aggregated: bad task file, unknown metric, degenerate baseline."""

    code = ErrorCode.VALIDATION


def accuracy(y_true: ArrayLike, y_pred: ArrayLike) -> float:
    """Fraction of exact matches."""
    t, p = np.asarray(y_true), np.asarray(y_pred)
    if t.shape != p.shape or t.size == 0:
        raise EvaluationError(
            f"accuracy needs two equal, non-empty label arrays, got {t.shape} and {p.shape}"
        )
    return float(np.mean(t == p))


def f1_macro(y_true: ArrayLike, y_pred: ArrayLike) -> float:
    """Unweighted mean of per-class F1 over the classes present in `y_true` or `y_pred`.

    A class that is never predicted and never true contributes nothing; one that is predicted but never
    true (or the reverse) contributes 0, as in scikit-learn's `f1_score(average="macro")`.
    """
    t, p = np.asarray(y_true), np.asarray(y_pred)
    if t.shape != p.shape or t.size == 0:
        raise EvaluationError(
            f"f1_macro needs two equal, non-empty label arrays, got {t.shape} and {p.shape}"
        )
    scores = []
    for label in np.union1d(t, p):
        tp = float(np.sum((t == label) & (p == label)))
        fp = float(np.sum((t != label) & (p == label)))
        fn = float(np.sum((t == label) & (p != label)))
        scores.append(2 * tp / (2 * tp + fp + fn) if tp else 0.0)
    return float(np.mean(scores))


def rmse(y_true: ArrayLike, y_pred: ArrayLike) -> float:
    """Root mean squared error."""
    t, p = np.asarray(y_true, dtype=np.float64), np.asarray(y_pred, dtype=np.float64)
    if t.shape != p.shape or t.size == 0:
        raise EvaluationError(f"rmse needs two equal, non-empty value arrays, got {t.shape} and {p.shape}")
    return float(np.sqrt(np.mean((t - p) ** 2)))


@dataclass(frozen=True)
class Metric:
    name: str
    fn: Callable[[ArrayLike, ArrayLike], float]
    maximize: bool
    kinds: tuple[str, ...]  # task kinds the metric applies to


METRICS: dict[str, Metric] = {
    "f1_macro": Metric("f1_macro", f1_macro, True, ("classification",)),
    "accuracy": Metric("accuracy", accuracy, True, ("classification",)),
    "rmse": Metric("rmse", rmse, False, ("regression",)),
}


def get_metric(name: str) -> Metric:
    try:
        return METRICS[name]
    except KeyError:
        raise EvaluationError(f"unknown metric {name!r}; known: {', '.join(METRICS)}") from None


def normalized_score(model: float, random: float, *, maximize: bool) -> float:
    """C_t: the model's metric relative to the random-embedding baseline's."""
    if maximize:
        if random >= 1.0:
            raise EvaluationError("the random baseline is already perfect (R_t = 1); C_t is undefined")
        return (model - random) / (1.0 - random)
    if random <= 0.0:
        raise EvaluationError("the random baseline has zero error (R_t = 0); C_t is undefined")
    return 1.0 - model / random


def normalized_metric_mean(
    model: Mapping[str, float], random: Mapping[str, float], metrics: Mapping[str, str]
) -> float:
    """NMM over the tasks in `model`: the mean of C_t, with `metrics` naming each task's metric."""
    if not model:
        raise EvaluationError("NMM needs at least one task")
    missing = sorted(set(model) - set(random))
    if missing:
        raise EvaluationError(f"no random-baseline score for tasks {missing}")
    scores = [
        normalized_score(value, random[task], maximize=get_metric(metrics[task]).maximize)
        for task, value in model.items()
    ]
    return float(np.mean(scores))
