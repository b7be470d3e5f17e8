"""A forkserver that can no longer start workers is replaced: a /tmp cleaner (systemd-tmpfiles,
tmpreaper) that deleted its socket had left a long-running server unable to start any worker again."""

from __future__ import annotations

import logging
import multiprocessing
import os
import resource
import shutil
import signal
import sys
import time
from multiprocessing import forkserver

import pytest

from service.core.processes import forkserver_in_use, restart_forkserver, worker_context
from service.core.workers import WorkerPool, WorkerStartError

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="forkserver: Linux only")


def pid() -> int:
    return os.getpid()


def _forkserver_pid() -> int | None:
    pid: int | None = getattr(forkserver._forkserver, "_forkserver_pid", None)
    return pid


def _delete_the_forkserver_socket() -> str:
    """What a /tmp cleaner does to a long-running server: the forkserver's socket and its directory
    (/tmp/pymp-*/listener-*) deleted; the forkserver itself runs on. Returns the deleted address."""
    address = forkserver_in_use(worker_context(()))
    assert isinstance(address, str) and os.path.exists(address)
    shutil.rmtree(os.path.dirname(address))
    return address


def test_a_worker_starts_again_after_the_forkserver_socket_was_deleted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The repro: socket deleted, then the worker dies (the OOM killer). Every later start had failed
    with a bare FileNotFoundError (a 500 `internal_error` for every page) until the forkserver was
    killed by hand; the pool starts a new forkserver and the job runs. A worker of the old forkserver
    (another pool's) serves on meanwhile, and the old forkserver exits and is reaped after it."""
    with WorkerPool(1, name="other") as other, WorkerPool(1, name="test") as pool:
        old_worker = other.call(pid, (), timeout_s=60)
        first = pool.call(pid, (), timeout_s=60)
        old_server = _forkserver_pid()
        deleted = _delete_the_forkserver_socket()
        os.kill(first, signal.SIGKILL)
        while pool._idle[0].process.is_alive():
            time.sleep(0.01)
        with caplog.at_level(logging.WARNING, logger="service.core.workers"):
            second = pool.call(pid, (), timeout_s=60)
        assert second not in (first, old_worker)
        assert _forkserver_pid() not in (None, old_server)
        assert os.path.isdir(os.path.dirname(deleted))  # made again, for the new forkserver's socket
        messages = [record.getMessage() for record in caplog.records]
        assert any(f"the idle test worker {first} died (exit code -9, SIGKILL" in m for m in messages)
        assert any(
            "could not be launched: FileNotFoundError" in m and "new forkserver" in m for m in messages
        )
        assert other.call(pid, (), timeout_s=60) == old_worker  # forked by the old forkserver, still serving
        assert pool.call(pid, (), timeout_s=60) == second
    assert old_server is not None
    if _children(old_server):  # workers an earlier test left running hold it: it outlives them
        return
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and os.path.exists(f"/proc/{old_server}"):
        time.sleep(0.05)  # its last worker closed: it exits, and the reaper thread leaves no zombie
    assert not os.path.exists(f"/proc/{old_server}")


def _children(pid: int) -> list[str]:
    """The processes `pid` forked that still run (or exited unreaped); [] where the kernel does not say."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as children:
            return children.read().split()
    except OSError:
        return []


def test_only_the_forkserver_that_failed_is_forgotten() -> None:
    """Threads whose starts failed together restart it once: one that saw the old forkserver does not
    forget the new one another thread has launched meanwhile."""
    ctx = worker_context(())
    with WorkerPool(1, name="test") as pool:
        pool.call(pid, (), timeout_s=60)
        running = _forkserver_pid()
        assert not restart_forkserver(ctx, "/tmp/pymp-gone/listener-gone")
        assert _forkserver_pid() == running
        assert not restart_forkserver(multiprocessing.get_context("spawn"), forkserver_in_use(ctx))
        assert _forkserver_pid() == running
        assert pool.call(pid, (), timeout_s=60) > 0


def test_a_worker_that_cannot_be_launched_is_a_start_error_and_gives_its_place_back() -> None:
    """Out of file descriptors, a worker's pipe could not be made: a bare OSError (a 500
    `internal_error`). A `WorkerStartError` now (after a second try), the pool left as it was, and the
    next call, with descriptors to spare, has its worker."""
    with WorkerPool(1, name="test") as pool:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        lowest_free = os.open(os.devnull, os.O_RDONLY)
        os.close(lowest_free)
        resource.setrlimit(resource.RLIMIT_NOFILE, (lowest_free, hard))  # no descriptor can be made
        try:
            with pytest.raises(WorkerStartError, match=r"could not be launched: OSError: \[Errno 24\]"):
                pool.call(pid, (), timeout_s=60)
        finally:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        assert pool.live_workers == 0
        assert pool.call(pid, (), timeout_s=60) > 0
