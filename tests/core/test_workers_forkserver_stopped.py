"""A stopped forkserver (SIGSTOP: a debugger's, an operator's; a frozen cgroup) left a worker's start waiting
for good for the pid of the process it had asked for (CPython's `forkserver.read_signed` has no timeout): the
pool's thread hung, and with it every later start behind the place it held. The start is bounded
(`service.core.processes.forkserver_deadline`): past it the forkserver is forgotten and killed, and the start
is tried again from a new one. The forkserver, its stop and its kill are real; it is one of the test's own
(`restart_forkserver` first)."""

from __future__ import annotations

import contextlib
import logging
import os
import select
import signal
import sys
import threading
from collections.abc import Iterator
from multiprocessing import forkserver
from multiprocessing.context import BaseContext
from typing import Any

import pytest

from service.core import processes, workers
from service.core.processes import ForkserverDeadline, forkserver_in_use, restart_forkserver, worker_context
from service.core.workers import WorkerPool
from tests.factories.waiting import until
from tests.factories.worker_jobs import pid

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="forkserver: Linux only")

# The first start's deadline, short so that the test need not wait the real one (two minutes) out; later
# starts keep the real one. A bound the stopped forkserver always passes, not a timing.
_FIRST_DEADLINE_S = 0.5


def _forkserver_pid() -> int | None:
    server: int | None = getattr(forkserver._forkserver, "_forkserver_pid", None)
    return server


def _own_forkserver() -> int:
    """A forkserver of this test's own: the workers it forks are the test's alone."""
    ctx = worker_context(())
    restart_forkserver(ctx, forkserver_in_use(ctx))
    with WorkerPool(1, name="starter") as starter:
        starter.call(pid, (), timeout_s=60)
    server = _forkserver_pid()
    assert server is not None
    return server


def _exited(pidfd: int) -> bool:
    """Whether the process of `pidfd` has exited (a zombie included), asked without waiting."""
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    return bool(poller.poll(0))


def _next_deadline_short(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The pool's next start under a deadline of `_FIRST_DEADLINE_S`, later ones under theirs; the deadlines
    each start got."""
    given: list[float] = []
    real = processes.forkserver_deadline

    @contextlib.contextmanager
    def first_short(ctx: BaseContext, timeout_s: float) -> Iterator[ForkserverDeadline]:
        given.append(_FIRST_DEADLINE_S if not given else timeout_s)
        with real(ctx, given[-1]) as watch:
            yield watch

    monkeypatch.setattr(workers, "forkserver_deadline", first_short)
    return given


def test_a_start_a_stopped_forkserver_never_answers_is_abandoned_and_tried_again_from_a_new_one(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The review's repro: the forkserver SIGSTOPped, then a worker started. The start had waited for
    good; it ends, the stopped forkserver is killed (not left stopped, nor a zombie), the job runs in a
    worker of a new forkserver, and the warning names what happened."""
    server = _own_forkserver()
    pidfd = os.pidfd_open(server)  # its kill and its end are asked of the process itself, never a reused pid
    deadlines = _next_deadline_short(monkeypatch)
    outcome: dict[str, Any] = {}
    pool = WorkerPool(1, name="test")

    def start() -> None:
        try:
            outcome["worker"] = pool.call(pid, (), timeout_s=60)
        except BaseException as exc:  # the test's thread reports it
            outcome["error"] = exc

    starting = threading.Thread(target=start, name="test-start", daemon=True)
    try:
        os.kill(server, signal.SIGSTOP)
        with caplog.at_level(logging.WARNING, logger="service.core.workers"):
            starting.start()
            until(
                lambda: not starting.is_alive(), "the start behind the stopped forkserver ended", bound_s=60
            )
        assert "error" not in outcome, outcome
        assert outcome["worker"] > 0
        assert _forkserver_pid() not in (None, server)  # the retry's worker, from a new forkserver
        until(lambda: _exited(pidfd), "the stopped forkserver was killed", bound_s=30)
        assert pool.call(pid, (), timeout_s=60) == outcome["worker"]  # the new worker serves on
    finally:
        # Not ended by the pool (the test failed first): its end, which also ends a start still waiting.
        with contextlib.suppress(ProcessLookupError):
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        if starting.is_alive():
            starting.join(30)
        pool.close()
        os.close(pidfd)
    assert deadlines == [_FIRST_DEADLINE_S, workers.STARTUP_TIMEOUT_S]  # the retry had the real one
    messages = [record.getMessage() for record in caplog.records]
    assert any(
        f"test worker could not be launched: its forkserver {server} did not answer within 0.5 s (stopped?)"
        " and was killed; trying once more, from a new forkserver" in message
        for message in messages
    ), messages


def test_a_start_the_forkserver_answers_in_time_leaves_it_running() -> None:
    """The deadline is over with the start: a forkserver that answered is neither forgotten nor killed once
    its time has passed (the timer is cancelled, and one that fires late finds the start over)."""
    server = _own_forkserver()
    ctx = worker_context(())
    with WorkerPool(1, name="test") as pool:
        pool.call(pid, (), timeout_s=60)
        with processes.forkserver_deadline(ctx, 60.0) as watch:
            pass
        watch._expire(forkserver_in_use(ctx))  # as a timer that fired just after the start was over
        assert watch.abandoned is None
        assert _forkserver_pid() == server
        assert pool.call(pid, (), timeout_s=60) > 0
    assert _forkserver_pid() == server
