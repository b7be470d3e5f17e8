"""`Engine.close()` on an engine still running: it is a stop without drain, then the release of the
backend. It had released the backend under the running batcher: the calls in flight failed as backend
failures (health said unhealthy), and probe/warm-up ran on (an inference process was started again)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from service.core.checkpoint import load_checkpoint
from service.core.errors import ErrorCode, HtmllmError
from service.engine.engine import Engine
from service.engine.runners import PreparedBatch, RunnerOutput
from service.engine.runners.torch import TorchRunner
from service.engine.types import EngineConfig, ShuttingDownError
from tests.factories.pages import make_pages

SAFETY_S = 60  # bounds on waits that end at once when the engine is right: no timing under test


class _GatedRunner(TorchRunner):
    """The real torch runner, whose passes wait for `go` (a pass in flight for as long as the test
    wants), and which records its close and any pass asked of it after that."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.go = threading.Event()
        self.running = threading.Event()
        self.closed_at_pass: list[bool] = []  # per pass asked: whether the runner had been closed
        self.closes = 0

    def run(self, prepared: PreparedBatch) -> RunnerOutput:
        self.closed_at_pass.append(self._closed)
        self.running.set()
        self.go.wait(SAFETY_S)
        return super().run(prepared)

    def close(self) -> None:
        self.closes += 1
        super().close()


def _engine(checkpoint: Path) -> tuple[Engine, _GatedRunner]:
    ckpt = load_checkpoint(checkpoint)
    runner = _GatedRunner(ckpt.model)
    config = EngineConfig(preprocess_workers=1, max_batch_requests=2, max_wait_ms=0)
    return Engine(runner, ckpt.tokenizer, ckpt.meta, config), runner


async def _wait(event: threading.Event) -> bool:
    return await asyncio.to_thread(event.wait, SAFETY_S)


async def test_close_of_a_running_engine_stops_it_without_drain_then_releases_the_backend(
    tiny_checkpoint: Path,
) -> None:
    engine, runner = _engine(tiny_checkpoint)
    await engine.start()
    # One call in a forward pass, several queued behind it (batches of 2).
    calls = [asyncio.ensure_future(engine.embed(make_pages(2, seed=seed))) for seed in range(5)]
    try:
        assert await _wait(runner.running)
        engine.close()
        assert runner.closes == 0  # released after the stop, not under the running batcher
        for call in (engine.probe, engine.warmup):
            with pytest.raises(ShuttingDownError, match="closed"):
                await call()
        with pytest.raises(ShuttingDownError):
            await engine.embed(make_pages(1))
    finally:
        runner.go.set()
    outcomes = await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), SAFETY_S)
    # What was accepted is answered: the pass in flight, or ShuttingDownError; never a backend failure.
    errors = [outcome for outcome in outcomes if isinstance(outcome, BaseException)]
    assert errors and all(isinstance(error, ShuttingDownError) for error in errors), errors
    await asyncio.wait_for(engine.stop(), SAFETY_S)  # waits for the release
    assert runner.closes == 1 and runner._closed
    assert not any(runner.closed_at_pass)  # no pass reached the closed runner
    assert engine.health.failures == 0 and engine.queue_size == 0
    engine.close()
    assert runner.closes == 1  # idempotent
    with pytest.raises(ShuttingDownError):
        await engine.start()


async def test_close_without_a_stop_releases_the_backend_on_its_own(tiny_checkpoint: Path) -> None:
    """Nobody awaits `stop` after the close (the engine is dropped): its release still runs, on the loop."""
    engine, runner = _engine(tiny_checkpoint)
    runner.go.set()
    await engine.start()
    assert len(await engine.embed(make_pages(2))) == 2
    engine.close()
    deadline = time.monotonic() + SAFETY_S
    while runner.closes == 0 and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    assert runner.closes == 1 and engine._batcher is None  # stopped first, then released


async def test_close_from_another_thread_stops_on_the_engines_loop(tiny_checkpoint: Path) -> None:
    engine, runner = _engine(tiny_checkpoint)
    runner.go.set()
    await engine.start()
    assert len(await engine.embed(make_pages(2))) == 2
    await asyncio.to_thread(engine.close)
    with pytest.raises(ShuttingDownError):
        await engine.embed(make_pages(1))
    await asyncio.wait_for(engine.stop(), SAFETY_S)  # waits for the release the close began
    assert runner.closes == 1 and engine._batcher is None


def test_close_between_runs_of_the_loop_stops_and_releases_at_once(tiny_checkpoint: Path) -> None:
    """A caller driving its own loop (`run_until_complete`) closes between two runs of it: nothing would
    run a task there, so the close stops and releases the engine itself."""
    engine, runner = _engine(tiny_checkpoint)
    runner.go.set()
    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(engine.start())
        assert len(loop.run_until_complete(engine.embed(make_pages(2)))) == 2
        engine.close()
        assert runner.closes == 1 and engine._batcher is None
        with pytest.raises(ShuttingDownError):
            loop.run_until_complete(engine.probe())
    finally:
        loop.close()


async def test_close_of_a_stopped_engine_releases_the_backend_at_once(tiny_checkpoint: Path) -> None:
    engine, runner = _engine(tiny_checkpoint)
    runner.go.set()
    async with engine:
        await engine.warmup()
    engine.close()
    assert runner.closes == 1
    with pytest.raises(ShuttingDownError):
        await engine.probe()


def test_a_closed_torch_runner_refuses_a_pass_as_shutting_down(tiny_checkpoint: Path) -> None:
    runner = TorchRunner(load_checkpoint(tiny_checkpoint).model)
    docs: Sequence[Sequence[int]] = [[2, 7, 8, 3]]
    assert runner.run(runner.prepare(docs)).embeddings.shape[0] == 1
    runner.close()
    with pytest.raises(ShuttingDownError, match="closed") as refused:
        runner.run(runner.prepare(docs))
    assert isinstance(refused.value, HtmllmError) and refused.value.code is ErrorCode.SHUTTING_DOWN
