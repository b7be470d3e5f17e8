"""The evaluation runner's bookkeeping: which checkpoints are evaluated and under which names."""

from __future__ import annotations

import json
import logging
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


def fake_engine(monkeypatch: pytest.MonkeyPatch, dim: int) -> list[list[str | bytes]]:
    """Replace the Engine by a stub that records what it was asked to embed (a vector per document)."""
    import hashlib

    import numpy as np

    import model_training.evaluation.runner as runner

    calls: list[list[str | bytes]] = []

    async def embed(
        _checkpoint: Path, docs: list[str | bytes], *, max_length: int | None, config: EvalConfig
    ) -> tuple[np.ndarray, list[bool]]:
        calls.append(list(docs))
        raw = [d if isinstance(d, bytes) else d.encode() for d in docs]
        seeds = [int(hashlib.sha256(d).hexdigest()[:8], 16) for d in raw]
        vectors = np.stack([np.random.default_rng(s).normal(size=dim) for s in seeds]).astype(np.float32)
        return vectors, [False] * len(docs)

    monkeypatch.setattr(runner, "_engine_embed", embed)
    return calls


TINY_HEAD = HeadConfig(hidden=8, max_epochs=2, patience=1, batch_size=16)


def test_text_embeddings_are_redone_when_the_extraction_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--input text` embeddings were cached on the page bytes and the model alone: after an extraction
    change (EXTRACTION_VERSION, an extractor library) the new texts were extracted but never embedded,
    and the old texts' embeddings were reported as the new extraction's."""
    import service.core.extract as extraction
    from service.core.checkpoint import read_meta

    corpus = write_corpus(tmp_path / "corpus.jsonl", sites=6, pages_per_site=3)
    derive_tasks(corpus, tmp_path / "tasks", min_pages=4, min_sites=3, folds=3)
    tasks = [t for t in load_tasks(tmp_path / "tasks") if t.spec.name == "page_kind"]
    ckpt = build_tiny_checkpoint(tmp_path / "ckpt")
    calls = fake_engine(monkeypatch, read_meta(ckpt).embedding_dim)
    config = EvalConfig(
        checkpoints=(ckpt,), inputs=("text",), baselines=(), head=TINY_HEAD, cache_dir=tmp_path / "cache"
    )
    run_evaluation(tasks, config)
    assert len(calls) == 1
    run_evaluation(tasks, config)
    assert len(calls) == 1  # the same extraction: the cached embeddings are reused

    class Extracted:
        text = "the same sentence for every page"

    monkeypatch.setattr(extraction, "EXTRACTION_VERSION", extraction.EXTRACTION_VERSION + "-next")
    monkeypatch.setattr(extraction, "extract", lambda *_args, **_kwargs: Extracted())
    run_evaluation(tasks, config)
    assert len(calls) == 2 and set(calls[1]) == {Extracted.text}
    # The pruned-HTML embeddings do not depend on the extraction: still cached.
    html = EvalConfig(**{**config.__dict__, "inputs": ("html",)})
    run_evaluation(tasks, html)
    run_evaluation(tasks, html)
    assert len(calls) == 3


def test_report_and_served_heads_record_the_hash_of_their_tasks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Figures made on other tasks or folds (sites.py had regrouped pages; the published figures stayed)
    are told apart by the hash of the pages, labels, sites and folds they were computed on."""
    from model_training.evaluation.runner import train_heads
    from model_training.evaluation.tasks import HASH_METRIC, hash_metric, task_sha256
    from service.core.checkpoint import read_meta

    corpus = write_corpus(tmp_path / "corpus.jsonl", sites=6, pages_per_site=3)
    derive_tasks(corpus, tmp_path / "tasks", min_pages=4, min_sites=3, folds=3)
    tasks = [t for t in load_tasks(tmp_path / "tasks") if t.spec.name in ("page_kind", "language")]
    ckpt = build_tiny_checkpoint(tmp_path / "ckpt")
    fake_engine(monkeypatch, read_meta(ckpt).embedding_dim)
    config = EvalConfig(checkpoints=(ckpt,), baselines=("random",), head=TINY_HEAD)
    write_report(run_evaluation(tasks, config), tmp_path / "report")
    report = json.loads((tmp_path / "report" / "report.json").read_text(encoding="utf-8"))
    expected = {t.spec.name: task_sha256(t) for t in tasks}
    assert {row["name"]: row["sha256"] for row in report["tasks"]} == expected
    heads = train_heads(ckpt, tasks, config).heads
    assert {name: spec.metrics[HASH_METRIC] for name, (spec, _) in heads.items()} == {
        name: hash_metric(digest) for name, digest in expected.items()
    }


def test_eval_run_seeds_reports_the_spread_over_seeds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Docs had drawn conclusions from NMM differences smaller than what a second seed moves them by;
    `--seeds` repeats the heads over seeds (embedding once) and reports each figure's mean and std."""
    import statistics

    from service.cli import main
    from service.core.checkpoint import read_meta

    corpus = write_corpus(tmp_path / "corpus.jsonl", sites=6, pages_per_site=3)
    derive_tasks(corpus, tmp_path / "tasks", min_pages=4, min_sites=3, folds=3)
    ckpt = build_tiny_checkpoint(tmp_path / "ckpt")
    calls = fake_engine(monkeypatch, read_meta(ckpt).embedding_dim)
    out = tmp_path / "report"
    argv = ["eval", "run", "--checkpoint", str(ckpt), "--tasks", str(tmp_path / "tasks"), "--out", str(out)]
    argv += ["--baselines", "random", "--cache", str(tmp_path / "cache")]
    argv += ["--hidden", "8", "--max-epochs", "3", "--patience", "1"]
    assert main([*argv, "--seeds", "0,1,2"]) == 0
    assert len(calls) == 1  # embedded once, the heads trained three times
    report = json.loads((out / "report.json").read_text(encoding="utf-8"))
    assert report["config"]["seed"] == 0  # the tables are the first seed's
    spread = report["seed_spread"]
    assert set(spread) == {s["name"] for s in report["systems"]}
    row = next(s for s in report["systems"] if s["kind"] == "checkpoint")
    figures = spread[row["name"]]
    assert figures["seeds"] == [0, 1, 2]
    for task in {t["name"] for t in report["tasks"]}:
        runs = figures[task]["values"]
        assert len(runs) == 3 and runs[0] == row["scores"][task]["mean"]
        assert figures[task]["mean"] == pytest.approx(statistics.mean(runs))
        assert figures[task]["std"] == pytest.approx(statistics.stdev(runs))
    assert figures["nmm"]["values"][0] == row["nmm"] and len(figures["nmm"]["values"]) == 3
    assert "## Seed spread" in (out / "report.md").read_text(encoding="utf-8")
    # One seed (the default): no spread section.
    assert main(argv) == 0
    assert "seed_spread" not in json.loads((out / "report.json").read_text(encoding="utf-8"))


def test_a_truncation_past_the_models_length_is_said_where_it_is_capped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """`--truncate 64,4096` on a 128-token model runs 64 and 128: the 4096 row the user asked for had
    vanished from the report without a word."""
    from service.core.checkpoint import read_meta

    corpus = write_corpus(tmp_path / "corpus.jsonl", sites=6, pages_per_site=3)
    derive_tasks(corpus, tmp_path / "tasks", min_pages=4, min_sites=3, folds=3)
    tasks = [t for t in load_tasks(tmp_path / "tasks") if t.spec.name == "page_kind"]
    ckpt = build_tiny_checkpoint(tmp_path / "ckpt")
    max_length = read_meta(ckpt).max_length
    fake_engine(monkeypatch, read_meta(ckpt).embedding_dim)
    config = EvalConfig(
        checkpoints=(ckpt,), truncate=(24, 4096, 8192), inputs=("html",), baselines=(), head=TINY_HEAD,
        cache_dir=tmp_path / "cache",
    )  # fmt: skip
    with caplog.at_level(logging.WARNING, logger="model_training.evaluation.runner"):
        result = run_evaluation(tasks, config)
    assert sorted(s.truncate for s in result.systems) == [24, max_length]
    assert f"--truncate 4096,8192 is past the model's max_length {max_length}" in caplog.text
