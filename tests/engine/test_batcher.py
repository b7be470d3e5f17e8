"""The batcher: every document it accepted is answered, wherever it was when it stopped or whatever a
forward pass did; and the health it keeps of the passes."""

from __future__ import annotations

import asyncio
import re
import threading
import time
from collections.abc import Sequence

import numpy as np
import pytest

from service.engine.batcher import Batcher
from service.engine.runners import PreparedBatch, RunnerOutput
from service.engine.types import BackendError, BackendHealth, ShuttingDownError


class _BlockingRunner:
    """A runner whose forward passes wait for `release`: a slow model, held mid-pass."""

    backend = "fake"
    device = "cpu"
    dtype = "float32"
    threads = 1
    attention = "none"

    def __init__(self) -> None:
        self.release = threading.Event()
        self.started = threading.Event()
        self.aborted = False

    def cost(self, lengths: Sequence[int]) -> int:
        return sum(lengths)

    def prepare(self, batch: Sequence[Sequence[int]], *, pad_to: int | None = None) -> PreparedBatch:
        tokens = sum(len(ids) for ids in batch)
        return PreparedBatch(payload=len(batch), documents=len(batch), tokens=tokens, padded_tokens=tokens)

    def run(self, prepared: PreparedBatch) -> RunnerOutput:
        self.started.set()
        self.release.wait(30)
        rows = int(prepared.payload)  # type: ignore[call-overload]
        return RunnerOutput(embeddings=np.zeros((rows, 4), dtype=np.float32), scores={})

    def abort(self) -> None:
        self.aborted = True

    def close(self) -> None:
        pass


async def test_closing_answers_the_batch_in_a_pass_and_the_window_being_formed() -> None:
    """The documents of the batch in a forward pass, the batch waiting for it and those of the window
    the former still holds: each gets ShuttingDownError (they had waited until the server cancelled
    them, an untyped 500 for an accepted request)."""
    runner = _BlockingRunner()
    batcher = Batcher(runner, max_batch_tokens=1000, max_batch_requests=2, max_wait_ms=0)
    batcher.start()
    futures = [batcher.submit([2, 5, 3], deadline=None) for _ in range(12)]
    await asyncio.to_thread(runner.started.wait, 30)  # the first batch is in its pass
    await asyncio.sleep(0.1)  # the next one waits at the hand-off, the rest in the former's window
    asyncio.get_running_loop().call_later(0.2, runner.release.set)
    await batcher.close()
    assert all(f.done() for f in futures)
    assert runner.aborted  # the pass in flight was stopped where the backend can
    for future in futures:
        with pytest.raises(ShuttingDownError):
            future.result()


class _FaultyRunner(_BlockingRunner):
    """Each pass answers as `faults` says next: raise, rows missing from a head, or a good output."""

    def __init__(self, faults: list[str]) -> None:
        super().__init__()
        self.release.set()
        self.faults = faults

    def run(self, prepared: PreparedBatch) -> RunnerOutput:
        rows = int(prepared.payload)  # type: ignore[call-overload]
        fault = self.faults.pop(0) if self.faults else "none"
        if fault == "raise":
            raise RuntimeError("CUDA error: an illegal memory access")
        head_rows = rows - 1 if fault == "short head" else rows
        embeddings = np.zeros((rows - 1 if fault == "short" else rows, 4), dtype=np.float32)
        return RunnerOutput(embeddings=embeddings, scores={"quality": np.zeros(head_rows, dtype=np.float32)})


async def test_a_failing_or_malformed_pass_fails_its_batch_and_the_batcher_goes_on() -> None:
    """Rows a head lacked had raised in the executor task and ended it: every later document waited
    for a forward pass that never came, and closing re-raised the IndexError."""
    runner = _FaultyRunner(["raise", "short head", "short", "none"])
    batcher = Batcher(runner, max_batch_tokens=1000, max_batch_requests=2, max_wait_ms=0)
    batcher.start()
    for expected in ("illegal memory access", "head 'quality' scores of shape (1,)", "embeddings", None):
        futures = [batcher.submit([2, 5, 3], deadline=None) for _ in range(2)]
        done, _ = await asyncio.wait(futures, timeout=10)
        assert len(done) == 2, f"the batcher stopped answering (expecting {expected})"
        for future in futures:
            if expected is None:
                assert future.result().scores["quality"].shape == ()
            else:
                with pytest.raises(BackendError, match=re.escape(expected)):
                    future.result()
    await batcher.close()


async def test_health_counts_failed_passes_in_a_row_and_a_success_ends_the_run() -> None:
    runner = _FaultyRunner(["raise", "short", "raise", "none", "raise"])
    batcher = Batcher(runner, max_batch_tokens=1000, max_batch_requests=1, max_wait_ms=0)
    batcher.start()
    assert batcher.health == BackendHealth()

    async def one_pass() -> None:
        await asyncio.wait([batcher.submit([2, 5, 3], deadline=None)], timeout=10)

    before = time.monotonic()
    for failures in (1, 2):
        await one_pass()
        health = batcher.health
        assert health.failures == failures and health.pass_started is None
        assert health.failing_since is not None and before <= health.failing_since <= time.monotonic()
    first_failure = batcher.health.failing_since
    with pytest.raises(BackendError, match="illegal memory access"):  # a probe counts like a batch
        await batcher.run_direct([[2, 5, 3]])
    assert batcher.health.failures == 3 and batcher.health.failing_since == first_failure
    assert batcher.health.last_error is not None and "illegal memory access" in batcher.health.last_error
    await batcher.run_direct([[2, 5, 3]])  # "none": the run of failures ends
    assert batcher.health == BackendHealth()
    await one_pass()  # "raise": a new run starts
    assert batcher.health.failures == 1 and batcher.health.failing_since != first_failure
    await batcher.close()


async def test_health_says_when_the_running_pass_began() -> None:
    runner = _BlockingRunner()
    batcher = Batcher(runner, max_batch_tokens=1000, max_batch_requests=1, max_wait_ms=0)
    batcher.start()
    before = time.monotonic()
    future = batcher.submit([2, 5, 3], deadline=None)
    assert await asyncio.to_thread(runner.started.wait, 10)
    started = batcher.health.pass_started
    assert started is not None and before <= started <= time.monotonic()
    runner.release.set()
    await asyncio.wait_for(future, 10)
    assert batcher.health.pass_started is None
    runner.release.clear()
    runner.started.clear()
    probe = asyncio.ensure_future(batcher.run_direct([[2, 5, 3]]))  # a pass outside the queue too
    assert await asyncio.to_thread(runner.started.wait, 10)
    assert batcher.health.pass_started is not None
    runner.release.set()
    await probe
    assert batcher.health.pass_started is None
    await batcher.close()


async def test_the_last_window_is_not_held_after_it_is_answered() -> None:
    """The former kept its last window (documents, futures and the rows they hold: views of the whole
    batch's output) until the next window came."""
    runner = _BlockingRunner()
    runner.release.set()
    batcher = Batcher(runner, max_batch_tokens=1000, max_batch_requests=2, max_wait_ms=0)
    batcher.start()
    futures = [batcher.submit([2, 5, 3], deadline=None) for _ in range(5)]
    done, _ = await asyncio.wait(futures, timeout=30)
    assert len(done) == 5
    await asyncio.sleep(0)  # the former's last step after it handed off the last batch
    assert batcher._window == []
    await batcher.close()


class _AbortableRunner(_BlockingRunner):
    """A pass that hangs until `abort` (a hung child process), which makes it fail as the child's does."""

    def __init__(self) -> None:
        super().__init__()
        self.passes = 0

    def run(self, prepared: PreparedBatch) -> RunnerOutput:
        self.passes += 1
        self.started.set()
        self.release.wait(30)
        if self.aborted:
            raise RuntimeError("the inference process died during a forward pass")
        return super().run(prepared)

    def abort(self) -> None:
        self.aborted = True
        self.release.set()


@pytest.mark.parametrize("cancelled", [True, False])
async def test_closing_aborts_a_probe_pass_that_hangs(cancelled: bool) -> None:
    """A probe's or warm-up's pass (outside the queue) was not a pass in flight for `close`: a hung child
    there was never aborted, and close waited for the inference thread for ever. The aborted pass is the
    shutdown's, not the backend's: it had raised BackendError and counted a failure in `health` (the
    server logged "backend probe failed" as it stopped)."""
    runner = _AbortableRunner()
    batcher = Batcher(runner, max_batch_tokens=1000, max_batch_requests=2, max_wait_ms=0)
    batcher.start()
    probe = asyncio.ensure_future(batcher.run_direct([[2, 5, 3]]))
    assert await asyncio.to_thread(runner.started.wait, 30)
    if cancelled:
        probe.cancel()  # the server cancels its probe before it stops the engine
    closing = asyncio.ensure_future(batcher.close())
    try:
        await asyncio.wait_for(asyncio.shield(closing), 10)
    finally:
        runner.release.set()  # before the fix: let the thread go, so the test ends
        await closing
    assert runner.aborted
    if cancelled:
        assert probe.cancelled()
    else:
        with pytest.raises(ShuttingDownError):
            await probe
    assert batcher.health.failures == 0


async def test_a_direct_pass_during_close_is_shutting_down_not_a_runtime_error() -> None:
    """A probe or warm-up while the engine stops: the batcher's pools may be shut down already, which
    raised "cannot schedule new futures after shutdown"; and one queued behind the pass in flight ran
    after close had looked for passes to abort."""
    runner = _AbortableRunner()
    batcher = Batcher(runner, max_batch_tokens=1000, max_batch_requests=2, max_wait_ms=0)
    batcher.start()
    document = batcher.submit([2, 5, 3], deadline=None)
    assert await asyncio.to_thread(runner.started.wait, 30)  # the batch's pass holds the thread
    queued = asyncio.ensure_future(batcher.run_direct([[2, 5, 3]]))
    for _ in range(3000):  # until the probe waits for the inference thread (a bound, not a timing)
        if batcher._infer_pool._work_queue.qsize():
            break
        await asyncio.sleep(0.01)
    assert not queued.done() and batcher._infer_pool._work_queue.qsize() == 1
    closing = asyncio.ensure_future(batcher.close())
    await asyncio.sleep(0)  # close has begun
    with pytest.raises(ShuttingDownError):
        await batcher.run_direct([[2, 5, 3]])
    try:
        await asyncio.wait_for(asyncio.shield(closing), 10)
    finally:
        runner.release.set()
        await closing
    with pytest.raises(ShuttingDownError):
        await queued
    assert runner.passes == 1  # the queued probe never ran
    with pytest.raises(ShuttingDownError):
        document.result()


async def test_a_close_cancelled_on_the_way_answers_everything_and_stays_cancelled() -> None:
    """The task closing the batcher cancelled while it waits for the batcher's tasks (a timeout around
    `async with engine`): the cancellation was swallowed with the tasks' own, so the timeout never
    fired. The close still answers every document, and the cancellation goes on after it."""
    runner = _BlockingRunner()
    runner.release.set()
    batcher = Batcher(runner, max_batch_tokens=1000, max_batch_requests=2, max_wait_ms=10_000)
    batcher.start()
    futures = [batcher.submit([2, 5, 3], deadline=None)]  # waits in the window for company
    closing = asyncio.ensure_future(batcher.close())
    await asyncio.sleep(0)  # the close has cancelled the batcher's tasks and waits for them
    assert not closing.done()
    closing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await closing
    for future in futures:
        with pytest.raises(ShuttingDownError):
            future.result()
