"""A forkserver that can no longer start workers is replaced: a /tmp cleaner (systemd-tmpfiles,
tmpreaper) that deleted its socket had left a long-running server unable to start any worker again."""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import resource
import shutil
import signal
import subprocess
import sys
import time
from multiprocessing import forkserver
from pathlib import Path

import pytest

from service.core.processes import forkserver_in_use, restart_forkserver, worker_context
from service.core.workers import WorkerDiedError, WorkerLostError, WorkerPool, WorkerStartError
from tests.factories.cli import ROOT, cli_env

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
            with pytest.raises(WorkerStartError, match=r"launched: too many open files: the limit is"):
                pool.call(pid, (), timeout_s=60)
        finally:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        assert pool.live_workers == 0
        assert pool.call(pid, (), timeout_s=60) > 0


# A process group of its own whose leader, standing in for the server (it takes the signals and lives on),
# runs two worker pools, forgets the forkserver between their starts (`restart_forkserver`), then signals
# the whole group as a terminal's hang-up and Ctrl-C do, then as a group's SIGTERM does.
GROUP_SIGNALLED = """
import json, os, signal, sys
from multiprocessing import forkserver, resource_tracker
from service.core.processes import forkserver_in_use, restart_forkserver
from service.core.workers import WorkerPool

def pid():
    return os.getpid()

def said(pid):
    status = open(f"/proc/{pid}/status").read()
    fields = dict(line.split(":", 1) for line in status.splitlines())
    held = int(fields["SigBlk"], 16) | int(fields["SigIgn"], 16)
    return [sig.name for sig in (signal.SIGHUP, signal.SIGINT, signal.SIGTERM) if held & 1 << sig - 1]

if __name__ == "__main__":
    os.setsid()
    for sig in (signal.SIGHUP, signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: None)
    seen = {}
    # The second pool runs a job again in a fresh worker should the SIGTERM kill its worker only once it
    # holds the job, not while it is idle.
    with WorkerPool(1, name="first") as first, WorkerPool(1, name="second", lost_worker_retries=1) as second:
        seen["first"] = first.call(pid, (), timeout_s=60)
        seen["tracker"] = resource_tracker._resource_tracker._pid
        restart_forkserver(first._ctx, forkserver_in_use(first._ctx))
        seen["second"] = second.call(pid, (), timeout_s=60)  # from a new forkserver
        forkserver_pid = forkserver._forkserver._forkserver_pid
        os.killpg(0, signal.SIGHUP)
        os.killpg(0, signal.SIGINT)
        # Each answers after the signals were sent, which a process they ended could not.
        seen["first after"] = first.call(pid, (), timeout_s=60)
        seen["second after"] = second.call(pid, (), timeout_s=60)
        seen["tracker holds"] = said(seen["tracker"])
        os.killpg(0, signal.SIGTERM)
        seen["second after SIGTERM"] = second.call(pid, (), timeout_s=60)  # a new worker, if need be
        seen["forkserver kept"] = forkserver._forkserver._forkserver_pid == forkserver_pid
        seen["tracker after SIGTERM"] = said(seen["tracker"])
    print(json.dumps(seen))
"""


def test_workers_their_forkserver_and_the_resource_tracker_outlive_the_signals_to_the_group(
    tmp_path: Path,
) -> None:
    """A terminal's hang-up (or an SSH session's) reaches every process of its group: the preprocessing
    and extractor processes, the forkserver and the resource tracker had died of it, and the pages they
    held failed as crashes while the server drained. They ignore it (and Ctrl-C) now, the forkserver
    started again after `restart_forkserver` too. A group's SIGTERM (systemd's stop) still ends a worker,
    as a `kill` does (multiprocessing's exit ends daemonic workers so, and the pool tells such a death
    from a crash), but neither the forkserver nor the tracker: a new worker is forked at once."""
    script = tmp_path / "group.py"  # a file: a worker imports the main module of a script
    script.write_text(GROUP_SIGNALLED)
    env = cli_env()
    proc = subprocess.run(
        [sys.executable, str(script)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    seen = json.loads(proc.stdout.splitlines()[-1])
    assert seen["first after"] == seen["first"] and seen["second after"] == seen["second"], seen
    assert "SIGHUP" in seen["tracker holds"], seen
    assert seen["forkserver kept"], seen
    assert seen["tracker after SIGTERM"] == seen["tracker holds"], seen
    assert seen["second after SIGTERM"] not in (seen["second"], None), seen  # that one ended; a new one
    assert "SIGHUP" not in proc.stderr and "SIGINT" not in proc.stderr, proc.stderr


def pid_of_page(page: str) -> int:
    return os.getpid()


def test_a_worker_of_a_replaced_forkserver_killed_holding_a_job_is_lost_not_the_jobs_crash(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A worker forked by a forkserver that `restart_forkserver` has since forgotten serves on; killed
    from outside while it holds a job (the OOM killer), it was the last process holding that forkserver,
    which exited first and so never told its exit status: 255, read as the page's crash (a 422
    `extraction_failed`) where a kill is a lost worker, its job run again in a fresh worker."""
    from tests.factories.worker_kills import kill_workers_holding

    ctx = worker_context(())
    restart_forkserver(ctx, forkserver_in_use(ctx))  # one of the test's own: its worker, its only child
    with WorkerPool(1, name="test", lost_worker_retries=1) as pool:
        first = pool.call(pid, (), timeout_s=60)
        old_server = _forkserver_pid()
        assert restart_forkserver(ctx, forkserver_in_use(ctx))
        killed = kill_workers_holding(monkeypatch, b"killed under this page", kills=1)
        with caplog.at_level(logging.WARNING, logger="service.core.workers"):
            second = pool.call(pid_of_page, ("killed under this page",), timeout_s=60)
        assert killed == [first] and second not in (first, 0)
        assert _forkserver_pid() not in (None, old_server)  # the retry's worker, from the new forkserver
        messages = [record.getMessage() for record in caplog.records]
        assert any(
            f"the test worker {first} died while it held a job (exit code 255: its exit status is unknown"
            in m
            for m in messages
        ), messages


def exit_255() -> None:
    os._exit(255)


def test_a_worker_of_the_forkserver_in_use_that_exits_255_holding_a_job_is_the_jobs_crash() -> None:
    """Only a replaced forkserver loses its worker's exit status: 255 from a worker of the one in use is
    the worker's own (a job's `sys.exit(-1)`), the job's doing, and not run again."""
    with WorkerPool(1, name="test", lost_worker_retries=1) as pool:
        with pytest.raises(WorkerDiedError) as died:
            pool.call(exit_255, (), timeout_s=60)
        assert died.value.exit_code == 255 and not isinstance(died.value, WorkerLostError)
