"""`htmllm_worker_replacements_total{pool, reason}`: every worker process the server's pools lose or
replace, where each had been one warning line only. Every pair of a pool the server runs is exported at
0 from the start (a rate() alert needs the series before the first replacement); a pool it does not run
(threads preprocess) has none. The kills are real."""

from __future__ import annotations

import re

import pytest

from service.api.app import create_app
from service.api.runtime import Runtime
from service.core.extract.pool import POOL_NAME as EXTRACTOR_POOL
from service.core.worker_health import IDLE_DIED, KILLED, REPLACEMENT_REASONS
from service.engine.preprocessing import POOL_NAME as PREPROCESSING_POOL
from tests.api.conftest import SettingsFactory, app_client, serving
from tests.api.pages import page
from tests.factories.worker_kills import kill_workers_holding

MARKER = "the kernel picks the process extracting this page"
PAGE = (
    "<html><body><article>"
    + f"<p>Sentence after sentence says that {MARKER}.</p>" * 12
    + "</article></body></html>"
)


def _replacements(text: str) -> dict[tuple[str, str], float]:
    found = re.findall(r'^htmllm_worker_replacements_total\{pool="(\w+)",reason="(\w+)"\} (\S+)$', text, re.M)
    return {(pool, reason): float(value) for pool, reason, value in found}


async def test_the_extractor_pool_is_counted_from_0_and_thread_preprocessing_is_not(
    settings_for: SettingsFactory,
) -> None:
    async with app_client(settings_for(preprocess_pool="thread")) as client:
        text = (await client.get("/metrics")).text
    assert "# TYPE htmllm_worker_replacements_total counter" in text
    assert _replacements(text) == {(EXTRACTOR_POOL, reason): 0.0 for reason in REPLACEMENT_REASONS}


async def test_preprocessing_and_extractor_processes_lost_are_counted_by_pool_and_reason(
    settings_for: SettingsFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At 0 for both pools before any page; then a preprocessing process killed while idle (through the
    engine's observer) and an extractor process killed under a page (its pool built by the runtime on the
    first /v1/extract) each count once under their own pool and reason."""
    app = create_app(settings_for(preprocess_pool="process"))
    runtime: Runtime = app.state.runtime
    async with serving(app) as client:
        at_start = _replacements((await client.get("/metrics")).text)
        assert at_start == {
            (pool, reason): 0.0
            for pool in (PREPROCESSING_POOL, EXTRACTOR_POOL)
            for reason in REPLACEMENT_REASONS
        }
        assert runtime.engine is not None and runtime.engine._preprocessing._processes is not None
        (worker,) = runtime.engine._preprocessing._processes._idle
        worker.process.kill()  # the OOM killer picks an idle preprocessing process
        worker.process.join()
        assert (await client.post("/v1/embed", json={"documents": [{"html": page(1)}]})).status_code == 200
        kill_workers_holding(monkeypatch, MARKER.encode(), kills=1)
        body = {"documents": [{"html": PAGE}], "extractors": ["resiliparse"]}
        assert (await client.post("/v1/extract", json=body)).status_code == 200  # its retry serves it
        counted = _replacements((await client.get("/metrics")).text)
    assert {key: value for key, value in counted.items() if value} == {
        (PREPROCESSING_POOL, IDLE_DIED): 1.0,
        (EXTRACTOR_POOL, KILLED): 1.0,
    }
    assert counted.keys() == at_start.keys()
