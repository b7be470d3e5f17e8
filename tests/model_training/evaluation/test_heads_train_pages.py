"""`heads train` says which pages it left out, and saves no head fit on an encoder replaced meanwhile."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from model_training.evaluation.derive import derive_tasks
from service.core.checkpoint import read_meta
from tests.factories.checkpoint import build_tiny_checkpoint
from tests.model_training.evaluation.pagegen import write_corpus
from tests.model_training.evaluation.test_runner import fake_engine


@pytest.fixture
def setup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path, list[str]]:
    """A tiny checkpoint, its tasks, the Engine stubbed; the `heads train` arguments."""
    corpus = write_corpus(tmp_path / "corpus.jsonl", sites=6, pages_per_site=3)
    derive_tasks(corpus, tmp_path / "tasks", min_pages=4, min_sites=3, folds=3)
    ckpt = build_tiny_checkpoint(tmp_path / "ckpt", heads=False)
    fake_engine(monkeypatch, read_meta(ckpt).embedding_dim)
    args = ["heads", "train", "--checkpoint", str(ckpt), "--tasks", str(tmp_path / "tasks"), "--cache", ""]
    args += ["--hidden", "8", "--max-epochs", "2", "--patience", "1", "--folds", "3"]
    return ckpt, tmp_path / "tasks", args


def test_pages_that_fail_pruning_are_counted_and_listed(
    setup: tuple[Path, Path, list[str]], caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    """A row nesting 20,000 divs and an empty one had been left out without a word: `embedding 210
    pages`, `pages 210`, where `eval run` said "2 page(s) excluded" and listed why in report.json."""
    from service.cli import main

    ckpt, tasks, args = setup
    pages = tasks / "page_kind" / "pages.jsonl"
    rows = pages.read_text(encoding="utf-8").splitlines()
    label = json.loads(rows[0])["label"]
    bad = [
        {"id": "deep", "html": "<div>" * 20000, "label": label, "group": "bad.example", "fold": 0},
        {"id": "empty", "html": "", "label": label, "group": "bad.example", "fold": 0},
    ]
    pages.write_text("\n".join([*rows, *(json.dumps(row) for row in bad)]) + "\n", encoding="utf-8")
    with caplog.at_level(logging.WARNING, logger="model_training.evaluation.runner"):
        assert main(args) == 0
    out = capsys.readouterr().out
    assert "2 page(s) excluded from every head (failed pruning):" in out, out
    assert "  page_kind 'deep': prune: preprocess_failed: page nests more than 8192" in out
    assert "  page_kind 'empty': prune: the pruned page is empty" in out
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(w.startswith("2 page(s) excluded from every task (failed pruning): page_kind") for w in warned)
    kind = next(spec for spec in read_meta(ckpt).heads if spec.name == "page_kind")
    assert kind.metrics["pages"] == len(rows)  # the heads were fit without them


def test_nothing_excluded_prints_no_exclusions(
    setup: tuple[Path, Path, list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    from service.cli import main

    _, _, args = setup
    assert main(args) == 0
    assert "excluded" not in capsys.readouterr().out


def test_heads_fit_on_an_encoder_replaced_meanwhile_are_not_saved(
    setup: tuple[Path, Path, list[str]], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A training run re-exporting the checkpoint while `heads train` embedded its pages: the heads
    had been saved, recorded as the new encoder's, with figures measured on the old one's embeddings."""
    import model_training.evaluation.runner as runner
    from service.cli import main

    ckpt, _, args = setup
    embed = runner._engine_embed

    async def embed_then_replace(*a: object, **k: object) -> object:
        result = await embed(*a, **k)  # type: ignore[arg-type]
        build_tiny_checkpoint(ckpt, heads=False, seed=1)  # same shapes, other weights
        return result

    monkeypatch.setattr(runner, "_engine_embed", embed_then_replace)
    capsys.readouterr()
    assert main(args) == 1
    said = capsys.readouterr().err.strip().splitlines()[-1]  # after the replacing save's progress bar
    assert said.startswith("htmllm heads train: checkpoint_invalid: the heads ['page_kind'"), said
    assert "were fit on the embeddings of another encoder than" in said
    assert read_meta(ckpt).heads == [] and not list((ckpt / "heads").glob("*.safetensors"))
