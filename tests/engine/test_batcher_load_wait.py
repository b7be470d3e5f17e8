"""The batcher's drain rate leaves out what a pass spent waiting for its model to load (a runner's
`load_wait_s`: an inference process restarting), whether that pass succeeded or failed; a document's
timings count that wait as queueing, not inference."""

from __future__ import annotations

import asyncio
import time

import pytest

from service.engine.admission import DrainRate
from service.engine.batcher import Batcher
from service.engine.runners import PreparedBatch, RunnerOutput
from service.engine.types import BackendError
from tests.factories.runners import HOLD_BOUND_S, BlockingRunner

HOLD_S = 1.0  # how long the model "loads": far longer than the fake passes, which answer at once


class _ReloadingRunner(BlockingRunner):
    """Its first pass waits for `release` as for its model to load again, counts that wait in
    `load_wait_s` (as `ProcessRunner` does) and fails: the restart it waited for failed. Later passes
    answer at once."""

    def __init__(self) -> None:
        super().__init__()
        self.load_wait_s = 0.0
        self.passes = 0

    def run(self, prepared: PreparedBatch) -> RunnerOutput:
        self.passes += 1
        if self.passes > 1:
            return super().run(prepared)  # `release` is set by now
        self.started.set()
        waiting = time.monotonic()
        self.release.wait(HOLD_BOUND_S)
        self.load_wait_s += time.monotonic() - waiting
        raise RuntimeError("restart 1 of the inference process failed")


async def test_a_failed_pass_s_wait_for_the_model_does_not_slow_the_next_batch() -> None:
    """The next batch's interval starts where the last finished one ended, so a failed pass's wait for a
    restart (which ended no batch) had counted in it."""
    runner = _ReloadingRunner()
    drain = DrainRate()
    batcher = Batcher(runner, max_batch_tokens=1000, max_batch_requests=1, max_wait_ms=0, drain=drain)
    batcher.start()
    try:
        failed = batcher.submit([2, 5, 3], deadline=None)
        served = batcher.submit([2, 5, 3], deadline=None)
        assert await asyncio.to_thread(runner.started.wait, HOLD_BOUND_S)
        held_from = time.monotonic()
        await asyncio.sleep(HOLD_S)
        held_s = time.monotonic() - held_from
        runner.release.set()
        with pytest.raises(BackendError, match="restart 1 of the inference process failed"):
            await asyncio.wait_for(failed, HOLD_BOUND_S)
        await asyncio.wait_for(served, HOLD_BOUND_S)
        # Busy since before the hold, and the one document answered after it: counting the wait, that
        # document alone read as at least `held_s` of work.
        per_document = drain.seconds_for(1)
        assert per_document is not None and per_document < held_s
    finally:
        await batcher.close()


class _LoadingRunner(BlockingRunner):
    """Each pass first waits for `release` as for its model to load (counted in `load_wait_s`, as
    `ProcessRunner` counts a restart), then answers at once."""

    def __init__(self) -> None:
        super().__init__()
        self.load_wait_s = 0.0

    def run(self, prepared: PreparedBatch) -> RunnerOutput:
        waiting = time.monotonic()  # before `started`: the test's hold then lies wholly inside the wait
        self.started.set()
        self.release.wait(HOLD_BOUND_S)
        self.load_wait_s += time.monotonic() - waiting
        return super().run(prepared)


async def test_a_pass_s_wait_for_the_model_is_the_document_s_queue_time_not_inference() -> None:
    """The timing headers and the inference histogram had read a restart's wait as a pass of seconds."""
    runner = _LoadingRunner()
    reported: list[float] = []
    batcher = Batcher(
        runner,
        max_batch_tokens=1000,
        max_batch_requests=1,
        max_wait_ms=0,
        on_batch=lambda stats: reported.append(stats.inference_s),
    )
    batcher.start()
    try:
        answer = batcher.submit([2, 5, 3], deadline=None)
        assert await asyncio.to_thread(runner.started.wait, HOLD_BOUND_S)
        await asyncio.sleep(HOLD_S)
        runner.release.set()
        row = await asyncio.wait_for(answer, HOLD_BOUND_S)
        # The fake pass answers at once: all but scheduling noise of the held second is the load's.
        assert row.queue_s >= HOLD_S and row.inference_s < HOLD_S / 2, row
        assert reported == [row.inference_s]
    finally:
        await batcher.close()
