"""Metrics and the NMM against hand-computed values, in both metric directions."""

from __future__ import annotations

import math

import pytest

from model_training.evaluation.metrics import (
    EvaluationError,
    accuracy,
    f1_macro,
    normalized_metric_mean,
    normalized_score,
    rmse,
)


def test_accuracy_counts_exact_matches() -> None:
    assert accuracy(["a", "b", "a", "c"], ["a", "b", "b", "c"]) == 0.75


def test_f1_macro_by_hand() -> None:
    # a: tp=1 fp=1 fn=1 -> 0.5; b: tp=1 fp=0 fn=1 -> 2/3; c: tp=1 fp=1 fn=0 -> 2/3.
    y_true = ["a", "a", "b", "b", "c"]
    y_pred = ["a", "b", "b", "c", "c"]
    assert f1_macro(y_true, y_pred) == pytest.approx((0.5 + 2 / 3 + 2 / 3) / 3)


def test_f1_macro_counts_a_never_true_class_as_zero() -> None:
    # a: tp=1 fn=1 -> 2/3; z is predicted but never true -> 0.
    assert f1_macro(["a", "a"], ["a", "z"]) == pytest.approx((2 / 3 + 0.0) / 2)


def test_rmse_by_hand() -> None:
    assert rmse([1.0, 2.0, 3.0], [1.0, 4.0, 1.0]) == pytest.approx(math.sqrt(8 / 3))


def test_metrics_reject_mismatched_inputs() -> None:
    with pytest.raises(EvaluationError):
        accuracy([1, 2], [1])
    with pytest.raises(EvaluationError):
        rmse([], [])


def test_normalized_score_maximised_metric() -> None:
    # C = (M - R) / (1 - R): (0.8 - 0.4) / 0.6 = 2/3.
    assert normalized_score(0.8, 0.4, maximize=True) == pytest.approx(2 / 3)
    assert normalized_score(0.4, 0.4, maximize=True) == 0.0
    assert normalized_score(1.0, 0.4, maximize=True) == pytest.approx(1.0)


def test_normalized_score_minimised_metric() -> None:
    # C = 1 - M / R: 1 - 0.5 / 2.0 = 0.75; worse than random is negative.
    assert normalized_score(0.5, 2.0, maximize=False) == pytest.approx(0.75)
    assert normalized_score(3.0, 2.0, maximize=False) == pytest.approx(-0.5)


def test_nmm_averages_both_directions() -> None:
    model = {"kind": 0.8, "lang": 0.9, "length": 0.5}
    random = {"kind": 0.4, "lang": 0.5, "length": 2.0}
    metrics = {"kind": "f1_macro", "lang": "accuracy", "length": "rmse"}
    # (2/3 + (0.9 - 0.5) / 0.5 + 0.75) / 3 = (0.6667 + 0.8 + 0.75) / 3
    assert normalized_metric_mean(model, random, metrics) == pytest.approx((2 / 3 + 0.8 + 0.75) / 3)


def test_nmm_rejects_degenerate_baselines() -> None:
    with pytest.raises(EvaluationError):
        normalized_score(1.0, 1.0, maximize=True)
    with pytest.raises(EvaluationError):
        normalized_score(0.1, 0.0, maximize=False)
    with pytest.raises(EvaluationError):
        normalized_metric_mean({"a": 0.5}, {}, {"a": "accuracy"})
