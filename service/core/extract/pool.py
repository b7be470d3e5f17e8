"""Run extractors in killable worker processes, so a per-extractor time limit really bounds time.

A thread stuck in lxml or in resiliparse's C code cannot be stopped, and a crash there (a segfault)
would take the whole service down. So each extraction runs in a long-lived worker process that takes
one job at a time over a pipe; the caller waits at most `timeout_s` for the answer and, past it, kills
the worker and reports `ExtractionTimeoutError`. A dead worker is replaced on the next call.

The fast path stays fast: workers are started once and reused (a job costs one pipe round trip of the
page text, about 1.5 ms per corpus page on the benchmark machine), and on Linux they are forked from a
forkserver that has already imported the extractor libraries, so replacing a killed worker costs tens
of milliseconds, not the second it takes to import trafilatura. Workers announce readiness only after
importing the libraries, and the time limit starts when the job is sent, so start-up never counts
against an extraction.
"""

from __future__ import annotations

import signal
import threading
import time
from multiprocessing.connection import Connection
from multiprocessing.context import BaseContext
from multiprocessing.process import BaseProcess
from typing import Any, Final, Protocol

from service.core.cpus import cpu_budget
from service.core.errors import ErrorCode, HtmllmError
from service.core.extract.extractors import RawOutput, run_extractor
from service.core.processes import worker_context

STARTUP_TIMEOUT_S: Final = 120.0
_PRELOAD: Final = (
    "service.core.extract.extractors",
    "resiliparse.extract.html2text",
    "resiliparse.parse.lang",
    "justext",
    "trafilatura",
)


def default_workers() -> int:
    """One extractor process per CPU this process may use (its container's CPU limit counts), up to 4."""
    return max(1, min(4, cpu_budget().threads))


class ExtractionError(HtmllmError):
    """An extractor failed on a page (raised, crashed, or the options were unusable)."""

    code = ErrorCode.EXTRACTION_FAILED


class ExtractionTimeoutError(ExtractionError):
    """An extractor ran past its time limit and its worker was killed."""


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


def _worker_main(conn: Connection) -> None:
    """A worker's loop: import the extractors, say ready, then answer (name, html, language) jobs."""
    # Ctrl-C reaches the whole process group; the parent decides when workers stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for module in _PRELOAD:
        __import__(module)
    conn.send(("ready",))
    while True:
        try:
            job = conn.recv()
        except (EOFError, OSError):
            return
        if job is None:
            return
        name, html, language = job
        try:
            out = run_extractor(name, html, language)
        except Exception as exc:
            conn.send(("error", type(exc).__name__, str(exc)[:500]))
        else:
            conn.send(("ok", out.text, out.language))


class _Worker:
    """One worker process and the parent's end of its pipe."""

    def __init__(self, ctx: BaseContext) -> None:
        self._kill_lock = threading.Lock()
        parent, child = ctx.Pipe(duplex=True)
        process: BaseProcess = ctx.Process(  # type: ignore[attr-defined]
            target=_worker_main, args=(child,), name="htmllm-extract", daemon=True
        )
        process.start()
        child.close()
        self.process = process
        self.conn = parent
        if not parent.poll(STARTUP_TIMEOUT_S):
            self.kill()
            raise ExtractionError(f"extractor worker did not start within {STARTUP_TIMEOUT_S:.0f} s")
        try:
            parent.recv()
        except (EOFError, OSError) as exc:
            code = self.kill()
            raise ExtractionError(f"extractor worker died while starting (exit code {code})") from exc

    def kill(self) -> int | None:
        """Stop the process now and reap it; returns its exit code. Safe from two threads at once (the
        pool's `close` and the job's own thread, which sees the pipe break)."""
        with self._kill_lock:
            if self.process.is_alive():
                self.process.kill()
            self.process.join(5.0)
            if not self.conn.closed:
                self.conn.close()
            return self.process.exitcode


class ExtractorPool:
    """Up to `workers` extractor processes shared by any number of calling threads.

    A caller takes an idle worker (or starts one, or waits for one), sends the job and waits at most
    `timeout_s`. A worker that timed out or crashed is killed and not reused.
    """

    def __init__(self, workers: int | None = None, *, context: BaseContext | None = None) -> None:
        workers = default_workers() if workers is None else workers
        if workers < 1:
            raise ValueError(f"an extractor pool needs at least one worker, got {workers}")
        self.workers = workers
        self._ctx = context or worker_context(_PRELOAD)
        self._cond = threading.Condition()
        self._idle: list[_Worker] = []
        self._busy: set[_Worker] = set()  # for `close`, which stops them too
        self._live = 0
        self._closed = False

    def _acquire(self) -> _Worker:
        with self._cond:
            while True:
                if self._closed:
                    raise ExtractionError("the extractor pool is closed")
                if self._idle:
                    worker = self._idle.pop()
                    if not worker.process.is_alive():
                        # Killed while idle (the OOM killer, an operator): the page about to be sent
                        # did not do it, so it must not fail as "crashed its worker". Reap and replace.
                        self._live -= 1
                        worker.kill()
                        continue
                    self._busy.add(worker)
                    return worker
                if self._live < self.workers:
                    self._live += 1
                    break
                self._cond.wait()
        try:
            worker = _Worker(self._ctx)
        except BaseException:
            with self._cond:
                self._live -= 1
                self._cond.notify()
            raise
        with self._cond:
            self._busy.add(worker)
            closed = self._closed
        if closed:  # closed while it started: `close` did not see it
            worker.kill()
        return worker

    def _release(self, worker: _Worker, *, healthy: bool) -> None:
        with self._cond:
            self._busy.discard(worker)
            keep = healthy and not self._closed
            if keep:
                self._idle.append(worker)
            else:
                self._live -= 1
            self._cond.notify()
        if not keep:
            worker.kill()

    def run(self, name: str, html: str, *, language: str | None, timeout_s: float | None) -> RawOutput:
        worker = self._acquire()
        healthy = False
        try:
            reply = self._exchange(worker, name, html, language, timeout_s)
            healthy = True
        finally:
            self._release(worker, healthy=healthy)
        if reply[0] == "ok":
            return RawOutput(reply[1], reply[2])
        raise ExtractionError(f"{name} failed: {reply[1]}: {reply[2]}")

    def _exchange(
        self, worker: _Worker, name: str, html: str, language: str | None, timeout_s: float | None
    ) -> tuple[Any, ...]:
        started = time.perf_counter()
        if timeout_s is not None and timeout_s >= threading.TIMEOUT_MAX:
            # `poll` cannot wait that long (inf, 1e12: OverflowError); nor would anyone: no bound.
            timeout_s = None
        try:
            worker.conn.send((name, html, language))
            ready = worker.conn.poll(timeout_s)
        except (BrokenPipeError, EOFError, OSError) as exc:
            code = worker.kill()
            raise ExtractionError(f"{name}: extractor worker died (exit code {code})") from exc
        if not ready:
            worker.kill()
            elapsed = time.perf_counter() - started
            raise ExtractionTimeoutError(f"{name} ran past its {timeout_s} s limit ({elapsed:.2f} s); killed")
        try:
            reply: tuple[Any, ...] = worker.conn.recv()
        except (EOFError, OSError) as exc:
            code = worker.kill()
            raise ExtractionError(f"{name} crashed its worker (exit code {code})") from exc
        return reply

    @property
    def live_workers(self) -> int:
        """Worker processes currently started (idle or busy)."""
        with self._cond:
            return self._live

    def close(self) -> None:
        """Stop every worker now: idle ones, and busy ones, whose jobs then fail with `ExtractionError`.

        A busy worker left to finish outlived a server's shutdown (a pathological page keeps one at
        100% CPU for its whole time limit, or longer once its parent is gone)."""
        with self._cond:
            self._closed = True
            idle, self._idle = self._idle, []
            busy = list(self._busy)
            self._live -= len(idle)
            self._cond.notify_all()
        for worker in [*idle, *busy]:
            worker.kill()

    def __enter__(self) -> ExtractorPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_default_pool: ExtractorPool | None = None
_default_lock = threading.Lock()


def default_pool() -> ExtractorPool:
    """The process-wide pool `extract` uses when given none, started on first use (never at import)."""
    global _default_pool
    with _default_lock:
        if _default_pool is None:
            _default_pool = ExtractorPool()
        return _default_pool
