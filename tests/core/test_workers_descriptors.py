"""Worker starts that fail for want of file descriptors (EMFILE: a server whose connections took them all)
leave none open behind them, so the pool starts workers again once descriptors are free.

multiprocessing's forkserver start left two descriptors open each time its second pipe could not be made,
and two more, with the child it had forked waiting for good, when its duplicate of the data pipe could not
be made: each leak was for good, and a server that ran out under load a few times kept failing every worker
start (503 for every page, while /ready said 200) after the load had gone. The scenarios run in a process of
their own, whose descriptor limit they lower and fill with real descriptors; the failures are real EMFILEs.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import pytest

from service.core.workers import WorkerPool
from tests.factories.cli import run_python

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="forkserver, /proc: Linux only")

# Shared by the scenarios: the process's descriptors counted, and every free one taken (up to a limit
# lowered just above those open, so that taking them all is quick).
_SETUP = """
import json, os, resource, time
from multiprocessing import forkserver
from service.core.workers import WorkerPool, WorkerStartError
from tests.factories.worker_jobs import pid

def descriptors():
    return len(os.listdir("/proc/self/fd"))

def take_all():
    taken = []
    while True:
        try:
            taken.append(os.open(os.devnull, os.O_RDONLY))
        except OSError:
            return taken

with WorkerPool(1, name="warm") as warm:  # the forkserver and the resource tracker run from here on
    warm.call(pid, (), timeout_s=60)
baseline = descriptors()
highest = max(int(fd) for fd in os.listdir("/proc/self/fd"))
resource.setrlimit(resource.RLIMIT_NOFILE, (highest + 64, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
"""

# A start tried with 0, 1, 2, ... descriptors free: each fails at another step of it (the worker's pipe, the
# forkserver's socket, its first pipe, its second), then the descriptors are freed and a start must succeed.
SCAN = (
    _SETUP
    + """
rounds = []
for free in range(12):
    with WorkerPool(1, name="test") as pool:
        taken = take_all()
        for fd in taken[len(taken) - free:]:
            os.close(fd)
        try:
            pool.call(pid, (), timeout_s=60)
            failed = None
        except WorkerStartError as exc:
            failed = exc.message
        for fd in taken[:len(taken) - free]:
            os.close(fd)
        started = pool.call(pid, (), timeout_s=60) > 0
    rounds.append({"free": free, "failed": failed, "started": started, "left open": descriptors() - baseline})
print(json.dumps(rounds))
"""
)

# Every descriptor taken right after the forkserver took the start (`connect_to_new_process` returned):
# the launch fails making its duplicate of the data pipe, after the forkserver forked the worker's process.
LAUNCH_FAILS = (
    _SETUP
    + """
taken = []
connect = forkserver.connect_to_new_process

def connect_then_take_all(fds):
    pipes = connect(fds)
    taken.extend(take_all())
    return pipes

forkserver.connect_to_new_process = connect_then_take_all
with WorkerPool(1, name="test") as pool:
    try:
        pool.call(pid, (), timeout_s=60)
        failed = None
    except WorkerStartError as exc:
        failed = exc.message
    forkserver.connect_to_new_process = connect
    for fd in taken:
        os.close(fd)
    worker = pool.call(pid, (), timeout_s=60)
    server = forkserver._forkserver._forkserver_pid
    deadline = time.monotonic() + 10  # a bound: the process whose data pipe closed ends at once
    while True:
        with open(f"/proc/{server}/task/{server}/children") as children:
            forked = [int(child) for child in children.read().split()]
        if forked == [worker] or time.monotonic() > deadline:
            break
        time.sleep(0.01)
left_open = descriptors() - baseline
print(json.dumps({"failed": failed, "worker": worker, "forked": forked, "left open": left_open}))
"""
)


def _run(script: str) -> Any:
    """Run `script` in a process of its own (the forkserver, workers and descriptor limit its own); what it
    printed last, as JSON."""
    proc = run_python(script)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout.splitlines()[-1])


def test_starts_failing_for_want_of_descriptors_leave_none_open_and_the_pool_starts_workers_again() -> None:
    """The review's repro, in one process: each start tried with fewer descriptors free than it needs
    fails (`WorkerStartError`), then, descriptors free again, the pool starts its worker, and the process
    holds as many descriptors as before. A start that failed at the forkserver's second pipe had left two
    open each time (the first pipe's two ends), for good."""
    rounds = _run(SCAN)
    assert all(round_["started"] for round_ in rounds), rounds
    failed = [round_["free"] for round_ in rounds if round_["failed"]]
    assert failed == list(range(len(failed))) and len(failed) >= 5, rounds  # as few free as failed ever
    assert "too many open files: the limit is" in rounds[0]["failed"], rounds  # and how to raise it
    assert [round_["left open"] for round_ in rounds] == [0] * len(rounds), rounds


def test_a_launch_that_fails_after_the_forkserver_forked_leaves_no_descriptor_and_no_process() -> None:
    """Out of descriptors right after the forkserver took the start, multiprocessing left its status pipe
    and its data pipe open, and the process the forkserver had forked waited on that data pipe for good
    (a process per such start, for the server's life). Both pipes are closed: that process ends, and the
    forkserver's only child is the worker started once descriptors were free again."""
    seen = _run(LAUNCH_FAILS)
    assert "could not be launched: too many open files: the limit is" in (seen["failed"] or ""), seen
    assert seen["left open"] == 0, seen
    assert seen["forked"] == [seen["worker"]], seen


def test_a_killed_worker_still_referenced_holds_no_descriptor() -> None:
    """A worker the pool killed, but that something still names (an exception's traceback in a reference
    cycle, which a serving process may not collect for hours), kept its process's status pipe and the
    duplicate of its data pipe open until collected. The pool closes them with the rest of the worker."""
    with WorkerPool(1, name="test") as pool:
        pool.prestart()
        (worker,) = pool._idle
        pipes = {os.readlink(f"/proc/self/fd/{worker.process.sentinel}")}
    assert worker.pid is not None
    open_now = {os.readlink(f"/proc/self/fd/{fd}") for fd in _descriptors()}
    assert not pipes & open_now, (pipes, open_now)


def _descriptors() -> list[int]:
    fds = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # the listing's own
            continue
        fds.append(int(fd))
    return fds
