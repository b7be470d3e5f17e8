"""/ready while no extractor process can start (`POST /v1/extract`'s pool): 503 with the reason once as
many extraction jobs in a row were refused for it as passes make the backend unready
(`HTMLLM_UNREADY_AFTER_FAILURES`), until a probe job gets a process again.

Each such request had been a 503 `not_ready` while /ready said 200: the pod stayed in rotation, and with
processes that can never start again it answered /v1/extract 503 for ever. The processes are real; one
that cannot start is made by killing the pool's worker and giving the next ones a module to import that
does not exist.
"""

from __future__ import annotations

import sys
from typing import Any

import httpx
import pytest

from service.api.app import create_app
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
