"""A stop (SIGTERM) during the warm-up, or held by a pass that serves no one, is a complete drain:
nothing accepted was failed, so the exit status is 0 and no ERROR is logged."""

from __future__ import annotations

import asyncio
import logging
import threading

import pytest

from service.api import app as app_module
from service.api.app import create_app, load_engine
from service.api.runtime import Runtime
from service.engine.runners import PreparedBatch, RunnerOutput
from tests.api.conftest import SettingsFactory, serving

# A bound on how long a pass may be held, so that a regression fails instead of hanging: never a timing.
HOLD_BOUND_S = 20


class _StuckEngine:
    """An engine whose draining stop never ends (a pass in flight that it waits for), with `owed`
    documents accepted and unanswered."""

    def __init__(self, owed: int) -> None:
        self.queue_size = owed
        self.stops: list[bool] = []

    async def stop(self, *, drain: bool = True) -> None:
        self.stops.append(drain)
        if drain:
            await asyncio.Event().wait()
        self.queue_size = 0  # what was owed is failed now


async def test_a_stop_that_runs_out_of_time_with_nothing_owed_is_a_complete_drain(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Any timeout had counted as a drain cut short: exit status 1 and "the queue did not drain ...;
    failing what is left" for a server that had accepted nothing (a SIGTERM during the warm-up)."""
    engine = _StuckEngine(owed=0)
    caplog.set_level(logging.WARNING, logger="service.api.app")
    assert await app_module._stop(engine, 0.01) is True  # type: ignore[arg-type]
    assert engine.stops == [True, False]  # the stop is still finished, without the drain
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
    assert "every document accepted was answered" in caplog.text


async def test_a_stop_that_runs_out_of_time_with_documents_owed_is_cut_short(
    caplog: pytest.LogCaptureFixture,
) -> None:
    engine = _StuckEngine(owed=3)
    caplog.set_level(logging.WARNING, logger="service.api.app")
    assert await app_module._stop(engine, 0.01) is False  # type: ignore[arg-type]
    assert engine.stops == [True, False]
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors and "failing the 3 documents left" in errors[0], caplog.text


async def test_a_stop_during_the_warm_up_neither_waits_for_it_nor_reads_as_cut_short(
    settings_for: SettingsFactory, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """SIGTERM while the warm-up batch runs (a large checkpoint on CPU, /ready still 503): the stop waited
    for that batch, which serves no one, and past the drain budget called the drain cut short."""
    settings = settings_for(drain_timeout_s=600)  # no budget runs out here: only the warm-up could hold it
    engine = load_engine(settings)
    working = engine._runner.run
    entered, release, finished = threading.Event(), threading.Event(), threading.Event()

    def held(prepared: PreparedBatch) -> RunnerOutput:  # the first pass is the warm-up's
        entered.set()
        release.wait(HOLD_BOUND_S)
        try:
            return working(prepared)
        finally:
            finished.set()

    monkeypatch.setattr(engine._runner, "run", held)
    caplog.set_level(logging.INFO)
    app = create_app(settings, engine)
    runtime: Runtime = app.state.runtime
    try:
        async with serving(app) as client:
            assert await asyncio.to_thread(entered.wait, 60)
            assert (await client.get("/ready")).status_code == 503  # still warming up
            runtime.begin_shutdown()  # what SIGTERM does first; then uvicorn ends the lifespan
        assert not finished.is_set(), "the stop waited for the warm-up pass"
        assert runtime.drain_cut_short is False
        assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
    finally:
        release.set()
        await asyncio.to_thread(finished.wait, 60)  # the pass's thread ends before the test's loop does
