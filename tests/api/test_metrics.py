"""The engine's batch reports and the routes' failures as Prometheus series."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import re
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry, PlatformCollector, ProcessCollector, generate_latest
from starlette.types import Message, Receive, Scope, Send

from service.api import app as app_module
from service.api import metrics as metrics_module
from service.api import runtime as runtime_module
from service.api.app import create_app, load_engine
from service.api.metrics import (
    EngineMetricsObserver,
    GcPauseObserver,
    RequestMetricsMiddleware,
    ServiceMetrics,
    status_class,
)
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
    # Only what was asked for and failed moved; the rest are exported at 0 from the start.
    assert 'htmllm_extractions_failed_total{code="extraction_failed",extractor="resiliparse"} 0.0' in text


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


def _sample(text: str, name: str, **labels: str) -> float:
    """The value of the one sample of `name` with exactly `labels` (in any order)."""
    found = []
    for match in re.finditer(rf"^{name}\{{(.*)\}} (\S+)$", text, re.M):
        if dict(re.findall(r'(\w+)="([^"]*)"', match.group(1))) == labels:
            found.append(float(match.group(2)))
    assert len(found) == 1, (name, labels, text)
    return found[0]


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


class _Clock:
    """`time` as the middleware sees it: what the fake apps below say they took, no real time."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now


def _route(clock: _Clock, status: int | None, seconds: float) -> Any:
    """An app taking `seconds` and answering `status`: None, no answer (the client left); 500, a raise."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        clock.now += seconds
        if status == 500:
            raise RuntimeError("a server fault")
        if status is not None:
            await send({"type": "http.response.start", "status": status, "headers": []})
            await send({"type": "http.response.body", "body": b""})

    return app


async def _call(middleware: RequestMetricsMiddleware) -> None:
    scope: Scope = {"type": "http", "path": "/v1/embed", "method": "POST"}

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        return None

    with contextlib.suppress(RuntimeError):
        await middleware(scope, receive, send)


async def test_request_durations_are_split_by_status_class(monkeypatch: pytest.MonkeyPatch) -> None:
    """A queue-full flood (4079 429s in milliseconds, 90 200s and 127 504s in 1-2.5 s) gave the route a
    histogram p90 of 0.1 s: with one series per route, fast refusals hid how slow served requests were.
    Each class is its own series now; the 429s and the client gone (499) are all 4xx."""
    clock = _Clock()
    monkeypatch.setattr(metrics_module, "time", clock)
    metrics = ServiceMetrics()
    answers = ((200, 2.0), (429, 0.004), (429, 0.004), (None, 0.004), (504, 2.0), (500, 0.004))
    for status, seconds in answers:
        await _call(
            RequestMetricsMiddleware(_route(clock, status, seconds), metrics=metrics, routes=["/v1/embed"])
        )
    text = _series(metrics)

    def bucket(klass: str, le: str) -> float:
        labels = {"route": "/v1/embed", "method": "POST", "status_class": klass, "le": le}
        return _sample(text, "htmllm_request_duration_seconds_bucket", **labels)

    assert (bucket("2xx", "1.0"), bucket("2xx", "2.5")) == (0.0, 1.0)
    assert bucket("4xx", "0.005") == 3.0  # two 429s and the 499
    assert (bucket("5xx", "1.0"), bucket("5xx", "2.5")) == (1.0, 2.0)  # the 500, then the 504
    assert 'status="499"' in text and 'status="429"' in text  # the counter keeps each code


def test_status_classes_are_bounded() -> None:
    assert [status_class(s) for s in (101, 200, 304, 429, 499, 504)] == [
        "1xx",
        "2xx",
        "3xx",
        "4xx",
        "4xx",
        "5xx",
    ]
    assert {status_class(s) for s in (0, 99, 600, 999, -1)} == {"other"}


async def test_served_and_refused_requests_are_timed_apart_through_the_app(
    settings_for: SettingsFactory,
) -> None:
    async with app_client(settings_for()) as client:
        assert (await client.post("/v1/embed", json={"documents": [{"html": page(1)}]})).status_code == 200
        assert (await client.post("/v1/embed", json={"documents": []})).status_code in (400, 422)
        text = (await client.get("/metrics")).text
    for klass in ("2xx", "4xx"):
        labels = {"route": "/v1/embed", "method": "POST", "status_class": klass}
        assert _sample(text, "htmllm_request_duration_seconds_count", **labels) == 1.0


_LINUX_PROC = Path("/proc/self/stat").exists()


@pytest.mark.skipif(not _LINUX_PROC, reason="prometheus_client reads process_* from /proc")
async def test_metrics_tell_the_process_memory_and_descriptors_in_every_app(
    settings_for: SettingsFactory,
) -> None:
    """docs/deployment.md sends operators to /metrics for memory, and the app's own registry had no
    process series at all. Each app has its own registry, so two in one process both get them."""
    async with app_client(settings_for(warmup=False), wait_ready=False) as client:
        text = (await client.get("/metrics")).text
    for name in ("process_resident_memory_bytes", "process_open_fds", "process_max_fds"):
        assert float(_gauge(text, name)) > 0, name
    assert "process_cpu_seconds_total " in text and "python_info{" in text
    assert "process_resident_memory_bytes " in _series(ServiceMetrics())  # a second registry, no clash


@pytest.mark.skipif(not _LINUX_PROC, reason="prometheus_client reads process_* from /proc")
@pytest.mark.parametrize("auto_describe", [True, False])
def test_a_registry_that_has_the_process_series_already_gets_them_once(auto_describe: bool) -> None:
    """A host's registry (prometheus_client's global one has both collectors, and checks names: a second
    copy raised) is accepted, and one that does not check names is not scraped twice."""
    registry = CollectorRegistry(auto_describe=auto_describe)
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    text = _series(ServiceMetrics(registry=registry))
    assert "htmllm_queue_size" in text
    for name in ("process_resident_memory_bytes ", "process_open_fds ", "python_info{"):
        assert len([line for line in text.splitlines() if line.startswith(name)]) == 1, name


def _alert_table_queries() -> list[str]:
    docs = Path(__file__).resolve().parents[2] / "docs" / "deployment.md"
    section = docs.read_text(encoding="utf-8").split("\n## Alerts\n", 1)[1].split("\n#", 1)[0]
    return [cell for line in section.splitlines() if line.startswith("|") for cell in line.split("`")[1::2]]


# The labels the scrape target (the ServiceMonitor) adds to every series, or the kubelet's series have.
_TARGET_LABELS = {"pod", "namespace", "container", "resource"}
# The series of a TYPE line's family (a counter's TYPE line names its `_total` series already).
_SUFFIXES = {"counter": ("",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}


@pytest.mark.skipif(not _LINUX_PROC, reason="the memory alerts read process_* from /proc")
async def test_every_series_and_label_the_alert_table_names_is_in_a_scrape(
    settings_for: SettingsFactory,
) -> None:
    """docs/deployment.md had sent operators to metrics for memory that no scrape held: every series
    name and label its alert table's PromQL uses must be one /metrics answers (labelled series that have
    no sample yet count by their TYPE line), or one the target or the kubelet adds."""
    async with app_client(settings_for()) as client:
        assert (await client.post("/v1/embed", json={"documents": [{"html": page(1)}]})).status_code == 200
        assert (await client.post("/v1/embed", json={"documents": []})).status_code == 400
        text = (await client.get("/metrics")).text
    types = re.findall(r"^# TYPE (\w+) (\w+)$", text, re.M)
    exposed = {name + suffix for name, kind in types for suffix in _SUFFIXES[kind]}
    labels = set(re.findall(r'(\w+)="', text)) | _TARGET_LABELS
    queries = _alert_table_queries()
    assert len(queries) >= 8, queries
    names = {n for q in queries for n in re.findall(r"\b(?:htmllm|process|python)_[a-z_]+", q)}
    assert names and names <= exposed, names - exposed
    used = {label for q in queries for label in re.findall(r'(\w+)\s*(?:=~|!=|=)\s*"', q)}
    used |= {
        label.strip()
        for q in queries
        for group in re.findall(r"by \(([^)]*)\)", q)
        for label in group.split(",")
    }
    assert used and used <= labels, used - labels


def test_a_metric_named_in_a_help_text_is_one_a_query_finds() -> None:
    # A HELP text is where a dashboard author copies a name from: `htmllm_result_cache_hits` (the
    # counter's name without its `_total`) had given an empty query.
    text = _series(ServiceMetrics())
    exported = {line.split("{")[0].split(" ")[0] for line in text.splitlines() if not line.startswith("#")}
    named = {
        name
        for line in text.splitlines()
        if line.startswith("# HELP ")
        for name in re.findall(r"\bhtmllm_\w+", line.split(" ", 3)[3])
    }
    assert named and named <= exported, sorted(named - exported)
