"""A start that cannot reach a forkserver that a start before ran out of file descriptors with names the
limit in its warning.

A start out of descriptors that reached its forkserver ends it (`forkserver_exit`), and the next start
meets it gone: its warning said only `ConnectionRefusedError: [Errno 111] Connection refused; trying once
more, from a new forkserver`, nothing of the limit, which is what to act on. The descriptors run out for
real, in a process of its own with a low `RLIMIT_NOFILE`; the forkserver is then made unreachable for
certain (its socket deleted, as a /tmp cleaner does) rather than left to end, which it does at its own pace.
"""

from __future__ import annotations

import sys

import pytest

from tests.factories.cli import run_python

LIMIT = 128

_SCRIPT = f"""
import logging, os, resource, shutil
from service.core.processes import forkserver_in_use, worker_context
from service.core.workers import WorkerPool
from tests.factories.worker_jobs import add

logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
resource.setrlimit(resource.RLIMIT_NOFILE, ({LIMIT}, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))


def unreachable():
    shutil.rmtree(os.path.dirname(forkserver_in_use(worker_context(()))))


with WorkerPool(1, name="first") as pool:
    pool.call(add, (1, 2), timeout_s=60)
unreachable()  # (no start ran out of descriptors with it)
with WorkerPool(1, name="control") as pool:
    print("started", pool.call(add, (1, 2), timeout_s=60), flush=True)
held = []
try:
    while True:
        held.append(os.open(os.devnull, os.O_RDONLY))
except OSError:
    pass
with WorkerPool(1, name="short") as pool:
    try:
        pool.call(add, (1, 2), timeout_s=60)
    except Exception as exc:
        print("refused", exc, flush=True)
for fd in held:
    os.close(fd)
unreachable()
with WorkerPool(1, name="again") as pool:
    print("started", pool.call(add, (1, 2), timeout_s=60), flush=True)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="forkserver: Linux only")
def test_a_start_that_cannot_reach_a_forkserver_short_of_descriptors_names_the_limit() -> None:
    proc = run_python(_SCRIPT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.splitlines()[0] == "started 3" and proc.stdout.splitlines()[-1] == "started 3"
    assert "refused short worker could not be launched: too many open files" in proc.stdout, proc.stdout
    warnings = {
        name: [line for line in proc.stderr.splitlines() if line.startswith(f"WARNING {name} worker")]
        for name in ("control", "again")
    }
    limit = f"the limit is {LIMIT} open files (RLIMIT_NOFILE)"
    (control,) = warnings["control"]
    assert "FileNotFoundError" in control and "from a new forkserver" in control and limit not in control
    (again,) = warnings["again"]
    assert again.startswith("WARNING again worker could not be launched: FileNotFoundError: "), again
    reached = "a start before ran out of file descriptors, which ends the forkserver it reached"
    assert f"({reached}: {limit}" in again, again
    assert again.endswith("; trying once more, from a new forkserver"), again
