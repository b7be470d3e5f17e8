"""`WorkerPool.call`'s `on_taken`: told each time a live worker takes the job, before it is sent, so that
a caller counts a try's age from then and a worker's start apart (`RunningJobs.taken`)."""

from __future__ import annotations

import logging
import os
import signal
import sys

import pytest

from service.core.preparation import init_worker
from service.core.workers import WorkerPool, WorkerStartError
from tests.factories.waiting import until
from tests.factories.worker_jobs import pid

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="forkserver: Linux only")


def test_a_try_is_told_when_a_worker_takes_it_idle_or_just_started() -> None:
    with WorkerPool(1, name="taken") as pool:
        told: list[tuple[int, int]] = []

        def taken() -> None:  # what the pool counts then: live workers, busy ones
            told.append((pool._live, len(pool._busy)))

        first = pool.call(pid, (), timeout_s=30, on_taken=taken)
        assert told == [(1, 0)]  # started for it: told once it runs, before it is counted busy
        assert pool.call(pid, (), timeout_s=30, on_taken=taken) == first
        assert told == [(1, 0), (1, 0)]  # the idle worker taken again: told again
        (idle,) = pool._idle
        os.kill(first, signal.SIGKILL)  # killed while idle: the next call starts another, then is told
        until(lambda: not idle.alive(), "the idle worker is dead")
        assert pool.call(pid, (), timeout_s=30, on_taken=taken) != first
        assert len(told) == 3


def test_a_start_that_fails_is_never_told() -> None:
    told: list[None] = []
    broken = WorkerPool(1, name="taken", initializer=init_worker, initargs=("{not a tokenizer",))
    with broken as pool, pytest.raises(WorkerStartError):
        pool.call(pid, (), timeout_s=30, on_taken=lambda: told.append(None))
    assert told == []


def test_a_callback_that_raises_is_logged_and_loses_no_worker(caplog: pytest.LogCaptureFixture) -> None:
    def broken() -> None:
        raise RuntimeError("a broken callback")

    with WorkerPool(1, name="taken") as pool:
        pool.prestart()
        first = pool.call(pid, (), timeout_s=30, on_taken=broken)
        assert pool.call(pid, (), timeout_s=30) == first  # the worker went back to the idle ones
        assert pool.live_workers == 1
    said = [r for r in caplog.records if "on_taken callback raised" in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.ERROR
