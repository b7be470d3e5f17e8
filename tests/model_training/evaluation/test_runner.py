"""The evaluation runner's bookkeeping: which checkpoints are evaluated and under which names."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from model_training.evaluation.derive import derive_tasks
from model_training.evaluation.heads import HeadConfig
from model_training.evaluation.report import write_report
from model_training.evaluation.runner import EvalConfig, display_names, run_evaluation, unique_checkpoints
from model_training.evaluation.tasks import load_tasks
from tests.factories.checkpoint import build_tiny_checkpoint
from tests.model_training.evaluation.pagegen import write_corpus


def test_checkpoints_sharing_a_name_get_the_shortest_suffix_that_tells_them_apart(tmp_path: Path) -> None:
    a, b, c = tmp_path / "runs/a/model", tmp_path / "runs/b/model", tmp_path / "old/a/model"
    assert display_names({a: "t", b: "t"}) == {a: "t@a/model", b: "t@b/model"}
    assert display_names({a: "t", b: "t", c: "t"}) == {
        a: "t@runs/a/model",
        b: "t@runs/b/model",
        c: "t@old/a/model",
    }
    d = tmp_path / "runs/d"
    assert display_names({a: "t", d: "t", c: "u"}) == {a: "t@model", d: "t@d", c: "u"}  # as before
    # The same from a relative path: the suffix is of the directory, not of how it was spelled.
    assert display_names({Path("x/model"): "t", tmp_path / "y/model": "t"})[Path("x/model")] == "t@x/model"


def test_one_directory_given_twice_is_evaluated_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ckpt").mkdir()
    given = [Path("ckpt"), tmp_path / "ckpt", Path("ckpt/../ckpt"), Path("other")]
    assert unique_checkpoints(given) == [Path("ckpt"), Path("other")]


@pytest.mark.slow
def test_two_model_directories_are_two_systems_in_the_report(tmp_path: Path) -> None:
    """runs/a/model and runs/b/model (both `tiny-test`) were both `tiny-test@model`: one series in the
    plot and the studies, their rows told apart only by the checkpoint path."""
    corpus = write_corpus(tmp_path / "corpus.jsonl", sites=6, pages_per_site=3)
    derive_tasks(corpus, tmp_path / "tasks", min_pages=4, min_sites=3, folds=3)
    first = build_tiny_checkpoint(tmp_path / "runs/a/model")
    second = build_tiny_checkpoint(tmp_path / "runs/b/model", seed=1)
    tasks = [t for t in load_tasks(tmp_path / "tasks") if t.spec.name == "page_kind"]
    assert tasks
    config = EvalConfig(
        checkpoints=(first, second),
        baselines=(),
        head=HeadConfig(hidden=8, max_epochs=3, patience=1, batch_size=16),
    )
    result = run_evaluation(tasks, config)
    models = {s.checkpoint: s.model for s in result.systems}
    assert models == {str(first): "tiny-test@a/model", str(second): "tiny-test@b/model"}
    write_report(result, tmp_path / "report")
    report = json.loads((tmp_path / "report" / "report.json").read_text(encoding="utf-8"))
    assert len({s["name"] for s in report["systems"]}) == len({s["model"] for s in report["systems"]}) == 2


def test_a_missing_checkpoint_is_refused_before_any_page_is_pruned(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It was read after every page of every task had been pruned and extracted (minutes to hours)."""
    import model_training.evaluation.runner as runner
    from service.core.errors import HtmllmError

    def prepare(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("pages were prepared before the checkpoints were read")

    monkeypatch.setattr(runner, "prepare_tasks", prepare)
    config = EvalConfig(checkpoints=(tmp_path / "runs/a/modle",), baselines=("random",))
    with pytest.raises(HtmllmError, match=r"modle is not an htmllm checkpoint"):
        run_evaluation([], config)


def test_extracted_texts_are_cached_per_extraction_version(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Our extraction code changes texts without an extractor library changing version: a cache keyed on
    # the libraries alone served the old texts.
    import service.core.extract as extraction
    from model_training.evaluation.runner import PageTexts

    words = " ".join(f"word{i}" for i in range(80))
    pages = {"p": f"<html><body><article><p>{words}.</p></article></body></html>".encode()}
    first = PageTexts(pages, tmp_path)
    first.extract_all()
    assert "word79" in first.extracted("p")
    assert "p" in PageTexts(pages, tmp_path)._extracted  # the same version reads it back
    monkeypatch.setattr(extraction, "EXTRACTION_VERSION", "next")
    assert "p" not in PageTexts(pages, tmp_path)._extracted


def test_non_finite_head_metrics_are_left_out_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    # htmllm.json refuses NaN; a Spearman over a constant fold gives it, after every head was trained.
    from model_training.evaluation.runner import finite_metrics
    from service.core.modeling import HeadSpec

    metrics = {"spearman": float("nan"), "spearman_std": float("inf"), "cv_folds": 5, "pages": 40}
    kept = finite_metrics("quality", metrics)
    assert kept == {"cv_folds": 5, "pages": 40}
    assert "head quality: spearman, spearman_std not finite" in caplog.text
    with pytest.raises(ValueError):
        HeadSpec(name="quality", kind="regression", metrics=metrics)
    assert HeadSpec(name="quality", kind="regression", metrics=kept).metrics == kept
