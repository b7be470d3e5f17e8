"""`heads train --max-length N`: each head records the length it was fit and measured at, and a length
below the checkpoint's (the one the service runs pages at) is warned about.

The service runs heads on full-length embeddings while /info published figures measured at N
(schema_type f1 0.184 at 64 tokens against 0.236 at 128), with nothing in htmllm.json saying so.
"""

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
def setup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, list[str]]:
    """A tiny checkpoint (max_length 128), its tasks, the Engine stubbed; the `heads train` arguments."""
    corpus = write_corpus(tmp_path / "corpus.jsonl", sites=6, pages_per_site=3)
    derive_tasks(corpus, tmp_path / "tasks", min_pages=4, min_sites=3, folds=3)
    ckpt = build_tiny_checkpoint(tmp_path / "ckpt", heads=False)
    fake_engine(monkeypatch, read_meta(ckpt).embedding_dim)
    args = ["heads", "train", "--checkpoint", str(ckpt), "--tasks", str(tmp_path / "tasks"), "--cache", ""]
    args += ["--hidden", "8", "--max-epochs", "2", "--patience", "1", "--folds", "3"]
    return ckpt, args


def _recorded(ckpt: Path) -> dict[str, dict[str, float]]:
    heads = json.loads((ckpt / "htmllm.json").read_text(encoding="utf-8"))["heads"]
    return {h["name"]: h["metrics"] for h in heads}


def test_a_shorter_max_length_is_recorded_in_each_head_and_warned_about(
    setup: tuple[Path, list[str]], caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    from service.cli import main

    ckpt, args = setup
    assert read_meta(ckpt).max_length == 128
    with caplog.at_level(logging.WARNING, logger="model_training.evaluation.runner"):
        assert main([*args, "--max-length", "64"]) == 0
    recorded = _recorded(ckpt)
    assert recorded and all(m["max_length"] == 64 for m in recorded.values()), recorded
    assert all(spec.metrics["max_length"] == 64 for spec in read_meta(ckpt).heads)  # as the service reads
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and "max_length 64 is shorter than the 128 tokens" in warned[0], warned
    assert "max_length 64" in capsys.readouterr().out  # the figures printed say the length too


def test_the_default_length_is_recorded_without_a_warning(
    setup: tuple[Path, list[str]], caplog: pytest.LogCaptureFixture
) -> None:
    from service.cli import main

    ckpt, args = setup
    with caplog.at_level(logging.WARNING, logger="model_training.evaluation.runner"):
        assert main(args) == 0
        assert main([*args, "--max-length", "128"]) == 0
    assert all(m["max_length"] == 128 and type(m["max_length"]) is int for m in _recorded(ckpt).values())
    assert not [r for r in caplog.records if "shorter than" in r.getMessage()]
