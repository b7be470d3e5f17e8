"""`tasks derive` that writes no task is a typed error (exit 1), with derive.json still saying why.

An empty corpus had exited 0 with every task skipped; `heads train` then failed later on "no task
directories". `tokenizer train` and `data prepare` refuse an empty corpus the same way.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from model_training.evaluation.derive import derive_tasks
from model_training.evaluation.metrics import EvaluationError
from tests.model_training.evaluation.pagegen import write_corpus


def _derive(corpus: Path, out: Path, *extra: str) -> int:
    from service.cli import main

    return main(["tasks", "derive", "--corpus", str(corpus), "--out", str(out), *extra])


def test_an_empty_corpus_is_refused_and_derive_json_says_why(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    corpus = tmp_path / "empty.jsonl"
    corpus.write_text("", encoding="utf-8")
    out = tmp_path / "tasks"
    assert _derive(corpus, out) == 1
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("htmllm tasks derive: validation_error: no task was derived")
    assert f"{corpus} holds no page to label" in err[0] and "derive.json records why" in err[0]
    assert "page_kind: skipped (" in captured.out  # each task's reason, as for any skipped task
    summary = json.loads((out / "derive.json").read_text(encoding="utf-8"))
    assert [row["task"] for row in summary] == ["page_kind", "schema_type", "language"]
    assert all(row["skipped"] and row["pages"] == 0 for row in summary)


def test_pages_too_few_for_every_task_are_refused_naming_each_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    corpus = write_corpus(tmp_path / "corpus.jsonl", sites=6, pages_per_site=2)
    out = tmp_path / "tasks"
    assert _derive(corpus, out, "--min-pages", "100", "--min-sites", "3", "--folds", "3") == 1
    err = capsys.readouterr().err
    assert "every task was skipped on the 12 page(s)" in err and "language: fewer than two classes" in err
    assert json.loads((out / "derive.json").read_text(encoding="utf-8"))[0]["pages"] == 12
    # One task written is a derivation: exit 0, as before.
    assert _derive(corpus, out, "--min-pages", "2", "--min-sites", "2", "--folds", "2") == 0


def test_require_a_task_passes_when_one_task_was_written(tmp_path: Path) -> None:
    from model_training.evaluation.derive import require_a_task

    corpus = write_corpus(tmp_path / "corpus.jsonl", sites=15, pages_per_site=4)
    results = derive_tasks(corpus, tmp_path / "tasks", min_pages=6, min_sites=3, folds=3)
    require_a_task(results, corpus, tmp_path / "tasks")
    for r in results:
        r.path = None
    with pytest.raises(EvaluationError, match="no task was derived"):
        require_a_task(results, corpus, tmp_path / "tasks")
