"""The engine's batch reports and the routes' failures as Prometheus series."""

from __future__ import annotations

import gc

import pytest
from prometheus_client import generate_latest

from service.api.metrics import EngineMetricsObserver, GcPauseObserver, ServiceMetrics
from service.api.routers import extract as extract_router
from service.core.extract import ExtractionError
from service.engine import DeadlineExceededError
from service.engine.types import BatchStats
from tests.api.conftest import SettingsFactory, app_client


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
