"""Run extractors in killable worker processes (`service.core.workers`), so a per-extractor time
limit really bounds time and a crash in an extractor's C code fails one page, not the service.

Workers are forked from a forkserver that has already imported the extractor libraries, so replacing a
killed worker costs tens of milliseconds, not the second it takes to import trafilatura. A worker killed
from outside while it holds a page (the kernel's OOM killer, `kill -9`) says nothing of the page or the
extractor: the page is run again in a fresh worker (`LOST_WORKER_RETRIES`), then `ExtractorLostError`.

Tries in a row refused because no worker could start are counted (`ExtractorPool.start_health`, the jobs
refused together once: `StartRefusals`), so that a server can stop taking traffic while they are
(`start_trouble`); a probe job now and then tells it when one starts again.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable
from contextvars import ContextVar
from multiprocessing.context import BaseContext
from typing import Any, Final, Protocol, TypeVar

from service.core.cpus import cpu_budget
from service.core.errors import ErrorCode, HtmllmError
from service.core.extract.extractors import RawOutput, run_extractor
from service.core.worker_health import (
    RecurringWarning,
    StartHealth,
    StartRefusals,
    start_check_due,
    start_trouble,
)
from service.core.workers import (
    JobError,
    WorkerDiedError,
    WorkerError,
    WorkerLostError,
    WorkerPool,
    WorkerStartError,
    WorkerTimeoutError,
)

_PRELOAD: Final = (
    "service.core.extract.extractors",
    "resiliparse.extract.html2text",
    "resiliparse.parse.lang",
    "justext",
    "trafilatura",
)
# The pool's name: in its workers' warnings ("the extractor worker ... died") and the `pool` label the
# service counts their replacements under (`htmllm_worker_replacements_total`).
POOL_NAME: Final = "extractor"
# A page whose extractor process was killed from outside is tried again in a fresh process this many
# times before `ExtractorLostError`, as served preprocessing does (`LOST_PROCESS_RETRIES`): one OOM kill
# under a burst of big pages should neither fail a request nor change which extractor the union picks.
LOST_WORKER_RETRIES: Final = 2
# How an extractor's process ends when an allocation fails in native code: Rust aborts (resiliparse),
# and C code that does not check for NULL segfaults.
_OUT_OF_MEMORY_EXITS: Final = frozenset({-signal.SIGABRT, -signal.SIGSEGV})
# The least time between two probe jobs of a pool whose workers cannot start (`observe_start_trouble`):
# readiness probes ask often, and each try costs a fork (the interval of the server's own probes). Also
# how long a run of refusals below the threshold lasts before a probe job checks it (`start_check_due`).
PROBE_INTERVAL_S = 5.0
_PROBE_TIMEOUT_S: Final = 10.0  # a probe job does nothing: what it waits for is the worker's start

logger = logging.getLogger(__name__)

T = TypeVar("T")

# The refusals a job running on this thread may count with (`ExtractorPool.submitted`): the pool's count
# and its ticket as the job was submitted.
_SUBMITTED: ContextVar[tuple[StartRefusals, int] | None] = ContextVar("htmllm_submitted", default=None)


def default_workers() -> int:
    """One extractor process per CPU this process may use (its container's CPU limit counts), up to 4."""
    return max(1, min(4, cpu_budget().threads))


class ExtractionError(HtmllmError):
    """An extractor failed on a page (raised, crashed, or the options were unusable)."""

    code = ErrorCode.EXTRACTION_FAILED


class ExtractionTimeoutError(ExtractionError):
    """An extractor ran past its time limit and its worker was killed."""


class ExtractorLostError(HtmllmError):
    """The extractor process that held a page was killed from outside (the kernel's OOM killer, `kill -9`)
    in each of its tries: the server's trouble, not the page's nor the extractor's, so `not_ready` (503
    with Retry-After; `htmllm extract` leaves the page for the next run) and no `ExtractionError`. As
    one, the union had gone on to the next extractor (the page's text then depended on a kill) and
    `htmllm extract` had written a permanent `extraction_failed` row that no resume redid. So is an
    extractor process that could not be started (its forkserver's socket removed by a /tmp clean-up), or
    that ran past its time limit hardly on the CPU (stopped, starved: `WorkerTimeoutError.stalled`), where
    both had been the page's `extraction_failed`."""

    code = ErrorCode.NOT_READY


def _probe_job() -> None:
    """What a probe sends a worker: nothing to do; that a worker started to take it is the answer."""


class Runner(Protocol):
    """Runs one named extractor on decoded HTML, within `timeout_s` seconds when one is given."""

    def run(self, name: str, html: str, *, language: str | None, timeout_s: float | None) -> RawOutput: ...


class InlineRunner:
    """Runs extractors in the calling process: no isolation and NO time bound.

    For trusted input only, where the pipe round trip matters: benchmarks measure it against the
    isolated path, and tests use it to pin extractor behaviour quickly.
    """

    def run(self, name: str, html: str, *, language: str | None, timeout_s: float | None) -> RawOutput:
        try:
            return run_extractor(name, html, language)
        except Exception as exc:
            raise ExtractionError(f"{name} failed: {type(exc).__name__}: {exc}") from exc


class ExtractorPool(WorkerPool):
    """Up to `workers` extractor processes shared by any number of calling threads.

    A caller takes an idle worker (or starts one, or waits for one), sends the job and waits at most
    `timeout_s`. A worker that timed out or crashed is killed and not reused; one killed from outside
    under a job is replaced and the job run again (`LOST_WORKER_RETRIES`). `on_replaced`: as
    `WorkerPool` takes it, told why each worker was lost or replaced.
    """

    def __init__(
        self,
        workers: int | None = None,
        *,
        memory_limit_bytes: int | None = None,
        context: BaseContext | None = None,
        on_replaced: Callable[[str], object] | None = None,
    ) -> None:
        super().__init__(
            default_workers() if workers is None else workers,
            name=POOL_NAME,
            preload=_PRELOAD,
            memory_limit_bytes=memory_limit_bytes,
            context=context,
            lost_worker_retries=LOST_WORKER_RETRIES,
            on_replaced=on_replaced,
        )
        self._starts = StartRefusals()  # the tries refused for want of a worker (`start_health`)
        self._health_lock = threading.Lock()
        self._probe: threading.Thread | None = None  # the latest probe job's thread
        self._probe_started: float | None = None  # when it started (`time.monotonic()`)
        self._trouble_logged = False  # the refusals have been logged, their end not yet
        self._probe_failures = RecurringWarning(logger)  # failed probes: said once a minute at most

    @property
    def start_health(self) -> StartHealth:
        """How starting the workers has gone lately (`StartHealth`): tries in a row refused for want of
        one, the jobs refused together counted once."""
        return self._starts.health

    def submitted(self, job: Callable[[], T]) -> Callable[[], T]:
        """`job`, bound to the refusals counted as it is submitted (now): run later, on any thread, each
        of its calls that no worker can start for counts only if none was counted since (`StartRefusals`).
        What a server's extraction threads wrap each job in as they take it: one request's jobs wait
        for a thread and start one after another, and each had counted a try of its own."""
        ticket = (self._starts, self._starts.ticket())

        def bound() -> T:
            token = _SUBMITTED.set(ticket)
            try:
                return job()
            finally:
                _SUBMITTED.reset(token)

        return bound

    def run(self, name: str, html: str, *, language: str | None, timeout_s: float | None) -> RawOutput:
        try:
            output: RawOutput = self._counted_call(run_extractor, (name, html, language), timeout_s)
        except WorkerTimeoutError as exc:
            if exc.stalled:  # stopped or starved, hardly on the CPU: the server's trouble, not the page's
                raise ExtractorLostError(
                    f"{name} did not run on this page: {exc.message}; try it again later"
                ) from exc
            raise ExtractionTimeoutError(f"{name} {exc.message}") from exc
        except JobError as exc:
            hint = self._memory_hint(exc.type_name, exc.message)
            raise ExtractionError(f"{name} failed: {exc.message}{hint}") from exc
        except WorkerLostError as exc:  # before WorkerError, its base: not the extractor's failure
            raise ExtractorLostError(
                f"{name} did not run on this page: {exc.message}; try it again later"
            ) from exc
        except WorkerStartError as exc:  # (a forkserver gone with /tmp's clean-up: the server's trouble)
            raise ExtractorLostError(
                f"{name} did not run on this page: {exc.message}; try it again later"
            ) from exc
        except WorkerDiedError as exc:
            hint = self._memory_hint("", "", exit_code=exc.exit_code)
            raise ExtractionError(f"{name}: {exc.message}{hint}") from exc
        except WorkerError as exc:
            raise ExtractionError(f"{name}: {exc.message}") from exc
        except Exception as exc:
            message = str(exc)[:500]
            hint = self._memory_hint(type(exc).__name__, message, module=type(exc).__module__)
            raise ExtractionError(f"{name} failed: {type(exc).__name__}: {message}{hint}") from exc
        return output

    def _counted_call(
        self, function: Callable[..., object], args: tuple[object, ...], timeout_s: float | None
    ) -> Any:
        """`call`, its start counted in `start_health`: a `WorkerStartError` adds a refusal (unless one was
        counted since the job was submitted: `submitted`, else since this call), a job that a worker took
        (answered, failed, timed out or died with) ends the run. A closed pool counts for neither: it
        refuses on purpose."""
        bound = _SUBMITTED.get()
        ticket = bound[1] if bound is not None and bound[0] is self._starts else self._starts.ticket()
        try:
            result = self.call(function, args, timeout_s=timeout_s)
        except WorkerStartError as exc:
            self._starts.refused(exc.message, ticket, time.monotonic())
            raise
        except (JobError, WorkerTimeoutError, WorkerDiedError):
            self._started()
            raise
        self._started()
        return result

    def _started(self) -> None:
        """A worker took a job: the workers start again (said once, where their trouble was said)."""
        if not self._starts.started():
            return
        with self._health_lock:
            logged, self._trouble_logged = self._trouble_logged, False
        if logged:
            logger.info("%s processes start again", self.name)

    def start_trouble(
        self, after_failures: int, now: float | None = None, run: StartHealth | None = None
    ) -> str | None:
        """Why extraction jobs are refused now (`after_failures` tries in a row, at least one, for want of
        a worker that starts: `worker_health.start_trouble`, the rule the preprocessing pool's readiness
        follows too), or None; no side effects, cheap (attribute reads): what a server's readiness and
        every answer's connection rule ask. `now`: `time.monotonic()` unless given (a clock of the
        caller's, which moves with the one `failing_since` was read on); `run`: `start_health` as the
        caller read it already (one read, so that its other uses of it agree), else read now."""
        if self._closed:
            return None
        at = time.monotonic() if now is None else now
        health = self.start_health if run is None else run
        workers = f"{self.name} process"
        return start_trouble(health, after_failures, at, workers=workers, jobs="extraction jobs")

    def observe_start_trouble(self, after_failures: int, now: float | None = None) -> str | None:
        """`start_trouble`, for a readiness probe: while it holds, a probe job goes to a worker now and
        then (one at a time, at most every `PROBE_INTERVAL_S`, on a thread of its own), so that a server
        that no extraction reaches any more (it is out of rotation for this) sees a worker start again;
        its onset is logged once, and its end (`_started`). Without the probe, a pool whose starts
        failed once stayed in trouble for good: nothing but a request would have tried again. A run below
        the threshold that has lasted `PROBE_INTERVAL_S` is checked by a probe job too
        (`start_check_due`): its success ends the run, its refusal counts."""
        if self._closed:
            return None
        at = time.monotonic() if now is None else now
        trouble = self.start_trouble(after_failures, at)
        if trouble is None and not start_check_due(self.start_health, after_failures, at, PROBE_INTERVAL_S):
            return None
        with self._health_lock:
            logged = self._trouble_logged
            self._trouble_logged = logged or trouble is not None
            probing = self._probe is not None and self._probe.is_alive()
            started = time.monotonic()
            due = self._probe_started is None or started - self._probe_started >= PROBE_INTERVAL_S
            if not probing and due:
                self._probe_started = started
                self._probe = threading.Thread(
                    target=self._run_probe, name=f"htmllm-{self.name}-probe", daemon=True
                )
                self._probe.start()
        if trouble is not None and not logged:
            logger.warning(
                "extraction jobs are refused until one of the %s processes starts again: %s",
                self.name,
                trouble,
            )
        return trouble

    def _run_probe(self) -> None:
        """A probe job (`observe_start_trouble`'s thread); its outcome is in `start_health`. A failure is
        said once a minute at most (a probe runs every few seconds while the fault lasts; its onset and
        its end are logged once each), a success each time (once per fault)."""
        try:
            self._counted_call(_probe_job, (), _PROBE_TIMEOUT_S)
        except Exception as exc:  # its outcome is counted; the log says why
            message = exc.message if isinstance(exc, HtmllmError) else f"{type(exc).__name__}: {exc}"
            self._probe_failures.log(time.monotonic(), "%s probe failed: %s", self.name, message)
        else:
            self._probe_failures.reset()
            logger.info("%s probe succeeded: one of its processes started", self.name)

    def _memory_hint(
        self, type_name: str, message: str, *, module: str = "", exit_code: int | None = None
    ) -> str:
        """What to add to a failure's message when it is what an extractor does past the workers' memory
        limit (`memory_limit_bytes`), or "": the error itself rarely says so.

        Measured past a 200 MiB limit on pages of 14-15 MB: trafilatura raised `MemoryError` (with no
        message) or lxml's `XPathEvalError: unknown error`, and resiliparse (also jusText's language
        detection) aborted in Rust ("memory allocation of 9437184 bytes failed": exit code -6). A
        failure of that kind without a limit, or any other with one, is left as it is.
        """
        if self.memory_limit_bytes is None:
            return ""
        out_of_memory = (
            type_name == "MemoryError"
            or exit_code in _OUT_OF_MEMORY_EXITS
            or (module.startswith("lxml") and (message == "unknown error" or "memory" in message.lower()))
        )
        if not out_of_memory:
            return ""
        return (
            f" (likely the extractor processes' memory limit, {self.memory_limit_bytes / 2**20:g} MiB: the "
            "page needs more)"
        )


_default_pool: ExtractorPool | None = None
_default_lock = threading.Lock()


def default_pool() -> ExtractorPool:
    """The process-wide pool `extract` uses when given none, started on first use (never at import)."""
    global _default_pool
    with _default_lock:
        if _default_pool is None:
            _default_pool = ExtractorPool()
        return _default_pool
