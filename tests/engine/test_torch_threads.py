"""Two torch engines in one process share torch's one intra-op thread count: what each reports is it."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from service.engine.engine import Engine
from service.engine.runners.torch import TorchRunner
from service.engine.types import EngineConfig


@pytest.fixture
def torch_threads_kept(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """torch's count restored after the test, and no runner built before it remembered."""
    monkeypatch.setattr(TorchRunner, "_process_threads", None, raising=False)
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


@pytest.mark.usefixtures("torch_threads_kept")
def test_a_second_engine_with_another_thread_count_changes_the_first_and_says_so(
    tiny_checkpoint: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """`torch.set_num_threads` is process-wide: the first engine's passes run the second's count, and
    `info.threads` had kept reporting the first's own (1 while both ran 2)."""
    caplog.set_level(logging.WARNING, logger="service.engine.runners.torch")
    first = Engine.from_checkpoint(tiny_checkpoint, EngineConfig(intra_op_threads=1))
    assert first.info.threads == torch.get_num_threads() == 1
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    second = Engine.from_checkpoint(tiny_checkpoint, EngineConfig(intra_op_threads=2))
    assert first.info.threads == second.info.threads == torch.get_num_threads() == 2
    assert any("one per process" in r.getMessage() and r.levelno == logging.WARNING for r in caplog.records)
    first.close()
    second.close()


@pytest.mark.usefixtures("torch_threads_kept")
def test_the_same_thread_count_again_is_not_warned_about(
    tiny_checkpoint: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="service.engine.runners.torch")
    Engine.from_checkpoint(tiny_checkpoint, EngineConfig(intra_op_threads=1)).close()
    again = Engine.from_checkpoint(tiny_checkpoint, EngineConfig(intra_op_threads=1))
    assert again.info.threads == 1
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    again.close()
