"""Closing the batcher while a pass outside the queue (warm-up, probe) runs: the close does not wait for
a pass that serves no one, and what must wait for it (`wait_closed`, a second close) still does."""

from __future__ import annotations

import asyncio

from service.engine.batcher import Batcher
from tests.factories.runners import BlockingRunner


async def _closed_during_a_warm_up() -> tuple[Batcher, BlockingRunner]:
    """A batcher closed while its warm-up pass (cancelled by its caller, as the app's lifespan does)
    still holds the inference thread."""
    runner = BlockingRunner()
    batcher = Batcher(runner, max_batch_tokens=1000, max_batch_requests=2, max_wait_ms=0)
    batcher.start()
    warm_up = asyncio.ensure_future(batcher.run_direct([[2, 5, 3]] * 2))
    assert await asyncio.to_thread(runner.started.wait, 30)
    warm_up.cancel()
    await asyncio.gather(warm_up, return_exceptions=True)
    await batcher.close()
    return batcher, runner


async def test_close_does_not_wait_for_a_warm_up_pass_in_flight() -> None:
    """The close had shut the inference pool down with `wait=True`: a server's stop waited for the whole
    warm-up batch, which serves no one, and past its drain budget read as a drain cut short (exit 1)."""
    batcher, runner = await _closed_during_a_warm_up()
    try:
        assert not runner.finished.is_set(), "the close waited for the warm-up pass"
        assert runner.aborted  # stopped where the backend can (a child process is killed)
    finally:
        runner.release.set()
        await batcher.wait_closed()


async def test_wait_closed_still_waits_for_that_pass() -> None:
    """What needs the runner free (a start on it: `Engine.start`) waits for the pass the close left."""
    batcher, runner = await _closed_during_a_warm_up()
    waiting = asyncio.ensure_future(batcher.wait_closed())
    try:
        await asyncio.sleep(0)
        assert not waiting.done() and not runner.finished.is_set()
    finally:
        runner.release.set()
    await waiting
    assert runner.finished.is_set()


async def test_a_second_close_waits_for_that_pass() -> None:
    """A second close (an engine leaving an ended event loop) is there to wait for the last pass."""
    batcher, runner = await _closed_during_a_warm_up()
    closing = asyncio.ensure_future(batcher.close())
    try:
        for _ in range(3):  # a close that does not wait is done by now
            await asyncio.sleep(0)
        assert not closing.done() and not runner.finished.is_set()
    finally:
        runner.release.set()
    await closing
    assert runner.finished.is_set()
