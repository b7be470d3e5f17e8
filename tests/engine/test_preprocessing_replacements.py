"""A preprocessing process lost or replaced reaches the Engine's observer as `worker_replaced(pool,
reason)`, on the event loop like every hook, from the observer the engine holds at that moment (the app
sets its own after the engine is built). The kills are real."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from service.core.worker_health import IDLE_DIED, KILLED
from service.engine.engine import Engine
from service.engine.preprocessing import LOST_PROCESS_RETRIES, POOL_NAME
from service.engine.types import EngineConfig, EngineObserver
from tests.factories.worker_kills import kill_workers_holding

MARKER = "the kernel picks the process pruning this page"


class _Replacements(EngineObserver):
    """Records each replacement and whether it was told on the loop's thread."""

    def __init__(self) -> None:
        self.told: list[tuple[str, str]] = []
        self.threads: set[int] = set()

    def worker_replaced(self, pool: str, reason: str) -> None:
        self.told.append((pool, reason))
        self.threads.add(threading.get_ident())


async def test_a_preprocessing_process_lost_reaches_the_observer_on_the_loop(
    tiny_checkpoint: Path, pages: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    config = EngineConfig(preprocess_pool="process", preprocess_workers=1)
    async with Engine.from_checkpoint(tiny_checkpoint, config) as engine:
        observer = _Replacements()
        engine.observer = observer  # after the engine is built, as the app sets its own
        await engine.embed(pages[:1])
        assert engine._preprocessing._processes is not None
        (worker,) = engine._preprocessing._processes._idle
        worker.process.kill()  # the OOM killer picks an idle worker
        worker.process.join()
        await engine.embed(pages[:1])
        killed = kill_workers_holding(monkeypatch, MARKER.encode(), kills=LOST_PROCESS_RETRIES)
        await engine.embed([f"<html><body><p>{MARKER}</p></body></html>"])  # its last try serves it
        await asyncio.sleep(0)
    assert len(killed) == LOST_PROCESS_RETRIES
    assert observer.told == [(POOL_NAME, IDLE_DIED)] + [(POOL_NAME, KILLED)] * LOST_PROCESS_RETRIES
    assert observer.threads == {threading.get_ident()}  # the loop's
