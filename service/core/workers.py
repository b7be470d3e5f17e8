"""Killable worker processes: one job at a time each, a time limit per job, a memory limit per worker.

A thread stuck in C code (lxml, resiliparse, the pruner's HTML parser) cannot be stopped, a segfault
there would take the whole service down, and a parse that allocates gigabytes takes the pod with it.
So CPU-heavy work on untrusted pages (text extraction, pruning) runs in long-lived worker processes
that each take one job at a time over a pipe; the caller waits at most `timeout_s` for the answer and,
past it, kills that worker alone (`WorkerTimeoutError`), so the other workers' jobs go on. A worker
may be given a memory limit (`RLIMIT_DATA`, Linux): an allocation past it fails inside the job, as a
`MemoryError` or the parser's own typed failure, and the worker lives on. That holds from the job's
first byte: a job is framed (its length, then its bytes) and read straight into one buffer of its
size (`worker_framing`), so a page too large for the limit is read past and answered as a `MemoryError`
too, not the worker's death in the middle of taking it in. A dead worker is replaced
on the next call; one killed while idle (the OOM killer, an operator) is replaced without blaming the
page that comes next. One killed from outside while it holds a job (SIGKILL: the kernel's OOM killer,
`kill -9`; SIGTERM) is told from one the job crashed (SIGSEGV, SIGABRT, an exit status of its own):
`WorkerLostError`, which says nothing of the job, and which a pool given `lost_worker_retries` answers
by running the job again in a fresh worker. So is one whose exit status went with the forkserver it was
forked by, replaced since (`restart_forkserver`) or dead (the OOM killer picks it too): 255 is all that
reads, a kill as likely as a crash. The workers of a dead forkserver that still live serve on (whether
a worker lives is asked of the kernel, not of its forkserver), and the next worker started comes from a
new forkserver.
Our own kills (a job past its time limit, `close`) are neither: they raise `WorkerTimeoutError` and
`WorkerError`. A worker past its time limit that was hardly on the CPU meanwhile (stopped, starved) is
told from one a job kept busy: `WorkerTimeoutError.stalled`. A worker that a failed job left holding
most of the room its memory limit gave it is replaced, not left to fail every later job. Each worker
lost or killed is one warning in the log (`service.core.workers`), and one call of the pool's
`on_replaced` with why (`worker_health.REPLACEMENT_REASONS`), for its owner to count.

The fast path stays fast: workers are started once and reused (a job costs one pipe round trip of its
arguments and result, about 1.5 ms per corpus page on the benchmark machine), and on Linux they are
forked from a forkserver that has already imported `preload`, so replacing a killed worker costs tens
of milliseconds. Workers announce readiness only after their imports and initializer, and the time
limit starts when the job is handed to the pipe (sending a large one counts), so start-up never counts
against a job. A worker whose process cannot be launched is tried once more, from a new forkserver where
the one in use cannot be reached or died under the start (`service.core.processes.restart_forkserver`), or
did not answer it within `STARTUP_TIMEOUT_S` (stopped: it is killed, `forkserver_deadline`). A
start that failed leaves no descriptor open (`close_failed_start`: multiprocessing's own leaks included),
so a server whose descriptors ran out starts workers again once they are free.

`concurrent.futures.ProcessPoolExecutor` is not used: one dead worker breaks the whole executor and
fails every job in flight, and it offers no way to stop one job.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import resource
import select
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from multiprocessing.context import BaseContext
from multiprocessing.process import BaseProcess
from multiprocessing.reduction import ForkingPickler
from typing import Any, Final, Self

from service.core.errors import HtmllmError
from service.core.processes import (
    SHORTAGES,
    ForkserverDeadline,
    close_failed_start,
    forkserver_deadline,
    forkserver_in_use,
    group_signals_held,
    ignore_group_signals,
    launch_failure,
    out_of_descriptors,
    restart_forkserver,
    start_forkserver,
    worker_context,
)
from service.core.worker_framing import DRAIN_CHUNK, JOB_HEADER, ReadPast, receive_job, report, send_job
from service.core.worker_health import (
    CRASHED,
    IDLE_DIED,
    KILLED,
    LOST_STATUS,
    MEMORY_RETAINED,
    STALLED,
    TIME_LIMIT,
    ProcGauges,
    cpu_used,
    lost_cause,
    stalled,
    status_unread,
    warn_died,
    warn_idle_died,
    warn_retained,
    warn_time_limit,
)

_log = logging.getLogger(__name__)

# How the pool sends a job (looked up at each send): tests replace it to act right after a chosen job is sent.
_send_job = send_job

# A worker's start, from its launch to its word that it is ready: past it, the start fails (and a forkserver
# that did not answer it is replaced: `forkserver_deadline`).
STARTUP_TIMEOUT_S: Final = 120.0
# The longest a call waits for a worker's start that ends (a worker, or WorkerStartError): a launch that
# failed is tried once more (`WorkerPool._launch`: one whose forkserver did not answer, after the
# whole STARTUP_TIMEOUT_S), each start under STARTUP_TIMEOUT_S. What readiness holds a page's wait for
# its process to (`service.api.preprocessing_readiness`).
START_BOUND_S: Final = 2 * STARTUP_TIMEOUT_S
# Linux's default pipe capacity: a send of more may wait for the worker to read.
_PIPE_BUFFER: Final = 64 * 1024
# How long a worker whose pipe broke is given to finish dying on its own before it is killed: its exit
# status is then its own (what killed it), not the SIGKILL of its reaping.
_DYING_GRACE_S: Final = 1.0


class WorkerError(HtmllmError):
    """A worker could not run a job: it did not start, died, ran out of time, or the pool is closed.
    The caller decides which typed error its user sees (`code` is `internal_error` until it does)."""


class WorkerStartError(WorkerError):
    """A worker did not come up (it could not be launched, died starting, or did not say ready in time):
    the server's fault, not the job's."""


class _LaunchError(WorkerStartError):
    """The worker's process could not even be launched (`Process.start` raised: the forkserver cannot be
    reached, did not answer in time, no process can be forked): the pool tries once more, after
    `restart_forkserver`. `forkserver_replaced`: the forkserver was replaced already (it did not answer)."""

    def __init__(self, message: str, *, forkserver_replaced: bool = False) -> None:
        super().__init__(message)
        self.forkserver_replaced = forkserver_replaced


class WorkerDiedError(WorkerError):
    """The worker died while it held the job (a crash in C code, a signal); `exit_code` says how."""

    def __init__(self, message: str, *, exit_code: int | None) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class WorkerLostError(WorkerDiedError):
    """The worker was killed from outside while it held the job (the OOM killer, `kill -9`), or its exit
    status was lost with its forkserver, replaced or dead (`worker_health.lost_cause`), in each of the job's
    tries: nothing the job did, so not the job's failure. A subclass, so that a caller that only knows
    "died" still catches it."""


class WorkerTimeoutError(WorkerError):
    """The job ran past its time limit; its worker was killed. `cpu_s`: the CPU time the worker used
    meanwhile (None where it could not be read)."""

    def __init__(self, message: str, *, elapsed_s: float, cpu_s: float | None = None) -> None:
        super().__init__(message)
        self.elapsed_s = elapsed_s
        self.cpu_s = cpu_s

    @property
    def stalled(self) -> bool:
        """Whether the worker was hardly on the CPU for the job (`worker_health.stalled`): stopped or
        starved, so the time limit says nothing of the job. A pathological page keeps its worker busy."""
        return stalled(self.cpu_s, self.elapsed_s)


class JobError(WorkerError):
    """The job raised an exception that could not be sent back as itself (it would not pickle)."""

    def __init__(self, message: str, *, type_name: str) -> None:
        super().__init__(message)
        self.type_name = type_name


def limit_memory(limit_bytes: int | None) -> None:
    """Cap this process's data (heap and private writable mappings, what `/proc/self/status` calls
    VmData) at `limit_bytes`, and turn core dumps off. Linux only (elsewhere `RLIMIT_DATA` does not
    cover `mmap`, so it would not bound a parser's allocations); None: no cap."""
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # a worker killed mid-page writes no core file
    if limit_bytes is None or not sys.platform.startswith("linux"):
        return
    _, hard = resource.getrlimit(resource.RLIMIT_DATA)
    if hard != resource.RLIM_INFINITY:
        limit_bytes = min(limit_bytes, hard)
    resource.setrlimit(resource.RLIMIT_DATA, (limit_bytes, hard))


def mib_as_bytes(limit_mib: int | None) -> int | None:
    """A memory limit given in MiB (a setting, an option) as `WorkerPool` takes it; 0 or None: none."""
    return limit_mib * 2**20 if limit_mib else None


def _worker_main(
    conn: Connection,
    preload: Sequence[str],
    memory_limit_bytes: int | None,
    initializer: Callable[..., object] | None,
    initargs: tuple[Any, ...],
) -> None:
    """A worker's loop: import, initialize, limit, say ready, then answer (function, args) jobs."""
    # A Ctrl-C or a hang-up reaches the whole process group; the parent decides when workers stop (it
    # drains through them). SIGTERM keeps its default: the pool kills its workers itself, but a forced
    # quit skips its `close`, and multiprocessing's exit handler then ends daemonic children with SIGTERM
    # and waits for them. One a group's SIGTERM killed holding a job is "killed from outside", and its
    # job runs again in a fresh worker (`lost_worker_retries`), from a forkserver that outlived it.
    ignore_group_signals((signal.SIGINT, signal.SIGHUP))
    for module in preload:
        __import__(module)
    if initializer is not None:
        initializer(*initargs)
    # Allocated before the limit: reading past a job too large for it then allocates nothing.
    fd, header, spare = conn.fileno(), bytearray(JOB_HEADER.size), bytearray(DRAIN_CHUNK)
    # After the trusted start-up (a tokenizer's warm-up briefly needs more than it keeps): the limit is
    # on what the jobs, the untrusted pages, add.
    limit_memory(memory_limit_bytes)
    try:
        _serve(conn, fd, header, spare)
    except (BrokenPipeError, ConnectionResetError):
        # The parent is gone (`kill -9` of the command): no one is left to answer, and a traceback on
        # the terminal it shared would only say so. The worker ends as at the end of its input.
        return


def _serve(conn: Connection, fd: int, header: bytearray, spare: bytearray) -> None:
    """Say ready (with the pid of the process that forked it: `_Worker.forked_by`), then answer jobs until
    the parent closes its end."""
    conn.send(("ready", os.getppid()))
    while True:
        try:
            message: bytearray | None = receive_job(fd, header, spare)
        except (EOFError, OSError):
            return
        except ReadPast as past:  # the pipe is at the next job
            report(conn, past.error)
            continue
        job: Any = None
        try:
            job = pickle.loads(message)  # type: ignore[arg-type]
            message = None  # a page's bytes, twice
            function, args = job
            job = None
            result = function(*args)
        except Exception as exc:  # the job's, or its arguments' unpickling (a MemoryError under the limit)
            # Free what the job holds before reporting, which needs memory too: its arguments, and the
            # frames its traceback keeps (a MemoryError sent with them alive died unsent, exit 1).
            message = job = function = args = None
            report(conn, exc)
        else:
            conn.send(("ok", result))
            result = None


def _pidfd_of(pid: int | None) -> int | None:
    """A pidfd of process `pid` (Linux 5.3+), or None where none can be opened (another system, a sandbox
    that refuses the call)."""
    pidfd_open = getattr(os, "pidfd_open", None)
    if pid is None or pidfd_open is None:
        return None
    try:
        fd: int = pidfd_open(pid)
    except OSError:
        return None
    return fd


def _reap_orphan(pidfd: int, exit_code: int) -> int:
    """Reap the process of `pidfd` if it became this process's child, and return its real exit code;
    else `exit_code`, as multiprocessing read it.

    A worker outlives its dead forkserver as an orphan, the child of the nearest subreaper: of this
    process where it is a container's PID 1 (the image runs the server so). multiprocessing never waits
    for a forkserver's worker, so each one that died after its forkserver stayed a zombie for good (a
    pid each, against the pod's pids limit), its status read as 255 when the kernel held the real one.
    Called once multiprocessing is done with the process: a child it forked itself it has reaped by
    then, so nothing is taken from it here (ChildProcessError: not ours, or reaped already)."""
    try:
        reaped = os.waitid(os.P_PIDFD, pidfd, os.WEXITED | os.WNOHANG)
    except (ChildProcessError, OSError, AttributeError):  # AttributeError: no P_PIDFD (not Linux)
        return exit_code
    if reaped is None:  # still running (a kill that failed): left as it was
        return exit_code
    if reaped.si_code == os.CLD_EXITED:
        return int(reaped.si_status)
    return -int(reaped.si_status)  # CLD_KILLED, CLD_DUMPED: the signal, as multiprocessing writes it


def _wait_exited(pidfd: int, timeout_s: float) -> bool:
    """Whether the process of `pidfd` has exited (a zombie included), waiting up to `timeout_s`."""
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    return bool(poller.poll(max(0, int(timeout_s * 1000))))


class _Worker:
    """One worker process, the parent's end of its pipe, and its /proc files (Linux): `gauges`.

    Whether it runs, and its kill, go through a pidfd of it where there is one (Linux; opened as soon as
    its pid is known, so that a start that fails is killed so too), not through multiprocessing alone: a
    forkserver's worker is judged by the status its forkserver sends, and once the forkserver died (the
    kernel's OOM killer), every worker of it read as exited with 255 at once, the live ones too. A live
    idle worker was then "found dead" and replaced, and the pool's kills (a job past its time limit,
    `close`, a start that failed) sent nothing: multiprocessing signals no process it counts as exited. A
    pidfd names the process itself, so a pid recycled after it was reaped is never signalled."""

    def __init__(self, ctx: BaseContext, name: str, args: tuple[Any, ...]) -> None:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S  # for the launch and the word that it is ready
        self._kill_lock = threading.Lock()
        self.gauges = ProcGauges(None, self._kill_lock)  # none until it is ready
        try:
            parent, child = ctx.Pipe(duplex=True)
        except OSError as exc:  # no file descriptors left
            raise _LaunchError(f"{name} worker could not be launched: {launch_failure(exc)}") from exc
        process: BaseProcess = ctx.Process(  # type: ignore[attr-defined]
            target=_worker_main, args=(child, *args), name=name, daemon=True
        )
        answered: ForkserverDeadline | None = None
        try:
            with group_signals_held():  # it, and the forkserver it may start, outlive a hang-up
                start_forkserver(ctx)  # (no current directory on its import path; the log format told)
                with forkserver_deadline(ctx, STARTUP_TIMEOUT_S) as answered:  # (stopped: replaced)
                    process.start()
        except Exception as exc:  # the forkserver cannot be reached (its socket deleted), fork failed
            parent.close()
            child.close()
            close_failed_start(exc)  # what multiprocessing left open (no descriptors left)
            if answered is not None and answered.abandoned is not None:
                raise _LaunchError(
                    f"{name} worker could not be launched: its forkserver {answered.abandoned} did not answer"
                    f" within {answered.timeout_s:g} s (stopped?) and was killed",
                    forkserver_replaced=True,
                ) from exc
            raise _LaunchError(f"{name} worker could not be launched: {launch_failure(exc)}") from exc
        child.close()
        self.process = process
        self.conn = parent
        self.pid: int | None = process.pid
        # At once, not once it is ready: a worker whose forkserver died (the OOM killer) before it said ready
        # reads as exited to multiprocessing, which then sent the kill of a failed start nowhere, and a
        # worker stuck starting lived on, orphaned. Its pid is not taken again meanwhile: it is reaped only
        # after it exits, and the kernel hands a pid out again only after going through all the others.
        self._pidfd = _pidfd_of(process.pid)
        try:
            # Its forkserver, where it has one: if that is replaced or dies while it lives, its exit status
            # may be lost (`worker_health.status_unread`).
            self.forked_by: int | None = self._ready(name, deadline)
        except BaseException:
            self.kill()  # its pipe and pidfd too; once killed, a kill again only says its exit code
            raise
        self.gauges = ProcGauges(process.pid, self._kill_lock)
        if self._pidfd is None:  # none to be had at its start (no descriptor left then)
            self._pidfd = _pidfd_of(process.pid)

    def _ready(self, name: str, deadline: float) -> int | None:
        """Wait for the worker to say it is ready, up to `deadline` (`time.monotonic`); the pid of the process
        that forked it. WorkerStartError (the worker killed) when it died first or did not say it in time."""
        if not self.conn.poll(max(0.0, deadline - time.monotonic())):
            self.kill()
            raise WorkerStartError(f"{name} worker did not start within {STARTUP_TIMEOUT_S:.0f} s")
        try:
            ready = self.conn.recv()
        except (EOFError, OSError) as exc:
            code = self.kill()
            raise WorkerStartError(f"{name} worker died while starting (exit code {code})") from exc
        forked_by: int | None = ready[1]
        return forked_by

    def alive(self) -> bool:
        """Whether the process runs: the kernel's word where a pidfd can ask it, else multiprocessing's."""
        if self._pidfd is None:
            return self.process.is_alive()
        return not _wait_exited(self._pidfd, 0.0)

    def send_kill(self) -> None:
        """SIGKILL the process, leaving its pipe and reaping to `kill`: from a thread other than the job's,
        under a write to its pipe (the dead reader fails the write). Nothing when `kill` is under way."""
        if not self._kill_lock.acquire(blocking=False):
            return  # `kill` holds it: it kills the process itself
        try:
            self._signal_kill()
        finally:
            self._kill_lock.release()

    def kill(self, *, grace_s: float = 0.0) -> int | None:
        """Stop the process (after `grace_s` to end on its own) and reap it; returns its exit code. Safe
        from two threads at once (the pool's `close` and the job's own thread, which sees the pipe break)."""
        with self._kill_lock:
            if grace_s > 0:
                self._join(grace_s)
            if self.alive():
                self._signal_kill()
            self._join(5.0)
            if not self.conn.closed:
                self.conn.close()
            self.gauges.close()
            code = self.process.exitcode
            if self._pidfd is not None:
                if code is not None:
                    code = _reap_orphan(self._pidfd, code)
                os.close(self._pidfd)
                self._pidfd = None
            if code is not None:
                # Its status pipe and the duplicate of its data pipe, now rather than when the process
                # object is collected: something may name the worker long after (a traceback in a reference
                # cycle, which a serving process may not collect for hours). The process object still
                # answers: its exit code is read already.
                popen = getattr(self.process, "_popen", None)
                if popen is not None:
                    popen.close()
            return code

    def _signal_kill(self) -> None:
        """SIGKILL the process; the caller holds `_kill_lock` (the pidfd is not closed meanwhile)."""
        if self._pidfd is None:
            self.process.kill()
            return
        with contextlib.suppress(ProcessLookupError):  # exited already (a zombie, or reaped)
            signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)

    def _join(self, timeout_s: float) -> None:
        """Wait up to `timeout_s` for the process to exit and its exit status to be read. The pidfd first:
        multiprocessing's wait ends at once for every worker of a dead forkserver (`alive`)."""
        deadline = time.monotonic() + timeout_s
        if self._pidfd is not None:
            _wait_exited(self._pidfd, timeout_s)
        self.process.join(max(0.0, deadline - time.monotonic()))


class WorkerPool:
    """Up to `workers` worker processes shared by any number of calling threads.

    A caller takes an idle worker (or starts one, or waits for one), sends the job and waits at most
    `timeout_s`. A worker that timed out or died is killed and not reused. Jobs are module-level
    functions and picklable arguments; a job's exception comes back as itself. A job whose worker was
    killed from outside is run again in a fresh worker, up to `lost_worker_retries` times (each try
    under its own `timeout_s`: the kill cut the try short, not the job), before `WorkerLostError`; 0
    (the default) for a pool whose jobs must not run twice.

    `on_replaced(reason)` is called once for each worker lost or killed but by `close`, with one of
    `worker_health.REPLACEMENT_REASONS`, on the thread whose job or call found it (never under the
    pool's lock): how the service counts them in a metric, where the warning each also logs is one line
    among millions. What it raises is logged and dropped: a broken counter must not fail the job.
    """

    def __init__(
        self,
        workers: int,
        *,
        name: str,
        preload: Sequence[str] = (),
        initializer: Callable[..., object] | None = None,
        initargs: tuple[Any, ...] = (),
        memory_limit_bytes: int | None = None,
        context: BaseContext | None = None,
        lost_worker_retries: int = 0,
        on_replaced: Callable[[str], object] | None = None,
    ) -> None:
        if workers < 1:
            raise ValueError(f"the {name} pool needs at least one worker, got {workers}")
        if lost_worker_retries < 0:
            raise ValueError(f"lost_worker_retries must be >= 0, got {lost_worker_retries}")
        self.workers = workers
        self.name = name
        self.memory_limit_bytes = memory_limit_bytes
        self.lost_worker_retries = lost_worker_retries
        self._on_replaced = on_replaced
        self._ctx = context or worker_context(preload)
        self._worker_args = (tuple(preload), memory_limit_bytes, initializer, initargs)
        self._cond = threading.Condition()
        self._idle: list[_Worker] = []
        self._busy: set[_Worker] = set()  # for `close`, which stops them too
        self._live = 0
        self._closed = False

    def prestart(self) -> None:
        """Start the workers not running now (blocking), so the next jobs do not wait for a process."""
        with self._cond:
            missing = self.workers - self._live
            self._live += missing  # reserved: callers meanwhile wait for these instead of starting more
        for started in range(missing):
            try:
                worker = self._start()
            except BaseException:
                with self._cond:
                    self._live -= missing - started - 1  # `_start` gave back its own
                    self._cond.notify_all()
                raise
            self._release(worker, healthy=True)

    def call(
        self,
        function: Callable[..., Any],
        args: tuple[Any, ...],
        *,
        timeout_s: float | None,
        on_taken: Callable[[], object] | None = None,
    ) -> Any:
        """`function(*args)` in a worker; its result, or its exception raised here.

        WorkerTimeoutError past `timeout_s` (the worker is killed), WorkerDiedError when the worker
        dies holding the job (WorkerLostError when it was killed from outside, in every try),
        WorkerStartError when a worker cannot start (in two tries), WorkerError when the pool is closed.

        `on_taken()` is called each time a live worker takes the job (an idle one, or one just started
        for it), before the job is sent: from then on the try runs under `timeout_s`, and a start before
        it under its own bound (`START_BOUND_S`). A caller that waits for a busy worker to come free
        waits before it too: a caller with more threads than the pool has workers sees that wait as
        well (the engine's dispatch threads are as many as its workers, so its calls never wait so).
        How a caller tells a try stuck in its worker from one waiting for a slow start
        (`service.engine.preprocessing.RunningJobs`). Called under the pool's lock, as the worker is
        counted busy: it must be quick and must not call the pool; what it raises is logged and dropped."""
        tries = 1
        while True:
            worker = self._acquire(on_taken)
            healthy = False
            try:
                reply = self._exchange(worker, function, args, timeout_s)
                healthy = reply[0] == "ok" or not self._retains_memory(worker)
                break
            except WorkerLostError as lost:
                if tries > self.lost_worker_retries:
                    if tries == 1:
                        raise
                    raise WorkerLostError(
                        f"{lost.message}, in each of {tries} tries", exit_code=lost.exit_code
                    ) from lost
                tries += 1  # in a fresh worker: the lost one is not reused
            finally:
                self._release(worker, healthy=healthy)
        if reply[0] == "ok":
            return reply[1]
        _, payload, type_name, message = reply
        if payload is not None:
            try:
                error = pickle.loads(payload)
            except Exception:
                error = None
            if isinstance(error, Exception):
                # Raised, the error's traceback keeps this frame, which names it: a cycle, and so the
                # error and what its caller adds to it (the page it failed on) wait for a full
                # collection, which a serving process all but never runs (service.engine.collector).
                try:
                    raise error
                finally:
                    del error
        raise JobError(f"{type_name}: {message}", type_name=type_name)

    def _retains_memory(self, worker: _Worker) -> bool:
        """Whether `worker`, its job failed, should be replaced: its heap stayed near its memory limit."""
        limit = self.memory_limit_bytes
        if limit is None or not worker.gauges.retains_memory(limit):
            return False
        warn_retained(self.name, worker.pid, worker.gauges, limit)
        self._replaced(MEMORY_RETAINED)
        return True

    def _replaced(self, reason: str) -> None:
        """Tell `on_replaced` that a worker was lost or killed for `reason`; what it raises is logged."""
        if self._on_replaced is None:
            return
        try:
            self._on_replaced(reason)
        except Exception:
            _log.exception("the %s pool's on_replaced callback raised on %r", self.name, reason)

    def _taken(self, on_taken: Callable[[], object] | None) -> None:
        """Tell `on_taken` (`call`) that a worker took the job; what it raises is logged: raised under the
        pool's lock, it had lost the worker taken (neither idle nor busy, yet counted live)."""
        if on_taken is None:
            return
        try:
            on_taken()
        except Exception:
            _log.exception("the %s pool's on_taken callback raised", self.name)

    def _acquire(self, on_taken: Callable[[], object] | None = None) -> _Worker:
        died = 0  # idle workers found dead: told to `on_replaced` once the lock is let go
        try:
            with self._cond:
                while True:
                    if self._closed:
                        raise WorkerError(f"the {self.name} pool is closed")
                    if self._idle:
                        worker = self._idle.pop()
                        if not worker.alive():
                            # Killed while idle (the OOM killer, an operator): the job about to be sent
                            # did not do it, so it must not fail as "died". Reap and replace.
                            self._live -= 1
                            code = worker.kill()
                            unread = status_unread(self._ctx, code, worker.forked_by)
                            warn_idle_died(self.name, worker.pid, code, unread=unread)
                            died += 1
                            continue
                        self._taken(on_taken)
                        self._busy.add(worker)
                        return worker
                    if self._live < self.workers:
                        self._live += 1
                        break
                    self._cond.wait()
        finally:
            for _ in range(died):
                self._replaced(IDLE_DIED)
        return self._start(on_taken)

    def _start(self, on_taken: Callable[[], object] | None = None) -> _Worker:
        """A new worker, busy, in a place `_live` already counts (given back if it cannot start);
        `on_taken` is told once it is (`call`)."""
        try:
            worker = self._launch()
        except BaseException:
            with self._cond:
                self._live -= 1
                self._cond.notify()
            raise
        with self._cond:
            self._taken(on_taken)  # with the busy mark: whoever sees it busy sees the try's start
            self._busy.add(worker)
            closed = self._closed
        if closed:  # closed while it started: `close` did not see it
            worker.kill()
        return worker

    def _launch(self) -> _Worker:
        """A new worker; one whose process could not be launched is tried once more, from a new forkserver
        where the one in use cannot be reached (`restart_forkserver`): a /tmp cleaner that deleted its
        socket had left the server unable to start any worker until an operator killed the forkserver. One
        that did not answer in time (stopped) is replaced already (`forkserver_deadline`)."""
        seen = forkserver_in_use(self._ctx)
        try:
            return _Worker(self._ctx, self.name, self._worker_args)
        except _LaunchError as exc:
            # Its socket deleted, no one listening on it, or it died under this start (a start that failed
            # for want of descriptors ends CPython's forkserver, as any client that hangs up unsent does;
            # dying, it broke or refused the next start too: EOFError, BrokenPipeError): the forkserver
            # cannot be reached. Another failure (no descriptors left, no memory to fork) would fail a new
            # one as well.
            # One that a start before ran out of descriptors with ended that way (`forkserver_exit`): the
            # refused connection says nothing of the limit, which is what to act on (`SHORTAGES`).
            unreachable = isinstance(exc.__cause__, FileNotFoundError | ConnectionError | EOFError)
            ended = SHORTAGES.ended(seen) if unreachable else None
            restarted = exc.forkserver_replaced or (unreachable and restart_forkserver(self._ctx, seen))
            _log.warning(
                "%s%s; trying once more%s",
                exc.message,
                "" if ended is None else f" ({ended})",
                ", from a new forkserver" if restarted else "",
            )
            first = None
            if out_of_descriptors(exc.__cause__):
                SHORTAGES.note(self._ctx)
                first = exc.message
        try:
            return _Worker(self._ctx, self.name, self._worker_args)
        except _LaunchError as again:
            if out_of_descriptors(again.__cause__):
                SHORTAGES.note(self._ctx)
            if first is None or out_of_descriptors(again.__cause__):
                raise
            # A start out of descriptors after it reached the forkserver ends it (`forkserver_exit`), and the
            # next meets it dying (refused, or cut off): the limit, not that, is what to act on.
            retried = again.message.removeprefix(f"{self.name} worker could not be launched: ")
            raise _LaunchError(f"{first} (once more: {retried})") from again

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

    def _exchange(
        self, worker: _Worker, function: Callable[..., Any], args: tuple[Any, ...], timeout_s: float | None
    ) -> tuple[Any, ...]:
        started = time.perf_counter()
        if timeout_s is not None and timeout_s >= threading.TIMEOUT_MAX:
            # `poll` cannot wait that long (inf, 1e12: OverflowError); nor would anyone: no bound.
            timeout_s = None
        job = ForkingPickler.dumps((function, args))
        # A job larger than the pipe's buffer blocks the send until the worker reads it: one that does
        # not (stopped, swapping) would hold this thread past the limit, so a timer kills it then.
        expired = threading.Event()
        # The worker's CPU time at the job's start and at its limit: a worker hardly on the CPU meanwhile
        # was stalled, not busy with the job (`WorkerTimeoutError.stalled`).
        cpu = [worker.gauges.cpu_s() if timeout_s is not None else None, None]
        guard = None
        if timeout_s is not None and JOB_HEADER.size + len(job) > _PIPE_BUFFER:

            def expire() -> None:
                cpu[1] = worker.gauges.cpu_s()
                expired.set()
                # The process only: its pipe is this thread's to close (closed under a write in
                # progress, the write failed untyped); the dead reader fails the write with EPIPE.
                worker.send_kill()

            guard = threading.Timer(timeout_s, expire)
            guard.daemon = True
            guard.start()
        try:
            _send_job(worker.conn, job)
            del job
            if guard is not None:
                guard.cancel()
            left = None if timeout_s is None else max(0.0, timeout_s - (time.perf_counter() - started))
            ready = not expired.is_set() and worker.conn.poll(left)
        except (EOFError, OSError, TypeError) as exc:  # TypeError: `close` shut the pipe under `conn`
            code = worker.kill(grace_s=0.0 if expired.is_set() else _DYING_GRACE_S)
            if not expired.is_set():
                raise self._died(worker, f"the {self.name} worker died (exit code {code})", code) from exc
            ready = False
        if not ready:
            if not expired.is_set():
                cpu[1] = worker.gauges.cpu_s()
            worker.kill()
            raise self._timed_out(worker, timeout_s, time.perf_counter() - started, cpu[0], cpu[1])
        try:
            reply_bytes = worker.conn.recv_bytes()
        except (EOFError, OSError, TypeError) as exc:
            code = worker.kill(grace_s=_DYING_GRACE_S)
            raise self._died(worker, f"crashed its {self.name} worker (exit code {code})", code) from exc
        try:
            reply: tuple[Any, ...] = pickle.loads(reply_bytes)
        except Exception as exc:
            raise JobError(f"its result could not be read: {exc}", type_name=type(exc).__name__) from exc
        return reply

    def _timed_out(
        self,
        worker: _Worker,
        timeout_s: float | None,
        elapsed_s: float,
        cpu_at_start: float | None,
        cpu_at_limit: float | None,
    ) -> WorkerTimeoutError:
        """The error of a job past its limit, whose worker was killed; logged, with how busy it was, and told
        to `on_replaced` as `stalled` or `time_limit` as that says."""
        cpu_s = cpu_used(cpu_at_start, cpu_at_limit)
        message = f"ran past its {timeout_s} s limit ({elapsed_s:.2f} s); its worker was killed"
        was_stalled = stalled(cpu_s, elapsed_s)
        if was_stalled:
            message += f": it was stalled, not busy with the job (on the CPU for {cpu_s or 0:.2f} s of it)"
        warn_time_limit(self.name, worker.pid, timeout_s, elapsed_s, cpu_s)
        self._replaced(STALLED if was_stalled else TIME_LIMIT)
        return WorkerTimeoutError(message, elapsed_s=elapsed_s, cpu_s=cpu_s)

    def _died(self, worker: _Worker, message: str, exit_code: int | None) -> WorkerError:
        """A worker gone while it held a job: the job's doing, unless `close` killed it, something outside
        the pool did, or what did cannot be known (`worker_health.lost_cause`): `WorkerLostError` for those
        two; logged and told to `on_replaced` (`killed`, `lost_status` or `crashed`), but for `close`."""
        if self._closed:
            return WorkerError(f"the {self.name} pool was closed while the job ran")
        # First: a forkserver that is lost stays lost, so `lost_cause` then finds it so too.
        unread = status_unread(self._ctx, exit_code, worker.forked_by)
        cause = lost_cause(self._ctx, exit_code, worker.forked_by)
        warn_died(self.name, worker.pid, exit_code, unread=unread)
        self._replaced(CRASHED if cause is None else LOST_STATUS if unread else KILLED)
        if cause is not None:
            return WorkerLostError(f"its {self.name} worker {cause}", exit_code=exit_code)
        return WorkerDiedError(message, exit_code=exit_code)

    @property
    def live_workers(self) -> int:
        """Worker processes currently started (idle or busy)."""
        with self._cond:
            return self._live

    def close(self) -> None:
        """Stop every worker now: idle ones, and busy ones, whose jobs then fail with `WorkerError`.

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

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
