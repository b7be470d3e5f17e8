"""/ready while no extractor process can start (`POST /v1/extract`'s pool): 503 with the reason once as
many extraction jobs in a row were refused for it as passes make the backend unready
(`HTMLLM_UNREADY_AFTER_FAILURES`), until a probe job gets a process again.

Each such request had been a 503 `not_ready` while /ready said 200: the pod stayed in rotation, and with
processes that can never start again it answered /v1/extract 503 for ever. The processes are real; one
that cannot start is made by killing the pool's worker and giving the next ones a module to import that
does not exist.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from service.api.app import create_app
from service.api.code_stamp import CodeStamp
from service.api.runtime import Runtime
from service.core.extract import pool as pool_module
from service.core.extract.pool import ExtractorPool
from tests.api.conftest import SettingsFactory, serving
from tests.api.pages import page
from tests.factories.waiting import ready_until

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="forkserver: Linux only")


def _no_process_starts(pool: ExtractorPool) -> tuple[Any, ...]:
    (worker,) = pool._idle
    worker.process.kill()
    worker.process.join()
    working = pool._worker_args
    _, limit, initializer, initargs = working
    pool._worker_args = (("htmllm_no_such_module",), limit, initializer, initargs)
    return working


async def _extract(client: httpx.AsyncClient, seed: int) -> httpx.Response:
    body = {"documents": [{"html": page(seed)}], "extractors": ["resiliparse"]}
    return await client.post("/v1/extract", json=body)


async def test_extraction_jobs_refused_for_want_of_a_process_turn_ready_503_until_one_starts(
    settings_for: SettingsFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pool_module, "PROBE_INTERVAL_S", 0.0)
    app = create_app(settings_for(extract_workers=1))
    runtime: Runtime = app.state.runtime
    async with serving(app) as client:
        await ready_until(client, 200, "after the warm-up")
        assert (await _extract(client, 1)).status_code == 200
        pool = runtime.extractor_pool
        assert pool is not None
        working = _no_process_starts(pool)
        for seed in (2, 3):
            refused = await _extract(client, seed)
            assert refused.status_code == 503 and refused.json()["error"]["code"] == "not_ready"
        assert (await client.get("/ready")).status_code == 200  # below the threshold (3)
        assert (await _extract(client, 4)).status_code == 503

        ready = await client.get("/ready")
        assert ready.status_code == 503 and ready.json()["error"]["code"] == "not_ready", ready.text
        assert "no extractor process could start for the last" in ready.json()["error"]["message"]
        assert runtime.unready_reason() is not None  # every answer closes its connection meanwhile

        pool._worker_args = working  # the fault passed: a probe job gets a process again
        await ready_until(client, 200, "a probe job started an extractor process")
        assert runtime.unready_reason() is None
        assert (await _extract(client, 5)).status_code == 200


async def test_one_requests_jobs_refused_together_count_as_one_try(settings_for: SettingsFactory) -> None:
    """2 documents x ["union", "resiliparse"], refused in one blip: one try. Each job had counted one as it
    began on the (one) extraction thread: "the last 4 extraction jobs", /ready 503 at once."""
    app = create_app(settings_for(extract_workers=1))
    runtime: Runtime = app.state.runtime
    async with serving(app) as client:
        await ready_until(client, 200, "after the warm-up")
        assert (await _extract(client, 1)).status_code == 200
        pool = runtime.extractor_pool
        assert pool is not None
        _no_process_starts(pool)
        body = {"documents": [{"html": page(2)}, {"html": page(3)}], "extractors": ["union", "resiliparse"]}
        refused = await client.post("/v1/extract", json=body)
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "not_ready", refused.text
        assert pool.start_health.start_failures == 1
        assert (await client.get("/ready")).status_code == 200  # one try failed: traffic decides


def _at(runtime: Runtime, later_s: float) -> None:
    moved = time.monotonic() + later_s
    runtime.clock = lambda: moved


async def test_an_extractor_pool_that_cannot_start_for_long_turns_health_503_until_it_starts(
    settings_for: SettingsFactory, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """It had kept the pod unready for ever, /health 200, and nothing logged that a restart was needed:
    now it follows the preprocessing processes' rule (`HTMLLM_UNHEALTHY_AFTER_S`), and /health's turn
    to 503 and its end are logged once each."""
    monkeypatch.setattr(pool_module, "PROBE_INTERVAL_S", 0.0)
    app = create_app(settings_for(extract_workers=1, unhealthy_after_s=300))
    runtime: Runtime = app.state.runtime
    caplog.set_level(logging.INFO, logger="service.api.runtime")
    async with serving(app) as client:
        await ready_until(client, 200, "after the warm-up")
        assert (await _extract(client, 1)).status_code == 200
        pool = runtime.extractor_pool
        assert pool is not None
        working = _no_process_starts(pool)
        for seed in (2, 3, 4):
            assert (await _extract(client, seed)).status_code == 503
        ready = await client.get("/ready")
        assert ready.status_code == 503, ready.text
        assert "WorkerStartError" not in ready.json()["error"]["message"]  # the cause, not a class
        assert (await client.get("/health")).status_code == 200  # not for long enough yet

        _at(runtime, 300)
        for _ in range(2):  # each probe says it; the log once
            health = await client.get("/health")
            assert health.status_code == 503 and health.json()["error"]["code"] == "unhealthy", health.text
            assert "no extractor process has started for 30" in health.json()["error"]["message"]
        needed = [r for r in caplog.records if "a restart is needed" in r.getMessage()]
        assert len(needed) == 1 and needed[0].levelno == logging.ERROR, needed
        assert "no extractor process has started" in needed[0].getMessage()

        runtime.clock = time.monotonic
        pool._worker_args = working  # the fault passed: a probe job gets a process again
        await ready_until(client, 200, "a probe job started an extractor process")
        assert (await client.get("/health")).status_code == 200
        assert any("/health answers 200 again" in r.getMessage() for r in caplog.records)


async def test_with_the_code_changed_on_disk_an_extractor_that_cannot_start_asks_for_a_restart_at_once(
    settings_for: SettingsFactory, tmp_path: Path
) -> None:
    app = create_app(settings_for(extract_workers=1, unhealthy_after_s=300))
    runtime: Runtime = app.state.runtime
    (tmp_path / "a.py").write_text("A = 1\n", encoding="utf-8")
    runtime.code = CodeStamp(tmp_path)
    async with serving(app) as client:
        await ready_until(client, 200, "after the warm-up")
        assert (await _extract(client, 1)).status_code == 200
        pool = runtime.extractor_pool
        assert pool is not None
        (tmp_path / "a.py.new").write_text("A = 2\n", encoding="utf-8")
        os.replace(tmp_path / "a.py.new", tmp_path / "a.py")  # an upgrade in place, under the server
        _no_process_starts(pool)
        for seed in (2, 3, 4):
            assert (await _extract(client, seed)).status_code == 503
        health = await client.get("/health")
        assert health.status_code == 503 and health.json()["error"]["code"] == "unhealthy", health.text
        message = health.json()["error"]["message"]
        assert "no extractor process could start" in message and "the code on disk changed" in message
