"""The Engine's preprocessing pools: prune and tokenize on threads, or on processes held to a time and
memory limit, never on the event loop; and how they are closed under pages still in work.

Apart from the Engine because they are mechanics: the Engine decides when they start and close (under
its lifecycle lock, after its batcher, or beside the batcher's close for a stop without drain) and what a
caller may submit; this class only runs the work and turns what the pools raise into the errors callers
are answered with.
"""

from __future__ import annotations

import asyncio
import enum
import functools
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor, ThreadPoolExecutor
from typing import Any, TypeVar

from service.core.errors import HtmllmError
from service.core.preparation import (
    MEMORY_LIMIT_SETTING,
    Prepared,
    Preprocessed,
    count_limit,
    init_worker,
    prepare,
    prepare_in_worker,
    preprocess,
    preprocess_in_worker,
)
from service.core.prune import InputTooLargeError
from service.core.tokenizer import HtmlTokenizer
from service.core.words import built_word_tables
from service.core.worker_health import KILLED, LOST_STATUS, StartRefusals
from service.core.workers import WorkerError, WorkerPool, WorkerStartError, mib_as_bytes
from service.engine.failures import OverLimitError, mark, worker_failure
from service.engine.token_listing import rendered_tokens
from service.engine.types import Document, EngineConfig, PoolHealth, ShuttingDownError

T = TypeVar("T")

# The process pool's name: in its workers' warnings ("the preprocessing worker ... died") and the `pool`
# label the service counts their replacements under (`htmllm_worker_replacements_total`).
POOL_NAME = "preprocessing"

# A page whose process was killed from outside (the OOM killer, `kill -9`) is tried again in a fresh
# process this many times before its caller is told `not_ready` (`failures.ProcessLostError`): a kill
# says nothing of the page, and one OOM kill under a burst of big pages should not fail a request.
LOST_PROCESS_RETRIES = 2

# What a preprocessing process imports before its memory limit is set (and the forkserver it is forked
# from once for all): the preparation code, and what decoding imports only on the first page that needs
# it, charset detection (`charset_normalizer`, whose compiled modules are mapped into memory as they load)
# and the codecs of every encoding a page may be declared or detected in (the CJK ones load compiled
# modules too). Imported under the limit, by a worker that a big page had left near it, charset detection
# failed to map its modules ("ImportError: ... failed to map segment"), and every later undeclared
# non-UTF-8 page in that worker with it, as `preprocess_failed`. About 4 MiB of each worker's data.
PRELOAD: tuple[str, ...] = (
    "service.core.preparation",
    "charset_normalizer",
    *(
        f"encodings.{codec}"
        for codec in (
            *(f"cp{page}" for page in range(1250, 1259)), "cp866", "cp874", "cp932", "cp949",
            *(f"iso8859_{part}" for part in (2, 3, 4, 5, 6, 7, 8, 10, 13, 14, 15, 16)),
            "koi8_r", "koi8_u", "mac_cyrillic", "mac_roman", "gb18030", "big5", "big5hkscs", "euc_jp",
            "iso2022_jp", "iso2022_jp_ext", "utf_16_be", "utf_16_le", "utf_32_be", "utf_32_le", "utf_8_sig",
        )
    ),
)  # fmt: skip


def _caller_cancelled() -> bool:
    """Whether the running task itself is being cancelled. A function of its own so that the task is
    never a local of a frame that a CancelledError's traceback keeps: the task keeps that error, and
    the cycle held the frame's page until a full collection."""
    task = asyncio.current_task()
    return task is None or task.cancelling() > 0


class Phase(enum.Enum):
    """Where a preprocessing job is now (`RunningJobs`), each phase held to its own bound by readiness
    (`service.api.preprocessing_readiness`): what a job stuck in it says, and how long a sound one may
    take there, differ."""

    # Its own work on the preprocessing thread that runs it: every job with threads, and with processes
    # what still runs on one (a /tokenize listing, the result cache's key hash). Held to what a job on a
    # thread is, as with threads: it cannot be stopped, and the jobs behind it wait.
    THREAD = "thread"
    # A page's call to the processes, waiting for one to take the page: an idle one at once, or one
    # started for it, which the pool holds to `START_BOUND_S`.
    WAITING = "waiting"
    # A page's try on the process that took it, from then (`RunningJobs.taken`): the pool kills the
    # process at the page's time limit.
    ON_PROCESS = "on_process"


class RunningJobs:
    """The jobs the preprocessing threads run now, each with its phase (`Phase`) and since when it has been
    in it (`time.monotonic`), kept by the thread that runs it: how a server tells a stuck worker (alive,
    not answering) from a slow page.

    A page that hangs for good on a thread (an endless loop in a C parser) holds that thread for good, and
    each page behind it waits: its request had been answered 504 at its deadline while /ready said 200.
    Kept until the job itself ends, not until its caller stops waiting (a caller's timeout cancels only
    the wait). With processes, a page's whole call (`WorkerPool.call`) is one job, run by a thread that
    waits on the processes, in two phases each try: waiting for a process (`Phase.WAITING`), then on it
    from when it took the page (`taken`, `Phase.ON_PROCESS`). Counted from the try's start, the page's
    age took in the start of its process, and readiness had to allow a whole start beside the time limit
    to every page, a page stuck in a live process included. A page whose process was killed from outside
    is tried again in a fresh one (`retried`), waiting for it again, with a time limit of its own. What
    runs on a preprocessing thread itself even then (`run`) is `Phase.THREAD`, as every job is with
    threads: counted with the tries on processes, it had been held to a process's time limit, which it
    has none of, and /ready had named a process and its kill for a thread that nothing stops."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._next = 0
        # The jobs of each phase, each since when it has been in it, in the order they came in: the first
        # of each is its oldest.
        self._jobs: dict[Phase, dict[int, float]] = {phase: {} for phase in Phase}
        self._mine = threading.local()  # the token of the job this thread runs (`run`), for `taken`

    def run(self, job: Callable[..., T], *args: object) -> T:
        """`job(*args)` on this thread, counted as running on it meanwhile (`Phase.THREAD`)."""
        return self._run(Phase.THREAD, job, *args)

    def waiting(self, job: Callable[..., T], *args: object) -> T:
        """`job(*args)` on this thread, a call to the processes: counted as waiting for a process until one
        takes the page (`taken`), as on that process from then on."""
        return self._run(Phase.WAITING, job, *args)

    def _run(self, phase: Phase, job: Callable[..., T], *args: object) -> T:
        with self._lock:
            token = self._next
            self._next += 1
            self._jobs[phase][token] = time.monotonic()
        self._mine.token = token
        try:
            return job(*args)
        finally:
            self._mine.token = None
            with self._lock:
                for jobs in self._jobs.values():
                    jobs.pop(token, None)

    def taken(self) -> None:
        """A process took the page of the call this thread runs (`WorkerPool.call`'s `on_taken`): its try
        runs from now, under the page's time limit. Nothing when this thread runs no such call."""
        self._move(Phase.ON_PROCESS)

    def retried(self) -> None:
        """The call this thread runs begins a new try now (its page in a fresh process, after the last one
        was killed from outside): it waits for that process again, its age from now. Nothing when this
        thread runs no such call."""
        self._move(Phase.WAITING)

    def _move(self, phase: Phase) -> None:
        """This thread's call to the processes into `phase`, since now: put last, so the first of each
        phase stays its oldest. A job on the thread itself never moves: it has no process."""
        token = getattr(self._mine, "token", None)
        if token is None:
            return
        with self._lock:
            calls = (self._jobs[Phase.WAITING], self._jobs[Phase.ON_PROCESS])
            if any(token in jobs for jobs in calls):
                for jobs in calls:
                    jobs.pop(token, None)
                self._jobs[phase][token] = time.monotonic()

    def since(self, phase: Phase) -> float | None:
        """Since when the job longest in `phase` has been in it (`time.monotonic`), or None when none is."""
        with self._lock:
            return next(iter(self._jobs[phase].values()), None)

    def oldest(self) -> float | None:
        """When the job running longest began (on its thread, or its page's try on its process:
        `time.monotonic`), or None when none runs."""
        running = (self.since(Phase.THREAD), self.since(Phase.ON_PROCESS))
        return min((since for since in running if since is not None), default=None)

    def oldest_waiting(self) -> float | None:
        """Since when the job waiting longest for a process to take its page has waited (`time.monotonic`),
        or None when none waits."""
        return self.since(Phase.WAITING)


class Preprocessing:
    """The preprocessing threads and, with `preprocess_pool="process"`, the processes and the threads
    that wait on them; from `start` to `close`, which the Engine calls (one Engine, one of these).

    The calls take the thread pool the Engine handed out when it admitted the call (`threads` then): a
    call that outlives a stop finds that pool shut down and is told ShuttingDownError, not served by
    the pools of a later start.
    """

    def __init__(
        self,
        tokenizer: HtmlTokenizer,
        config: EngineConfig,
        max_length: int,
        *,
        on_replaced: Callable[[str], object] | None = None,
    ) -> None:
        self._tokenizer = tokenizer
        self._config = config
        self._max_length = max_length
        self._pool: ThreadPoolExecutor | None = None
        self._processes: WorkerPool | None = None  # preprocess_pool="process"
        # Told why each process was lost or replaced (`WorkerPool`), on the thread that waited on it
        # (through `_replaced`).
        self._on_replaced = on_replaced
        # Threads that wait on the processes: apart, so that a page stuck in one (up to its time limit)
        # never holds up the work of `_pool` (hashing a page for the result cache).
        self._dispatch: ThreadPoolExecutor | None = None
        # The executor jobs callers await now: a stop without drain cancels them (their callers get
        # ShuttingDownError, `off_loop`) rather than wait for a thread that may never finish.
        self._off_loop_waits: set[asyncio.Future[Any]] = set()
        # The tries in a row refused because no process could start, the pages refused together counted
        # once (`StartRefusals`, the extractor pool's rule too); changed on the loop.
        self._starts = StartRefusals()
        # The jobs on the threads now (`RunningJobs`): what readiness reads to find a stuck worker.
        self.running = RunningJobs()

    @property
    def health(self) -> PoolHealth:
        """How starting the processes has gone lately (`PoolHealth`): tries in a row refused for want of
        one, the pages refused together counted once (`_start_failed`)."""
        return self._starts.health

    @property
    def threads(self) -> ThreadPoolExecutor | None:
        """The preprocessing threads between `start` and `close`, else None."""
        return self._pool

    async def start(self) -> None:
        """Build the pools and start every process now, so the first pages do not wait for one.

        A start that fails part way (a process that cannot start, a cancelled start) closes what it built
        before it raises: the Engine has no batcher then, and a second start would have replaced the
        pools (processes included) with new ones nobody closes."""
        try:
            await self._start()
        except BaseException:
            await self.close()
            raise

    async def _start(self) -> None:
        workers = self._config.preprocess_workers
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="htmllm-preprocess")
        if self._config.preprocess_pool == "process":
            self._processes = WorkerPool(
                workers,
                name=POOL_NAME,
                preload=PRELOAD,
                initializer=init_worker,
                # The tables the tokenizer's warm-up built here (if it needs them): a second less per start.
                # (Timed: its workers leave out the pruner's name lookup check, `prune_document`.)
                initargs=(
                    self._tokenizer.to_json(),
                    built_word_tables(),
                    self._config.preprocess_timeout_s is not None,
                ),
                memory_limit_bytes=mib_as_bytes(self._config.preprocess_memory_limit_mb),
                lost_worker_retries=LOST_PROCESS_RETRIES,
                on_replaced=self._replaced,
            )
            self._dispatch = ThreadPoolExecutor(workers, thread_name_prefix="htmllm-preprocess-dispatch")
            await asyncio.to_thread(self._processes.prestart)

    def _replaced(self, reason: str) -> None:
        """A process lost or replaced for `reason`, told by the pool on the thread that waited on it: one
        killed from outside under a page is followed by the page's next try in a fresh process, with a
        time limit of its own (`LOST_PROCESS_RETRIES`), so its call waits for that process again, its age
        from now (`RunningJobs.retried`): the page's whole call had been held to one try's bound, and
        readiness took a page retried after an OOM kill for a stuck pool. Then `on_replaced`'s."""
        if reason in (KILLED, LOST_STATUS):
            self.running.retried()
        if self._on_replaced is not None:
            self._on_replaced(reason)

    async def close(self) -> None:
        """Kill the preprocessing processes, then end the threads (idempotent). In this order: a thread
        waits on its process's page, so the threads first would wait for every page in work, up to
        `preprocess_timeout_s` (for ever without one), and answer it as the page's failure.

        The preprocessing threads are not waited for: a page being pruned on one cannot be stopped
        (threads, unlike processes, cannot be killed), and a stop that waited for it had neither returned
        nor answered the page's caller. Its caller gets ShuttingDownError now; the thread ends when the
        page is done. The threads that wait on processes end as soon as those are killed.
        """
        if self._processes is not None:
            # Forgotten before they are killed: the pages they fail are ShuttingDownError (`_in_process`).
            processes, self._processes = self._processes, None
            await asyncio.to_thread(processes.close)
        dispatch, pool = self._dispatch, self._pool
        self._dispatch = self._pool = None
        for waiting in list(self._off_loop_waits):
            waiting.cancel()  # what its caller then raises: ShuttingDownError (`off_loop`)
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
        if dispatch is not None:
            await asyncio.to_thread(dispatch.shutdown, wait=True, cancel_futures=True)

    async def off_loop(
        self, executor: Executor, job: Callable[..., T], *args: object, on_process: bool = False
    ) -> T:
        """`job(*args)` on `executor`; ShuttingDownError when `close` cancelled it or shut the executor
        down, CancelledError only when the calling task itself was cancelled. `on_process`: the job is a
        call to the processes, waiting for one until it takes the page (`RunningJobs.waiting`).

        `stop(drain=False)` cancels the jobs callers wait for; a bare CancelledError would reach callers
        nobody cancelled (a library caller's TaskGroup, `asyncio.gather`), which then cannot tell it from
        their own cancellation.
        """
        counted = self.running.waiting if on_process else self.running.run
        try:
            future = asyncio.get_running_loop().run_in_executor(executor, counted, job, *args)
        except RuntimeError as exc:  # "cannot schedule new futures after shutdown"
            raise ShuttingDownError("the engine stopped before this document was preprocessed") from exc
        self._off_loop_waits.add(future)
        try:
            return await future
        except asyncio.CancelledError:
            if _caller_cancelled():
                raise  # the caller was cancelled (its deadline, a disconnect): not ours to answer
            raise ShuttingDownError("the engine stopped before this document was preprocessed") from None
        finally:
            self._off_loop_waits.discard(future)
            # What is raised here keeps this frame in its traceback, and the future keeps what is raised:
            # a cycle that held the page until a full collection, which a serving process all but never
            # runs (service.engine.collector). Freed by reference counting once the error is answered.
            del future

    async def prepare(self, pool: ThreadPoolExecutor, doc: Document, truncate: bool) -> Prepared:
        """The token ids of `doc`, from the threads (`pool`) or the processes; OverLimitError for a page
        over the max length with `truncate` off. The Engine checks that it runs first."""
        try:
            if self._processes is None:
                prepared = await self.off_loop(pool, self._prepare, doc, truncate)
            else:
                args = (doc.html, doc.encoding, self._max_length, truncate)
                prepared = await self._in_process(prepare_in_worker, *args)
        except HtmllmError as exc:
            mark(exc, doc)  # so that the caller of an all-or-nothing call can name the page (`naming`)
            raise
        if prepared.over_limit is not None:
            count = f"{'' if prepared.over_limit_exact else 'more than '}{prepared.over_limit}"
            raise mark(OverLimitError(doc.id, count, self._max_length), doc)
        return prepared

    def _prepare(self, doc: Document, truncate: bool) -> Prepared:
        """Prune and tokenize on this thread (the thread pool's job)."""
        max_length = self._max_length
        return prepare(self._tokenizer, doc.html, doc.encoding, max_length=max_length, truncate=truncate)

    async def preprocess(self, pool: ThreadPoolExecutor, doc: Document) -> Preprocessed:
        """The pruned HTML and its token count (`Engine.preprocess`), from the threads or the processes."""
        max_length = self._max_length
        try:
            if self._processes is not None:
                return await self._in_process(preprocess_in_worker, doc.html, doc.encoding, max_length)
            return await self.off_loop(pool, preprocess, self._tokenizer, doc.html, doc.encoding, max_length)
        except HtmllmError as exc:
            mark(exc, doc)
            raise

    async def tokenize(
        self, pool: ThreadPoolExecutor, doc: Document, add_special_tokens: bool
    ) -> tuple[bytes, bool]:
        """The page's tokens listed as JSON, and whether the list is whole (`Engine.tokenize`): pruned as
        `preprocess` prunes it (/v1/preprocess's html, its failures too), then listed on the preprocessing
        threads (`pool`), a job they count (`running`), at most `count_limit` tokens."""
        pruned = (await self.preprocess(pool, doc)).html
        limit = count_limit(self._max_length)
        try:
            return await self.off_loop(
                pool, rendered_tokens, self._tokenizer, pruned, limit, add_special_tokens
            )
        except HtmllmError as exc:
            mark(exc, doc)
            raise

    async def _in_process(self, job: Callable[..., T], *args: object) -> T:
        """Run `job` on a preprocessing process, waited for by one of the dispatch threads; a worker
        that runs past `preprocess_timeout_s` is killed and only its page fails. One killed from outside
        is replaced and the page tried again (`LOST_PROCESS_RETRIES`)."""
        processes, dispatch = self._processes, self._dispatch
        if processes is None or dispatch is None:
            raise ShuttingDownError("the engine stopped before this document was preprocessed")
        timeout_s = self._config.preprocess_timeout_s
        # Its try's age from when a process takes the page (`RunningJobs.taken`), not from the call's
        # start: a process's start has its own bound.
        call = functools.partial(processes.call, job, args, timeout_s=timeout_s, on_taken=self.running.taken)
        ticket = self._starts.ticket()  # as the page is submitted: its refusal counts if none came since
        try:
            result: T = await self.off_loop(dispatch, call, on_process=True)
        except MemoryError as exc:  # raised in the worker before the pruner ran (taking the page in)
            self._started()
            raise InputTooLargeError(
                "the page needs more memory than a preprocessing process may use "
                f"({self._config.preprocess_memory_limit_mb} MiB, {MEMORY_LIMIT_SETTING})"
            ) from exc
        except WorkerError as exc:
            if self._processes is not processes:  # `close` killed the pool under this page
                raise ShuttingDownError("the engine stopped while this document was preprocessed") from exc
            if isinstance(exc, WorkerStartError):
                self._start_failed(exc, ticket)
            else:  # a process took the page (and timed out, crashed or was killed with it)
                self._started()
            raise worker_failure(exc, timeout_s) from exc
        self._started()
        return result

    def _start_failed(self, exc: WorkerStartError, ticket: int) -> None:
        """Count a page refused because no process could start (`health`): each such page had been a
        503 while /ready said 200 and /health too, for ever where no process can start again (the code
        on disk replaced under the server by a package upgrade, which a new process imports).

        Counted once per try, not per page (`StartRefusals`): a page counts only if no refusal was
        counted since it was submitted (`ticket`), so the pages refused together (one request's 64, in
        one blip of the forkserver) count once, and a try made after a refusal counts again. Counted per
        page, one such request had turned /ready 503 until the next probe; a run that goes on, try after
        try, is what readiness is for. The message is the error's own, without its class (a private one)."""
        self._starts.refused(exc.message, ticket, time.monotonic())

    def _started(self) -> None:
        """A process took a page: the processes start again, whatever became of the page."""
        self._starts.started()

    async def probe(self) -> None:
        """One small page through a preprocessing process (none without them): how a server that no
        traffic reaches any more, unready because none could start, learns that one does again. What
        the page refused raises (`ProcessStartError`); a success ends the run in `health`."""
        if self._processes is not None:
            await self._in_process(preprocess_in_worker, "<p>probe</p>", None, self._max_length)
