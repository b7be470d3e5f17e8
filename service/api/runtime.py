"""What one app holds while it runs (settings, metrics, engine, extraction pools) and how routes reach it.

Routes take `RuntimeDep` / `EngineDep` (FastAPI `Annotated` dependencies) instead of module globals, so
several apps (tests, the benchmark's two servers) live side by side in one process.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated, Any, ParamSpec, TypeVar

from fastapi import Depends, Request
from starlette.types import Message, Receive

from service.api.api_keys import ApiKeys
from service.api.checkpoint_identity import CheckpointIdentity
from service.api.code_stamp import CodeStamp
from service.api.errors import ClientDisconnectedError
from service.api.metrics import ServiceMetrics
from service.api.preprocessing_readiness import PreprocessingReadiness, start_outage
from service.api.settings import Settings
from service.core.errors import ErrorCode, HtmllmError
from service.core.worker_health import RecurringWarning, StartHealth, start_check_due
from service.engine import Engine
from service.engine.collector import CollectorState

if TYPE_CHECKING:
    from service.core.extract import ExtractorPool

T = TypeVar("T")
P = ParamSpec("P")

logger = logging.getLogger(__name__)

# The scope's `charge(count)`: charges `count` more bytes to the request's share of the in-flight body
# budget, or raises OverloadedError (service.api.limits).
CHARGE_KEY = "htmllm.charge"
# The request's Content-Encoding as sent, which `limits.py` undoes before a route reads the body (and
# drops from the headers), kept in the scope under this key so that a body still compressed after it
# is told from one sent without any (`service.api.documents.check_not_compressed`).
CONTENT_ENCODING_KEY = "htmllm.content_encoding"
# The least time between two probe passes of a failing backend (or probe pages of failing preprocessing).
PROBE_INTERVAL_S = 5.0


@dataclass
class PacedProbe:
    """A probe run in the background (the backend's pass, a page through the preprocessing processes):
    one at a time, at most every PROBE_INTERVAL_S, so that /ready and the scrapes calling for it often
    start it seldom."""

    task: asyncio.Task[None] | None = None
    started_at: float | None = None

    def start(self, probe: Callable[[], Awaitable[None]]) -> None:
        """Start `probe()` unless one runs or one started within PROBE_INTERVAL_S."""
        if self.task is not None and not self.task.done():
            return
        now = time.monotonic()
        if self.started_at is not None and now - self.started_at < PROBE_INTERVAL_S:
            return
        self.started_at = now
        self.task = asyncio.ensure_future(probe())

    async def cancel(self) -> None:
        if self.task is not None:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)


class ExtractionThreads(ThreadPoolExecutor):
    """The threads /v1/extract's jobs run on: each job takes the extractor pool's count of refused starts
    as it is submitted (`ExtractorPool.submitted`), so that the jobs of a request refused together for
    want of a process count as one try, however long they wait for a thread. Taken as a job began, a
    request of 2 documents x 2 extractors refused during one blip had counted 4 tries, /ready 503 at once."""

    def __init__(self, pool: ExtractorPool, workers: int) -> None:
        super().__init__(workers, thread_name_prefix="htmllm-extract")
        self._pool = pool

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        return super().submit(self._pool.submitted(functools.partial(fn, *args, **kwargs)))


class BodyReaders:
    """The requests waiting for more of their body, so that shutdown can answer them in time.

    A client uploading slowly when SIGTERM comes (60 s of `HTMLLM_BODY_TIMEOUT_S` against 30 s of drain)
    was cancelled by uvicorn when its graceful timeout ran out: a bare 500 in plain text, no
    `Retry-After`. Shortly before the drain budget ends the runtime calls `cut_off`, and each such
    request is answered 503 `shutting_down` (the body never came, so the request was never accepted; the
    client retries elsewhere). Only a wait for the next piece of body can be cut off.
    """

    def __init__(self) -> None:
        self._waiting: set[asyncio.Task[object]] = set()
        self._cut: set[asyncio.Task[object]] = set()
        self.closed = False  # cut off: a body read from now on is answered at once

    async def receive(self, receive: Receive) -> Message:
        task = asyncio.current_task()
        assert task is not None
        self._waiting.add(task)
        try:
            return await receive()
        finally:
            self._waiting.discard(task)

    def was_cut(self, task: asyncio.Task[object] | None) -> bool:
        """Whether `cut_off` cancelled `task` (and not someone else); clears the mark and the cancel."""
        if task is None or task not in self._cut:
            return False
        self._cut.discard(task)
        task.uncancel()
        return True

    def cut_off(self) -> int:
        """Cancel every wait for a body; returns how many there were."""
        self.closed = True
        for task in self._waiting:
            self._cut.add(task)
            task.cancel()
        return len(self._waiting)


class PendingAnswers:
    """The requests waiting for their work (`answer_or_cancel`), so that shutdown can answer them in time.

    The cut-off fails what is accepted (queued, in a forward pass, or still being preprocessed: the
    engine's stop fails the last at once, without waiting for the pass in flight), and each request then
    answers at once; but a document that nothing can fail in time would keep its request waiting: a stop
    held up before it gets to the pages in preprocessing (it kills the preprocessing processes first, and
    waits up to 5 s for each to end: one in uninterruptible sleep ends only once its I/O does). A
    report-mode request waits for every document, and an all-or-nothing one whose documents are all such
    pages has none failed to answer with; uvicorn's graceful timeout then cancelled it, a bare plain-text
    500. Halfway through the margin the runtime calls `cut_off`, and each request still waiting is
    answered 503 `shutting_down`, as a request with a document still queued is.
    """

    def __init__(self) -> None:
        self._due: asyncio.Future[None] | None = None
        self.waiting = 0  # requests in `answer_or_cancel` now
        self.closed = False  # cut off: a request waiting from now on is answered at once

    def due(self) -> asyncio.Future[None]:
        """A future, shared by the waiting requests, that `cut_off` ends (one per event loop)."""
        loop = asyncio.get_running_loop()
        if self._due is None or self._due.get_loop() is not loop:
            self._due = loop.create_future()
            if self.closed:
                self._due.set_result(None)
        return self._due

    def cut_off(self) -> int:
        """Tell every waiting request to answer now; returns how many there were."""
        self.closed = True
        if self._due is not None and not self._due.done():
            self._due.set_result(None)
        return self.waiting


@dataclass
class Runtime:
    """The state of one running app; `app.state.runtime`."""

    settings: Settings
    metrics: ServiceMetrics
    api_keys: ApiKeys = field(default_factory=ApiKeys)  # none: the model routes are open
    engine: Engine | None = None
    checkpoint: CheckpointIdentity | None = None  # the engine's checkpoint, for /info: set by the lifespan
    started: bool = False  # engine started: model routes answer
    ready: bool = False  # warmed with a full-size batch: /ready says so
    stopping: bool = False  # shutdown began: new model requests get 503
    warmup_error: str | None = None  # the last failed warm-up's error, until one succeeds
    warmup_attempts: int = 0  # warm-ups tried so far
    warmup_failing_since: float | None = None  # `clock()` when the first warm-up failed, until one succeeds
    start_failure: str | None = None  # why the lifespan's start failed (a typed error), said in one line
    collector: CollectorState | None = None  # the garbage collector set for serving, after the warm-up
    drain_deadline: float | None = None  # time.monotonic() by which shutdown must be done
    drain_cut_short: bool = False  # the drain budget ran out: queued documents or uploads were failed 503
    extractor_pool: ExtractorPool | None = None
    body_readers: BodyReaders = field(default_factory=BodyReaders)  # requests whose bodies still come
    answers: PendingAnswers = field(default_factory=PendingAnswers)  # requests waiting for their work
    extract_threads: ThreadPoolExecutor | None = None
    _extract_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    _extract_jobs: int = 0  # extractions submitted and not finished (cancelled ones included)
    _extract_jobs_lock: threading.Lock = field(default_factory=threading.Lock)

    loop: asyncio.AbstractEventLoop | None = None  # the app's loop, set by the lifespan
    # What the probes measure ages with: `time.monotonic`, the engine's clock (tests move it on).
    clock: Callable[[], float] = time.monotonic
    _cutoff: asyncio.Task[None] | None = None
    _probe: PacedProbe = field(default_factory=PacedProbe)  # the backend's passes
    # Failed probe and check passes: said once a minute at most (one every PROBE_INTERVAL_S while the
    # backend stays broken), as the pools' failed probes are.
    _probe_failures: RecurringWarning = field(default_factory=lambda: RecurringWarning(logger))
    _stall_logged: bool = False  # /ready has logged a stalled pass and not yet its end
    # The preprocessing pools' readiness: refused tries, a stuck job, the code replaced on disk.
    preprocessing: PreprocessingReadiness = field(default_factory=PreprocessingReadiness)
    _pool_probe: PacedProbe = field(default_factory=PacedProbe)  # a page through the preprocessing pool
    # Failed probe pages: said once a minute at most (one every PROBE_INTERVAL_S while the fault lasts).
    _pool_probe_failures: RecurringWarning = field(default_factory=lambda: RecurringWarning(logger))
    _unhealthy_logged: bool = False  # /health has logged its 503 and not yet its end

    @property
    def code(self) -> CodeStamp:
        """The code as the server started with it (`PreprocessingReadiness.code`)."""
        return self.preprocessing.code

    @code.setter
    def code(self, stamp: CodeStamp) -> None:
        self.preprocessing.code = stamp

    def unready_reason(self) -> str | None:
        """Why /ready answers 503, or None: shutting down, not warmed yet, a model process being started
        again, failing passes, no preprocessing process starting, a stuck preprocessing job, a stalled
        pass.

        The same condition /ready answers by, without its side effects (it starts no probe and logs
        nothing), and cheap: a few attribute reads, a clock read, and a lock taken for the oldest
        preprocessing job. ConnectionLifetimeMiddleware asks it for every answer, and closes each
        connection while it holds: readiness only steers new connections, so a client already connected
        would otherwise keep sending to a pod that cannot answer. A healthy pod, however loaded, never
        meets it: its passes succeed and end well within the request timeout."""
        refused = self.not_serving()
        if refused is not None:
            return refused.message
        engine = self.engine
        assert engine is not None  # `not_serving` refuses without one
        outage = engine.outage
        preprocessing, now = self.preprocessing, self.clock()
        return (
            (outage.reason if outage else None)
            or self._failing_passes()
            or preprocessing.refusals(engine, self.settings, now)
            or preprocessing.stuck(engine, self.settings, now)
            or self.extraction_trouble()
            or self.stalled_pass()
        )

    def not_serving(self) -> HtmllmError | None:
        """The error /ready answers before it looks at the backend, or None: shutting down
        (`shutting_down`), or not warmed with a full-size batch yet (`not_ready`, with the last failed
        warm-up's error). /ready and `unready_reason` both start with it, so the two cannot drift apart."""
        if self.stopping:
            return HtmllmError("the server is shutting down", code=ErrorCode.SHUTTING_DOWN)
        if self.engine is None or not self.ready:
            detail = f": warm-up failed: {self.warmup_error}" if self.warmup_error else ""
            return HtmllmError(f"the model is not ready{detail}", code=ErrorCode.NOT_READY)
        return None

    def _failing_passes(self) -> str | None:
        """Why the backend is not to be trusted with traffic (`unready_after_failures` passes failed in a
        row), or None; no side effects."""
        if self.engine is None:
            return None
        health = self.engine.health
        if health.failures < self.settings.unready_after_failures:
            return None
        since = health.failing_since
        over = "" if since is None else f" over {self.clock() - since:.0f} s"
        return f"the last {health.failures} forward passes failed{over} ({health.last_error}); probing it"

    def backend_trouble(self) -> str | None:
        """Why the backend cannot be trusted with traffic: its model process is gone (`Engine.outage`:
        died, and a new one loads or failed to start), or `_failing_passes`. While passes fail, or no
        model process loads, a probe pass runs now and then (at most every PROBE_INTERVAL_S, one at a
        time) so that a server no traffic reaches sees the backend recover: for a model process, the
        probe's pass starts a new one, and its failures count towards `unhealthy`. None runs while a new
        one loads: its pass would only wait for the load, a pass that `unhealthy` would count as hung."""
        outage = self.engine.outage if self.engine is not None else None
        trouble = self._failing_passes()
        if (outage is not None and not outage.loading) or (trouble is not None and outage is None):
            self._start_probe()
        elif outage is None:
            self.check_failed_passes()
        return (outage.reason if outage else None) or trouble

    def preprocessing_trouble(self) -> str | None:
        """Why /ready answers 503 for the preprocessing pools (`PreprocessingReadiness.observe`: tries
        refused for want of a process, which a probe page then retries at most every PROBE_INTERVAL_S;
        a stuck job), or None."""
        if self.engine is None:
            return None
        return self.preprocessing.observe(
            self.engine, self.settings, self.clock(), self._start_pool_probe, PROBE_INTERVAL_S
        )

    def extraction_trouble(self, *, observe: bool = False) -> str | None:
        """Why /v1/extract's jobs are refused now for want of an extractor process that starts
        (`ExtractorPool.start_trouble`: tries in a row, the jobs refused together counted once), or None;
        `observe`: /ready's and /health's, which also probe (a run below the threshold too, to end it:
        `start_check_due`) and log it."""
        pool = self.extractor_pool
        if pool is None:
            return None
        check = pool.observe_start_trouble if observe else pool.start_trouble
        return check(self.settings.unready_after_failures, self.clock())

    def check_failed_passes(self) -> None:
        """Start a check pass (`Engine.probe(check=True)`) where passes failed, fewer than
        `unready_after_failures`, and none has run for PROBE_INTERVAL_S since the latest: its success
        ends their run, as a model process started anew ends it with its own pass. With the model in
        this process a failed pass on an idle pod had stayed counted until traffic came: /ready's count
        (the next failure, days later, adding to it) and `htmllm_backend_consecutive_failures`, whose
        alert paged for as long as the pod stayed idle. /ready and the /metrics scrape call it, so the
        count follows the clock of the probes and scrapes, not only the model's traffic. A check that
        fails counts, as a probe's failure does: an idle pod whose backend broke goes unready. Never
        during an outage (a model process dead or being started again): a pass then starts the process
        again, which `backend_trouble`'s probes do at /ready's pace, and a scrape had restarted a
        process that could not start every 5 s, logged as failed checks."""
        if self.engine is None or self.engine.outage is not None:
            return
        health = self.engine.health
        last = health.last_failed_at
        if not health.failures or last is None or health.pass_started is not None:
            return
        if health.failures >= self.settings.unready_after_failures:
            return  # `backend_trouble`'s probes, whose success ends the run for good
        if self.clock() - last >= PROBE_INTERVAL_S:
            self._start_probe(check=True)

    def check_refused_starts(self) -> None:
        """For the /metrics scrape: check a run of refused starts below /ready's threshold that has lasted
        PROBE_INTERVAL_S, for the preprocessing processes (a probe page) and the extractor processes (a
        probe job), as /ready does (`start_check_due`) and as `check_failed_passes` checks failed passes:
        its success ends the run, its refusal counts. Without it a pod that only Prometheus watches (no
        readiness probe) kept a refusal counted until a page or job came, blips days apart added up to
        "tries in a row" and `htmllm_ready` turned 0 on a sound pool; and a pool that broke on an idle
        pod never reached the threshold, `htmllm_ready` 1 throughout. Cheap, and paced as /ready's
        probes are (one at a time, at most every PROBE_INTERVAL_S). Past the threshold nothing here:
        the pod is unready, and its probes (and its traffic's tries) are /ready's, whose onset is logged
        there. Not before the warm-up succeeded nor once shutdown began, as the probes themselves."""
        engine = self.engine
        if engine is None or self.not_serving() is not None:
            return
        now, after = self.clock(), self.settings.unready_after_failures
        if start_check_due(engine.preprocessing_health, after, now, PROBE_INTERVAL_S):
            self._start_pool_probe()
        pool = self.extractor_pool
        if pool is not None and pool.start_trouble(after, now) is None:
            pool.observe_start_trouble(after, now)  # below the threshold: only its check, when due

    def stalled_pass(self) -> str | None:
        """Why the backend cannot answer in time although nothing failed, or None: one forward pass has
        run for `Settings.stalled_pass_s` (the request timeout by default). Each document in that pass
        was queued before it began, so its request has been answered 504 already; the pass serves no
        one, and every request routed here waits behind it. A slow but sound pass (a full-size batch on
        CPU takes seconds) stays far below the request timeout, or the requests time out anyway. It
        clears as soon as the pass ends; a pass that never does is left to `unhealthy`."""
        limit = self.settings.stalled_pass_s
        if self.engine is None or limit is None:
            return None
        started = self.engine.health.pass_started
        if started is None:
            return None
        running = self.clock() - started
        if running < limit:
            return None
        return f"a forward pass has run for {running:.0f} s (the limit is {limit:g} s)"

    def observe_stall(self) -> str | None:
        """`stalled_pass`, for /ready: the kubelet's event for a failed probe has no body, so the first
        probe to find a pass stalled logs a warning with the reason, and the first to find none after it
        an info. Once per episode, not per probe (every few seconds for as long as the pass hangs)."""
        stalled = self.stalled_pass()
        if stalled is not None and not self._stall_logged:
            self._stall_logged = True
            logger.warning("a forward pass has stalled, /ready answers 503 until it ends: %s", stalled)
        elif stalled is None and self._stall_logged:
            self._stall_logged = False
            logger.info("no forward pass is stalled any more: /ready no longer answers 503 for it")
        return stalled

    def warmup_failed(self, error: str) -> None:
        """Count a failed warm-up: /ready says why, and `unhealthy` how long it has been failing."""
        self.warmup_error = error
        if self.warmup_failing_since is None:
            self.warmup_failing_since = self.clock()

    def warmup_succeeded(self) -> None:
        """A warm-up went through: nothing failing any more (`warmup_failed`'s record cleared)."""
        self.warmup_error = None
        self.warmup_failing_since = None

    def unhealthy(self) -> str | None:
        """Why a liveness probe should restart the server, or None: every pass (probes included) has
        failed for `unhealthy_after_s` since the warm-up, one pass has run that long (a hung device),
        or the warm-up has failed that long (retried meanwhile: a backend that cannot run a full-size
        batch never gets ready, and a pod that is live but never ready holds its slot for good); and at
        once when the model process cannot be started again before the server is (`Outage.permanent`:
        the checkpoint changed under it), which no wait cures and a restart does (it loads the new
        checkpoint). It had waited `unhealthy_after_s` like a fault that may pass: minutes of a pod
        unready and live, each probe meanwhile spawning a child that loaded the whole model in vain.
        Likewise for the worker pools: no preprocessing or extractor process could start for
        `unhealthy_after_s` (probes included; `start_outage`, one rule for both), or a preprocessing job
        has been stuck that long (a thread cannot be stopped); at once where no process of either can
        start and the code on disk changed since the server started
        (`PreprocessingReadiness.restart_needed`). No side effects but probes: /health's log is
        `observe_health`'s."""
        limit = self.settings.unhealthy_after_s
        if self.engine is None or limit <= 0:
            return None
        outage = self.engine.outage
        if outage is not None and outage.permanent:
            return outage.reason
        now = self.clock()
        # The extractor pool's run, read once: whether it is refused and since when, read apart, can
        # disagree (a job taking a worker, or refused, between the two reads).
        pool = self.extractor_pool
        run = pool.start_health if pool is not None else StartHealth()
        extraction = self._extraction_refused(run, now)
        refused = self.preprocessing.refusals(self.engine, self.settings, now) or extraction
        restart = self.preprocessing.restart_needed(refused)
        if restart is not None:
            return restart
        health = self.engine.health
        if health.pass_started is not None and now - health.pass_started >= limit:
            return f"a forward pass has run for {now - health.pass_started:.0f} s"
        warming = self.warmup_failing_since
        if not self.ready and warming is not None and now - warming >= limit:
            tries = f"{self.warmup_attempts} attempts; {self.warmup_error}"
            return f"the warm-up has failed for {now - warming:.0f} s ({tries})"
        if not self.ready and not self.stopping:
            # The warm-up loop is in charge: its full-size retries exercise the backend, and their
            # failures (above) say how long it has failed; failed passes and probes are for after it.
            return None
        since = health.failing_since
        if since is not None and self.backend_trouble() is not None and now - since >= limit:
            failed = f"{health.failures} in a row; {health.last_error}"
            return f"every forward pass has failed for {now - since:.0f} s ({failed})"
        # /ready's side effects: a probe page or job while refused, the log.
        self.preprocessing_trouble()
        self.extraction_trouble(observe=True)
        pools = self.preprocessing.unhealthy(self.engine, self.settings, now, limit)
        return pools or start_outage(run, extraction is not None, now, limit, "extractor process")

    def _extraction_refused(self, run: StartHealth, now: float) -> str | None:
        """`ExtractorPool.start_trouble` of the extractor pool's `run`, read by the caller (once), or None:
        no pool, or one closed (it refuses on purpose)."""
        pool = self.extractor_pool
        if pool is None:
            return None
        return pool.start_trouble(self.settings.unready_after_failures, now, run)

    def observe_health(self) -> str | None:
        """`unhealthy`, for /health: its turn to 503 is logged once, as an error with the reason ("a restart
        is needed"), and its end once, so that a liveness restart leaves its reason in the log (the
        kubelet's event for a failed probe has no body); only the code replaced on disk had been logged."""
        reason = self.unhealthy()
        if reason is not None and not self._unhealthy_logged:
            self._unhealthy_logged = True
            logger.error("a restart is needed, /health answers 503 until then: %s", reason)
        elif reason is None and self._unhealthy_logged:
            self._unhealthy_logged = False
            logger.info("/health answers 200 again: no restart is needed any more")
        return reason

    def _start_probe(self, *, check: bool = False) -> None:
        # Not before the warm-up succeeded: its retries already exercise the backend, and a probe's
        # three-token success would only end the failure count they keep.
        engine = self.engine
        if engine is None or self.stopping or not self.started or not self.ready:
            return
        self._probe.start(lambda: self._run_probe(engine, check))

    async def _run_probe(self, engine: Engine, check: bool) -> None:
        kind = "check" if check else "probe"
        try:
            await engine.probe(check=check)
        except Exception as exc:  # its outcome is in engine.health; the log says why
            # Once a minute at most: the onset and the end of the fault /ready says once each
            # (`backend_trouble`'s reason), and the count is the gauge's.
            self._probe_failures.log(time.monotonic(), "backend %s failed: %s", kind, exc)
        else:
            self._probe_failures.reset()
            logger.info("backend %s succeeded: the backend serves again", kind)

    def _start_pool_probe(self) -> None:
        """A probe page through the preprocessing processes (`Engine.probe_preprocessing`), as
        `_start_probe` starts a pass: after the warm-up, one at a time, at most every PROBE_INTERVAL_S."""
        engine = self.engine
        if engine is None or self.stopping or not self.started or not self.ready:
            return
        self._pool_probe.start(lambda: self._run_pool_probe(engine))

    async def _run_pool_probe(self, engine: Engine) -> None:
        try:
            await engine.probe_preprocessing()
        except Exception as exc:  # its outcome is in engine.preprocessing_health; the log says why
            # Once a minute at most: one every PROBE_INTERVAL_S while the fault lasts, whose onset and
            # end `PreprocessingReadiness.observe` logs once each.
            self._pool_probe_failures.log(time.monotonic(), "preprocessing probe failed: %s", exc)
        else:
            self._pool_probe_failures.reset()
            logger.info("preprocessing probe succeeded: a preprocessing process started")

    async def cancel_probe(self) -> None:
        for probe in (self._probe, self._pool_probe):
            await probe.cancel()

    def begin_shutdown(self) -> None:
        """Start the drain clock (on the first SIGTERM), so the whole shutdown fits in one drain timeout.

        Called from a signal handler: it only records the deadline and hands the rest to the loop.
        """
        if self.drain_deadline is not None:
            return
        self.drain_deadline = time.monotonic() + self.settings.drain_timeout_s
        if self.loop is not None and not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self._arm_cutoff)

    def _arm_cutoff(self) -> None:
        self._cutoff = asyncio.ensure_future(self._cut_off())

    async def _cut_off(self) -> None:
        """Shortly before the drain budget ends, fail what is still queued with a typed 503, and half the
        margin later answer 503 every request still waiting (`PendingAnswers`), so every accepted request
        is answered before the server has to drop connections."""
        margin = min(1.0, 0.1 * self.settings.drain_timeout_s)
        await asyncio.sleep(max(0.0, self.drain_time_left() - margin))
        # What the stop below cannot fail in time is answered halfway through the margin, so that the
        # answer is out before uvicorn cancels the request.
        late = asyncio.get_running_loop().call_later(margin / 2, self._answer_the_rest)
        try:
            await self._fail_what_is_left()
        except asyncio.CancelledError:  # the lifespan's: every request has been answered by then
            late.cancel()
            raise

    async def _fail_what_is_left(self) -> None:
        waiting = self.body_readers.cut_off()
        if waiting:
            logger.warning("drain budget spent: answering %d requests whose bodies are still coming", waiting)
            self.drain_cut_short = True
        # The extractions first: the engine's stop below returns only once the forward pass in flight has
        # ended (seconds for a large batch on CPU, past the margin), and extractions stopped after it had
        # been answered by `_answer_the_rest`, a whole-request 503, instead of their entries' errors.
        if self.extractor_pool is not None and self.extraction_backlog:
            # Running jobs' workers are killed and queued jobs find the pool closed: each ends as a
            # typed per-extractor error in its request's answer, not as a request dropped at exit.
            logger.warning("drain budget spent: stopping %d extraction jobs", self.extraction_backlog)
            self.stopping = True
            self.drain_cut_short = True
            self.extractor_pool.close()
        if self.engine is not None and self.engine.queue_size:
            logger.warning("drain budget spent: failing %d queued documents", self.engine.queue_size)
            self.stopping = True
            self.drain_cut_short = True
            await self.engine.stop(drain=False)

    def _answer_the_rest(self) -> None:
        unanswered = self.answers.cut_off()
        if unanswered:
            logger.warning(
                "drain budget spent: answering %d requests still waiting for their documents", unanswered
            )
            self.stopping = True
            self.drain_cut_short = True

    async def cancel_cutoff(self) -> None:
        if self._cutoff is not None:
            self._cutoff.cancel()
            await asyncio.gather(self._cutoff, return_exceptions=True)

    def drain_time_left(self) -> float:
        """Seconds left to drain the engine: what the signal's clock leaves, or the full timeout."""
        if self.drain_deadline is None:
            return self.settings.drain_timeout_s
        return max(0.0, self.drain_deadline - time.monotonic())

    async def extraction(self) -> tuple[ExtractorPool, ThreadPoolExecutor]:
        """The extractor process pool and the threads that wait on it, started on first use."""
        async with self._extract_lock:
            if self.extractor_pool is None or self.extract_threads is None:
                from service.core.extract import ExtractorPool
                from service.core.extract.pool import POOL_NAME
                from service.core.workers import mib_as_bytes

                workers = self.settings.extract_workers
                limit = mib_as_bytes(self.settings.extract_memory_limit_mb)
                replaced = functools.partial(self.metrics.worker_replaced, POOL_NAME)
                self.extractor_pool = ExtractorPool(workers, memory_limit_bytes=limit, on_replaced=replaced)
                self.extract_threads = ExtractionThreads(self.extractor_pool, workers)
            return self.extractor_pool, self.extract_threads

    def admit_extraction(self, jobs: int) -> None:
        """Bound the extraction backlog as the engine bounds its queue: 429 beyond it, at once."""
        limit = self.settings.max_queue_documents
        if jobs > limit:  # never fits, however long the client waits: not a 429 to retry
            raise HtmllmError(
                f"the request needs {jobs} extraction jobs (documents x extractors); the extraction "
                f"queue holds {limit} (HTMLLM_MAX_QUEUE_DOCUMENTS): send fewer documents or extractors",
                code=ErrorCode.TOO_MANY_DOCUMENTS,
            )
        with self._extract_jobs_lock:
            if self._extract_jobs + jobs > limit:
                raise HtmllmError(
                    f"the extraction queue is full ({self._extract_jobs} of {limit} jobs)",
                    code=ErrorCode.OVERLOADED,
                )
            self._extract_jobs += jobs

    def extraction_done(self, _: Future[Any]) -> None:
        """A job ended (done, failed or cancelled before it ran); runs on whichever thread ended it."""
        with self._extract_jobs_lock:
            self._extract_jobs -= 1

    def checkpoint_header(self) -> dict[str, str]:
        """`CHECKPOINT_HEADER` for a model route's answer (set by the lifespan before any is served)."""
        assert self.checkpoint is not None  # read by the lifespan before the engine is in place
        return self.checkpoint.header()

    @property
    def extraction_backlog(self) -> int:
        with self._extract_jobs_lock:
            return self._extract_jobs

    def close_extraction(self) -> None:
        if self.extract_threads is not None:
            self.extract_threads.shutdown(wait=False, cancel_futures=True)
        if self.extractor_pool is not None:
            self.extractor_pool.close()


async def get_runtime(request: Request) -> Runtime:
    """The app's runtime. `async` although it never awaits: FastAPI runs a plain `def` dependency on a
    thread-pool worker, which for these two cost every request two thread hops and their GIL hand-offs
    on the event loop (9% of the loop's samples under load, `benchmarks/service.py`)."""
    runtime: Runtime = request.app.state.runtime
    return runtime


RuntimeDep = Annotated[Runtime, Depends(get_runtime)]


async def get_engine(runtime: RuntimeDep) -> Engine:
    """The engine, for routes that need the model; 503 before it started or once shutdown began.

    `async` for the reason `get_runtime` gives.
    """
    if runtime.stopping:
        raise HtmllmError("the server is shutting down", code=ErrorCode.SHUTTING_DOWN)
    if runtime.engine is None or not runtime.started:
        raise HtmllmError("the model is not loaded yet", code=ErrorCode.NOT_READY)
    return runtime.engine


EngineDep = Annotated[Engine, Depends(get_engine)]


def _pending_answers(request: Request) -> PendingAnswers | None:
    """The shutdown's hold on the requests of the app that serves `request`; None for a request that no
    app's runtime serves (one built by hand), which only its work, disconnect and timeout end."""
    runtime = getattr(getattr(request.scope.get("app"), "state", None), "runtime", None)
    return runtime.answers if isinstance(runtime, Runtime) else None


async def _wait_for_disconnect(receive: Receive) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


async def answer_or_cancel(request: Request, work: Awaitable[T], *, timeout_s: float) -> T:
    """Await `work` unless the client disconnects (cancel it: its queued documents are skipped),
    `timeout_s` passes (cancel it and answer 504) or the drain budget is all but spent (cancel it and
    answer 503 `shutting_down`: `PendingAnswers`).

    The body has been read by then, so the only message left on `receive` is the disconnect.
    """
    answers = _pending_answers(request)
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_wait_for_disconnect(request.receive))
    due = answers.due() if answers is not None else None
    waits: set[asyncio.Future[Any]] = {task, watcher} if due is None else {task, watcher, due}
    if answers is not None:
        answers.waiting += 1
    try:
        try:
            done, _ = await asyncio.wait(waits, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if answers is not None:
                answers.waiting -= 1
            watcher.cancel()
            if not task.done():
                task.cancel()
        answered, disconnected = task in done, watcher in done
        cut_off = due in done and not answered and not disconnected
        del done, _
        if answered:
            if task.cancelled():  # not by us: the engine shut down under it
                raise HtmllmError(
                    "the server shut down before the request was answered", code=ErrorCode.SHUTTING_DOWN
                )
            return task.result()
        # The engine may be mid-way through our documents; wait for the cancellation to settle so
        # nothing of this request outlives it.
        await asyncio.gather(task, return_exceptions=True)
        if disconnected:
            raise ClientDisconnectedError("client disconnected")
        if cut_off:
            raise HtmllmError(
                "the server shut down before the request was answered", code=ErrorCode.SHUTTING_DOWN
            )
        raise HtmllmError(f"the request took longer than {timeout_s:g} s", code=ErrorCode.TIMEOUT)
    finally:
        # The task keeps the work's error, whose traceback keeps this frame: while the frame still
        # names the task (or the set `wait` put it in) that is a cycle, which kept every failed
        # request's pages until a full collection, one a serving process all but never runs
        # (service.engine.collector).
        del task, watcher, waits
