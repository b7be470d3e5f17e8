"""A page's try on a preprocessing process is held to its time limit from when a process took it, and a
process's start to the start's own bound (`PreprocessingReadiness.stuck`).

Counted from the try's start, the start had to be allowed to every page: a page stuck in a live process
(stopped, here) turned /ready 503 only after the request timeout, a whole start (120 s) and 10 s; and a
start that took longer than that, legitimately (a launch whose forkserver did not answer, tried once more
from a new one: `START_BOUND_S`), was "stuck". The processes, the stopped page and the slow start are
real; ages are moved on through `Runtime.clock`.
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
from tests.factories.worker_jobs import stop_self
from tests.factories.worker_starts import hang_while_starting

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


async def test_a_slow_start_is_held_to_the_starts_own_bound_not_a_tries(
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
            assert runtime.engine.preprocessing_waiting_since is not None  # the page waits for its start
            assert runtime.engine.preprocessing_running_since is None  # no try on a process yet

            # Past a start, the request timeout and the grace together (the bound this had before), within
            # what the pool holds a start to: a launch tried twice.
            _at(runtime, settings.request_timeout_s + STARTUP_TIMEOUT_S + PROCESS_KILL_GRACE_S + 30)
            ready = await client.get("/ready")
            assert ready.status_code == 200, ready.text
            assert runtime.unready_reason() is None

            _at(runtime, START_BOUND_S + PROCESS_KILL_GRACE_S + 1)
            ready = await client.get("/ready")
            assert ready.status_code == 503, ready.text
            message = ready.json()["error"]["message"]
            assert "a page has waited 251 s for a preprocessing process to start" in message
            assert "(the limit is 250 s: a process's start, tried twice, and the kill)" in message
        finally:
            runtime.clock = time.monotonic
            if pid is not None:
                os.kill(pid, signal.SIGKILL)  # the start fails: the page is refused, 503
        refused = await request
        assert refused.status_code == 503, refused.text
        assert runtime.engine.preprocessing_waiting_since is None
