"""A page whose preprocessing process is slow to start is no stuck pool.

With processes, a page's call to the pool starts a process where none is idle and holds that start to
`START_BOUND_S` (a launch tried twice, 120 s each) itself. The stuck bound had left the start out (the
request timeout and 10 s): a start that took 100 s and then served turned /ready 503 ("the pool is
stuck", every connection closed) 40 s in. The process and its slow start are real (an initializer that
hangs); ages are moved on through `Runtime.clock`.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from service.api.app import create_app
from service.api.preprocessing_readiness import PROCESS_KILL_GRACE_S
from service.api.runtime import Runtime
from service.core.workers import START_BOUND_S, STARTUP_TIMEOUT_S
from tests.api.conftest import SettingsFactory, serving
from tests.api.pages import page
from tests.factories.waiting import ready_until, until_async
from tests.factories.worker_starts import hang_while_starting


def _at(runtime: Runtime, later_s: float) -> None:
    """Move the runtime's clock `later_s` on from now."""
    moved = time.monotonic() + later_s
    runtime.clock = lambda: moved


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="forkserver: Linux only")
async def test_a_page_waiting_for_a_slow_process_start_is_not_a_stuck_pool(
    settings_for: SettingsFactory, tmp_path: Path
) -> None:
    settings = settings_for(preprocess_pool="process", preprocess_workers=1, request_timeout_s=30)
    app = create_app(settings)
    runtime: Runtime = app.state.runtime
    pid_file = tmp_path / "starting.pid"
    async with serving(app) as client:
        await ready_until(client, 200, "after the warm-up")
        assert runtime.engine is not None
        processes = runtime.engine._preprocessing._processes
        assert processes is not None
        (worker,) = processes._idle
        worker.process.kill()  # the next page starts a process, which hangs in its start
        worker.process.join()
        preload, limit, _, _ = processes._worker_args
        processes._worker_args = (preload, limit, hang_while_starting, (str(pid_file),))
        request = asyncio.ensure_future(client.post("/v1/embed", json={"documents": [{"html": page(1)}]}))
        pid = None
        try:
            await until_async(pid_file.exists, "the page's process is starting")
            pid = int(pid_file.read_text())
            assert runtime.engine.preprocessing_waiting_since is not None  # the page's wait counts
            assert runtime.engine.preprocessing_running_since is None  # no try on a process yet

            # Past a start, the request timeout and the grace together (the bound this had before, from
            # the try's start), within what the pool holds a start to: a launch tried twice.
            _at(runtime, settings.request_timeout_s + STARTUP_TIMEOUT_S + PROCESS_KILL_GRACE_S + 30)
            ready = await client.get("/ready")
            assert ready.status_code == 200, ready.text
            assert runtime.unready_reason() is None

            _at(runtime, START_BOUND_S + PROCESS_KILL_GRACE_S + 1)
            ready = await client.get("/ready")  # past what the pool itself bounds a start to
            assert ready.status_code == 503, ready.text
            message = ready.json()["error"]["message"]
            assert "a process's start, tried twice, and the kill): the pool is stuck" in message
        finally:
            runtime.clock = time.monotonic
            if pid is not None:
                os.kill(pid, signal.SIGKILL)  # the start fails: the page is refused, 503
        refused = await request
        assert refused.status_code == 503, refused.text
