"""A page's try on a preprocessing process is held to its time limit from when a process took it, and a
process's start to the start's own bound (`PreprocessingReadiness.stuck`).

Counted from the try's start, the start had to be allowed to every page: a page stuck in a live process
(stopped, here) turned /ready 503 only after the request timeout, a whole start (120 s) and 10 s; and a
start that took longer than that, legitimately (a launch whose forkserver did not answer, tried once more
from a new one: `START_BOUND_S`), was "stuck". The processes and the stopped page are
real (the slow start: test_preprocessing_readiness_slow_start.py); ages are moved on through `Runtime.clock`.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time

import pytest

from service.api.app import create_app
from service.api.preprocessing_readiness import PROCESS_KILL_GRACE_S
from service.api.runtime import Runtime
from tests.api.conftest import SettingsFactory, serving
from tests.factories.waiting import ready_until, until_async
from tests.factories.worker_jobs import stop_self

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="forkserver: Linux only")


def _at(runtime: Runtime, later_s: float) -> None:
    """Move the runtime's clock `later_s` on from now."""
    moved = time.monotonic() + later_s
    runtime.clock = lambda: moved


async def test_a_page_stuck_in_its_process_is_seen_after_its_time_limit_and_the_grace(
    settings_for: SettingsFactory,
) -> None:
    settings = settings_for(preprocess_pool="process", preprocess_workers=1, request_timeout_s=30)
    app = create_app(settings)
    runtime: Runtime = app.state.runtime
    async with serving(app) as client:
        await ready_until(client, 200, "after the warm-up")
        assert runtime.engine is not None
        processes = runtime.engine._preprocessing._processes
        assert processes is not None
        held = asyncio.ensure_future(runtime.engine._preprocessing._in_process(stop_self))  # stopped mid-page
        pid = None
        try:
            await until_async(lambda: runtime.engine.preprocessing_running_since is not None, "a try runs")
            (worker,) = processes._busy
            pid = worker.pid
            assert runtime.engine.preprocessing_waiting_since is None  # an idle process took it at once

            _at(runtime, settings.request_timeout_s + PROCESS_KILL_GRACE_S - 1)
            assert (await client.get("/ready")).status_code == 200

            _at(runtime, settings.request_timeout_s + PROCESS_KILL_GRACE_S + 1)  # no start to allow for
            ready = await client.get("/ready")
            assert ready.status_code == 503, ready.text
            message = ready.json()["error"]["message"]
            assert "a page's try on a preprocessing process has run for 41 s" in message
            assert (
                "(the limit is 40 s: its time limit, the kill and the reaping): the pool is stuck" in message
            )
        finally:
            runtime.clock = time.monotonic
            if pid is not None:
                os.kill(pid, signal.SIGCONT)  # the page goes on, and its try ends
        assert await held == pid
        assert runtime.engine.preprocessing_running_since is None
        assert (await client.get("/ready")).status_code == 200
