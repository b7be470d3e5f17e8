"""The Engine: raw HTML in, embeddings and head scores out, with no HTTP in sight.

`await engine.embed(docs)` prunes and tokenizes each document on a worker pool (never on the event
loop), hands the token ids to the batcher (the one owner of the queue) and awaits each document's row
of a batch. The HTTP service, the bulk `htmllm embed` command and evaluation all use this class.

Lifecycle: `start()` inside a running event loop (or `async with engine`), `stop(drain=True)` refuses new
work with `ShuttingDownError` and returns once every accepted document has been answered, `close()`
releases the backend for good (on an engine still running: `stop(drain=False)` first). An engine
serves the loop that started it; once that loop is closed, `stop()` or `start()` on another discards
what it left (`Engine._leave_ended_loop`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import math
import numbers
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import TracebackType
from typing import TypeVar

import numpy as np

from service.core.checkpoint import CheckpointMeta, checkpoint_fingerprint
from service.core.errors import CheckpointError, ErrorCode, HtmllmError, shown
from service.core.modeling import HeadSpec
from service.core.preparation import Preprocessed
from service.core.prune import PRUNE_VERSION
from service.core.tokenizer import HtmlTokenizer
from service.engine.admission import DrainRate
from service.engine.batcher import Batcher, OutputShapes
from service.engine.collector import cancel_and_forget
from service.engine.failures import PAGE_FAILURES, for_copy, naming_failures
from service.engine.loading import build_runner, check_device
from service.engine.preprocessing import POOL_NAME as PREPROCESSING_POOL
from service.engine.preprocessing import Phase, Preprocessing
from service.engine.progress import (
    AWAITING_COPY,
    DONE,
    PREPROCESSING,
    QUEUED,
    Progress,
    describe,
    whereabouts,
)
from service.engine.result_cache import CachedRow, ResultCache, cache_key
from service.engine.runners import Runner
from service.engine.runners.process import Outage, ProcessRunner
from service.engine.types import (
    BackendHealth,
    BatchStats,
    DeadlineExceededError,
    Document,
    DocumentResult,
    EngineConfig,
    EngineObserver,
    InvalidDocumentError,
    ModelInfo,
    NotReadyError,
    OverloadedError,
    PoolHealth,
    ShuttingDownError,
    StageTimings,
    TooManyDocumentsError,
    UnknownHeadError,
    WrongEventLoopError,
    as_document,
    as_documents,
)

logger = logging.getLogger(__name__)
_T = TypeVar("_T")

# A `deadline` further ahead than this is no deadline an embedding call means: it is a `time.time()`
# (about 1.7e9, wall clock) where a `time.monotonic()` (seconds since boot) was wanted, which had been
# taken and never expired. A year, far past any request timeout a server is given (HTMLLM_REQUEST_TIMEOUT_S
# is at most `service.api.settings.MAX_DURATION_S`, a day).
MAX_DEADLINE_AHEAD_S = 365 * 86_400.0


def _forget_failed_row(track: Progress) -> None:
    """Drop a document's row future once it failed: the future keeps the error, whose traceback keeps
    `_embed_one`'s frame and so `track` (a cycle, as in `_embed_one`). A row that came back, or one cut
    short by a cancellation, stays: a late call's message says which documents were in a forward pass."""
    future = track.future
    if future is not None and future.done() and not future.cancelled() and future.exception() is not None:
        track.future = None


def _checked_deadline(deadline: object, now: float) -> float | None:
    """`deadline` as a float, or None; InvalidDocumentError (validation_error, as for the documents) for
    one that is no number (`"5"` had been a bare TypeError), NaN, or more than MAX_DEADLINE_AHEAD_S past
    `now` (a `time.monotonic()` value)."""
    if deadline is None:
        return None
    if isinstance(deadline, bool) or not isinstance(deadline, numbers.Real):
        raise InvalidDocumentError(
            f"deadline is a time.monotonic() value (time.monotonic() + seconds) or None, "
            f"not {type(deadline).__name__}"
        )
    value = float(deadline)
    if math.isnan(value):
        raise InvalidDocumentError("deadline is NaN; give time.monotonic() + seconds, or None")
    if value - now > MAX_DEADLINE_AHEAD_S:
        raise InvalidDocumentError(
            f"deadline is {value - now:.0f} s from now, more than a year: it is a time.monotonic() value "
            "(time.monotonic() + seconds), not a time.time() one; None for no deadline"
        )
    return value


def _log_release_failure(
    future: asyncio.Future[None] | concurrent.futures.Future[None],
) -> None:
    """Done callback of the release that `Engine.close` began: its failure, logged (nobody may await it)."""
    if not future.cancelled() and (error := future.exception()) is not None:
        logger.error("closing the engine failed", exc_info=error)


def _failure_code(task: asyncio.Future[DocumentResult], late: ErrorCode | None) -> ErrorCode | None:
    """The code one document of a failed all-or-nothing call is counted under, as `Engine._settle`
    answers it, or None: embedded (the call's failure drops its result), or dropped unfinished, which is
    no failure of its own (`Engine._count_dropped` reports those that never reached the queue).

    A pass that fails fails each of its rows at once, and their tasks end before the call hears of the
    first: every document of that pass is counted, as `_settle` counts it."""
    if task.done() and not task.cancelled():
        error = task.exception()
        if error is None:
            return None
        return error.code if isinstance(error, HtmllmError) else ErrorCode.INTERNAL  # as `_settle` has it
    return late  # still on its way: timed out at the deadline, else dropped with the call


def _warn_heads_fit_longer(heads: Sequence[HeadSpec], max_length: int) -> None:
    """Warn once, at load, of the heads fit and measured on longer pages than this engine runs (the
    `max_length` their metrics record, `htmllm heads train`): their scores here are of shorter inputs
    than they learned from, and the figures /info shows for them are not of those inputs. `heads train
    --max-length` warns of the converse; a shorter `HTMLLM_MAX_LENGTH` had started without a word."""
    longer = {
        spec.name: int(length)
        for spec in heads
        if (length := spec.metrics.get("max_length")) is not None and length > max_length
    }
    if longer:
        logger.warning(
            "max_length %d is shorter than the pages the heads %s were fit and measured on: their scores are "
            "of pages cut shorter than they were trained on, and the metrics /info shows for them were "
            "measured at their own length; serve at the checkpoint's max_length, or retrain the heads "
            "with `htmllm heads train --max-length %d`",
            max_length,
            ", ".join(f"{name} ({length} tokens)" for name, length in longer.items()),
            max_length,
        )


class Engine:
    """Batched inference over one checkpoint; safe to share between any number of concurrent callers."""

    def __init__(
        self,
        runner: Runner,
        tokenizer: HtmlTokenizer,
        meta: CheckpointMeta,
        config: EngineConfig | None = None,
        *,
        observer: EngineObserver | None = None,
        checkpoint_sha256: str | None = None,
    ) -> None:
        """`checkpoint_sha256`: the fingerprint of the files `runner` loaded, for `info` (a runner in a
        model process says its own, which wins: its process loaded them)."""
        config = config or EngineConfig()
        self.config = config
        self.observer = observer or EngineObserver()
        self._runner = runner
        self._tokenizer = tokenizer
        self._meta = meta
        # What `info` names the loaded checkpoint by. A model process's own: it loaded the files (and the
        # checkpoint may have changed between this process's read of `meta` and its load).
        self._checkpoint_sha256 = checkpoint_sha256
        self._training_run_id = meta.training_run_id
        if isinstance(runner, ProcessRunner):
            self._checkpoint_sha256, self._training_run_id = runner.fingerprint, runner.training_run_id
        self._heads: dict[str, HeadSpec] = {spec.name: spec for spec in meta.heads}
        # What every forward pass must answer per document, checked before a row is read (`_malformed`).
        self._row_shapes = OutputShapes(
            meta.embedding_dim,
            {spec.name: (spec.outputs,) if spec.kind == "classification" else () for spec in meta.heads},
        )
        max_length = config.max_length or meta.max_length
        if max_length > meta.max_length:
            raise ValueError(f"max_length {max_length} exceeds the checkpoint's {meta.max_length}")
        self._max_length = max_length
        _warn_heads_fit_longer(meta.heads, max_length)
        if meta.prune_version != PRUNE_VERSION:
            logger.warning(
                "checkpoint %s was trained on prune version %s, this build prunes with %s",
                meta.name,
                meta.prune_version,
                PRUNE_VERSION,
            )
        # Its pools: from start to stop.
        self._preprocessing = Preprocessing(tokenizer, config, max_length, on_replaced=self._worker_replaced)
        self._batcher: Batcher | None = None
        # What a stop cancelled on its way leaves ending, for the next start to wait for: the last
        # batcher's pass in flight (on its thread), and the preprocessing pools' close.
        self._stopped_batcher: Batcher | None = None
        self._closing_pools: asyncio.Future[None] | None = None
        self._last_health = BackendHealth()  # health while no batcher runs (before start, after stop)
        self._accepting = False
        self._closed = False
        # The stop and release that `close` began on an engine still running (`_stop_and_release`):
        # a task on the engine's loop, or a future of it when closed from another thread.
        self._releasing: asyncio.Future[None] | concurrent.futures.Future[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # the loop `start` ran on
        self._in_flight = 0
        self._idle: asyncio.Event | None = None
        # One start at a time (two concurrent ones had both built a batcher), and a stop waits for a start
        # under way rather than closing pools that start is still filling.
        self._lifecycle = asyncio.Lock()
        # Fed by the batcher, which alone knows when there is model work (`admission`).
        self._drain = DrainRate()
        cached = config.result_cache_documents
        self._cache: ResultCache | None = ResultCache(cached) if cached > 0 else None

    @classmethod
    def from_checkpoint(
        cls,
        path: str | Path,
        config: EngineConfig | None = None,
        *,
        observer: EngineObserver | None = None,
        encoder_only: bool = False,
    ) -> Engine:
        """Load a checkpoint for `config.backend` (the onnx backend exports model.onnx when missing).

        ValueError first, before anything loads, for what this machine cannot run (`check_device`:
        CUDA where there is none, flash_attention_2 on a CPU): the same error whatever the backend and
        wherever the model runs (it had been a ValueError after the load in this process, a BackendError
        after an ONNX export, and from an inference process a `checkpoint_invalid` seconds later).

        `encoder_only`: the checkpoint without its task heads (torch in this process: `build_runner`)."""
        config = config or EngineConfig()
        check_device(config)
        fingerprint: str | None = None
        if not config.inference_process:  # else the child fingerprints what it loads (`ProcessRunner`)
            # Before the load, as the child takes it: `info` names the files loaded, not those found
            # there later (a checkpoint replaced under a starting server had been served under its sha).
            with contextlib.suppress(CheckpointError):  # the load says what is wrong, in its own words
                fingerprint = checkpoint_fingerprint(path)
        runner, meta, tokenizer = build_runner(Path(path), config, encoder_only=encoder_only)
        return cls(runner, tokenizer, meta, config, observer=observer, checkpoint_sha256=fingerprint)

    @property
    def info(self) -> ModelInfo:
        return ModelInfo(
            name=self._meta.name,
            embedding_dim=self._meta.embedding_dim,
            max_length=self._max_length,
            pooling=self._meta.pooling,
            heads=list(self._heads.values()),
            backend=self._runner.backend,
            device=self._runner.device,
            dtype=self._runner.dtype,
            threads=self._runner.threads,
            attention=self._runner.attention,
            prune_version=PRUNE_VERSION,  # what prunes the pages this engine embeds
            checkpoint_prune_version=self._meta.prune_version,
            tokenizer_sha256=self._meta.tokenizer_sha256,
            checkpoint_sha256=self._checkpoint_sha256,
            training_run_id=self._training_run_id,
        )

    @property
    def tokenizer(self) -> HtmlTokenizer:
        return self._tokenizer

    @property
    def queue_size(self) -> int:
        """Documents accepted and not yet answered (preprocessing, queued or in a forward pass)."""
        return self._in_flight

    @property
    def accepting(self) -> bool:
        return self._accepting

    async def start(self) -> None:
        """Start the worker pool and the batcher on the running loop (idempotent, also concurrently)."""
        async with self._lifecycle:
            await self._start()

    async def _start(self) -> None:
        if self._loop_ended():  # what a closed loop left can never run: discarded, then started anew here
            await self._leave_ended_loop()
        if self._batcher is None and not self._closed:
            # Off the loop, and first: the checks below come after this await.
            await asyncio.to_thread(self._tokenizer.warm)
        if self._closed:
            raise ShuttingDownError("the engine has been closed; load a new one")
        if self._batcher is not None:
            self._check_loop()
            return
        self._loop = asyncio.get_running_loop()
        if self._stopped_batcher is not None:
            # One runner, one pass at a time: a pass the last stop left running ends before any other.
            await self._stopped_batcher.wait_closed()
            self._stopped_batcher = None
        if self._closing_pools is not None:  # else it would close the pools this start builds
            await asyncio.shield(self._closing_pools)
            self._closing_pools = None
        await self._preprocessing.start()
        if self._closed:  # `close` came during the awaits above: its runner is released, build nothing on it
            await self._preprocessing.close()
            raise ShuttingDownError("the engine has been closed; load a new one")
        self._batcher = Batcher(
            self._runner,
            max_batch_tokens=self.config.max_batch_tokens,
            max_batch_requests=self.config.max_batch_requests,
            max_wait_ms=self.config.max_wait_ms,
            on_batch=self._on_batch,
            on_skipped=self._on_skipped,
            drain=self._drain,
            row_shapes=self._row_shapes,
        )
        self._batcher.start()
        self._idle = asyncio.Event()
        self._idle.set()
        self._accepting = True

    async def stop(self, *, drain: bool = True) -> None:
        """Stop accepting; with `drain`, answer every accepted document first, else fail them at once
        with ShuttingDownError: those queued or in the forward pass in flight, and those still being
        preprocessed or waiting for a preprocessing thread or process (a page stuck on a thread
        included: the thread runs on, its result unused). It returns once that pass has ended.
        After a `close()` of the running engine it returns once that close has released the backend."""
        await self._stop(drain=drain)
        await self._released()

    async def _stop(self, *, drain: bool) -> None:
        """`stop`, but for the wait for `close`'s release (which runs this itself)."""
        # Under `_lifecycle`, but for the drain: a start under way finishes first (its pools are then ours
        # to close), and a start during the teardown waits for it, then starts anew. Holding the lock only
        # on the way in, a start between the batcher's close and the pools' had built pools and a batcher
        # that this stop then half closed: an engine that said it accepted and failed every call, and
        # pools nobody stopped. The drain waits outside it, so a stop(drain=False) can overtake it.
        async with self._lifecycle:
            if self._loop_ended():  # nothing accepted there can be answered now: no drain, no refusal
                await self._leave_ended_loop()
                return
            batcher, idle = self._batcher, self._idle
            if batcher is None:
                self._accepting = False
                # A stop that was cancelled (a server's bounded wait) or another one still waiting may
                # have left the workers running: this one stops them.
                await self._preprocessing.close()
                return
            self._check_loop()
            self._accepting = False
        if drain and idle is not None:
            await idle.wait()
        async with self._lifecycle:
            if self._batcher is not batcher:  # another stop took this shutdown over while this one waited
                if self._batcher is None:
                    await self._preprocessing.close()  # what that stop left, were it cancelled (idempotent)
                return
            self._last_health = batcher.health
            # Without drain the pages still being preprocessed fail now, beside the batcher's close, which
            # waits for the pass in flight: closed after it, they had waited for that pass (a large batch
            # on CPU: seconds, past a server's drain budget), and their callers with them. With drain
            # there are none left by now.
            closing = None if drain else asyncio.ensure_future(self._preprocessing.close())
            try:
                await batcher.close(ShuttingDownError("the engine stopped before this document ran"))
            finally:
                # Even when this stop is cancelled in the close (a server's bounded wait, while the pass
                # in flight ends): the batcher is closed by then, and an engine left holding it had kept
                # its pools running and, started again, said it accepted while it refused every call.
                self._batcher = None
                self._stopped_batcher = batcher
                self._closing_pools = closing or asyncio.ensure_future(self._preprocessing.close())
                await asyncio.shield(self._closing_pools)
                if idle is not None:  # a draining stop that this one overtook: its documents are answered
                    idle.set()

    def close(self) -> None:
        """Release the backend for good; idempotent. After it the engine refuses documents, `start`,
        `probe` and `warmup` with ShuttingDownError.

        On an engine still running (started and not stopped) it is `stop(drain=False)` first: what is in
        flight fails at once with ShuttingDownError, as in any stop without drain, and the backend is
        released once that stop is done (a task on the engine's loop; `await engine.stop()` waits for
        it). Drain first with `await engine.stop()` to answer them. The backend had been released under
        the running batcher: an onnx engine failed the calls in flight as backend failures (its health
        then said unhealthy), and a model process was started again by the next pass and never closed.
        """
        self._accepting = False
        if self._closed:
            return
        self._closed = True
        loop = self._loop
        if self._batcher is None or loop is None or loop.is_closed():
            # Nothing can queue a pass any more (stopped, never started, or the loop that ran it ended):
            # a pass still on the inference thread ends first (the runner's close waits, or lets it end).
            self._runner.close()
            return
        release = self._stop_and_release()
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        releasing: asyncio.Future[None] | concurrent.futures.Future[None]
        if running is None and not loop.is_running():  # between `run_until_complete`s: done here and now
            loop.run_until_complete(release)
            return
        if loop.is_running() and running is not loop:  # closed from another thread
            releasing = asyncio.run_coroutine_threadsafe(release, loop)
        else:  # on the engine's loop (or on another while the engine's is idle: it runs there next)
            releasing = loop.create_task(release, name="htmllm-engine-close")
        releasing.add_done_callback(_log_release_failure)
        self._releasing = releasing

    async def _stop_and_release(self) -> None:
        """What `close` does to an engine still running: stop without drain, then release the runner
        (off the loop: an inference process is joined)."""
        try:
            await self._stop(drain=False)
        finally:
            await asyncio.to_thread(self._runner.close)

    async def _released(self) -> None:
        """Until the release that `close` began on a running engine is done (at once when there is none,
        or when it belongs to a loop that has ended). Its failure is logged, not raised here."""
        releasing = self._releasing
        if releasing is None or releasing.done():
            return
        if isinstance(releasing, asyncio.Future):
            if releasing.get_loop() is not asyncio.get_running_loop():
                return
            await asyncio.wait([releasing])
        else:
            await asyncio.wait([asyncio.wrap_future(releasing)])

    def _check_loop(self) -> None:
        """WrongEventLoopError unless called on the loop the engine was started on."""
        loop = asyncio.get_running_loop()
        if self._loop is not None and loop is not self._loop:
            if self._loop.is_closed():
                raise WrongEventLoopError(
                    "the engine was started on another event loop, now closed; `await engine.stop()` or "
                    "`await engine.start()` on this loop first (an Engine serves the loop that started it: "
                    "one asyncio.run around start, embed and stop)"
                )
            raise WrongEventLoopError(
                "the engine was started on another event loop (still running); an Engine serves the loop "
                "that started it (one asyncio.run around start, embed and stop)"
            )

    def _loop_ended(self) -> bool:
        """Whether the engine runs, or ran, on an event loop that has been closed since (a first
        `asyncio.run(engine.start())`, then a second `asyncio.run`)."""
        return self._loop is not None and self._loop.is_closed()

    async def _leave_ended_loop(self) -> None:
        """Discard what `start` built on a loop that has been closed, and end its threads and processes.

        That loop's tasks and futures can never run again: a drain would wait for ever, and
        WrongEventLoopError from `stop` and `start` had left an engine that could neither stop nor start
        again (and its preprocessing processes running until the interpreter exits). `asyncio.run`
        ended every task of its loop before it closed it, so the batcher's close, run here, only fails
        what was left queued and shuts its threads down (after a pass still running on one), and the
        preprocessing pools' close kills the processes and ends the threads. (Embedding is not restarted
        this way: a call starting pools and processes on its own would surprise its caller.)"""
        batcher, stopped = self._batcher, self._stopped_batcher
        self._batcher = self._stopped_batcher = None
        self._closing_pools = None  # a task of the closed loop; the close below does its work again
        self._loop = None
        self._accepting = False
        # An Event that waiters of the closed loop may hold (set, it would wake them on that loop); it
        # still says the engine ran once (`_require_started`).
        self._idle = asyncio.Event()
        self._idle.set()
        try:
            if batcher is not None:
                self._last_health = batcher.health
                await batcher.close(
                    ShuttingDownError("the engine's event loop ended before this document ran")
                )
            if stopped is not None:  # closed already: again, to wait here for its last pass to end
                await stopped.close()
        finally:
            await self._preprocessing.close()

    async def __aenter__(self) -> Engine:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        """Stop: drained after a block that ended normally, at once (what is in flight fails with
        ShuttingDownError) after one that raised; the block's exception goes on.

        A drain cancelled (a timeout around the block, its task cancelled) stops without drain before
        the cancellation goes on: the block had been left with the batcher and the pools running, and
        the calls in flight unanswered once the loop ended (or for ever, behind a pass that hung)."""
        if exc_type is not None:
            await self.stop(drain=False)
            return
        try:
            await self.stop()
        except asyncio.CancelledError:
            await self.stop(drain=False)
            raise

    def resolve_heads(self, heads: Sequence[str] | None) -> list[str]:
        """The heads to report: all when None; an unknown name, or a name that is no str, raises
        UnknownHeadError (a library caller's `heads=[1]` had been a bare TypeError, `[["a"]]` one still)."""
        if heads is None:
            return list(self._heads)
        if isinstance(heads, str):  # a sequence of characters, each an unknown head
            raise UnknownHeadError(f"heads is a list of head names (one head: [{shown([heads])}]), not a str")
        if isinstance(heads, bytes | bytearray | Mapping):  # ints, or a mapping's keys taken as the names
            raise UnknownHeadError(f"heads is a list of head names, not {type(heads).__name__}")
        try:
            names = list(heads)  # once: a generator read twice had reported no head at all, silently
        except TypeError as exc:  # not iterable (`heads=5`)
            raise UnknownHeadError(f"heads is a list of head names, not {type(heads).__name__}") from exc
        wrong = sorted({type(name).__name__ for name in names if not isinstance(name, str)})
        if wrong:
            raise UnknownHeadError(f"heads are head names (str), not {', '.join(wrong)}")
        unknown = [h for h in names if h not in self._heads]
        if unknown:
            raise UnknownHeadError(f"unknown head(s) {shown(unknown)}; this model has {sorted(self._heads)}")
        return list(dict.fromkeys(names))

    async def preprocess(self, doc: Document | str | bytes) -> Preprocessed:
        """The pruned HTML and its token count (with [CLS]/[SEP], before truncation), for debugging;
        counted up to `count_limit` of the model's max length (`tokens_exact` False past it).

        Admitted against the same bounded queue as `embed` (a flood of debugging calls must not pile
        pages up in the workers' queue without limit) and drained by `stop(drain=True)` like it.
        """
        document = as_document(doc)
        return await self._one_page(lambda pool: self._preprocessing.preprocess(pool, document))

    async def tokenize(
        self, doc: Document | str | bytes, *, add_special_tokens: bool = True
    ) -> tuple[bytes, bool]:
        """The tokens of the page's pruned HTML as TEI's /tokenize lists them, rendered as JSON
        (`token_listing.token_list`: offsets into the pruned HTML, [CLS] and [SEP] around them with
        `add_special_tokens`), at most `count_limit` of the model's max length of them; and whether that
        is all of them.

        Admitted against the same bounded queue as `preprocess`, and held in it until the list is made,
        on the preprocessing threads (`Preprocessing.tokenize`): listed on the API's own threads, any
        number of /tokenize calls of big pages had run at once, outside the queue and its 429.
        """
        document = as_document(doc)
        return await self._one_page(
            lambda pool: self._preprocessing.tokenize(pool, document, add_special_tokens)
        )

    async def _one_page(self, work: Callable[[ThreadPoolExecutor], Awaitable[_T]]) -> _T:
        """`work(pool)` for one page admitted against the bounded queue (`preprocess`, `tokenize`), its
        place held until the work ends, whatever way it ends."""
        pool = self._require_accepting()
        self._check_room(1)
        self._admit(1)
        try:
            return await work(pool)
        finally:
            self._release(1)

    def _require_open(self) -> None:
        """ShuttingDownError once `close` was called: a probe or warm-up then had run on the released
        backend (and started a new inference process, which nobody closed)."""
        if self._closed:
            raise ShuttingDownError("the engine has been closed")

    def _require_accepting(self) -> ThreadPoolExecutor:
        """The thread pool, while the engine takes new documents (NotReady before start, ShuttingDown
        once `stop` began)."""
        self._require_open()
        if not self._accepting:
            self._require_started()
            raise ShuttingDownError("the engine is shutting down and accepts no new documents")
        return self._require_started()

    def check_call_size(self, count: int) -> None:
        """TooManyDocumentsError when one call's `count` documents could never fit the bounded queue,
        however long the caller waited: a 422 to split the call, not a 429 that a client retries forever.

        `embed` checks it; a caller that admits documents one by one (the service's /v1/preprocess)
        checks it for the whole request first, or its last documents find the queue full of its first.
        """
        if count > self.config.max_queue_documents:
            raise TooManyDocumentsError(
                f"{count} documents in one call exceed the queue's {self.config.max_queue_documents}"
            )

    def _check_room(self, count: int) -> None:
        """OverloadedError unless `count` more documents fit the bounded queue."""
        if self._in_flight + count > self.config.max_queue_documents:
            raise OverloadedError(
                f"the queue is full ({self._in_flight} of {self.config.max_queue_documents} documents)"
            )

    def _check_wait(self, count: int, remaining_s: float | None) -> None:
        """OverloadedError when the queue ahead, drained at the measured rate, would keep `count` more
        documents past their deadline (`admission`): a 429 now rather than a 504 at the deadline."""
        if remaining_s is None or self._in_flight == 0:
            return  # alone, a request is served as fast as the engine can
        ahead = self._in_flight + count  # this request's last document waits for them all
        wait_s = self._drain.seconds_for(ahead)
        if wait_s is not None and wait_s > remaining_s:
            raise OverloadedError(
                f"with this request the queue holds about {wait_s:.1f} s of work ({ahead} documents at "
                f"{self._drain.rate or 0:.1f} a second), past this request's deadline in {remaining_s:.1f} s"
            )

    def _require_started(self) -> ThreadPoolExecutor:
        """The preprocessing threads, while the pools and the batcher run on this loop (NotReadyError
        before `start`, ShuttingDownError after `stop`)."""
        pool = self._preprocessing.threads
        if pool is None or self._batcher is None:
            if self._idle is not None:  # it ran once: it has been stopped
                raise ShuttingDownError("the engine has stopped")
            raise NotReadyError("the engine has not been started")
        self._check_loop()
        return pool

    async def embed(
        self,
        docs: Sequence[Document | str | bytes],
        *,
        heads: Sequence[str] | None = None,
        normalize: bool = True,
        truncate: bool | None = None,
        deadline: float | None = None,
    ) -> list[DocumentResult]:
        """Embed documents; results in input order. `deadline` is an absolute `time.monotonic()`.

        All or nothing: the first failing document (prune error, too many tokens, deadline, backend)
        raises and the others are dropped from the queue. `embed_settled` answers each one instead.
        A failure of a page itself in a call of several says which document it was, by id and index
        ("the document at index 40: page nests more than ..."), in its own class and code.
        """
        outcomes = await self._embed_all(docs, heads, normalize, truncate, deadline, settle=False)
        return [outcome for outcome in outcomes if isinstance(outcome, DocumentResult)]

    async def embed_settled(
        self,
        docs: Sequence[Document | str | bytes],
        *,
        heads: Sequence[str] | None = None,
        normalize: bool = True,
        truncate: bool | None = None,
        deadline: float | None = None,
    ) -> list[DocumentResult | HtmllmError]:
        """Each document's result or its own typed error, in input order.

        A crawler's batch of pages should not be lost to one of them: a page over the token limit with
        truncation off, one the pruner fails on, or one still queued when the deadline passes fails
        alone, and the others keep their results (at the deadline, those already embedded). What is
        wrong with the call itself (an unknown head, a full queue, shutting down) still raises.
        """
        return await self._embed_all(docs, heads, normalize, truncate, deadline, settle=True)

    async def _embed_all(
        self,
        docs: Sequence[Document | str | bytes],
        heads: Sequence[str] | None,
        normalize: bool,
        truncate: bool | None,
        deadline: float | None,
        *,
        settle: bool,
    ) -> list[DocumentResult | HtmllmError]:
        called = time.monotonic()
        pool = self._require_accepting()
        head_names = self.resolve_heads(heads)
        deadline = _checked_deadline(deadline, called)
        for name, flag in (("normalize", normalize), ("truncate", truncate)):
            if not isinstance(flag, bool) and not (name == "truncate" and flag is None):
                # `truncate="no"` had been taken as true: any non-empty string is
                raise InvalidDocumentError(f"{name} is a bool, not {type(flag).__name__} ({flag!r:.40})")
        documents = as_documents(docs)
        if not documents:
            return []
        count = len(documents)
        self.check_call_size(count)
        self._check_room(count)
        if deadline is not None and deadline <= called:
            raise DeadlineExceededError("the deadline passed before the documents were queued")
        self._check_wait(count, None if deadline is None else deadline - called)
        self._admit(count)
        truncate = self.config.truncate if truncate is None else truncate
        progress = [Progress() for _ in documents]
        tasks = [
            asyncio.ensure_future(
                self._embed_one(pool, doc, head_names, normalize, truncate, deadline, called, track)
            )
            for doc, track in zip(documents, progress, strict=True)
        ]
        outcomes: list[DocumentResult | HtmllmError]
        try:
            timeout = None if deadline is None else deadline - time.monotonic()
            if settle:
                outcomes = await self._settle(tasks, progress, timeout)
            else:
                async with asyncio.timeout(timeout):
                    outcomes = list(await asyncio.gather(*tasks))
        except TimeoutError as exc:
            self._count_failed_call(tasks, late=ErrorCode.TIMEOUT)
            where = whereabouts(progress, self._batcher)
            self._log_late(where)
            after = f"{time.monotonic() - called:.1f} s after the call"
            raise DeadlineExceededError(
                f"the deadline passed {after}, before the documents were embedded: {where}"
            ) from exc
        except HtmllmError:
            self._count_failed_call(tasks)
            if count == 1:
                # One document needs no name: `htmllm embed`, which embeds page by page, writes the
                # message in a row of its own index (an "(index 0)" there would contradict it).
                raise
            with naming_failures(documents):  # named once, here: the HTTP layer's passes it on as it is
                raise
        except Exception as exc:  # a bug on a document's way: typed, as `_settle` answers it
            logger.error("embedding a document failed", exc_info=exc)
            self._count_failed_call(tasks)
            raise HtmllmError(
                f"embedding failed: {type(exc).__name__}: {exc}", code=ErrorCode.INTERNAL
            ) from exc
        finally:
            self._count_dropped(tasks, progress)
            cancel_and_forget(tasks)
            self._release(count)
        results = [outcome for outcome in outcomes if isinstance(outcome, DocumentResult)]
        self._notify(self.observer.documents_done, len(results), sum(r.tokens for r in results))
        self._count_failures(outcome.code for outcome in outcomes if isinstance(outcome, HtmllmError))
        return outcomes

    def _count_failed_call(
        self, tasks: Sequence[asyncio.Future[DocumentResult]], *, late: ErrorCode | None = None
    ) -> None:
        """Count the failed documents of an all-or-nothing call that failed: each as `embed_settled`
        answers it, so that the same input counts the same either way. The call's error is one
        document's; counting every document of the call under its code had made one page over the token
        limit in a call of ten read as ten. `late`: the deadline passed, and what was still on its way
        timed out."""
        self._count_failures(code for task in tasks if (code := _failure_code(task, late)) is not None)

    def _count_failures(self, codes: Iterable[ErrorCode]) -> None:
        """`htmllm_documents_failed_total`'s counts: one failed document per code in `codes`."""
        for code, failed in Counter(codes).items():
            self._failed(code, failed)

    def _count_dropped(
        self, tasks: Sequence[asyncio.Future[DocumentResult]], progress: Sequence[Progress]
    ) -> None:
        """Report the call's documents that end unfinished before they reached the queue (another
        document failed the call, the deadline passed, the caller left) as skipped: dropped before their
        forward pass. The batcher reports those it holds itself, when it drops them."""
        dropped = sum(
            1
            for task, track in zip(tasks, progress, strict=True)
            if (not task.done() or task.cancelled()) and track.stage in (PREPROCESSING, AWAITING_COPY)
        )
        if dropped:
            self._on_skipped(dropped)

    async def _settle(
        self,
        tasks: Sequence[asyncio.Future[DocumentResult]],
        progress: list[Progress],
        timeout: float | None,
    ) -> list[DocumentResult | HtmllmError]:
        """Wait for every document until the deadline; each one's result or error, late ones timed out."""
        done, pending = await asyncio.wait(tasks, timeout=timeout)
        if pending:
            self._log_late(whereabouts(progress, self._batcher))
        now = time.monotonic()
        outcomes: list[DocumentResult | HtmllmError] = []
        for task, track in zip(tasks, progress, strict=True):
            if task not in done:
                where = describe(track, now, self._batcher)
                outcomes.append(DeadlineExceededError(f"the deadline passed while the document was {where}"))
            elif task.cancelled():  # stop(drain=False) cancelled its turn in the preprocessing pool
                outcomes.append(ShuttingDownError("the engine stopped before this document was embedded"))
            elif isinstance(error := task.exception(), HtmllmError):
                outcomes.append(error)
            elif error is not None:
                logger.error("embedding a document failed", exc_info=error)
                outcomes.append(
                    HtmllmError(f"embedding failed: {type(error).__name__}: {error}", code=ErrorCode.INTERNAL)
                )
            else:
                outcomes.append(task.result())
        return outcomes

    def _log_late(self, where: str) -> None:
        waiting = self._batcher.waiting if self._batcher is not None else 0
        logger.warning(
            "a call's deadline passed: %s; documents in flight: %d, waiting for a batch: %d",
            where,
            self._in_flight,
            waiting,
        )

    async def _embed_one(
        self,
        pool: ThreadPoolExecutor,
        doc: Document,
        head_names: list[str],
        normalize: bool,
        truncate: bool,
        deadline: float | None,
        called: float,
        track: Progress,
    ) -> DocumentResult:
        cache, key = self._cache, b""
        if cache is not None:
            # Hashing a page takes time: off the loop, on the threads the call was admitted to.
            key = await self._preprocessing.off_loop(pool, cache_key, doc, truncate)
            track.enter(AWAITING_COPY)
            hit = await cache.settled(key)
            if isinstance(hit, HtmllmError):  # the copy in flight failed on the page itself
                raise for_copy(hit, doc) from hit
            if hit is not None:
                self._notify(self.observer.cache_hit)
                timings = StageTimings(0.0, 0.0, 0.0, 0.0, time.monotonic() - called)
                track.enter(DONE)
                return self._result(doc, hit, head_names, normalize, timings)
            cache.claim(key)
            track.enter(PREPROCESSING)
        page_failure: HtmllmError | None = None
        try:
            prepared = await self._preprocessing.prepare(self._require_started(), doc, truncate)
            batcher = self._batcher
            if batcher is None:
                raise ShuttingDownError("the engine stopped before this document was queued")
            track.enter(QUEUED)
            track.future = batcher.submit(prepared.ids, deadline=deadline)
            row = await track.future
            # A buffer of its own (the batch's is shared by its rows): what the cache keeps, and read
            # for this caller's answer, as for a cache hit's.
            finished = CachedRow.of(row.embedding, row.scores, len(prepared.ids), prepared.truncated)
            if cache is not None:
                cache.put(key, finished)
        except HtmllmError as exc:
            if exc.code in PAGE_FAILURES:
                page_failure = exc
            raise
        finally:
            if cache is not None:
                # A failure of the page itself goes to the copies waiting for it; after any other (this
                # caller's deadline, the backend) whoever waits embeds the page itself.
                cache.release(key, page_failure)
            # What this frame raises keeps the frame in its traceback: a local (or the row's future)
            # holding that error is a cycle, and a cycle kept the page (12 MB refused ones included)
            # until a full collection, which a serving process all but never runs
            # (service.engine.collector). Without it reference counting frees the page with the error.
            page_failure = None
            _forget_failed_row(track)
        timings = StageTimings(
            prune_s=prepared.prune_s,
            tokenize_s=prepared.tokenize_s,
            queue_s=row.queue_s,
            inference_s=row.inference_s,
            total_s=time.monotonic() - called,
        )
        result = self._result(doc, finished, head_names, normalize, timings)
        track.enter(DONE)
        self._notify(self._report_stages, result.timings)
        return result

    def _report_stages(self, timings: StageTimings) -> None:
        self.observer.stage("prune", timings.prune_s)
        self.observer.stage("tokenize", timings.tokenize_s)
        self.observer.stage("queue", timings.queue_s)
        self.observer.stage("inference", timings.inference_s)
        self.observer.stage("total", timings.total_s)

    def _result(
        self,
        doc: Document,
        row: CachedRow,
        head_names: list[str],
        normalize: bool,
        timings: StageTimings,
    ) -> DocumentResult:
        embedding = np.array(row.embedding, dtype=np.float32)  # the caller's own copy (rows are shared)
        if normalize:
            embedding /= max(float(np.linalg.norm(embedding)), 1e-12)
        scores: dict[str, dict[str, float] | float] = {}
        for name in head_names:
            spec, value = self._heads[name], row.score(name)
            if spec.kind == "classification":
                scores[name] = {label: float(p) for label, p in zip(spec.labels, value.tolist(), strict=True)}
            else:
                scores[name] = float(value)
        return DocumentResult(
            id=doc.id,
            embedding=embedding,
            scores=scores,
            tokens=row.tokens,
            truncated=row.truncated,
            timings=timings,
        )

    @property
    def health(self) -> BackendHealth:
        """The forward passes' recent outcome (`BackendHealth`): failures in a row, since when, and when
        the pass now running began. What a server's readiness and liveness read."""
        return self._batcher.health if self._batcher is not None else self._last_health

    @property
    def outage(self) -> Outage | None:
        """Why the backend cannot run a forward pass now although none failed, or None: its model
        process died and a new one is loading, or could not be started (`ProcessRunner.outage`). What
        /ready answers 503 with from the moment the child is found dead, and /health too when it is
        `permanent` (the checkpoint changed since this engine started: only a new engine serves it); a
        runner in this process has no such state (it dies with the server)."""
        runner = self._runner
        return runner.outage() if isinstance(runner, ProcessRunner) else None

    async def probe(self, *, check: bool = False) -> None:
        """One three-token forward pass outside the queue, which updates `health`: how a server that no
        traffic reaches any more (unready after failures) learns that its backend works again, and, with
        the model in a child process, what starts a dead child anew. `check`: a look at a backend whose
        last passes failed, below any threshold, on a pod traffic may not reach for hours: its success
        ends their run as a restarted model process's own pass does (a failure before the next success
        resumes it, `Batcher.run_direct`). BackendError when it fails; NotReadyError when the runner
        refuses any pass now; ShuttingDownError once stopped or closed."""
        self._require_open()
        self._require_started()
        assert self._batcher is not None
        await self._batcher.run_direct([self._tokenizer.special_ids.filler(3)], check=check)

    @property
    def preprocessing_health(self) -> PoolHealth:
        """Whether the preprocessing processes start (`PoolHealth`): tries in a row refused for want of
        one (pages refused together count once), since when and why. Always clear with
        `preprocess_pool="thread"`. What a server's readiness and liveness read beside `health`."""
        return self._preprocessing.health

    @property
    def preprocessing_running_since(self) -> float | None:
        """When the preprocessing job running longest began (`time.monotonic()`), or None when none runs:
        a job stuck on a thread cannot be stopped, so readiness and liveness read its age. With processes,
        a page's try on its process, from when the process took it (a process's start apart:
        `preprocessing_waiting_since`)."""
        return self._preprocessing.running.oldest()

    @property
    def preprocessing_waiting_since(self) -> float | None:
        """Since when the page waiting longest for a preprocessing process to take it has waited (its
        process's start: `time.monotonic()`), or None when none waits; always None with threads. The pool
        holds a start to `service.core.workers.START_BOUND_S`: one past it says the pool is stuck."""
        return self._preprocessing.running.oldest_waiting()

    def preprocessing_since(self, phase: Phase) -> float | None:
        """Since when the oldest preprocessing job in `phase` has been in it (`time.monotonic()`), or None:
        readiness holds each phase to its own bound (a job on its thread, a page's try on a process, a
        page waiting for a process's start), which `preprocessing_running_since` merges two of."""
        return self._preprocessing.running.since(phase)

    async def probe_preprocessing(self) -> None:
        """One small page through a preprocessing process, outside the queue (`Preprocessing.probe`),
        which updates `preprocessing_health`; what refused the page raises (`ProcessStartError`, coded
        `not_ready`, when no process could start), ShuttingDownError once stopped or closed."""
        self._require_open()
        self._require_started()
        await self._preprocessing.probe()

    async def warmup(self) -> None:
        """One full-size batch of full-length documents, outside the queue (allocations, kernel choice);
        ShuttingDownError once stopped or closed."""
        self._require_open()
        self._require_started()
        assert self._batcher is not None
        length = self._max_length
        count = max(1, min(self.config.max_batch_requests, self.config.max_batch_tokens // length))
        await self._batcher.run_direct([self._tokenizer.special_ids.filler(length)] * count)

    def _admit(self, count: int) -> None:
        self._in_flight += count
        if self._idle is not None:
            self._idle.clear()
        self._notify(self.observer.queue_size, self._in_flight)

    def _release(self, count: int) -> None:
        self._in_flight -= count
        if self._in_flight == 0 and self._idle is not None:
            self._idle.set()
        self._notify(self.observer.queue_size, self._in_flight)

    def _failed(self, code: ErrorCode, count: int) -> None:
        self._notify(self.observer.documents_failed, code, count)

    def _on_batch(self, stats: BatchStats) -> None:
        self._notify(self.observer.batch_done, stats)

    def _on_skipped(self, documents: int) -> None:
        self._notify(self.observer.documents_skipped, documents)

    def _worker_replaced(self, reason: str) -> None:
        """A preprocessing process lost or replaced for `reason` (`WorkerPool`'s `on_replaced`, called on
        the thread that waited on it): the observer's `worker_replaced(pool, reason)`, posted to the loop,
        where every hook runs. Looked up at each call: the app sets its observer after the engine is
        built. An observer without the hook (one not derived from `EngineObserver`) is skipped."""
        hook = getattr(self.observer, "worker_replaced", None)
        loop = self._loop
        if hook is None or loop is None:
            return
        with contextlib.suppress(RuntimeError):  # the loop is closed: nothing is left to count it
            loop.call_soon_threadsafe(self._notify, hook, PREPROCESSING_POOL, reason)

    def _notify(self, hook: Callable[..., object], *args: object) -> None:
        """Call an observer hook; a metrics bug must never fail a request."""
        try:
            hook(*args)
        except Exception:
            logger.exception("engine observer hook %s raised", getattr(hook, "__name__", hook))
