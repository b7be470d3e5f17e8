"""Each worker a pool loses or replaces is told to its `on_replaced`, with why (the service counts them in
`htmllm_worker_replacements_total`, where one warning line among millions of pages a day is no rate an
alert can watch); jobs that go well and `close` tell it nothing, and a callback that raises never fails a
job nor the pool. The deaths and kills are real."""

from __future__ import annotations

import logging
import os
import signal
import sys
import time

import pytest

from service.core.processes import forkserver_in_use, restart_forkserver, worker_context
from service.core.worker_health import (
    CRASHED,
    IDLE_DIED,
    KILLED,
    LOST_STATUS,
    MEMORY_RETAINED,
    REPLACEMENT_REASONS,
    STALLED,
    TIME_LIMIT,
)
from service.core.workers import (
    WorkerDiedError,
    WorkerError,
    WorkerLostError,
    WorkerPool,
    WorkerTimeoutError,
)
from tests.core.test_workers import _busy_with_a_long_sleep
from tests.factories.worker_heap import keep, keep_and_fail
from tests.factories.worker_jobs import add, pid, pid_of_page, spin, stop_self
from tests.factories.worker_kills import kill_workers_holding
from tests.memory import vm_data_mib

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc and RLIMIT_DATA: Linux")


def end_with(signum: int) -> None:
    os.kill(os.getpid(), signum)


def _wait_dead(pool: WorkerPool) -> None:
    """Until the pool's one idle worker, killed from outside, is seen dead."""
    (worker,) = pool._idle
    deadline = time.monotonic() + 10
    while worker.process.is_alive() and time.monotonic() < deadline:
        time.sleep(0.01)


def test_the_set_of_reasons_is_closed_and_each_is_a_label_value() -> None:
    assert len(set(REPLACEMENT_REASONS)) == len(REPLACEMENT_REASONS) == 7
    assert all(reason.isidentifier() and reason.islower() for reason in REPLACEMENT_REASONS)


@linux_only
def test_each_worker_lost_or_killed_is_told_with_its_reason() -> None:
    """A crash (SIGSEGV) is the job's; SIGKILL and SIGTERM are kills from outside, each try's worker told
    apart; the pool's own kill past the time limit is `time_limit` for a busy worker and `stalled` for one
    hardly on the CPU; a worker found dead while idle is `idle_died`. Jobs that go well tell nothing."""
    reasons: list[str] = []
    with WorkerPool(1, name="test", lost_worker_retries=1, on_replaced=reasons.append) as pool:
        for n in range(3):
            assert pool.call(add, (n, 1), timeout_s=60) == n + 1
        assert reasons == []
        with pytest.raises(WorkerDiedError) as crashed:
            pool.call(end_with, (signal.SIGSEGV,), timeout_s=60)
        assert not isinstance(crashed.value, WorkerLostError)
        assert reasons == [CRASHED]
        with pytest.raises(WorkerLostError):
            pool.call(end_with, (signal.SIGKILL,), timeout_s=60)  # and in its retry's worker
        assert reasons == [CRASHED, KILLED, KILLED]
        with pytest.raises(WorkerTimeoutError) as busy:
            pool.call(spin, (30,), timeout_s=0.5)
        assert not busy.value.stalled
        # Its replacement imports this module first: the stop's CPU below is then the job's alone.
        pool.call(pid, (), timeout_s=60)
        with pytest.raises(WorkerTimeoutError) as stopped:
            pool.call(stop_self, (), timeout_s=0.5)
        assert stopped.value.stalled
        assert reasons == [CRASHED, KILLED, KILLED, TIME_LIMIT, STALLED]
        os.kill(pool.call(pid, (), timeout_s=60), signal.SIGKILL)  # the OOM killer picks it while idle
        _wait_dead(pool)
        assert pool.call(add, (1, 2), timeout_s=60) == 3
        assert reasons == [CRASHED, KILLED, KILLED, TIME_LIMIT, STALLED, IDLE_DIED]


@linux_only
def test_a_worker_a_failed_job_left_near_its_memory_limit_is_memory_retained() -> None:
    with WorkerPool(1, name="test") as probe:
        probe.call(keep, (0,), timeout_s=60)  # the jobs' module imported: not counted as a job's data
        idle = probe.call(vm_data_mib, (), timeout_s=60)
    reasons: list[str] = []
    limit = (idle + 64) * 2**20
    with WorkerPool(1, name="test", memory_limit_bytes=limit, on_replaced=reasons.append) as pool:
        with pytest.raises(MemoryError):
            pool.call(keep_and_fail, (4,), timeout_s=60)  # a failure that leaves little: kept
        assert reasons == []
        with pytest.raises(MemoryError):
            pool.call(keep_and_fail, (40,), timeout_s=60)
        assert reasons == [MEMORY_RETAINED]


def test_a_worker_of_a_replaced_forkserver_killed_holding_a_job_is_lost_status(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Its exit status went with its forkserver (255): as likely a kill as a crash, told apart from both."""
    ctx = worker_context(())
    restart_forkserver(ctx, forkserver_in_use(ctx))  # one of the test's own: its worker, its only child
    reasons: list[str] = []
    with WorkerPool(1, name="test", lost_worker_retries=1, on_replaced=reasons.append) as pool:
        first = pool.call(pid, (), timeout_s=60)
        assert restart_forkserver(ctx, forkserver_in_use(ctx))
        killed = kill_workers_holding(monkeypatch, b"killed under this page", kills=1)
        assert pool.call(pid_of_page, ("killed under this page",), timeout_s=60) not in (first, 0)
        assert killed == [first]
    assert reasons == [LOST_STATUS]


def test_close_under_a_job_tells_nothing() -> None:
    """`close` kills its busy workers on purpose: no worker was lost to anything an operator must see."""
    reasons: list[str] = []
    pool = WorkerPool(1, name="test", on_replaced=reasons.append)
    thread, failures = _busy_with_a_long_sleep(pool, timeout_s=None)
    time.sleep(0.1)  # the job handed to the worker
    pool.close()
    thread.join(30)
    assert len(failures) == 1 and isinstance(failures[0], WorkerError)
    assert reasons == []


def test_a_callback_that_raises_is_logged_and_the_pool_serves_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A broken counter must not turn a page's crash into another error, nor leave the pool a worker short."""
    told: list[str] = []

    def broken(reason: str) -> None:
        told.append(reason)
        raise RuntimeError("the metrics backend is broken")

    caplog.set_level(logging.ERROR, logger="service.core.workers")
    with WorkerPool(1, name="test", on_replaced=broken) as pool:
        with pytest.raises(WorkerDiedError) as died:
            pool.call(end_with, (signal.SIGSEGV,), timeout_s=60)
        assert died.value.exit_code == -signal.SIGSEGV
        assert pool.call(add, (1, 2), timeout_s=60) == 3
        assert pool.live_workers == 1
    assert told == [CRASHED]
    (record,) = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert "on_replaced callback raised" in record.getMessage() and record.exc_info is not None
