"""A forkserver that died (the kernel's OOM killer, a `kill -9`) before multiprocessing replaced it: no
exit status of a worker it forked can be read any more (each reads 255), and multiprocessing read its live
workers as dead too. A worker of it killed holding a page was that page's crash (a 422
`preprocess_failed`, "crashed its preprocessing process (exit code 255)"), each idle worker was "found
dead" and replaced, and the pool's own kills sent nothing. The forkserver, the workers and the kills are
real; each test kills a forkserver of its own (`restart_forkserver` first), whose workers are its own."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import sys
import threading
import time
from multiprocessing import forkserver
from pathlib import Path
from typing import Any

import pytest

from service.core import workers
from service.core.processes import forkserver_in_use, forkserver_lost, restart_forkserver, worker_context
from service.core.worker_health import IDLE_DIED, LOST_STATUS, STALLED, TIME_LIMIT
from service.core.workers import WorkerPool, WorkerStartError, WorkerTimeoutError
from tests.factories.worker_jobs import orphaned_while_starting, pid, pid_of_page, spin

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="forkserver: Linux only")


def _forkserver_pid() -> int:
    pid: int = forkserver._forkserver._forkserver_pid  # type: ignore[attr-defined]
    return pid


def _own_forkserver() -> int:
    """A forkserver of this test's own: the workers it forks are the test's alone."""
    ctx = worker_context(())
    restart_forkserver(ctx, forkserver_in_use(ctx))
    with WorkerPool(1, name="starter") as starter:
        starter.call(pid, (), timeout_s=60)
    return _forkserver_pid()


def _kill_forkserver(server: int) -> None:
    """SIGKILL it and wait until it has exited, left unreaped: multiprocessing reaps it at the next start."""
    os.kill(server, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while os.waitid(os.P_PID, server, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
        assert time.monotonic() < deadline, "the forkserver did not die"
        time.sleep(0.005)


def _running(pid: int) -> bool:
    """Whether `pid` runs (not exited, a zombie not counted): /proc's state."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] not in "ZX"
    except OSError:
        return False


def test_a_worker_killed_holding_a_page_after_its_forkserver_died_is_lost_and_the_page_runs_again(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The review's repro: the worker stopped, the page sent, the forkserver killed, then the worker. Its
    exit status reads 255 and says nothing of the page: a lost worker (`lost_status`), its page run again
    in a fresh worker forked by a new forkserver, and the warning says the status is unknown."""
    server = _own_forkserver()
    reasons: list[str] = []
    with WorkerPool(1, name="test", lost_worker_retries=1, on_replaced=reasons.append) as pool:
        first = pool.call(pid, (), timeout_s=60)
        killed: list[int] = []
        holder = threading.local()
        exchange, send = WorkerPool._exchange, workers._send_job

        def exchange_noting(self: WorkerPool, worker: Any, *args: Any) -> tuple[Any, ...]:
            holder.worker = worker
            return exchange(self, worker, *args)

        def send_then_kill_both(conn: Any, job: bytes | memoryview) -> None:
            if killed or b"killed under this page" not in bytes(job):
                send(conn, job)
                return
            worker = holder.worker.process.pid
            os.kill(worker, signal.SIGSTOP)  # it holds the page unanswered
            send(conn, job)
            _kill_forkserver(server)
            os.kill(worker, signal.SIGKILL)
            killed.append(worker)

        monkeypatch.setattr(WorkerPool, "_exchange", exchange_noting)
        monkeypatch.setattr(workers, "_send_job", send_then_kill_both)
        with caplog.at_level(logging.WARNING, logger="service.core.workers"):
            second = pool.call(pid_of_page, ("killed under this page",), timeout_s=60)
        assert killed == [first] and second not in (first, 0)
        assert _forkserver_pid() != server  # the retry's worker, from a new forkserver
        assert pool.call(pid, (), timeout_s=60) == second
    assert reasons == [LOST_STATUS]
    messages = [record.getMessage() for record in caplog.records]
    assert any(
        f"the test worker {first} died while it held a job (exit code 255: its exit status is unknown" in m
        for m in messages
    ), messages


def test_idle_workers_serve_on_after_their_forkserver_died_and_a_dead_one_is_told_unknown(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Live workers of a dead forkserver are not dead: they take the next pages, no warning, no
    replacement. Those killed while idle afterwards are found dead, their status named unknown (not "exit
    code 255" as if of their own), and replaced by a worker of a new forkserver."""
    server = _own_forkserver()
    reasons: list[str] = []
    with WorkerPool(2, name="test", on_replaced=reasons.append) as pool:
        pool.prestart()
        started = {worker.pid for worker in pool._idle if worker.pid is not None}
        assert len(started) == 2
        _kill_forkserver(server)
        with caplog.at_level(logging.WARNING, logger="service.core.workers"):
            served = {pool.call(pid, (), timeout_s=60) for _ in range(4)}
            assert served <= started and reasons == [], (served, started, reasons)
            assert not caplog.records, [record.getMessage() for record in caplog.records]
            for victim in started:
                os.kill(victim, signal.SIGKILL)
            while any(_running(victim) for victim in started):
                time.sleep(0.005)
            replacement = pool.call(pid, (), timeout_s=60)
        assert replacement not in started and _forkserver_pid() != server
        assert pool.live_workers == 1
    assert reasons == [IDLE_DIED, IDLE_DIED]
    messages = [record.getMessage() for record in caplog.records]
    for victim in started:
        assert any(
            f"the idle test worker {victim} died (exit code 255: its exit status is unknown" in m
            for m in messages
        ), messages


def test_a_worker_of_a_dead_forkserver_past_its_time_limit_is_killed() -> None:
    """multiprocessing counted it exited (255), so its kill sent nothing: the page went on burning a core
    after its 422, for as long as it ran. The pool kills it through its pidfd."""
    server = _own_forkserver()
    reasons: list[str] = []
    with WorkerPool(1, name="test", on_replaced=reasons.append) as pool:
        worker = pool.call(pid, (), timeout_s=60)
        _kill_forkserver(server)
        with pytest.raises(WorkerTimeoutError):
            pool.call(spin, (30,), timeout_s=0.3)
        assert _ended(worker), "the worker past its time limit was not killed"
        assert reasons in ([TIME_LIMIT], [STALLED])
        assert pool.call(pid, (), timeout_s=60) not in (worker, 0)


def _ended(worker: int) -> bool:
    """Whether `worker` has ended within 3 s; one still running is killed, for the test to end."""
    deadline = time.monotonic() + 3
    while _running(worker) and time.monotonic() < deadline:
        time.sleep(0.01)
    if _running(worker):
        os.kill(worker, signal.SIGKILL)
        return False
    return True


def test_forkserver_lost_reads_a_dead_forkserver_without_reaping_it() -> None:
    """It asks without reaping (`WNOWAIT`): multiprocessing's own `ensure_running` reaps the dead
    forkserver, and a start after a reap elsewhere failed on its `waitpid` (ChildProcessError)."""
    server = _own_forkserver()
    ctx = worker_context(())
    assert not forkserver_lost(ctx, server)
    _kill_forkserver(server)
    assert forkserver_lost(ctx, server) and forkserver_lost(ctx, server)
    assert os.waitid(os.P_PID, server, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None  # still unreaped
    with WorkerPool(1, name="test") as pool:
        assert pool.call(pid, (), timeout_s=60) > 0
    assert _forkserver_pid() != server
    assert forkserver_lost(ctx, server)  # replaced, reaped: still lost


def test_a_worker_whose_forkserver_died_before_it_was_ready_is_killed_when_its_start_fails(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Its forkserver killed while the worker started, multiprocessing read the worker as exited (255), so
    the kill of a start past its time limit sent nothing (its pidfd was opened only once it was ready), and
    the worker, stuck starting, lived on as an orphan. It is killed through a pidfd opened at its start."""
    _own_forkserver()
    monkeypatch.setattr(workers, "STARTUP_TIMEOUT_S", 1.0)
    pid_file = tmp_path / "worker.pid"
    pool = WorkerPool(1, name="test", initializer=orphaned_while_starting, initargs=(str(pid_file),))
    with pool, pytest.raises(WorkerStartError, match="did not start within"):
        pool.call(pid, (), timeout_s=60)
    worker = int(pid_file.read_text())
    assert _ended(worker), "the worker whose start failed lives on"
    assert pool.live_workers == 0


def test_a_start_whose_forkserver_dies_under_it_is_tried_again_from_a_new_forkserver(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A client that hangs up before asking for a process ends CPython's forkserver, as each start that
    failed for want of descriptors did. A start queued behind it failed (EOFError: no pid), and the one
    tried again at once reached the forkserver still exiting (ConnectionRefusedError): the first page after
    the descriptors were free again failed too. The start is tried again from a new forkserver. The
    forkserver is stopped until the start is queued behind the client that hung up."""
    server = _own_forkserver()
    address = forkserver_in_use(worker_context(()))
    assert isinstance(address, str)
    read_signed = forkserver.read_signed
    queued: list[int] = []

    def go_on_then_read(fd: int) -> int:
        if not queued:
            queued.append(fd)
            os.kill(server, signal.SIGCONT)  # it takes the client that hung up first, and dies of it
        value: int = read_signed(fd)
        return value

    os.kill(server, signal.SIGSTOP)
    try:
        with socket.socket(socket.AF_UNIX) as hung_up:
            hung_up.connect(address)
        monkeypatch.setattr(forkserver, "read_signed", go_on_then_read)
        with WorkerPool(1, name="test") as pool, caplog.at_level(logging.WARNING, "service.core.workers"):
            started = pool.call(pid, (), timeout_s=60)
    finally:
        with contextlib.suppress(ProcessLookupError):  # not let go (the test failed first): its end
            os.kill(server, signal.SIGCONT)
    assert queued and started > 0 and _forkserver_pid() != server
    messages = [record.getMessage() for record in caplog.records]
    assert any("could not be launched: EOFError" in m and "new forkserver" in m for m in messages), messages
