"""The review's repro, in an Engine: one preprocessing process, stopped, a page sent to it, its forkserver
killed (the kernel's OOM killer), then the process. The page was a 422 `preprocess_failed` ("this page
crashed its preprocessing process (exit code 255)"); its process's exit status went with the forkserver,
so it is prepared again in a fresh process, from a new forkserver, and embedded. The kills are real."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from multiprocessing import forkserver
from pathlib import Path
from typing import Any

import pytest

from service.core import workers
from service.core.processes import forkserver_in_use, restart_forkserver, worker_context
from service.core.worker_health import LOST_STATUS
from service.engine.engine import Engine
from service.engine.preprocessing import POOL_NAME
from service.engine.types import EngineConfig, EngineObserver

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="forkserver: Linux only")

MARKER = "the kernel picks the forkserver, then the process pruning this page"


class _Replacements(EngineObserver):
    def __init__(self) -> None:
        self.told: list[tuple[str, str]] = []

    def worker_replaced(self, pool: str, reason: str) -> None:
        self.told.append((pool, reason))


def _kill_forkserver_then_worker(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """When the page holding `MARKER` is sent: stop its worker first (it holds the page unanswered), then
    SIGKILL the forkserver in use (waiting until it died, unreaped), then the worker."""
    killed: list[int] = []
    holder = threading.local()
    exchange, send = workers.WorkerPool._exchange, workers._send_job

    def exchange_noting(self: workers.WorkerPool, worker: Any, *args: Any) -> tuple[Any, ...]:
        holder.worker = worker
        return exchange(self, worker, *args)

    def send_then_kill(conn: Any, job: bytes | memoryview) -> None:
        if killed or MARKER.encode() not in bytes(job):
            send(conn, job)
            return
        worker = holder.worker.process.pid
        server = forkserver._forkserver._forkserver_pid  # type: ignore[attr-defined]
        os.kill(worker, signal.SIGSTOP)
        send(conn, job)
        os.kill(server, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while os.waitid(os.P_PID, server, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
            assert time.monotonic() < deadline, "the forkserver did not die"
            time.sleep(0.005)
        os.kill(worker, signal.SIGKILL)
        killed.extend((server, worker))

    monkeypatch.setattr(workers.WorkerPool, "_exchange", exchange_noting)
    monkeypatch.setattr(workers, "_send_job", send_then_kill)
    return killed


async def test_a_page_whose_process_died_after_its_forkserver_is_prepared_again_not_a_crash(
    tiny_checkpoint: Path, pages: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    ctx = worker_context(())
    restart_forkserver(ctx, forkserver_in_use(ctx))  # the engine's workers come from a forkserver of its own
    config = EngineConfig(preprocess_pool="process", preprocess_workers=1)
    async with Engine.from_checkpoint(tiny_checkpoint, config) as engine:
        observer = _Replacements()
        engine.observer = observer
        await engine.embed(pages[:1])
        killed = _kill_forkserver_then_worker(monkeypatch)
        (embedded,) = await engine.embed([f"<html><body><p>{MARKER}</p></body></html>"])
        assert embedded is not None
        await engine.embed(pages[:1])  # the new process serves on
    assert len(killed) == 2
    assert observer.told == [(POOL_NAME, LOST_STATUS)]
