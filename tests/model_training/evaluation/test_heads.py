"""MLP head training on embedding arrays: it learns, stops early, and serves in the task's units."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from model_training.evaluation.heads import (
    HeadConfig,
    count_parameters,
    cross_validate,
    fixed_features,
    head_spec,
    predict,
    train_head,
    validation_split,
)
from model_training.evaluation.metrics import f1_macro
from model_training.evaluation.tasks import Task, TaskSpec
from service.core.modeling import PRESETS, TaskHead

FAST = HeadConfig(hidden=32, max_epochs=60, patience=8, batch_size=32)


def clustered(
    n: int, dim: int, classes: int, *, seed: int = 0, noise: float = 0.5
) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((classes, dim)) * 2
    y = rng.integers(0, classes, n)
    return (centres[y] + noise * rng.standard_normal((n, dim))).astype(np.float32), y


def make_task(targets: np.ndarray, spec: TaskSpec, sites: int = 20, folds: int = 5) -> Task:
    n = len(targets)
    groups = [f"site{i % sites}" for i in range(n)]
    return Task(
        spec=spec,
        path=Path("."),
        ids=[str(i) for i in range(n)],
        pages=[b""] * n,
        keys=[f"{i:064x}" for i in range(n)],
        targets=targets,
        groups=groups,
        folds=np.asarray([(i % sites) % folds for i in range(n)], dtype=np.int64),
    )


def test_head_learns_separable_classes() -> None:
    x, y = clustered(400, 16, 3)
    spec = head_spec(TaskSpec("t", "classification", "accuracy", ["a", "b", "c"]), FAST)
    trained = train_head(spec, x[:300], y[:300], x[300:], y[300:], FAST)
    assert isinstance(trained.head, TaskHead)
    assert np.mean(predict(trained.head, x[300:]) == y[300:]) > 0.9
    assert not trained.head.training


def test_early_stopping_on_noise_keeps_the_best_epoch() -> None:
    rng = np.random.default_rng(1)
    x, y = rng.standard_normal((200, 16)).astype(np.float32), rng.integers(0, 2, 200)
    spec = head_spec(TaskSpec("t", "classification", "accuracy", ["a", "b"]), FAST)
    config = HeadConfig(hidden=32, max_epochs=500, patience=5)
    trained = train_head(spec, x[:150], y[:150], x[150:], y[150:], config)
    assert trained.epochs < 500
    assert trained.epochs - trained.best_epoch == 5


def test_metric_stopping_keeps_the_epoch_it_reports() -> None:
    x, y = clustered(300, 16, 3, seed=6, noise=2.0)
    spec = head_spec(TaskSpec("t", "classification", "f1_macro", ["a", "b", "c"]), FAST)
    trained = train_head(spec, x[:200], y[:200], x[200:], y[200:], FAST, metric="f1_macro")
    assert trained.val_metric is not None and trained.best_epoch >= 1
    assert f1_macro(y[200:], predict(trained.head, x[200:])) == pytest.approx(trained.val_metric)


def test_regression_head_predicts_in_task_units() -> None:
    rng = np.random.default_rng(2)
    x = rng.standard_normal((300, 32)).astype(np.float32)
    y = 1000.0 + 50.0 * np.tanh(x[:, 0] - x[:, 1])  # far from zero mean and unit scale
    spec = head_spec(TaskSpec("r", "regression", "rmse"), FAST)
    trained = train_head(spec, x[:240], y[:240], x[240:], y[240:], FAST)
    predicted = predict(trained.head, x[240:])
    error = np.sqrt(np.mean((predicted - y[240:]) ** 2))
    assert error < 0.5 * np.std(y)  # predicting the mean would score 1.0 * std
    assert abs(np.mean(predicted) - 1000.0) < 10.0


@pytest.mark.slow
def test_cross_validation_reports_every_fold() -> None:
    x, y = clustered(200, 16, 2, seed=3)
    task = make_task(y, TaskSpec("t", "classification", "f1_macro", ["a", "b"]))
    result = cross_validate(task, fixed_features(x), FAST)
    assert len(result.folds) == 5 and result.metric == "f1_macro"
    assert result.mean == pytest.approx(np.mean(result.folds))
    assert result.std == pytest.approx(np.std(result.folds))
    assert result.mean > 0.9


def test_random_features_score_near_chance() -> None:
    _, y = clustered(200, 16, 2, seed=4)
    noise = np.random.default_rng(5).standard_normal((200, 16)).astype(np.float32)
    task = make_task(y, TaskSpec("t", "classification", "accuracy", ["a", "b"]))
    assert cross_validate(task, fixed_features(noise), FAST).mean < 0.7


def test_validation_split_is_by_site() -> None:
    groups = [f"s{i % 10}" for i in range(100)]
    fit, val = validation_split(groups, 0.2, seed=0)
    assert len(fit) + len(val) == 100
    assert not {groups[i] for i in fit} & {groups[i] for i in val}
    assert len({groups[i] for i in val}) == 2


def test_default_head_size_at_base_is_in_the_papers_range() -> None:
    spec = head_spec(TaskSpec("t", "classification", "f1_macro", [str(i) for i in range(10)]), HeadConfig())
    params = count_parameters(TaskHead(spec, PRESETS["base"]["hidden_size"]))
    assert 300_000 <= params <= 1_000_000
