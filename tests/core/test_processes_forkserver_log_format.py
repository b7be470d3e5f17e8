"""The workers' forkserver writes its one-line end in the format of the server's log lines.

Under JSON logs (`HTMLLM_LOG_FORMAT=json`, or `--log-format json`, which the environment does not show),
its line had been plain text in a stream of JSON objects: it is a fresh interpreter that runs none of the
server's logging set-up. It is now told the format at its launch (`start_forkserver`) and writes the same
object as the server's lines (`service.core.log_lines`). Its end is made for real, in a process of its
own: a client that hangs up unsent, as a start out of file descriptors does, ends it.
"""

from __future__ import annotations

import json
import sys

import pytest

from tests.factories.cli import run_python

_SCRIPT = """
import os, socket, sys
from multiprocessing import forkserver
from service.api.logs import configure_logging
from service.core.workers import WorkerPool
from tests.factories.worker_jobs import add

configure_logging("warning", sys.argv[1])  # (as the server's flag or settings do, not the environment)
with WorkerPool(1, name="first") as pool:
    pool.call(add, (1, 2), timeout_s=60)
    server = forkserver._forkserver
    pid = server._forkserver_pid
    with socket.socket(socket.AF_UNIX) as client:  # a start abandoned unsent: the forkserver ends
        client.connect(server._forkserver_address)
    os.waitpid(pid, 0)
    print("ended", pid, flush=True)
"""


def _forkserver_end(log_format: str) -> tuple[int, list[str]]:
    """The pid of a forkserver ended under a server whose lines are in `log_format`, and the lines of
    the process's stderr that tell of its end."""
    # (the environment says the other format: the server's lines decide)
    other = "text" if log_format == "json" else "json"
    proc = run_python(_SCRIPT, log_format, env={"HTMLLM_LOG_FORMAT": other})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    pid = int(proc.stdout.split()[-1])
    return pid, [line for line in proc.stderr.splitlines() if "forkserver" in line]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="forkserver: Linux only")
def test_the_forkserver_s_end_is_a_json_line_under_json_logs() -> None:
    pid, lines = _forkserver_end("json")
    assert len(lines) == 1, lines
    entry = json.loads(lines[0])
    assert list(entry) == ["time", "level", "logger", "message"], entry
    assert entry["level"] == "warning" and entry["logger"] == "service.core.forkserver_exit"
    assert entry["message"].startswith(f"the workers' forkserver {pid} exits: a worker start was abandoned")
    assert entry["time"].endswith("Z") and len(entry["time"]) == len("2026-01-01T00:00:00.000Z")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="forkserver: Linux only")
def test_the_forkserver_s_end_is_a_text_line_under_text_logs() -> None:
    pid, lines = _forkserver_end("text")
    assert len(lines) == 1 and lines[0].startswith(f"htmllm: the workers' forkserver {pid} exits: "), lines
