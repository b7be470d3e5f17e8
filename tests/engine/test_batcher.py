"""The batcher: every document it accepted is answered, wherever it was when it stopped or whatever a
forward pass did; and the health it keeps of the passes."""

from __future__ import annotations

import asyncio
import gc
import re
import time
import weakref

import numpy as np
import pytest

from service.engine.batcher import Batcher, OutputShapes
from service.engine.runners import PreparedBatch, RunnerOutput
from service.engine.types import BackendError, BackendHealth, ShuttingDownError
from tests.factories.drain import RecordingDrain
from tests.factories.runners import BlockingRunner


async def test_closing_answers_the_batch_in_a_pass_and_the_window_being_formed() -> None:
    """The documents of the batch in a forward pass, the batch waiting for it and those of the window
    the former still holds: each gets ShuttingDownError (they had waited until the server cancelled
    them, an untyped 500 for an accepted request)."""
    runner = BlockingRunner()
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


class _FaultyRunner(BlockingRunner):
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
    runner = BlockingRunner()
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
    runner = BlockingRunner()
    runner.release.set()
    batcher = Batcher(runner, max_batch_tokens=1000, max_batch_requests=2, max_wait_ms=0)
    batcher.start()
    futures = [batcher.submit([2, 5, 3], deadline=None) for _ in range(5)]
    done, _ = await asyncio.wait(futures, timeout=30)
    assert len(done) == 5
    await asyncio.sleep(0)  # the former's last step after it handed off the last batch
    assert batcher._window == []
    await batcher.close()


class _AbortableRunner(BlockingRunner):
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
    runner = BlockingRunner()
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


async def test_documents_whose_callers_left_do_not_pile_up_in_the_inbox() -> None:
    """While a pass runs long (a hung GPU, a child reloading the model), callers who give up leave
    their documents in the inbox until the former next takes a window: it had grown past the queue's
    bound with dead documents and their ids, and `waiting` counted them. They are dropped (and
    reported skipped) once over half of it; `waiting` counts those whose callers wait."""
    runner = BlockingRunner()
    skipped: list[int] = []
    batcher = Batcher(
        runner, max_batch_tokens=1000, max_batch_requests=2, max_wait_ms=0, on_skipped=skipped.append
    )
    batcher.start()
    first = batcher.submit([2, 5, 3], deadline=None)
    assert await asyncio.to_thread(runner.started.wait, 30)  # the pass holds the inference thread
    batch = [batcher.submit([2, 5, 3], deadline=None) for _ in range(2)]
    for _ in range(100):  # the former takes `batch` into a window and waits at the hand-off
        await asyncio.sleep(0)
    live = batcher.submit([2, 5, 3], deadline=None)
    for _ in range(50):
        calls = [batcher.submit([7] * 100, deadline=None) for _ in range(8)]
        for call in calls:
            call.cancel()  # the callers time out or disconnect
        await asyncio.sleep(0)  # their done-callbacks run
        assert batcher.waiting == 1
        assert len(batcher._inbox) <= 2 * batcher.waiting + 8
    assert sum(skipped) >= 50 * 8 - 16
    runner.release.set()
    for future in (first, *batch, live):
        assert (await asyncio.wait_for(future, 30)).embedding.shape == (4,)
    assert batcher.waiting == 0 and not batcher._inbox
    await batcher.close()


async def test_an_idle_batcher_holds_no_document_of_its_last_window() -> None:
    """The former's and the executor's loop frames had kept the last window (documents and their ids),
    the last batch's prepared input and its documents' futures until the next traffic: up to eight
    batches' worth of ids, for as long as the engine idled."""
    runner = BlockingRunner()
    runner.release.set()
    batcher = Batcher(runner, max_batch_tokens=1000, max_batch_requests=2, max_wait_ms=0)
    batcher.start()
    futures = [batcher.submit(list(range(2, 50)), deadline=None) for _ in range(7)]
    documents = [weakref.ref(doc) for doc in batcher._inbox]
    done, _ = await asyncio.wait(futures, timeout=30)
    assert len(done) == 7
    del futures, done
    for _ in range(10):  # the former and the executor reach their waits for the next work
        await asyncio.sleep(0)
    gc.collect()
    assert [ref for ref in documents if ref() is not None] == []
    await batcher.close()


async def test_the_drain_rate_is_busy_from_a_document_queued_to_the_last_pass_ending() -> None:
    """Busy while the batcher holds a document or runs a pass, and only then: the Engine had counted
    every admitted document (cache hits, /v1/preprocess, pages failing in preprocessing) as model work,
    and 10 s of cache hits read as a drain rate of a tenth."""
    runner = BlockingRunner()
    drain = RecordingDrain()
    batcher = Batcher(runner, max_batch_tokens=1000, max_batch_requests=4, max_wait_ms=0, drain=drain)
    batcher.start()
    assert drain.calls == []
    first = batcher.submit([2, 5, 3], deadline=None)
    assert await asyncio.to_thread(runner.started.wait, 30)
    # A caller who leaves while its document is in a pass: the pass is still work.
    first.cancel()
    await asyncio.sleep(0)
    assert drain.calls == ["busy"]
    runner.release.set()
    for _ in range(3000):  # until the pass ends (a bound, not a timing)
        if "idle" in drain.calls:
            break
        await asyncio.sleep(0.01)
    assert drain.calls == ["busy", "finished 1", "idle"]
    later = [batcher.submit([2, 5, 3], deadline=None) for _ in range(3)]
    await asyncio.wait_for(asyncio.gather(*later), 30)
    await asyncio.sleep(0)  # the futures' callbacks
    assert drain.calls[3:] == ["busy", "finished 3", "idle"]
    await batcher.close()


class _WrongWidthRunner(BlockingRunner):
    """Answers a head one class wider than the checkpoint's (a model reloaded since)."""

    def run(self, prepared: PreparedBatch) -> RunnerOutput:
        rows = int(prepared.payload)  # type: ignore[call-overload]
        return RunnerOutput(
            embeddings=np.zeros((rows, 4), dtype=np.float32),
            scores={"kind": np.full((rows, 4), 0.25, dtype=np.float32)},
        )


@pytest.mark.parametrize(
    ("shapes", "expected"),
    [
        (OutputShapes(4, {"kind": (3,)}), "head 'kind' scores of shape (1, 4); the checkpoint's gives (3,)"),
        (OutputShapes(4, {"kind": (4,), "quality": ()}), "no scores for head 'quality'"),
        (OutputShapes(8, {"kind": (4,)}), "embeddings of shape (1, 4)"),
        (OutputShapes(4, {"kind": (4,)}), None),
    ],
)
async def test_rows_of_another_shape_than_the_checkpoints_fail_the_batch(
    shapes: OutputShapes, expected: str | None
) -> None:
    """Rows are checked against the checkpoint's head specs before any is answered: a head of four
    classes zipped against three labels had raised an untyped ValueError in the Engine (or, with the
    same count, served other classes under the old names)."""
    batcher = Batcher(
        _WrongWidthRunner(), max_batch_tokens=1000, max_batch_requests=1, max_wait_ms=0, row_shapes=shapes
    )
    batcher.start()
    future = batcher.submit([2, 5, 3], deadline=None)
    await asyncio.wait([future], timeout=30)
    if expected is None:
        assert future.result().scores["kind"].shape == (4,)
    else:
        with pytest.raises(BackendError, match=re.escape(expected)):
            future.result()
    await batcher.close()
