"""A worker process killed from outside while it holds a job, as the kernel's OOM killer kills it: for the
tests of what a lost worker means for its job (`service.core.workers.WorkerLostError`).

The kill is real (SIGKILL to the real worker, after the real job was sent to it); the hook only picks the
moment, which a test could not otherwise hit: right after the parent handed a chosen job to its worker.
The worker is stopped (SIGSTOP) before the job is sent, so that it cannot answer a small job in the
moment before the kill lands: it dies holding the job unanswered, as a worker the OOM killer picks does.
"""

from __future__ import annotations

import os
import signal
import threading
from typing import Any

import pytest

from service.core import workers


def kill_workers_holding(monkeypatch: pytest.MonkeyPatch, marker: bytes, *, kills: int) -> list[int]:
    """SIGKILL the worker a job whose pickled bytes hold `marker` (a page's text) was just sent to, the
    first `kills` times such a job is sent; returns the killed workers' pids, as they are killed."""
    killed: list[int] = []
    holder = threading.local()  # the worker this thread is exchanging with (the pool's calls run on many)
    exchange, send = workers.WorkerPool._exchange, workers._send_job

    def exchange_noting(self: workers.WorkerPool, worker: Any, *args: Any) -> tuple[Any, ...]:
        holder.worker = worker
        return exchange(self, worker, *args)

    def send_then_kill(conn: Any, job: bytes | memoryview) -> None:
        if len(killed) >= kills or marker not in bytes(job):
            send(conn, job)
            return
        pid = holder.worker.process.pid
        os.kill(pid, signal.SIGSTOP)  # idle in its read: it stops before it can run the job
        send(conn, job)
        os.kill(pid, signal.SIGKILL)
        killed.append(pid)

    monkeypatch.setattr(workers.WorkerPool, "_exchange", exchange_noting)
    monkeypatch.setattr(workers, "_send_job", send_then_kill)
    return killed
