"""The engine's batch reports and the routes' failures as Prometheus series."""

from __future__ import annotations

import asyncio
import gc
import threading
from typing import Any

import httpx
import pytest
from prometheus_client import generate_latest

from service.api import app as app_module
from service.api import runtime as runtime_module
from service.api.app import create_app, load_engine
from service.api.metrics import EngineMetricsObserver, GcPauseObserver, ServiceMetrics
from service.api.routers import extract as extract_router
from service.api.runtime import Runtime
from service.core.extract import ExtractionError
from service.engine import DeadlineExceededError
from service.engine.types import BatchStats
from tests.api.conftest import SettingsFactory, app_client, serving
from tests.api.pages import page


def _series(metrics: ServiceMetrics) -> str:
    return generate_latest(metrics.registry).decode()


def test_a_batch_moves_its_histograms_and_the_host_share_only_where_measured() -> None:
    metrics = ServiceMetrics()
    observer = EngineMetricsObserver(metrics)
    stats = BatchStats(documents=3, tokens=40, padded_tokens=60, prepare_s=0.001, inference_s=0.2)
    observer.batch_done(stats)
    text = _series(metrics)
    assert "htmllm_batch_size_sum 3.0" in text and "htmllm_batch_padded_tokens_sum 60.0" in text
    assert "htmllm_batch_inference_seconds_count 1.0" in text
    assert "htmllm_batch_host_seconds_count 0.0" in text  # a CPU pass: the host is the device
    observer.batch_done(
        BatchStats(documents=1, tokens=9, padded_tokens=9, prepare_s=0.0, inference_s=0.05, host_s=0.04)
    )
    text = _series(metrics)
    assert "htmllm_batch_host_seconds_count 1.0" in text and "htmllm_batch_host_seconds_sum 0.04" in text


def test_collections_are_timed_by_generation_while_installed() -> None:
    metrics = ServiceMetrics()
    observer = GcPauseObserver(metrics)
    observer.install()
    try:
        gc.collect(0)
        gc.collect(2)
    finally:
        observer.remove()
    gc.collect(2)  # not observed: removed
    text = _series(metrics)
    assert 'htmllm_gc_pause_seconds_count{generation="2"} 1.0' in text
    assert 'htmllm_gc_pause_seconds_count{generation="0"} 0.0' not in text  # at least the one asked for
    assert observer not in gc.callbacks
    observer.remove()  # twice is harmless


def test_queue_size_help_says_what_it_counts() -> None:
    """HPA targets are set from this gauge: it counts every document accepted and not yet answered
    (preprocessing included, engine.py's `_admit`/`_release`), not only those waiting for a batch."""
    text = _series(ServiceMetrics())
    (help_line,) = [line for line in text.splitlines() if line.startswith("# HELP htmllm_queue_size ")]
    assert "accepted and not yet answered" in help_line and "batcher queue" not in help_line


async def test_failed_extractions_are_counted_by_code_and_extractor(
    settings_for: SettingsFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """/v1/extract answers 200 whatever its entries say, and no series counted the failed ones (embed
    has `htmllm_documents_failed_total`): an extractor failing on every page went unseen."""

    def extract(html: object, extractor: str, **_: object) -> object:
        raise ExtractionError(f"{extractor} raised on the page")

    monkeypatch.setattr(extract_router, "extract", extract)
    async with app_client(settings_for()) as client:
        documents = [{"html": "<p>a</p>"}, {"html": "<p>b</p>"}]
        body = {"documents": documents, "extractors": ["union", "justext"]}
        response = await client.post("/v1/extract", json=body)
        assert response.status_code == 200, response.text
        text = (await client.get("/metrics")).text
    for extractor in ("union", "justext"):
        series = f'htmllm_extractions_failed_total{{code="extraction_failed",extractor="{extractor}"}} 2.0'
        assert series in text
    assert 'extractor="resiliparse"' not in text  # only what was asked for and failed


def test_a_late_extraction_counts_as_a_timeout() -> None:
    """The request deadline's entries are built by the same `_failed`, with their own code."""
    metrics = ServiceMetrics()
    extract_router._failed("trafilatura", DeadlineExceededError("late"), metrics=metrics)
    series = 'htmllm_extractions_failed_total{code="timeout",extractor="trafilatura"} 1.0'
    assert series in _series(metrics)


async def test_metrics_has_no_created_series_and_leaves_other_registries_theirs(
    settings_for: SettingsFactory,
) -> None:
    """prometheus_client adds `<name>_created` to every counter and histogram child (a timestamp per
    label set, doubling the series stored); /metrics leaves them out, without the process-wide switch
    that would take them from every other registry in the process too."""
    async with app_client(settings_for(warmup=False), wait_ready=False) as client:
        await client.get("/health")  # a request counted: labelled counter and histogram children exist
        text = (await client.get("/metrics")).text
    series = [line.split("{")[0].split(" ")[0] for line in text.splitlines() if not line.startswith("#")]
    assert "htmllm_requests_total" in series and "htmllm_request_duration_seconds_bucket" in series
    assert not [name for name in series if name.endswith("_created")], text
    other = ServiceMetrics()
    other.requests.labels(route="/", method="GET", status="200").inc()
    assert "htmllm_requests_created" in _series(other)


def _gauge(text: str, name: str) -> float:
    (value,) = [line.split()[1] for line in text.splitlines() if line.startswith(f"{name} ")]
    return float(value)


async def _ready_and_gauge(client: httpx.AsyncClient) -> tuple[int, float]:
    """/ready's status, then `htmllm_ready` as a scrape right after it reads it."""
    status = (await client.get("/ready")).status_code
    return status, _gauge((await client.get("/metrics")).text, "htmllm_ready")


async def _poll_ready(client: httpx.AsyncClient, status: int) -> None:
    for _ in range(2000):  # a bounded number of event-loop turns, not a time
        if (await client.get("/ready")).status_code == status:
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"/ready never answered {status}")


async def test_the_ready_gauge_says_what_ready_says_in_every_state(
    settings_for: SettingsFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`htmllm_ready` was set to 1 by the warm-up and to 0 at the end of the lifespan only: through
    failing passes, a stalled pass and the drain /ready answered 503 while the gauge said 1."""
    monkeypatch.setattr(app_module, "WARMUP_RETRY_FIRST_S", 0.001)
    settings = settings_for(unready_after_failures=2, request_timeout_s=30)
    engine = load_engine(settings)
    runner: Any = engine._runner
    working = runner.run
    entered, release = threading.Event(), threading.Event()

    def broken(prepared: object) -> object:
        raise RuntimeError("CUDA error: an illegal memory access was encountered (simulated)")

    def wedged(prepared: object) -> object:
        entered.set()
        release.wait(60)
        return working(prepared)

    monkeypatch.setattr(runner, "run", broken)  # the warm-up fails
    app = create_app(settings, engine)
    runtime: Runtime = app.state.runtime
    async with serving(app) as client:
        for _ in range(2000):
            if runtime.warmup_error is not None:
                break
            await asyncio.sleep(0.005)
        assert await _ready_and_gauge(client) == (503, 0.0)  # warming: its warm-up failed
        monkeypatch.setattr(runner, "run", working)
        await _poll_ready(client, 200)
        assert await _ready_and_gauge(client) == (200, 1.0)

        monkeypatch.setattr(runner, "run", broken)  # two passes fail in a row
        body = {"documents": [{"html": page(1)}]}
        for _ in range(2):
            assert (await client.post("/v1/embed", json=body)).status_code == 500
        assert await _ready_and_gauge(client) == (503, 0.0)
        monkeypatch.setattr(runtime_module, "PROBE_INTERVAL_S", 0.0)
        monkeypatch.setattr(runner, "run", working)  # a probe pass (started by /ready) succeeds
        await _poll_ready(client, 200)
        assert await _ready_and_gauge(client) == (200, 1.0)

        monkeypatch.setattr(runner, "run", wedged)  # a pass stalls past the request timeout
        embed = asyncio.ensure_future(client.post("/v1/embed", json=body))
        try:
            assert await asyncio.to_thread(entered.wait, 60)
            started = engine.health.pass_started
            assert started is not None
            runtime.clock = lambda: started + 30.0
            assert await _ready_and_gauge(client) == (503, 0.0)
        finally:
            release.set()
        assert (await embed).status_code == 200
        assert await _ready_and_gauge(client) == (200, 1.0)

        runtime.stopping = True  # shutdown began (the lifespan's end sets it too)
        assert await _ready_and_gauge(client) == (503, 0.0)
