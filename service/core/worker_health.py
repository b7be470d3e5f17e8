"""How a worker pool (`service.core.workers`) judges its workers' health, and what it logs of each one lost
or replaced: how much CPU a worker had and how much data it holds (read from /proc in about a microsecond
each, through files kept open), whether a job past its time limit was stalled rather than busy, whether a
worker that failed a job holds too much of its memory limit to be kept, and whether a worker that died
holding a job was killed from outside (or cannot be known not to have been) rather than crashed by it.
And how a pool's owner counts the tries refused because no worker could start (`StartRefusals`), the one
rule both served pools (preprocessing, extractors) follow, which a server's readiness reads.

Each worker lost, killed or replaced is one warning in the pool's log, `service.core.workers`, where an
operator looks for them (docs name it); this module logs under that name. Each is also one of
`REPLACEMENT_REASONS`, which the pool hands its owner (`WorkerPool`'s `on_replaced`: the service counts
them in a metric, since one log line among millions of pages a day is no rate an alert can watch).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
from dataclasses import dataclass, replace
from multiprocessing.context import BaseContext
from typing import Final

from service.core.processes import forkserver_lost

_log = logging.getLogger("service.core.workers")

# The exit statuses of a worker killed from outside: SIGKILL (the kernel's OOM killer, `kill -9`) and
# SIGTERM (an operator's `kill`, a scheduler's). No fault in a job's code ends a worker so (a crash in C
# code is SIGSEGV, SIGBUS or SIGABRT; an error the worker cannot report, a positive status), and the pool's
# own SIGKILLs (past the time limit, at `close`) are told apart where it sends them.
KILLED_FROM_OUTSIDE: Final = frozenset({-signal.SIGKILL, -signal.SIGTERM})
# The exit status multiprocessing gives a forkserver's worker whose status the forkserver never sent: it
# had exited first, as one `restart_forkserver` forgot does with its last worker, or one the OOM killer
# chose. Whatever ended such a worker (a kill from outside as often as not), a job is not blamed on it
# (`forkserver_lost`).
STATUS_UNREAD: Final = 255
# A job past its time limit whose worker had the CPU for less than this share of the time was stalled (a
# SIGSTOP, a frozen cgroup, a machine so overloaded that the page never had its turn), not busy with a
# pathological page, which keeps its worker on the CPU: `WorkerTimeoutError.stalled`.
STALLED_CPU_SHARE: Final = 0.1
# A worker held to a memory limit that, after a job that failed, still holds more than this share of the
# room the limit left it at start (its data then) is replaced: a page that ran into the limit can leave
# the heap near it (glibc keeps what it freed), and every later page, good ones too, then failed in that
# worker (a lazy import of a compiled module failed to map it: ImportError on every undeclared non-UTF-8
# page). Only after a failure: what a job that succeeds keeps (the modules its first run imports, caches)
# a new worker would keep again, and replacing it for that would replace every worker after its first job.
RETAINED_SHARE: Final = 0.5
# What a warning says of a worker whose status is `STATUS_UNREAD`.
_UNREAD: Final = ": its exit status is unknown, its forkserver (replaced since, or dead) having exited first"
_PAGE_SIZE: Final = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096

# Why a pool lost or replaced a worker, as it tells its `on_replaced` callback (a metric's label, so a
# closed set): one for each warning below, the died ones split as `lost_cause` splits them.
KILLED: Final = "killed"  # died holding a job of SIGKILL or SIGTERM from outside: the OOM killer, a kill
CRASHED: Final = "crashed"  # died holding a job of its own doing: SIGSEGV, SIGABRT, an exit status
LOST_STATUS: Final = "lost_status"  # died holding a job, its status lost with its forkserver (replaced, dead)
TIME_LIMIT: Final = "time_limit"  # killed by the pool: its job ran past the time limit, busy on the CPU
STALLED: Final = "stalled"  # killed by the pool past the time limit, hardly on the CPU (stopped, starved)
MEMORY_RETAINED: Final = "memory_retained"  # replaced: a failed job left it near its memory limit
IDLE_DIED: Final = "idle_died"  # found dead while idle (the OOM killer, a kill), replaced before a job
REPLACEMENT_REASONS: Final = (KILLED, CRASHED, LOST_STATUS, TIME_LIMIT, STALLED, MEMORY_RETAINED, IDLE_DIED)


def stalled(cpu_s: float | None, elapsed_s: float) -> bool:
    """Whether a worker on the CPU for `cpu_s` of a job's `elapsed_s` was hardly on it (`STALLED_CPU_SHARE`):
    stopped or starved, so its time limit says nothing of the job. A pathological page keeps it busy."""
    return cpu_s is not None and cpu_s < STALLED_CPU_SHARE * elapsed_s


def signal_named(exit_code: int | None) -> str:
    """How a log line names the signal an exit code says killed a worker: ", SIGSEGV"; "" for none."""
    if exit_code is None or exit_code >= 0:
        return ""
    try:
        name = signal.Signals(-exit_code).name
    except ValueError:
        return ""
    if exit_code in KILLED_FROM_OUTSIDE:
        return f", {name}: killed from outside, by the kernel's OOM killer or a kill"
    return f", {name}"


class ProcGauges:
    """One worker's /proc files (Linux), kept open: how much CPU it has used and how much data it holds.

    `lock` is the worker's own, held while it is killed: a read meanwhile answers None, since the files
    are closed then and a number read could name another file."""

    def __init__(self, pid: int | None, lock: threading.Lock) -> None:
        self._lock = lock
        self._files: dict[str, int] = {}
        if pid is not None and sys.platform.startswith("linux"):
            for proc_file in ("schedstat", "statm"):
                # No /proc, or a kernel without schedstat: the worker is judged without it.
                with contextlib.suppress(OSError):
                    self._files[proc_file] = os.open(f"/proc/{pid}/{proc_file}", os.O_RDONLY)
        # Its data once started, limit set: what the jobs' own use is measured from (`retains_memory`).
        self.data_at_start = self.data_bytes()

    def cpu_s(self) -> float | None:
        """The CPU time its main thread, which runs the jobs, has used (/proc's schedstat), or None."""
        fields = self._read("schedstat")
        return int(fields[0]) / 1e9 if fields else None

    def data_bytes(self) -> int | None:
        """Its data (and stack) now, as /proc's statm counts it: what `RLIMIT_DATA` bounds; or None."""
        fields = self._read("statm")
        return int(fields[5]) * _PAGE_SIZE if fields and len(fields) > 5 else None

    def retains_memory(self, limit_bytes: int) -> bool:
        """Whether it still holds more than `RETAINED_SHARE` of the room its memory limit left it."""
        now = self.data_bytes()
        if now is None or self.data_at_start is None or self.data_at_start >= limit_bytes:
            return False  # unknown, or the limit left no room to begin with: a new worker has no more
        return now - self.data_at_start > RETAINED_SHARE * (limit_bytes - self.data_at_start)

    def close(self) -> None:
        """Close the files; the caller holds `lock` (the worker is being killed)."""
        for fd in self._files.values():
            os.close(fd)
        self._files.clear()

    def _read(self, name: str) -> list[bytes] | None:
        """A /proc file's fields, or None: not open, the process gone, or being killed now."""
        if not self._lock.acquire(blocking=False):
            return None
        try:
            fd = self._files.get(name)
            return None if fd is None else os.pread(fd, 256, 0).split()
        except OSError:
            return None
        finally:
            self._lock.release()


def cpu_used(at_start: float | None, at_limit: float | None) -> float | None:
    """The CPU time a worker used between two readings of `ProcGauges.cpu_s`, or None if either failed."""
    if at_start is None or at_limit is None:
        return None
    return max(0.0, at_limit - at_start)


def status_unread(ctx: BaseContext, exit_code: int | None, forked_by: int | None) -> bool:
    """Whether `exit_code` of a worker forked by `forked_by` is `STATUS_UNREAD`, no status of its own: its
    forkserver exited before telling it (`forkserver_lost`)."""
    return exit_code == STATUS_UNREAD and forkserver_lost(ctx, forked_by)


def lost_cause(ctx: BaseContext, exit_code: int | None, forked_by: int | None) -> str | None:
    """Why a worker that died holding a job with `exit_code` did not die of the job, as `WorkerLostError`
    says it; None when it did (its exit status its own: a crash, a signal of its code's doing)."""
    if status_unread(ctx, exit_code, forked_by):
        return (
            f"died while it held the job, of a cause unknown (exit code {exit_code}: the forkserver it came "
            "from, since replaced or dead, exited before telling its exit status; as likely the kernel's OOM "
            "killer or a kill), not counted as crashed by the job"
        )
    if exit_code is not None and exit_code in KILLED_FROM_OUTSIDE:
        return (
            f"was killed from outside while it held the job (exit code {exit_code}, "
            f"{signal.Signals(-exit_code).name}: the kernel's OOM killer or a kill), not crashed by the job"
        )
    return None


def warn_died(pool: str, pid: int | None, exit_code: int | None, *, unread: bool) -> None:
    """Log a worker that died holding a job; `unread`: its exit status went with its forkserver
    (`status_unread`)."""
    _log.warning(
        "the %s worker %s died while it held a job (exit code %s%s); replacing it",
        pool, pid, exit_code, _UNREAD if unread else signal_named(exit_code),
    )  # fmt: skip


def warn_idle_died(pool: str, pid: int | None, exit_code: int | None, *, unread: bool) -> None:
    """Log a worker found dead while idle (the OOM killer, an operator), about to be replaced; `unread`: its
    exit status went with its forkserver (`status_unread`)."""
    _log.warning(
        "the idle %s worker %s died (exit code %s%s); replacing it",
        pool, pid, exit_code, _UNREAD if unread else signal_named(exit_code),
    )  # fmt: skip


def warn_time_limit(
    pool: str, pid: int | None, timeout_s: float | None, elapsed_s: float, cpu_s: float | None
) -> None:
    """Log a worker killed for a job past its time limit, with how busy it was meanwhile."""
    _log.warning(
        "killed the %s worker %s: its job ran past its %s s time limit (%.2f s, %s of CPU%s); "
        "replacing it",
        pool, pid, timeout_s, elapsed_s, "unknown" if cpu_s is None else f"{cpu_s:.2f} s",
        ": the worker was stalled, not busy" if stalled(cpu_s, elapsed_s) else "",
    )  # fmt: skip


def warn_retained(pool: str, pid: int | None, gauges: ProcGauges, limit_bytes: int) -> None:
    """Log a worker replaced after a failed job for holding most of its memory limit (`retains_memory`)."""
    data = gauges.data_bytes() or 0
    _log.warning(
        "replacing the %s worker %s: after a failed job it still holds %.0f MiB of data, near its "
        "%.0f MiB limit (%.0f MiB when it started), which would fail the next pages",
        pool, pid, data / 2**20, limit_bytes / 2**20, (gauges.data_at_start or 0) / 2**20,
    )  # fmt: skip


@dataclass(frozen=True)
class StartHealth:
    """How starting a pool's workers has gone lately (`StartRefusals.health`; the Engine's `PoolHealth`):
    what a server's readiness and liveness read. A try refused because no worker could start
    (`WorkerStartError`: the forkserver gone, no process can be forked, the code on disk broken) counts,
    the jobs refused together once; any job a worker took (whatever became of it) ends the run.
    Times are `time.monotonic()`."""

    start_failures: int = 0  # tries in a row refused for want of a worker; jobs refused together count once
    failing_since: float | None = None  # when the first of those was refused
    last_error: str | None = None  # the latest refusal's message


class StartRefusals:
    """The tries in a row refused because no worker of a pool could start (`health`), counted from any
    thread.

    Counted once per try, not per job: a job counts only if no refusal was counted since it was submitted
    (`ticket`, taken then), so the jobs refused together (one request's pages or extractions, in one blip
    of the forkserver) count once, and a try made after a refusal counts again. Counted per job, one
    request of a few pages (2 documents x 2 extractors) had turned /ready 503 on its own; a run that goes
    on, try after try, is what readiness is for."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counted = 0  # refusals counted so far (never reset): the tickets
        # Replaced whole, never changed: read without the lock (readiness asks it for every answer).
        self.health = StartHealth()

    def ticket(self) -> int:
        """What a job takes as it is submitted, for `refused`: the refusals counted so far."""
        return self._counted

    def refused(self, error: str, ticket: int, now: float) -> None:
        """Count a job refused for want of a worker (`error`: why, said without the error's class), unless
        one was counted since it was submitted (`ticket`): then only the message is the latest."""
        with self._lock:
            run = self.health
            if run.start_failures and ticket != self._counted:  # refused together with one counted
                self.health = replace(run, last_error=error)
                return
            self._counted += 1
            since = now if run.failing_since is None else run.failing_since
            self.health = StartHealth(run.start_failures + 1, since, error)

    def started(self) -> bool:
        """A worker took a job: the run ends. Whether one was running (for its end to be said once)."""
        if not self.health.start_failures:
            return False
        with self._lock:
            ended = bool(self.health.start_failures)
            self.health = StartHealth()
        return ended


def start_trouble(
    run: StartHealth, after_failures: int, now: float, *, workers: str, jobs: str
) -> str | None:
    """Why a pool's jobs are refused now: `after_failures` tries in a row (at least one) refused for want of
    a worker that starts (`workers`: "extractor process"; `jobs`: what it runs, "pages"), or None. The one
    rule /ready applies to each pool."""
    if run.start_failures < max(1, after_failures):
        return None
    since = run.failing_since
    over = "" if since is None else f" over {max(0.0, now - since):.0f} s"
    return (
        f"no {workers} could start for the last {run.start_failures} tries{over}, the {jobs} refused "
        f"together counted once ({run.last_error}); probing it"
    )


def start_check_due(run: StartHealth, after_failures: int, now: float, interval_s: float) -> bool:
    """Whether a run of refusals below `after_failures` has lasted `interval_s` (its first refusal that long
    ago): a probe job then checks the pool, whose success ends the run and whose refusal counts, as the
    backend's check pass does for failed passes. Without it a refusal on an idle pod stayed counted until
    a job got a worker, and blips days apart added up to "in a row"."""
    since = run.failing_since
    return 0 < run.start_failures < after_failures and since is not None and now - since >= interval_s


class RecurringWarning:
    """A warning said again and again while a fault lasts (a probe that fails every few seconds): the first
    at WARNING, then at most one every `every_s` (the rest at DEBUG), until `reset` (the fault ended)."""

    def __init__(self, logger: logging.Logger, every_s: float = 60.0) -> None:
        self._logger = logger
        self.every_s = every_s
        self._said_at: float | None = None

    def log(self, now: float, message: str, *args: object) -> None:
        """Log `message % args` at WARNING if none was within `every_s` of `now`, else at DEBUG."""
        if self._said_at is None or now - self._said_at >= self.every_s:
            self._said_at = now
            self._logger.warning(message, *args)
        else:
            self._logger.debug(message, *args)

    def reset(self) -> None:
        """The fault ended: the next one's first line is a warning again."""
        self._said_at = None
