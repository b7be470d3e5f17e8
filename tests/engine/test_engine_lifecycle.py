"""The Engine's start and stop beside calls in flight: every caller gets a typed answer, never a
CancelledError it did not ask for, and neither start nor stop waits on what cannot end."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from service.core.checkpoint import load_checkpoint
from service.engine.engine import Engine
from service.engine.runners import PreparedBatch, RunnerOutput
from service.engine.runners.torch import TorchRunner
from service.engine.types import EngineConfig, ShuttingDownError
from tests.engine.conftest import hold_first_prepare
from tests.factories.pages import make_pages

SAFETY_S = 30  # bounds on waits that end at once when the engine is right


async def _until(condition: Callable[[], bool]) -> bool:
    """Whether `condition` came true within SAFETY_S, looked at every loop turn (and millisecond: a thread
    the condition waits for needs the GIL, which a loop spinning on sleep(0) hardly gives up)."""
    deadline = time.monotonic() + SAFETY_S
    while not condition():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.001)
    return True


@pytest.mark.parametrize("cached", [0, 8])
async def test_stop_without_drain_is_shutting_down_for_callers_nobody_cancelled(
    tiny_checkpoint: Path, monkeypatch: pytest.MonkeyPatch, cached: int
) -> None:
    """`stop(drain=False)` cancels the jobs waiting for a preprocessing thread; `embed` and `preprocess`
    re-raised that CancelledError into callers nobody had cancelled (a TaskGroup or gather of a library
    caller cannot tell it from its own cancellation)."""
    config = EngineConfig(preprocess_workers=1, result_cache_documents=cached)
    engine = Engine.from_checkpoint(tiny_checkpoint, config)
    await engine.start()
    held = hold_first_prepare(engine, monkeypatch)
    pages = make_pages(3, seed=5)
    try:
        embedding = asyncio.ensure_future(engine.embed(pages))
        settled = asyncio.ensure_future(engine.embed_settled(make_pages(2, seed=6)))
        assert await asyncio.to_thread(held.started.wait, SAFETY_S)
        preprocessing = asyncio.ensure_future(engine.preprocess(pages[0]))  # behind the held page
        await asyncio.sleep(0)
        stopping = asyncio.ensure_future(engine.stop(drain=False))
        # The calls end as the stop cancels their jobs; only then is the held page let go (the stop
        # had waited for it: that is the other test's subject).
        await asyncio.wait([embedding, settled, preprocessing], timeout=SAFETY_S)
    finally:
        held.release.set()
    await asyncio.wait_for(stopping, SAFETY_S)
    current = asyncio.current_task()
    assert current is not None and current.cancelling() == 0
    for call in (embedding, preprocessing):
        assert not call.cancelled()
        with pytest.raises(ShuttingDownError):
            call.result()
    assert all(isinstance(outcome, ShuttingDownError) for outcome in settled.result())
    assert engine.queue_size == 0
    engine.close()


async def test_stop_without_drain_answers_a_page_stuck_on_a_thread_and_returns(
    tiny_checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A thread cannot be stopped: the stop had waited for it (for ever, for a parse that never ends)
    and its caller with it. Now the caller gets ShuttingDownError and the thread runs on alone."""
    engine = Engine.from_checkpoint(tiny_checkpoint, EngineConfig(preprocess_workers=1))
    await engine.start()
    held = hold_first_prepare(engine, monkeypatch)
    try:
        call = asyncio.ensure_future(engine.embed(make_pages(1, seed=7)))
        assert await asyncio.to_thread(held.started.wait, SAFETY_S)
        await asyncio.wait_for(engine.stop(drain=False), SAFETY_S)
        with pytest.raises(ShuttingDownError):
            await asyncio.wait_for(call, SAFETY_S)
        assert engine.queue_size == 0
    finally:
        held.release.set()
    engine.close()


async def test_concurrent_starts_build_one_batcher(tiny_checkpoint: Path) -> None:
    """Two `start()`s at once (an "ensure started" in two coroutines) both found no batcher before their
    first await, and the second overwrote the first's: its tasks and pools were never stopped."""
    config = EngineConfig(preprocess_pool="process", preprocess_workers=1)
    engine = Engine.from_checkpoint(tiny_checkpoint, config)

    def formers() -> int:
        return sum(task.get_name() == "htmllm-batch-former" for task in asyncio.all_tasks())

    await asyncio.gather(engine.start(), engine.start())
    processes = engine._preprocessing._processes
    assert formers() == 1 and processes is not None
    assert len(await engine.embed(make_pages(2))) == 2
    await engine.stop()
    assert formers() == 0 and processes.live_workers == 0
    engine.close()


async def test_a_stop_during_a_start_stops_what_the_start_built(tiny_checkpoint: Path) -> None:
    """A stop while a start was still starting its processes found nothing to stop and returned; the
    start then finished, leaving an engine that took documents after its stop."""
    config = EngineConfig(preprocess_pool="process", preprocess_workers=1)
    engine = Engine.from_checkpoint(tiny_checkpoint, config)
    await asyncio.gather(engine.start(), engine.stop())
    assert not engine.accepting and engine._preprocessing._processes is None and engine._batcher is None
    with pytest.raises(ShuttingDownError):
        await engine.embed(make_pages(1))
    engine.close()


async def test_a_start_during_a_stop_waits_for_it_and_starts_anew(tiny_checkpoint: Path) -> None:
    """A start between the stop's closing of the batcher and of the pools found no batcher and built new
    pools; the stop then shut those down and left the old ones running, and the engine said it accepted
    while every call failed."""
    config = EngineConfig(preprocess_pool="process", preprocess_workers=1)
    engine = Engine.from_checkpoint(tiny_checkpoint, config)
    await engine.start()
    pools = engine._preprocessing
    old_processes, old_pool, old_dispatch = pools._processes, pools._pool, pools._dispatch
    assert old_processes is not None and old_pool is not None and old_dispatch is not None

    async def start_once_the_batcher_is_gone() -> None:
        for _ in range(100_000):  # a bound: the stop closes the batcher within a few loop turns
            if engine._batcher is None:
                break
            await asyncio.sleep(0)
        assert engine._batcher is None
        await engine.start()

    stopping_and_starting = asyncio.gather(engine.stop(drain=False), start_once_the_batcher_is_gone())
    await asyncio.wait_for(stopping_and_starting, SAFETY_S)
    assert old_processes.live_workers == 0
    assert old_pool._shutdown and old_dispatch._shutdown
    processes = engine._preprocessing._processes
    assert engine.accepting and processes is not None and processes is not old_processes
    assert len(await engine.embed(make_pages(2))) == 2
    await engine.stop()
    assert processes.live_workers == 0 and pools._pool is None and pools._dispatch is None
    engine.close()


async def test_leaving_the_block_answers_every_call_in_flight(tiny_checkpoint: Path) -> None:
    """A block that ends normally drains: calls it started and did not await get their results."""
    async with Engine.from_checkpoint(tiny_checkpoint) as engine:
        calls = [asyncio.ensure_future(engine.embed(make_pages(2, seed=seed))) for seed in range(3)]
        await asyncio.sleep(0)  # each call runs to its first await: admitted, not yet answered
        assert engine.queue_size == 6
    assert all(call.done() and len(call.result()) == 2 for call in calls)
    assert not engine.accepting and engine.queue_size == 0
    engine.close()


async def test_a_block_that_raises_stops_at_once_answers_the_calls_and_the_error_goes_on(
    tiny_checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The block's exception reaches the caller; the calls in flight (one held on its thread) each get
    ShuttingDownError rather than a wait for the held page; a stop after it, or two, does nothing."""
    engine = Engine.from_checkpoint(tiny_checkpoint, EngineConfig(preprocess_workers=1))
    held = hold_first_prepare(engine, monkeypatch)
    try:
        with pytest.raises(KeyError, match="the block's own"):
            async with engine:
                embedding = asyncio.ensure_future(engine.embed(make_pages(2, seed=8)))
                settled = asyncio.ensure_future(engine.embed_settled(make_pages(2, seed=9)))
                assert await asyncio.to_thread(held.started.wait, SAFETY_S)
                raise KeyError("the block's own")
        with pytest.raises(ShuttingDownError):
            await asyncio.wait_for(embedding, SAFETY_S)
        outcomes = await asyncio.wait_for(settled, SAFETY_S)
        assert all(isinstance(outcome, ShuttingDownError) for outcome in outcomes)
        assert engine._batcher is None and engine._preprocessing.threads is None and engine.queue_size == 0
        await asyncio.wait_for(engine.stop(), SAFETY_S)
        await asyncio.wait_for(engine.stop(drain=False), SAFETY_S)
        assert engine._batcher is None and not engine.accepting
    finally:
        held.release.set()
    engine.close()


async def test_a_drain_cancelled_on_the_way_out_still_stops_the_engine(
    tiny_checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A block left normally drains; cancelled during that drain (a timeout around the block), `__aexit__`
    returned with the batcher's tasks and the pools still running and a call still waiting, nobody left
    to stop them. Now it stops without drain, the call gets ShuttingDownError, and the cancel goes on."""
    engine = Engine.from_checkpoint(tiny_checkpoint, EngineConfig(preprocess_workers=1))
    held = hold_first_prepare(engine, monkeypatch)
    calls: list[asyncio.Future[object]] = []

    async def block() -> None:
        async with engine:
            calls.append(asyncio.ensure_future(engine.embed(make_pages(1, seed=10))))
            assert await asyncio.to_thread(held.started.wait, SAFETY_S)

    leaving = asyncio.ensure_future(block())
    try:
        # The block is left as soon as the page is held; the stop refuses new work, then waits for the call.
        assert await _until(lambda: bool(calls) and not engine.accepting)
        assert not leaving.done()
        leaving.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(leaving, SAFETY_S)
        assert engine._batcher is None and engine._preprocessing.threads is None
        assert not [task for task in asyncio.all_tasks() if task.get_name().startswith("htmllm-batch")]
        with pytest.raises(ShuttingDownError):
            await asyncio.wait_for(calls[0], SAFETY_S)
        assert engine.queue_size == 0
    finally:
        held.release.set()
    engine.close()


class _HeldRunner(TorchRunner):
    """The torch runner, whose forward passes wait for `release` (a slow pass, held)."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.started = threading.Event()
        self.release = threading.Event()

    def run(self, prepared: PreparedBatch) -> RunnerOutput:
        self.started.set()
        self.release.wait(SAFETY_S)
        return super().run(prepared)


async def test_a_stop_cancelled_while_a_pass_ends_leaves_an_engine_that_starts_again(
    tiny_checkpoint: Path,
) -> None:
    """`stop(drain=False)` cancelled while it waits for the pass in flight (a server's bounded wait for
    the stop): the engine had kept the closed batcher and the preprocessing pools, and a later start
    returned at once with `accepting` False, every call refused. Now the stop's teardown completes, and
    a start waits for that pass to end (one pass at a time on a runner), then serves."""
    checkpoint = load_checkpoint(tiny_checkpoint)
    runner = _HeldRunner(checkpoint.model, intra_op_threads=1)
    engine = Engine(runner, checkpoint.tokenizer, checkpoint.meta, EngineConfig())
    await engine.start()
    batcher = engine._batcher
    assert batcher is not None
    call = asyncio.ensure_future(engine.embed(make_pages(1, seed=11)))
    try:
        assert await asyncio.to_thread(runner.started.wait, SAFETY_S)
        stopping = asyncio.ensure_future(engine.stop(drain=False))
        # The close has answered the call and waits for the pass to end.
        assert await _until(lambda: batcher._closed and not batcher._tasks and call.done())
        stopping.cancel()
        with pytest.raises(asyncio.CancelledError):
            await stopping
        with pytest.raises(ShuttingDownError):
            await asyncio.wait_for(call, SAFETY_S)
        assert engine._batcher is None and engine._preprocessing.threads is None and not engine.accepting
        starting = asyncio.ensure_future(engine.start())
        for _ in range(20):
            await asyncio.sleep(0)
        assert not starting.done()  # the pass the stop left still holds the runner
    finally:
        runner.release.set()
    await asyncio.wait_for(starting, SAFETY_S)
    assert engine.accepting
    (result,) = await asyncio.wait_for(engine.embed(make_pages(1, seed=12)), SAFETY_S)
    assert result.tokens > 2
    await engine.stop()
    engine.close()
