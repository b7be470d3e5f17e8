"""A worker start out of file descriptors is one line naming the limit and how to raise it.

It had said `OSError: [Errno 24] Too many open files` (or, once its forkserver had died of the start,
`ConnectionRefusedError`), and the forkserver, which CPython ends whenever a client hangs up unsent (a
start that could not make its second pipe), printed a raw traceback of its own. The descriptors run out
for real: in a process of its own, with a low `RLIMIT_NOFILE`, all of them taken, then a few let go before
each start, so that each of the steps of a start is the one that fails in turn.
"""

from __future__ import annotations

import sys

import pytest

from tests.factories.cli import run_python

LIMIT = 128

_SCRIPT = f"""
import logging, os, resource
from service.core.workers import WorkerPool
from tests.factories.worker_jobs import add

logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
resource.setrlimit(resource.RLIMIT_NOFILE, ({LIMIT}, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
with WorkerPool(1, name="first") as first:
    first.call(add, (1, 2), timeout_s=60)  # the forkserver and the resource tracker run
for free in range(12):
    held = []
    try:
        while True:
            held.append(os.open(os.devnull, os.O_RDONLY))
    except OSError:
        pass
    for fd in held[:free]:
        os.close(fd)
    pool = WorkerPool(1, name="free%d" % free)
    try:
        print("started", free, pool.call(add, (1, 2), timeout_s=60), flush=True)
    except Exception as exc:
        print("refused", free, exc, flush=True)
    pool.close()
    for fd in held[free:]:
        os.close(fd)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="forkserver: Linux only")
def test_a_start_out_of_descriptors_is_one_line_with_the_limit_and_no_traceback() -> None:
    proc = run_python(_SCRIPT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    limit = f"the limit is {LIMIT} open files (RLIMIT_NOFILE): raise it with `ulimit -n`"
    refused = [line for line in proc.stdout.splitlines() if line.startswith("refused")]
    assert refused, proc.stdout
    for line in refused:  # each names the limit first, whatever a retry then met
        assert f"worker could not be launched: too many open files: {limit}" in line, line
    # The start that reached the forkserver before it ran out ended it: one line says so, not a traceback.
    ended = [line for line in proc.stderr.splitlines() if "forkserver" in line and "exits" in line]
    assert ended and all(limit in line for line in ended), proc.stderr
    # Once descriptors are free again, workers start (from a new forkserver where the old one ended).
    assert proc.stdout.splitlines()[-1] == "started 11 3", proc.stdout
