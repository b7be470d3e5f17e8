"""Run extractors in killable worker processes (`service.core.workers`), so a per-extractor time
limit really bounds time and a crash in an extractor's C code fails one page, not the service.

Workers are forked from a forkserver that has already imported the extractor libraries, so replacing a
killed worker costs tens of milliseconds, not the second it takes to import trafilatura. A worker killed
from outside while it holds a page (the kernel's OOM killer, `kill -9`) says nothing of the page or the
extractor: the page is run again in a fresh worker (`LOST_WORKER_RETRIES`), then `ExtractorLostError`.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from multiprocessing.context import BaseContext
from typing import Final, Protocol

from service.core.cpus import cpu_budget
from service.core.errors import ErrorCode, HtmllmError
from service.core.extract.extractors import RawOutput, run_extractor
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

    def run(self, name: str, html: str, *, language: str | None, timeout_s: float | None) -> RawOutput:
        try:
            output: RawOutput = self.call(run_extractor, (name, html, language), timeout_s=timeout_s)
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
