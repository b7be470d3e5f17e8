"""The token-budget dynamic batcher: the single owner of the queue of tokenized documents.

`submit` only appends to an inbox; one *former* task owns the waiting window. It takes every queued
document (after waiting up to `max_wait_ms` for company when the queue is short), sorts the window by
length so batches carry little padding, and cuts it into batches of at most `max_batch_requests`
documents and `max_batch_tokens` tokens (as the runner counts them: padded, or packed under flash-attn)
where the padded tokens plus a fixed cost per pass are least (`form_batches`). Documents whose caller
went away (future cancelled) or whose deadline passed are dropped when a batch is built, and from the
inbox as soon as they are over half of it. The former prepares batch n+1 on a worker thread while an
*executor* task runs batch n on the inference thread; a one-slot hand-off between them is what bounds the
overlap to one batch.

The batcher also times how fast it drains (`admission.DrainRate`): busy from the moment it holds a
document until it holds none and runs no pass, so that time spent elsewhere (preprocessing, the result
cache) never reads as slowness of the model; nor does a pass's wait for the model to load (`_load_wait_s`:
an inference process restarting), which a document's timings count as queueing, not inference.

A window is drained completely before the next one is taken, so a long document is never starved by a
stream of short ones.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from service.core.errors import ErrorCode, HtmllmError
from service.engine.admission import DrainRate
from service.engine.runners import PreparedBatch, Runner, RunnerOutput
from service.engine.types import (
    BackendError,
    BackendHealth,
    BatchStats,
    DeadlineExceededError,
    NotReadyError,
    ShuttingDownError,
)

logger = logging.getLogger(__name__)

# How many batches' worth of documents one window may hold; bounds the latency a window adds.
WINDOW_BATCHES = 8

# What one forward pass costs beyond its tokens, in tokens: what `form_batches` weighs a pass saved
# against the padding that batching documents of unequal lengths costs. Measured with the bundled model
# (mini preset: 6 layers, 384 wide) on the torch runner, 2 threads of the 2-core development CPU
# (`benchmarks/engine.py --pass-cost`): a pass over one 4-token document takes 6.8-7.3 ms, and passes of
# 4 to 4,096 tokens fit 5.4-9.6 ms plus 0.09-0.10 ms per token, a pass worth 60 to 96 tokens over five
# runs on the shared machine (docs/benchmarks.md, Engine). On a GPU a pass's fixed cost is worth far more
# tokens; there the runner packs in half precision (no padding to weigh it against), and a padded float32
# GPU runner cuts a little more often than would pay.
PASS_OVERHEAD_TOKENS = 80


@dataclass(frozen=True)
class BatchRow:
    """One document's share of a forward pass."""

    embedding: np.ndarray  # float32 (D,)
    scores: dict[str, np.ndarray]  # head -> (C,) probabilities or () value
    queue_s: float
    inference_s: float


@dataclass(eq=False)
class QueuedDocument:
    ids: list[int]
    future: asyncio.Future[BatchRow]
    deadline: float | None  # time.monotonic() seconds
    enqueued: float = field(default_factory=time.monotonic)
    in_inbox: bool = True  # until the former takes it into a window (or the inbox drops it)
    dead_in_inbox: bool = False  # its future ended while it was in the inbox (counted in `_inbox_dead`)

    def is_live(self, now: float) -> bool:
        """False when nobody waits for this document any more, failing it if its deadline passed."""
        if self.future.done():
            return False
        if self.deadline is not None and now >= self.deadline:
            self.future.set_exception(
                DeadlineExceededError("the deadline passed while the document was queued")
            )
            return False
        return True


@dataclass
class _Ready:
    documents: list[QueuedDocument]
    prepared: PreparedBatch
    prepare_s: float
    started: float | None = None  # time.monotonic() when its forward pass began


def form_batches(
    lengths: Sequence[int],
    cost: Callable[[Sequence[int]], int],
    *,
    max_tokens: int,
    max_requests: int,
    pass_overhead: int = PASS_OVERHEAD_TOKENS,
) -> list[list[int]]:
    """Indices of `lengths`, sorted by length and cut into batches within both budgets where the
    tokens the passes compute (`cost`: padded, or packed) plus `pass_overhead` per pass are least.

    Filling each batch up to the budget had padded 63 pages of 30 tokens to the 256 of one long page
    in the same batch (16,384 tokens computed for 2,146: 6x slower than two batches). The cut points
    come from a dynamic program over the sorted window: the cheapest plan for its first `end` documents
    is the cheapest plan for the first `start` plus one batch `start..end`, over the at most
    `max_requests` starts whose batch fits the budget: `n * max_requests` calls of `cost`, which must
    grow as a batch takes in more documents (padded and packed costs both do). Where the cost has no
    padding (a packed runner), every plan computes the same tokens and the one with the fewest passes
    wins: batches filled in order, as before. Of plans that cost the same, the one whose last batches
    are smallest (as filling in order leaves them) is taken.

    A document alone over the token budget still gets a batch of its own (the engine caps lengths).
    """
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    ordered = [lengths[i] for i in order]
    count = len(ordered)
    best = [0] * (count + 1)  # best[end]: the least total cost of the first `end` documents
    cut = [0] * (count + 1)  # cut[end]: where the last batch of that plan starts
    for end in range(1, count + 1):
        least, least_start = -1, end - 1
        for start in range(end - 1, max(end - max_requests, 0) - 1, -1):
            batch_cost = cost(ordered[start:end])
            if batch_cost > max_tokens and start < end - 1:
                break  # a longer batch costs more still
            total = best[start] + batch_cost
            if least < 0 or total < least:
                least, least_start = total, start
        best[end], cut[end] = least + pass_overhead, least_start
    batches: list[list[int]] = []
    end = count
    while end > 0:
        batches.append(order[cut[end] : end])
        end = cut[end]
    batches.reverse()
    return batches


class Batcher:
    """Owns the queue; forms, prepares and runs batches on `runner`."""

    def __init__(
        self,
        runner: Runner,
        *,
        max_batch_tokens: int,
        max_batch_requests: int,
        max_wait_ms: float,
        on_batch: Callable[[BatchStats], None] | None = None,
        on_skipped: Callable[[int], None] | None = None,
        drain: DrainRate | None = None,
        row_shapes: OutputShapes | None = None,
    ) -> None:
        """`drain` is told when the batcher is busy and what each batch finished; `row_shapes`, what a
        pass must answer per document (without it, only the row counts are checked)."""
        self._runner = runner
        self._max_tokens = max_batch_tokens
        self._max_requests = max_batch_requests
        self._max_wait_s = max_wait_ms / 1000.0
        self._on_batch = on_batch
        self._on_skipped = on_skipped
        self._drain = drain
        self._row_shapes = row_shapes
        self._inbox: deque[QueuedDocument] = deque()
        self._inbox_dead = 0  # documents in the inbox whose caller left (or that were answered)
        self._owed = 0  # documents submitted whose future has not ended
        self._passes = 0  # forward passes of queued batches running now (0 or 1)
        self._wakeup = asyncio.Event()
        self._ready: asyncio.Queue[_Ready] = asyncio.Queue(maxsize=1)
        self._in_hand: list[_Ready] = []  # taken from the hand-off, not yet answered
        self._window: list[QueuedDocument] = []  # the batch former's current window (held nowhere else)
        self._prepare_pool = ThreadPoolExecutor(1, thread_name_prefix="htmllm-collate")
        self._infer_pool = ThreadPoolExecutor(1, thread_name_prefix="htmllm-infer")
        self._tasks: list[asyncio.Task[None]] = []
        self._closed = False
        self._pools_closed: asyncio.Future[None] | None = None  # set by `close`
        self._failures = BackendHealth()  # the current run of failed passes (pass_started unused)
        self._failed_at: float | None = None  # when the latest of them was counted (time.monotonic())
        # A run that a restarted model process's check pass ended (`_end_recovered_run`), until a pass of
        # ours succeeds: a failure meanwhile resumes it.
        self._hidden: BackendHealth | None = None
        self._direct_started: float | None = None  # a pass outside the queue (warm-up, probe) began
        # `close` and the inference thread agree under it: either the direct pass does not start, or
        # close sees it started and aborts it.
        self._direct_lock = threading.Lock()

    @property
    def waiting(self) -> int:
        """Documents queued for a window whose caller still waits."""
        return len(self._inbox) - self._inbox_dead

    @property
    def health(self) -> BackendHealth:
        """The run of failed passes so far, and when the pass now on the inference thread began."""
        self._end_recovered_run()
        started = [ready.started for ready in self._in_hand if ready.started is not None]
        if self._direct_started is not None:
            started.append(self._direct_started)
        return dataclasses.replace(
            self._failures, pass_started=min(started, default=None), last_failed_at=self._failed_at
        )

    def _passed(self) -> None:
        if self._failures.failures:
            logger.warning("a forward pass succeeded after %d failed", self._failures.failures)
        self._failures, self._failed_at, self._hidden = BackendHealth(), None, None

    def _checked(self) -> None:
        """A check pass succeeded (`run_direct(check=True)`): the run of failed passes so far ends, as a
        model process started anew ends it with its own pass (`_end_recovered_run`), and is kept aside:
        a failure before a pass of ours succeeds resumes it. Without it a failed pass on an idle pod with
        the model in this process stayed counted (`htmllm_backend_consecutive_failures` at 1, its alert
        paging) until traffic came, which a pod that also fails its next pass turned unready for a
        fault of days before. Kept aside, not forgotten: a backend that fails every batch of traffic
        and passes every three-token check still adds its failures up to the unready threshold."""
        if not self._failures.failures:
            return
        logger.warning(
            "a check pass succeeded: the %d forward passes that failed before it end their run",
            self._failures.failures,
        )
        # The run shown includes any run kept aside before (a failure resumed it), so none is lost.
        self._hidden, self._failures, self._failed_at = self._failures, BackendHealth(), None

    def _pass_failed(self, message: str) -> BackendError:
        """Count a failed pass in `health`; the error its documents (or its caller) get."""
        self._end_recovered_run()
        run = self._failures
        if not run.failures and self._hidden is not None:
            run = self._hidden  # no pass of ours succeeded since the check pass ended it: it goes on
        since = run.failing_since
        self._failed_at = time.monotonic()
        self._failures = BackendHealth(
            failures=run.failures + 1,
            failing_since=self._failed_at if since is None else since,
            last_error=message,
        )
        return BackendError(message)

    def _end_recovered_run(self) -> None:
        """End the run of failed passes where the runner has run a pass of its own since the latest: a
        model process started anew after it (`ProcessRunner.recovered_at`). Without traffic no batch's
        pass came to end it: a child killed in its pass and replaced left the count (/ready's, and the
        metric an alert reads) at 1 for as long as the pod stayed idle, though the backend served again.

        Once only until a pass of ours succeeds: a check pass is three tokens, and a batch that kills the
        child every time (the OOM killer on a large batch) would otherwise have had each run ended by the
        next restart, the count never past 1, the pod never unready nor the alert firing. A failure after
        it resumes the run it ended (`_hidden`), and later restarts end none."""
        recovered = _recovered_at(self._runner)
        if (
            recovered is None
            or self._failed_at is None
            or recovered <= self._failed_at
            or self._hidden is not None
        ):
            return
        logger.warning(
            "the inference process started anew ran a forward pass: the %d that failed before it end "
            "their run",
            self._failures.failures,
        )
        self._hidden, self._failures, self._failed_at = self._failures, BackendHealth(), None

    def pass_started(self, future: asyncio.Future[BatchRow]) -> float | None:
        """When the forward pass holding the document behind `future` began, or None if it is not in
        one: what a passed deadline reports (queued vs a slow pass). A scan, for the rare late call."""
        for ready in self._in_hand:
            if ready.started is not None and any(doc.future is future for doc in ready.documents):
                return ready.started
        return None

    def start(self) -> None:
        if self._tasks:
            return
        self._tasks = [
            asyncio.create_task(self._form_loop(), name="htmllm-batch-former"),
            asyncio.create_task(self._run_loop(), name="htmllm-batch-executor"),
        ]

    def submit(self, ids: list[int], *, deadline: float | None) -> asyncio.Future[BatchRow]:
        """Queue one tokenized document; the future resolves to its row of a batch."""
        if self._closed:
            raise ShuttingDownError("the engine is shutting down")
        future: asyncio.Future[BatchRow] = asyncio.get_running_loop().create_future()
        doc = QueuedDocument(ids=ids, future=future, deadline=deadline)
        if self._drain is not None and not self._busy():
            self._drain.busy(doc.enqueued)
        self._owed += 1
        future.add_done_callback(lambda _: self._ended(doc))
        self._inbox.append(doc)
        self._wakeup.set()
        return future

    def _busy(self) -> bool:
        """Whether the batcher has work: a document whose caller waits, or a forward pass running."""
        return self._owed > 0 or self._passes > 0

    def _ended(self, doc: QueuedDocument) -> None:
        """`doc`'s future ended (answered, failed or cancelled by its caller leaving).

        One still in the inbox is dead weight: its token ids stay there until the former next takes a
        window, which may wait behind a pass of minutes (a hung GPU, a child process reloading the
        model) while callers who gave up keep adding theirs. Once the dead are over half of the inbox
        it is compacted, so it holds at most about twice the documents that callers wait for."""
        self._owed -= 1
        if doc.in_inbox:
            doc.dead_in_inbox = True
            self._inbox_dead += 1
            if 2 * self._inbox_dead > len(self._inbox):
                self._compact_inbox()
        self._check_idle()

    def _compact_inbox(self) -> None:
        live: deque[QueuedDocument] = deque()
        for doc in self._inbox:
            if doc.future.done():  # its callback may be still to come: it then finds it gone
                doc.in_inbox = False
            else:
                live.append(doc)
        dropped = len(self._inbox) - len(live)
        self._inbox, self._inbox_dead = live, 0
        self._skipped(dropped)

    def _check_idle(self) -> None:
        """Tell the drain rate when the work ends: the wait for the next document is no slowness."""
        if self._drain is not None and not self._busy():
            self._drain.idle()

    async def run_direct(self, batch: Sequence[Sequence[int]], *, check: bool = False) -> RunnerOutput:
        """One forward pass outside the queue, on the inference thread (warm-up, probe); its outcome
        counts in `health` like a batch's, but that a `check` pass's success ends a run of failures as
        a restarted model process's own pass does (`_checked`). A failure raises BackendError;
        NotReadyError where the runner refuses to run any pass now (`_refused`); ShuttingDownError once
        `close` began (its pools may be shut down already)."""
        loop = asyncio.get_running_loop()
        self._check_open()
        prepared = await loop.run_in_executor(self._prepare_pool, self._runner.prepare, batch)
        self._check_open()  # no await between this check and the submission: close cannot slip in
        try:
            output = await loop.run_in_executor(self._infer_pool, self._timed_direct_run, prepared)
        except ShuttingDownError:
            raise
        except Exception as exc:
            if self._closed:  # `close` aborted the pass (or the backend failed as it stopped): not a failure
                raise ShuttingDownError("the engine stopped during this forward pass") from exc
            if _refused(exc):
                raise NotReadyError(str(exc)) from exc
            raise self._pass_failed(f"the {self._runner.backend} backend failed: {exc}") from exc
        if check:
            self._checked()
        else:
            self._passed()
        return output

    def _check_open(self) -> None:
        if self._closed:
            raise ShuttingDownError("the engine is shutting down")

    def _timed_direct_run(self, prepared: PreparedBatch) -> RunnerOutput:
        """On the inference thread: the pass's start is when the thread takes it, not when it queued.
        A pass that `close` finds queued does not start: close waits for the thread and would not know
        to abort it."""
        with self._direct_lock:
            self._check_open()
            self._direct_started = time.monotonic()
        try:
            return self._runner.run(prepared)
        finally:
            self._direct_started = None

    async def close(self, error: HtmllmError | None = None) -> None:
        """Stop both tasks; whatever is still queued or in hand fails with `error` (or ShuttingDown).

        It returns once the pass in flight on the inference thread has ended, unless that pass is one
        outside the queue (`run_direct`: warm-up, probe), which nobody waits for: the first close then
        returns at once, and `wait_closed` (or a second close) waits for that pass."""
        with self._direct_lock:
            again = self._closed  # closed before: this close is to wait for the pass `close` left running
            self._closed = True
            direct = self._direct_started is not None
        # Before the cancellation: the batch in a forward pass leaves `_in_hand` as its task unwinds, and
        # the window being collated is held only by the former; both must be failed, not forgotten (their
        # callers would wait until the server cancels them: an untyped 500 for an accepted request).
        held = [doc for ready in self._in_hand for doc in ready.documents] + self._window
        # A probe's or warm-up's pass counts: a hung backend there had held the shutdown for ever.
        in_pass = direct or any(ready.started is not None for ready in self._in_hand)
        # A cancellation of the task closing (a timeout around `async with engine`) must not stop the close
        # half way (the documents below would never be answered), nor be swallowed with the tasks' own:
        # it goes on once the close is done.
        closing = asyncio.current_task()
        cancels = closing.cancelling() if closing is not None else 0
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        failure = error or ShuttingDownError("the engine stopped before this document ran")
        pending = held + list(self._inbox)
        for doc in self._inbox:
            doc.in_inbox = False
        self._inbox.clear()
        self._inbox_dead = 0
        while not self._ready.empty():
            self._in_hand.append(self._ready.get_nowait())
        for ready in self._in_hand:
            pending.extend(ready.documents)
        self._in_hand.clear()
        for doc in pending:
            if not doc.future.done():
                doc.future.set_exception(failure)
        # A forward pass may still be running on its thread: stop it where the backend can (a child
        # process), then wait for it off the event loop.
        if in_pass:
            self._runner.abort()
        # Shielded: a cancellation here (a server's bounded wait for the stop) leaves the pools to end
        # on their thread, the pass in flight first, and `wait_closed` to wait for that; unshielded, the
        # infer pool had never been shut down, its thread left running whatever pass it held.
        self._pools_closed = asyncio.ensure_future(asyncio.to_thread(self._shut_pools))
        if direct and not again:
            # A warm-up's or probe's pass serves no one: the close does not wait for it (a large
            # checkpoint's warm-up on CPU had held a server's stop for its whole drain budget, which then
            # read as a drain cut short). Its thread ends on its own, or the process does; `wait_closed`
            # (and a start on this runner) still waits for it, as does a second close.
            logger.info("not waiting for the warm-up or probe pass in flight: it serves no one")
        else:
            await asyncio.shield(self._pools_closed)
        if closing is not None and closing.cancelling() > cancels:
            raise asyncio.CancelledError

    def _shut_pools(self) -> None:
        self._prepare_pool.shutdown(wait=True)
        self._infer_pool.shutdown(wait=True)

    async def wait_closed(self) -> None:
        """Until the pools `close` shut down have ended: the forward pass in flight then is over, and the
        runner free for another batcher (a close that was cancelled returns before that)."""
        if self._pools_closed is not None:
            await asyncio.shield(self._pools_closed)

    async def _next_window(self) -> list[QueuedDocument]:
        while not self._inbox:
            self._wakeup.clear()
            await self._wakeup.wait()
        # A short queue waits (up to max_wait_ms) for company; a full batch's worth goes at once.
        give_up = time.monotonic() + self._max_wait_s
        while (
            self.waiting < self._max_requests
            and sum(len(d.ids) for d in self._inbox if not d.dead_in_inbox) < self._max_tokens
        ):
            remaining = give_up - time.monotonic()
            if remaining <= 0:
                break
            self._wakeup.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wakeup.wait(), remaining)
        # The window is bounded in documents and in tokens, so the batches it holds run in bounded time
        # and documents arriving meanwhile wait for at most one window.
        window: list[QueuedDocument] = []
        tokens = 0
        while self._inbox and len(window) < self._max_requests * WINDOW_BATCHES:
            if window and tokens + len(self._inbox[0].ids) > self._max_tokens * WINDOW_BATCHES:
                break
            doc = self._inbox.popleft()
            doc.in_inbox = False
            if doc.dead_in_inbox:
                self._inbox_dead -= 1
            window.append(doc)
            tokens += len(doc.ids)
        return window

    async def _form_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            # Take the next window only once the runner has taken the last prepared batch: the window
            # then holds everything that arrived while that batch waited, and is collated while it runs.
            # Taken earlier, it would hold only what came in the first max_wait_ms after the last one.
            await self._ready.join()
            # In a call of its own: its locals (the window's documents and ids, the last batch's prepared
            # input) end with it, rather than outliving it in this loop's frame while the engine idles.
            await self._form_window(loop)

    async def _form_window(self, loop: asyncio.AbstractEventLoop) -> None:
        """Take the next window, cut it into batches and hand each one off, prepared."""
        window = await self._next_window()
        now = time.monotonic()
        live = [doc for doc in window if doc.is_live(now)]
        self._window = live
        self._skipped(len(window) - len(live))
        del window
        try:
            # On the collation thread: a full window's plan is thousands of `cost` calls, which the event
            # loop would otherwise spend instead of answering requests.
            plan = await loop.run_in_executor(
                self._prepare_pool,
                functools.partial(
                    form_batches,
                    [len(doc.ids) for doc in live],
                    self._runner.cost,
                    max_tokens=self._max_tokens,
                    max_requests=self._max_requests,
                ),
            )
        except Exception as exc:  # the runner's cost: fail this window, keep forming the next
            logger.exception("forming batches failed")
            _fail(live, BackendError(f"forming batches failed: {type(exc).__name__}: {exc}"))
            self._window = []
            return
        for indices in plan:
            # Re-check just before collating: a caller may have gone while earlier batches ran.
            now = time.monotonic()
            docs = [live[i] for i in indices if live[i].is_live(now)]
            self._skipped(len(indices) - len(docs))
            if not docs:
                continue
            started = time.perf_counter()
            try:
                prepared = await loop.run_in_executor(
                    self._prepare_pool, self._runner.prepare, [doc.ids for doc in docs]
                )
            except Exception as exc:  # a collation bug must fail these documents, not the batcher
                logger.exception("collating a batch failed")
                _fail(docs, BackendError(f"collating a batch failed: {type(exc).__name__}: {exc}"))
                continue
            await self._ready.put(_Ready(docs, prepared, time.perf_counter() - started))
        # Every document of the window is handed off or answered: hold none of them (nor their rows)
        # until the next window.
        self._window = []

    async def _run_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._run_next(loop)  # in a call of its own, as `_form_window`

    async def _run_next(self, loop: asyncio.AbstractEventLoop) -> None:
        ready = await self._ready.get()
        self._ready.task_done()  # "taken": releases the batch former's join()
        self._in_hand.append(ready)
        try:
            await self._run_one(loop, ready)
        except Exception as exc:  # whatever broke, this task must live on to run the next batch
            logger.exception("answering a batch failed")
            _fail(ready.documents, BackendError(f"answering a batch failed: {type(exc).__name__}: {exc}"))
        finally:
            self._in_hand.remove(ready)
            self._check_idle()  # where every caller left during the pass, the work ends with it

    async def _run_one(self, loop: asyncio.AbstractEventLoop, ready: _Ready) -> None:
        now = time.monotonic()
        if not any(doc.is_live(now) for doc in ready.documents):
            # Every caller left while the batch waited for the model: skip the pass entirely.
            self._skipped(len(ready.documents))
            return
        start = ready.started = time.monotonic()
        self._passes += 1
        load_waits: list[float] = []
        try:
            output = await loop.run_in_executor(self._infer_pool, self._run_pass, ready.prepared, load_waits)
        except ShuttingDownError as exc:
            # The runner was closed before this pass reached it (a close racing the batch, or one from
            # outside the engine): the shutdown it is, as for a pass outside the queue (`run_direct`),
            # not a backend failure. It had been one: counted in `health` (three such batches turned
            # /ready 503), logged with a traceback, and answered `backend_failed` where `shutting_down`
            # tells a client to retry elsewhere. A new error: the runner's traceback holds this frame.
            logger.warning("a batch of %d found the runner closed: %s", len(ready.documents), exc)
            _fail(ready.documents, ShuttingDownError(f"the engine stopped before this document ran ({exc})"))
            return
        except Exception as exc:
            if _refused(exc):
                # No pass ran, and none failed: the documents are answered `not_ready` (503, retried on
                # another pod), uncounted in `health`. A new error: the runner's traceback holds this frame.
                logger.warning("a batch of %d was refused by the runner: %s", len(ready.documents), exc)
                _fail(ready.documents, NotReadyError(str(exc)))
                return
            logger.exception("a forward pass failed")
            _fail(ready.documents, self._pass_failed(f"the {self._runner.backend} backend failed: {exc}"))
            return
        finally:
            self._passes -= 1
            if self._drain is not None:  # a failed pass's wait too: the next batch's interval holds it
                self._drain.exclude(sum(load_waits))
        # A wait for the model to load (an inference process restarting) is queueing, not inference: the
        # timing headers and the inference histogram had read a restart as a pass of several seconds.
        load_wait_s = sum(load_waits)
        inference_s = max(0.0, time.monotonic() - start - load_wait_s)
        problem = _malformed(output, len(ready.documents), self._row_shapes)
        if problem is not None:
            # Checked before any row is answered: an output the rows cannot be read from would raise
            # here and end this task, and every later document would wait for a pass that never comes.
            logger.error("a forward pass returned a malformed output: %s", problem)
            _fail(
                ready.documents, self._pass_failed(f"the {self._runner.backend} backend returned {problem}")
            )
            return
        self._passed()
        for row, doc in enumerate(ready.documents):
            if doc.future.done():  # the caller left while the batch ran; its row is dropped
                continue
            doc.future.set_result(
                BatchRow(
                    embedding=output.embeddings[row],
                    scores={name: values[row] for name, values in output.scores.items()},
                    queue_s=start + load_wait_s - doc.enqueued,
                    inference_s=inference_s,
                )
            )
        if self._drain is not None:
            self._drain.finished(time.monotonic(), ready.prepared.documents)
        self._report(ready, inference_s, output.host_s)

    def _run_pass(self, prepared: PreparedBatch, load_waits: list[float]) -> RunnerOutput:
        """On the inference thread: a batch's pass; `load_waits` gets the seconds of it the runner spent
        waiting for its model to load (`_load_wait_s`), which the drain rate leaves out, whether the pass
        succeeded or failed. Read there, before and after: no other pass runs between the two."""
        before = _load_wait_s(self._runner)
        try:
            return self._runner.run(prepared)
        finally:
            load_waits.append(_load_wait_s(self._runner) - before)

    def _skipped(self, count: int) -> None:
        """Report dropped documents at once: a window whose documents all left runs no batch to carry it."""
        if count <= 0 or self._on_skipped is None:
            return
        try:
            self._on_skipped(count)
        except Exception:
            logger.exception("the skipped-documents observer raised")

    def _report(self, ready: _Ready, inference_s: float, host_s: float | None) -> None:
        if self._on_batch is None:
            return
        stats = BatchStats(
            documents=ready.prepared.documents,
            tokens=ready.prepared.tokens,
            padded_tokens=ready.prepared.padded_tokens,
            prepare_s=ready.prepare_s,
            inference_s=inference_s,
            host_s=host_s,
        )
        try:
            self._on_batch(stats)
        except Exception:
            logger.exception("the batch observer raised")


@dataclass(frozen=True)
class OutputShapes:
    """What a forward pass answers per document: the embedding's width and each head's row shape
    (`(classes,)` for a classification head, `()` for a regression one)."""

    embedding_dim: int
    heads: Mapping[str, tuple[int, ...]]


def _malformed(output: RunnerOutput, documents: int, shapes: OutputShapes | None = None) -> str | None:
    """Why the rows of `output` cannot be those of a batch of `documents`, or None when they can: an
    embedding row per document and, for every head, a row per document; with `shapes`, rows of those
    shapes for every head it names. A runner whose model is not the checkpoint's (an inference process
    that reloaded a head retrained since) had answered rows zipped against the wrong labels."""
    embedding_shape = getattr(output.embeddings, "shape", None)
    rows = (embedding_shape or (None,))[:1]
    if rows != (documents,) or (shapes is not None and embedding_shape != (documents, shapes.embedding_dim)):
        return f"embeddings of shape {embedding_shape} for {documents} documents"
    for name, values in output.scores.items():
        shape = getattr(values, "shape", None)
        if shape is None or shape[:1] != (documents,):
            return f"head {name!r} scores of shape {shape} for {documents} documents"
    if shapes is not None:
        for name, row in shapes.heads.items():
            got = output.scores.get(name)
            if got is None:
                return f"no scores for head {name!r}"
            if got.shape[1:] != row:
                return f"head {name!r} scores of shape {got.shape}; the checkpoint's gives {row} a row"
    return None


def _load_wait_s(runner: Runner) -> float:
    """The seconds `runner`'s passes have spent, in all, waiting for its model to load: an inference
    process's restart (`ProcessRunner.load_wait_s`); 0 for a runner whose model is always loaded."""
    return float(getattr(runner, "load_wait_s", 0.0))


def _recovered_at(runner: Runner) -> float | None:
    """When `runner` last showed it serves again outside the batcher's passes (`time.monotonic()`): an
    inference process started anew ran its check pass (`ProcessRunner.recovered_at`); None for a runner
    whose model lives in this process, which only a pass shows."""
    recovered = getattr(runner, "recovered_at", None)
    return None if recovered is None else float(recovered)


def _refused(exc: BaseException) -> bool:
    """Whether a runner's error refuses the pass rather than reports it failed: typed `not_ready`, the
    runner cannot run any pass now and says why (a model process that is not started again on a
    checkpoint changed since the engine started: `CheckpointChangedError`). Nothing ran, so nothing
    counts in `health`, and the documents get a retryable 503 rather than `backend_failed`'s 500."""
    return isinstance(exc, HtmllmError) and exc.code is ErrorCode.NOT_READY


def _fail(docs: Sequence[QueuedDocument], error: HtmllmError) -> None:
    for doc in docs:
        if not doc.future.done():
            doc.future.set_exception(error)
