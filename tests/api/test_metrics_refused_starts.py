"""The /metrics scrape checks a run of refused worker starts below /ready's threshold, as /ready does.

A refusal (no preprocessing or extractor process could start for a page or a job) below the threshold is
checked by a probe once it has lasted the probes' interval: its success ends the run, its refusal counts.
Only /ready and /health did so; a pod that only Prometheus watches (no readiness probe) kept the refusal
counted until a page or job came (blips days apart then added up to "in a row", and `htmllm_ready` went 0
on a sound pool), and a pool that broke on an idle pod never reached the threshold (`htmllm_ready` 1
throughout). Failed passes were already checked so (`check_failed_passes`). The processes are real; one
that cannot start is made by giving the next ones an initializer or a module that fails.
"""

from __future__ import annotations

import asyncio
import re
import sys

import httpx
import pytest

from service.api import runtime as runtime_module
from service.api.app import create_app
from service.api.runtime import Runtime
from service.core.extract import pool as pool_module
from tests.api.conftest import SettingsFactory, serving
from tests.api.pages import page
from tests.factories.waiting import ready_until

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="forkserver: Linux only")

PROBE_JOIN_S = 120.0  # far past what a probe job needs: only keeps a broken test from hanging


def _ready_gauge(metrics: str) -> float:
    found = re.search(r"^htmllm_ready (\S+)$", metrics, re.MULTILINE)
    assert found is not None, metrics
    return float(found.group(1))


async def _scrape_and_wait_for_the_page(client: httpx.AsyncClient, runtime: Runtime) -> str:
    """Scrape /metrics, then wait for the probe page it started; the exposition."""
    before = runtime._pool_probe.task
    metrics = (await client.get("/metrics")).text
    probe = runtime._pool_probe.task
    assert probe is not None and probe is not before, "the scrape started no probe page"
    await probe
    return metrics


async def test_a_scrape_checks_refused_preprocessing_starts_below_the_threshold(
    settings_for: SettingsFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runtime_module, "PROBE_INTERVAL_S", 0.0)
    app = create_app(settings_for(preprocess_pool="process", preprocess_workers=1))
    runtime: Runtime = app.state.runtime
    async with serving(app) as client:
        await ready_until(client, 200, "after the warm-up")
        engine = runtime.engine
        assert engine is not None
        processes = engine._preprocessing._processes
        assert processes is not None
        working = processes._worker_args
        (worker,) = processes._idle
        worker.process.kill()
        worker.process.join()
        preload, limit, initializer, _ = working
        processes._worker_args = (preload, limit, initializer, ("{not a tokenizer",))  # dies starting

        refused = await client.post("/v1/embed", json={"documents": [{"html": page(1)}]})
        assert refused.status_code == 503, refused.text
        assert engine.preprocessing_health.start_failures == 1
        # No traffic, no /ready: each scrape's check is refused and counts, up to the threshold (3).
        for count in (2, 3):
            await _scrape_and_wait_for_the_page(client, runtime)
            assert engine.preprocessing_health.start_failures == count
        assert _ready_gauge((await client.get("/metrics")).text) == 0

        processes._worker_args = working  # the fault passed; a blip below the threshold is checked too
        await ready_until(client, 200, "a probe page was preprocessed")
        assert engine.preprocessing_health.start_failures == 0
        (worker,) = processes._idle
        worker.process.kill()
        worker.process.join()
        processes._worker_args = (preload, limit, initializer, ("{not a tokenizer",))
        assert (await client.post("/v1/embed", json={"documents": [{"html": page(2)}]})).status_code == 503
        processes._worker_args = working
        metrics = await _scrape_and_wait_for_the_page(client, runtime)
        assert _ready_gauge(metrics) == 1
        assert engine.preprocessing_health.start_failures == 0  # the scrape's check ended the run


async def test_a_scrape_checks_refused_extractor_starts_below_the_threshold(
    settings_for: SettingsFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pool_module, "PROBE_INTERVAL_S", 0.0)
    app = create_app(settings_for(extract_workers=1))
    runtime: Runtime = app.state.runtime
    body = {"documents": [{"html": page(1)}], "extractors": ["resiliparse"]}
    async with serving(app) as client:
        await ready_until(client, 200, "after the warm-up")
        assert (await client.post("/v1/extract", json=body)).status_code == 200
        pool = runtime.extractor_pool
        assert pool is not None
        (worker,) = pool._idle
        worker.process.kill()
        worker.process.join()
        working = pool._worker_args
        _, limit, initializer, initargs = working
        pool._worker_args = (("htmllm_no_such_module",), limit, initializer, initargs)
        refused = await client.post("/v1/extract", json=body)
        assert refused.status_code == 503, refused.text
        assert pool.start_health.start_failures == 1

        pool._worker_args = working  # the fault passed: only a check would know
        await client.get("/metrics")
        probe = pool._probe
        assert probe is not None, "the scrape started no probe job"
        await asyncio.to_thread(probe.join, PROBE_JOIN_S)
        assert pool.start_health.start_failures == 0  # the scrape's check ended the run
