"""What the pool learns of a worker's health and acts on: a worker killed at its time limit says whether
it was busy or stalled, a worker whose heap stayed near its memory limit is replaced, and each worker the
pool loses or kills is one warning line (none for jobs that go well)."""

from __future__ import annotations

import logging
import os
import signal
import sys
from typing import Final

import pytest

from service.core.workers import WorkerDiedError, WorkerPool, WorkerTimeoutError
from tests.factories.worker_heap import keep, keep_and_fail
from tests.factories.worker_jobs import add, pid, spin, stop_self
from tests.memory import vm_data_mib

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc and RLIMIT_DATA: Linux")

_LOGGER: Final = "service.core.workers"


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == _LOGGER and r.levelno >= logging.WARNING]


@linux_only
def test_a_worker_busy_past_its_limit_is_the_jobs_a_stopped_one_is_stalled(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A page that keeps its worker on the CPU for the whole limit is the page's fault; a worker that was
    stopped (SIGSTOP) under a good page hardly ran it: `stalled`, which the Engine answers as retryable
    rather than as the page's `preprocess_failed`. Each kill is one warning naming the worker."""
    caplog.set_level(logging.WARNING, logger=_LOGGER)
    with WorkerPool(1, name="test") as pool:
        busy_pid = pool.call(pid, (), timeout_s=60)
        with pytest.raises(WorkerTimeoutError) as busy:
            pool.call(spin, (30,), timeout_s=1.0)
        assert not busy.value.stalled and busy.value.cpu_s is not None and busy.value.cpu_s > 0.1
        stopped_pid = pool.call(pid, (), timeout_s=60)
        with pytest.raises(WorkerTimeoutError) as stopped:
            pool.call(stop_self, (), timeout_s=1.0)
        assert stopped.value.stalled and stopped.value.cpu_s is not None and stopped.value.cpu_s < 0.1
        assert "it was stalled, not busy with the job" in stopped.value.message
        assert pool.call(add, (1, 2), timeout_s=60) == 3
    lines = _warnings(caplog)
    assert len(lines) == 2, lines
    assert f"killed the test worker {busy_pid}: its job ran past its 1.0 s time limit" in lines[0]
    assert "stalled" not in lines[0]
    assert f"killed the test worker {stopped_pid}" in lines[1] and "the worker was stalled" in lines[1]


@linux_only
def test_a_worker_stopped_before_it_reads_a_large_job_is_stalled() -> None:
    """A job larger than the pipe's buffer that a stopped worker never reads is timed by a timer, which
    reads the worker's CPU before it kills it: stalled, too."""
    with WorkerPool(1, name="test") as pool:
        os.kill(pool.call(pid, (), timeout_s=60), signal.SIGSTOP)
        with pytest.raises(WorkerTimeoutError) as stopped:
            pool.call(add, (b"x" * 2**22, b""), timeout_s=0.5)
        assert stopped.value.stalled and stopped.value.cpu_s is not None
        assert pool.call(add, (1, 2), timeout_s=60) == 3


@linux_only
def test_a_worker_whose_heap_a_failed_job_left_near_its_limit_is_replaced(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A page that ran into the limit left the worker's heap there, and every later page failed in it (a
    good non-UTF-8 page: ImportError, charset detection could not be loaded). A failed job that leaves
    little behind, or a job that succeeds (the modules and caches it keeps, a new worker would keep too),
    leaves its worker in place; a failed job that leaves more than half the room taken has it replaced."""
    caplog.set_level(logging.WARNING, logger=_LOGGER)
    with WorkerPool(1, name="test") as probe:
        probe.call(keep, (0,), timeout_s=60)  # the jobs' module imported: not counted as a job's data
        idle = probe.call(vm_data_mib, (), timeout_s=60)
    with WorkerPool(1, name="test", memory_limit_bytes=(idle + 64) * 2**20) as pool:
        worker = pool.call(os.getpid, (), timeout_s=60)
        with pytest.raises(MemoryError):
            pool.call(keep_and_fail, (8,), timeout_s=60)
        pool.call(keep, (16,), timeout_s=60)  # 24 MiB held: but only after a success
        assert pool.call(os.getpid, (), timeout_s=60) == worker
        assert _warnings(caplog) == []
        with pytest.raises(MemoryError):
            pool.call(keep_and_fail, (16,), timeout_s=60)  # 40 MiB of 64 held after a failure
        assert pool.call(os.getpid, (), timeout_s=60) != worker
        pool.call(keep, (40,), timeout_s=60)  # the room is back
        assert pool.live_workers == 1
    (line,) = _warnings(caplog)
    assert f"replacing the test worker {worker}: after a failed job it still holds" in line


def test_jobs_that_go_well_log_nothing(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger=_LOGGER)
    with WorkerPool(2, name="test", memory_limit_bytes=2**40) as pool:
        pool.prestart()
        for n in range(20):
            assert pool.call(add, (n, 1), timeout_s=60) == n + 1
    assert [r for r in caplog.records if r.name == _LOGGER] == []


def test_a_worker_that_dies_under_a_job_is_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger=_LOGGER)
    with WorkerPool(1, name="test") as pool:
        worker = pool.call(pid, (), timeout_s=60)
        with pytest.raises(WorkerDiedError):
            pool.call(os.kill, (worker, signal.SIGSEGV), timeout_s=60)
    (line,) = _warnings(caplog)
    assert f"the test worker {worker} died while it held a job (exit code -11, SIGSEGV)" in line
