"""The Markdown report says how many folds the run used."""

from __future__ import annotations

from typing import Any

from model_training.evaluation.heads import CVResult
from model_training.evaluation.report import render_markdown
from model_training.evaluation.runner import EvalResult, SystemResult


def _task(name: str, folds: int) -> dict[str, Any]:
    return {"name": name, "kind": "classification", "metric": "f1_macro", "pages": 20, "sites": 10,
            "folds": folds, "labels": ["a", "b"]}  # fmt: skip


def _result(*folds: int) -> EvalResult:
    tasks = [_task(f"t{i}", k) for i, k in enumerate(folds)]
    scores = {t["name"]: CVResult("f1_macro", 0.5, 0.1, [0.5] * t["folds"]) for t in tasks}
    return EvalResult(tasks=tasks, systems=[SystemResult(name="random", kind="random", scores=scores)])


def test_the_report_names_the_fold_count_the_run_used() -> None:
    """It said "5-fold cross-validation" whatever --folds was."""
    assert "2-fold cross-validation by site" in render_markdown(_result(2, 2))
    assert "5-fold" not in render_markdown(_result(2, 2))
    mixed = render_markdown(_result(2, 4))  # tasks whose rows carry their own folds
    assert "k-fold (per task: the Folds column) cross-validation" in mixed
