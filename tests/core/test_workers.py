"""The killable worker pool: results and typed errors come back, a stuck or dead worker fails its job
alone, and a worker held to a memory limit fails the allocation, not the process."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from service.core.errors import ErrorCode, HtmllmError
from service.core.workers import (
    JobError,
    WorkerDiedError,
    WorkerError,
    WorkerLostError,
    WorkerPool,
    WorkerStartError,
    WorkerTimeoutError,
)
from tests.memory import vm_data_mib

linux_only = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="RLIMIT_DATA bounds mmap on Linux"
)


def add(a: int, b: int) -> int:
    return a + b


def pid() -> int:
    return os.getpid()


def raise_typed(message: str) -> None:
    raise HtmllmError(message, code=ErrorCode.PAYLOAD_TOO_LARGE)


class _Unpicklable(Exception):
    def __init__(self, message: str, handle: object) -> None:
        super().__init__(message)
        self.handle = handle


def raise_unpicklable() -> None:
    raise _Unpicklable("holds a lock", threading.Lock())


def sleep(seconds: float) -> int:
    time.sleep(seconds)
    return os.getpid()


def die() -> None:
    os.kill(os.getpid(), signal.SIGSEGV)  # what a segfault in C code looks like to the parent


def tried(tries: str, signum: int) -> None:
    """Count the try (a line in the file `tries`), then end this worker with `signum`."""
    with open(tries, "a") as handle:
        handle.write(f"{os.getpid()}\n")
    os.kill(os.getpid(), signum)


def blocked_the_first_time(started: str) -> int:
    """Block (for a kill from outside to find the worker holding the job) unless `started` exists."""
    if os.path.exists(started):
        return os.getpid()
    with open(started, "w") as handle:
        handle.write(f"{os.getpid()}\n")
    time.sleep(600)
    return 0


def allocate(mib: int) -> int:
    return len(bytearray(mib * 2**20))


def checksum(page: bytes) -> tuple[int, int]:
    return len(page), zlib.crc32(page)


def _busy_with_a_long_sleep(
    pool: WorkerPool, *, timeout_s: float | None
) -> tuple[threading.Thread, list[BaseException]]:
    """A thread whose job sleeps ten minutes in a worker, started and busy; its failure lands in the list."""
    failures: list[BaseException] = []

    def run() -> None:
        try:
            pool.call(sleep, (600,), timeout_s=timeout_s)
        except BaseException as exc:
            failures.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    while not pool._busy:
        time.sleep(0.01)
    return thread, failures


@pytest.fixture(scope="module")
def pool() -> Iterator[WorkerPool]:
    with WorkerPool(2, name="test") as shared:
        yield shared


def test_results_and_typed_errors_come_back(pool: WorkerPool) -> None:
    assert pool.call(add, (2, 3), timeout_s=60) == 5
    assert pool.call(pid, (), timeout_s=60) != os.getpid()
    with pytest.raises(HtmllmError) as typed:
        pool.call(raise_typed, ("too big",), timeout_s=60)
    assert typed.value.code is ErrorCode.PAYLOAD_TOO_LARGE and typed.value.message == "too big"
    with pytest.raises(JobError) as untyped:
        pool.call(raise_unpicklable, (), timeout_s=60)
    assert untyped.value.type_name == "_Unpicklable" and "holds a lock" in untyped.value.message
    assert pool.call(add, (1, 1), timeout_s=60) == 2  # the worker that raised serves on


def test_a_stuck_job_kills_its_worker_alone() -> None:
    with WorkerPool(2, name="test") as pool:
        pool.prestart()
        thread, stuck = _busy_with_a_long_sleep(pool, timeout_s=0.5)
        (busy,) = pool._busy
        served = pool.call(sleep, (0,), timeout_s=60)  # the other worker answers meanwhile
        thread.join(60)
        assert served != busy.process.pid
        assert len(stuck) == 1 and isinstance(stuck[0], WorkerTimeoutError)
        assert "ran past its 0.5 s limit" in stuck[0].message
        assert not busy.process.is_alive()
        assert pool.live_workers == 1  # the killed worker left; the next call that needs it starts one
        pool.prestart()
        assert pool.live_workers == 2 and pool.call(add, (1, 2), timeout_s=60) == 3


def test_a_worker_that_dies_fails_its_job_and_is_replaced() -> None:
    with WorkerPool(1, name="test") as pool:
        first = pool.call(pid, (), timeout_s=60)
        with pytest.raises(WorkerDiedError) as died:
            pool.call(die, (), timeout_s=60)
        assert died.value.exit_code == -signal.SIGSEGV and "crashed its test worker" in died.value.message
        assert not isinstance(died.value, WorkerLostError)
        assert pool.call(pid, (), timeout_s=60) != first
        assert pool.live_workers == 1


def test_a_worker_killed_from_outside_holding_a_job_is_replaced_and_the_job_run_again(tmp_path: Path) -> None:
    """The OOM killer's SIGKILL says nothing of the job: it had failed as "crashed its worker", which the
    Engine answered as the page's fault (a preprocess_failed row no resume redid)."""
    started = tmp_path / "started"
    answers: list[object] = []
    with WorkerPool(1, name="test", lost_worker_retries=1) as pool:
        thread = threading.Thread(
            target=lambda: answers.append(pool.call(blocked_the_first_time, (str(started),), timeout_s=60))
        )
        thread.start()
        while not started.exists() or not started.read_text().endswith("\n"):
            time.sleep(0.01)
        killed = int(started.read_text())
        os.kill(killed, signal.SIGKILL)  # from outside, while the worker holds the job
        thread.join(60)
        assert len(answers) == 1 and answers[0] not in (killed, 0)  # answered by a fresh worker
        assert pool.live_workers == 1


@pytest.mark.parametrize(("signum", "retries", "tries"), [(signal.SIGKILL, 2, 3), (signal.SIGTERM, 0, 1)])
def test_a_job_lost_in_every_try_is_a_lost_worker_error(
    tmp_path: Path, signum: int, retries: int, tries: int
) -> None:
    log = tmp_path / "tries"
    with WorkerPool(1, name="test", lost_worker_retries=retries) as pool:
        with pytest.raises(WorkerLostError) as lost:
            pool.call(tried, (str(log), signum), timeout_s=60)
        assert lost.value.exit_code == -signum and "killed from outside" in lost.value.message
        assert isinstance(lost.value, WorkerDiedError)  # a caller that knows only "died" still catches it
        assert len(set(log.read_text().split())) == tries  # each try in a fresh worker
        assert (f"in each of {tries} tries" in lost.value.message) is (tries > 1)
        assert pool.call(add, (1, 2), timeout_s=60) == 3


def test_a_crash_or_the_time_limit_is_the_jobs_and_never_tried_again(tmp_path: Path) -> None:
    """Retries are for kills from outside only: the pool's own kill past the time limit (SIGKILL too)
    and a segfault are the job's doing, and a job that crashes its worker must not crash two more."""
    log = tmp_path / "tries"
    with WorkerPool(1, name="test", lost_worker_retries=2) as pool:
        with pytest.raises(WorkerDiedError) as died:
            pool.call(tried, (str(log), signal.SIGSEGV), timeout_s=60)
        assert not isinstance(died.value, WorkerLostError) and len(log.read_text().split()) == 1
        with pytest.raises(WorkerTimeoutError):
            pool.call(blocked_the_first_time, (str(tmp_path / "started"),), timeout_s=0.5)
        assert len((tmp_path / "started").read_text().split()) == 1
    with pytest.raises(ValueError, match="lost_worker_retries"):
        WorkerPool(1, name="test", lost_worker_retries=-1)


def test_a_worker_that_cannot_start_is_a_start_error_not_the_jobs() -> None:
    with WorkerPool(1, name="test", initializer=raise_typed, initargs=("no model",)) as pool:
        with pytest.raises(WorkerStartError, match="test worker died while starting"):
            pool.call(add, (1, 2), timeout_s=60)
        assert pool.live_workers == 0


def test_a_closed_pool_refuses_jobs() -> None:
    pool = WorkerPool(1, name="test")
    pool.close()
    with pytest.raises(WorkerError, match="the test pool is closed"):
        pool.call(add, (1, 2), timeout_s=60)


@linux_only
def test_the_memory_limit_fails_the_allocation_and_the_worker_lives_on() -> None:
    with WorkerPool(1, name="test") as probe:
        idle = probe.call(vm_data_mib, (), timeout_s=60)
    limit_mib = idle + 64
    with WorkerPool(1, name="test", memory_limit_bytes=limit_mib * 2**20) as pool:
        worker = pool.call(pid, (), timeout_s=60)
        assert pool.call(allocate, (16,), timeout_s=60) == 16 * 2**20
        with pytest.raises(MemoryError):
            pool.call(allocate, (256,), timeout_s=60)
        assert pool.call(allocate, (16,), timeout_s=60) == 16 * 2**20
        assert pool.call(pid, (), timeout_s=60) == worker  # the same process, memory given back


@linux_only
def test_a_job_too_large_to_take_in_is_a_memory_error_and_the_worker_serves_on() -> None:
    """Held to 16 MiB over its idle data, a worker cannot even receive a 64 MiB page: it died taking
    it in (`WorkerDiedError`, a new worker for the next job); it reads past it and says so. The jobs'
    module is preloaded, as a server preloads its jobs': imported by the first job, it took 10 of the
    16 MiB, and the pool replaces a worker that a failed job leaves holding most of its room."""
    with WorkerPool(1, name="test", preload=[__name__]) as probe:
        idle = probe.call(vm_data_mib, (), timeout_s=60)
    with WorkerPool(1, name="test", preload=[__name__], memory_limit_bytes=(idle + 16) * 2**20) as pool:
        worker = pool.call(pid, (), timeout_s=60)
        huge = os.urandom(64 * 2**20)
        with pytest.raises(MemoryError, match=r"a job of [\d,]+ bytes does not fit in the worker's memory"):
            pool.call(checksum, (huge,), timeout_s=60)
        # The pipe is at the next job's start: small and larger jobs come back whole, in the same process.
        assert pool.call(add, (2, 3), timeout_s=60) == 5
        fits = huge[: 2 * 2**20 + 7]
        assert pool.call(checksum, (fits,), timeout_s=60) == checksum(fits)
        with pytest.raises(MemoryError):
            pool.call(checksum, (huge,), timeout_s=60)
        assert pool.call(pid, (), timeout_s=60) == worker


def test_jobs_of_every_size_around_the_frames_edges_come_back_whole(pool: WorkerPool) -> None:
    for size in (0, 1, 8, 64 * 1024 - 60, 64 * 1024, 64 * 1024 + 1, 3 * 2**20 + 5):
        page = os.urandom(size)
        assert pool.call(checksum, (page,), timeout_s=60) == checksum(page), size


def test_a_worker_that_stops_reading_cannot_hold_a_large_job_past_its_limit() -> None:
    """A job larger than the pipe's buffer waits for the worker to read it: a stopped worker held the
    caller for ever (the limit only timed the answer)."""
    with WorkerPool(1, name="test") as pool:
        worker_pid = pool.call(pid, (), timeout_s=60)
        os.kill(worker_pid, signal.SIGSTOP)
        with pytest.raises(WorkerTimeoutError):
            pool.call(add, (b"x" * 2**22, b""), timeout_s=0.5)
        assert pool.call(add, (1, 2), timeout_s=60) == 3  # on a fresh worker


def test_a_job_whose_worker_close_kills_fails_as_closed_not_crashed() -> None:
    pool = WorkerPool(1, name="test")
    thread, failures = _busy_with_a_long_sleep(pool, timeout_s=None)
    pool.close()
    thread.join(60)
    assert len(failures) == 1 and type(failures[0]) is WorkerError
    assert "the test pool was closed while the job ran" in failures[0].message


def _fail_to_load() -> None:
    raise ValueError("cannot be loaded here")


class _Unreadable:
    def __reduce__(self) -> tuple[object, tuple[()]]:
        return (_fail_to_load, ())


def unreadable() -> _Unreadable:
    return _Unreadable()


def test_a_result_that_cannot_be_read_is_a_job_error(pool: WorkerPool) -> None:
    with pytest.raises(JobError, match="its result could not be read: cannot be loaded here"):
        pool.call(unreadable, (), timeout_s=60)
    assert pool.call(add, (2, 2), timeout_s=60) == 4


def _orphan(conn: object, parent_fd: int) -> None:
    """A forked worker without the copy of its parent's end that fork gave it (a pool's has none)."""
    from service.core.workers import _worker_main

    if parent_fd >= 0:
        os.close(parent_fd)
    _worker_main(conn, (), None, None, ())  # type: ignore[arg-type]


@pytest.mark.parametrize("gone", ["before it is ready", "during a job"])
def test_a_worker_whose_parent_is_gone_exits_quietly(gone: str, capfd: pytest.CaptureFixture[str]) -> None:
    """After `kill -9` of the command, its orphaned worker's answer meets a closed pipe: it printed a
    BrokenPipeError traceback on the terminal; it ends quietly, as at the end of its input."""
    import multiprocessing
    import pickle

    from service.core.workers import _send_job

    ctx = multiprocessing.get_context("fork")
    parent, child = ctx.Pipe(duplex=True)
    if gone == "before it is ready":
        parent.close()
        process = ctx.Process(target=_orphan, args=(child, -1), daemon=True)
        process.start()
    else:
        process = ctx.Process(target=_orphan, args=(child, parent.fileno()), daemon=True)
        process.start()
        assert parent.recv()[0] == "ready"
        _send_job(parent, pickle.dumps((sleep, (0.5,))))
        parent.close()  # the parent dies while its job runs
    child.close()
    process.join(60)
    assert process.exitcode == 0
    err = capfd.readouterr().err
    assert "Traceback" not in err and "BrokenPipeError" not in err
