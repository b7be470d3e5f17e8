"""A server that is a container's PID 1 (the image runs it so) inherits the workers of a forkserver that
died (the kernel's OOM killer): each that died after it stayed a zombie for good, since multiprocessing
never waits for a forkserver's worker, and its exit status read 255 while the kernel held the real one.
The pool reaps such a worker when it reaps it as its own. Real processes: a subreaper stands for PID 1."""

from __future__ import annotations

import json
import signal
import sys

import pytest

from tests.factories.cli import run_python

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="subreapers, pidfds: Linux")

# It becomes a subreaper, starts a pool (its forkserver is its own), kills the forkserver and then the
# idle worker, and asks the pool again: the dead worker is found and replaced. It prints the exit code the
# pool logged for it and the zombies left among its children.
SUBREAPER_CHILD = r"""
import ctypes, json, logging, os, signal, time
from service.core.workers import WorkerPool

def children(state):
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = open(f"/proc/{entry}/stat").read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == os.getpid() and fields[0] in state:
                found.append(int(entry))
    return found

def exited(pid):
    return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None

PR_SET_CHILD_SUBREAPER = 36
assert ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
codes = []
logging.getLogger("service.core.workers").addHandler(logging.Handler())
logging.getLogger("service.core.workers").handlers[0].emit = lambda record: codes.append(record.args[2])
with WorkerPool(1, name="orphans") as pool:
    worker = pool.call(os.getpid, (), timeout_s=60)
    from multiprocessing import forkserver
    server = forkserver._forkserver._forkserver_pid
    os.kill(server, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while not exited(server):
        assert time.monotonic() < deadline
        time.sleep(0.005)
    os.kill(worker, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while worker not in children("Z"):  # an orphan now, this subreaper's
        assert time.monotonic() < deadline
        time.sleep(0.005)
    replaced = pool.call(os.getpid, (), timeout_s=60)  # finds it dead; its next start reaps the forkserver
    zombies = children("Z")
print(json.dumps({"replaced": replaced != worker, "codes": codes, "zombies": zombies}))
"""


def test_a_worker_orphaned_by_its_dead_forkserver_is_reaped_with_its_real_exit_code() -> None:
    done = run_python(SUBREAPER_CHILD, timeout_s=120)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen == {"replaced": True, "codes": [-signal.SIGKILL], "zombies": []}, done.stderr
