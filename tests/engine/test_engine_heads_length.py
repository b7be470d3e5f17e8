"""An engine run at a shorter max_length than its heads were fit at says so when it loads.

Each head `htmllm heads train` writes records the tokens per page it was fit and measured at (its
metrics' `max_length`). Served with `HTMLLM_MAX_LENGTH` below that, the heads score pages cut shorter
than they learned from, and /info shows figures measured on longer ones: the engine started without a
word, while `heads train --max-length` warns of the converse.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import pytest

from service.core.checkpoint import load_checkpoint, read_meta, save_heads
from service.core.modeling import TaskHead
from service.engine.engine import Engine
from service.engine.types import EngineConfig
from tests.factories.checkpoint import TINY_MAX_LENGTH, build_tiny_checkpoint
from tests.factories.runners import BlockingRunner


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny checkpoint, its page_type head recorded as fit at 128 tokens, its quality head at 64."""
    root = build_tiny_checkpoint(tmp_path_factory.mktemp("heads-length") / "tiny")
    fit_at = {"page_type": TINY_MAX_LENGTH, "quality": 64}
    meta = read_meta(root)
    heads = {}
    for spec in meta.heads:
        spec = dataclasses.replace(spec, metrics={**spec.metrics, "max_length": fit_at[spec.name]})
        heads[spec.name] = (spec, TaskHead(spec, meta.embedding_dim))
    save_heads(root, heads)
    return root


def _warnings(checkpoint: Path, max_length: int | None, caplog: pytest.LogCaptureFixture) -> list[str]:
    loaded = load_checkpoint(checkpoint)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="service.engine.engine"):
        Engine(BlockingRunner(), loaded.tokenizer, loaded.meta, EngineConfig(max_length=max_length))
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def test_a_shorter_max_length_than_a_head_was_fit_at_is_warned_about_once(
    checkpoint: Path, caplog: pytest.LogCaptureFixture
) -> None:
    warned = _warnings(checkpoint, 96, caplog)
    assert len(warned) == 1, warned
    # The head and both lengths; the head fit at 64 (shorter than served: `heads train` warned) is not.
    assert "max_length 96" in warned[0] and "page_type (128 tokens)" in warned[0], warned
    assert "quality" not in warned[0]


@pytest.mark.parametrize("max_length", [None, TINY_MAX_LENGTH])
def test_serving_at_the_length_the_heads_were_fit_at_is_not_warned_about(
    checkpoint: Path, max_length: int | None, caplog: pytest.LogCaptureFixture
) -> None:
    assert _warnings(checkpoint, max_length, caplog) == []


def test_heads_that_record_no_length_are_not_warned_about(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The bundled model's heads predate the record: nothing is known of their length."""
    assert _warnings(build_tiny_checkpoint(tmp_path / "tiny"), 32, caplog) == []
