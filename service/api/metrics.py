"""Prometheus metrics, in a registry owned by one app (no global registry, nothing at import).

Request counts and durations per route come from `RequestMetricsMiddleware`; queue size, batch sizes,
batch tokens, per-stage durations and documents and tokens processed from the Engine's observer hooks
(`EngineMetricsObserver`); failures by code from the error handler; failed extractions from the
/v1/extract router (the three failure counters exported at 0 under every label value from the start);
worker processes lost or replaced from their pools' `on_replaced` (the preprocessing pool's through the
Engine's observer, the extractor pool's from the runtime that builds it); the build's
identity (`htmllm_build_info`) and readiness from the /metrics route at scrape time; the server process's
memory, CPU and file descriptors (`process_*`) and `python_info` from prometheus_client's own collectors,
read at scrape time.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Iterable, Iterator

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.metrics_core import Metric
from starlette.routing import compile_path
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.api.connections import status_sent
from service.core.errors import ErrorCode
from service.core.extract import EXTRACTORS, UNION
from service.core.worker_health import REPLACEMENT_REASONS
from service.engine import BatchStats, EngineObserver

# Seconds: from sub-millisecond pruning to a long CPU batch.
_DURATION_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
# Seconds: a young collection takes tens of microseconds, a full one over a loaded model's objects
# hundreds of milliseconds unless they are frozen (service.engine.collector).
_GC_PAUSE_BUCKETS = (0.0001, 0.0005, 0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
_BATCH_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
_BATCH_TOKEN_BUCKETS = (64, 256, 1024, 2048, 4096, 8192, 16384, 32768, 65536)
UNMATCHED_ROUTE = "<unmatched>"
OTHER_METHOD = "<other>"
_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS", "PATCH", "TRACE", "CONNECT"})
# `htmllm_build_info`'s labels: /info's fields of the same names.
BUILD_LABELS = ("version", "prune_version", "checkpoint_prune_version", "extraction_version")
# nginx's "client closed request": never seen by the client, but visible in the request metrics.
CLIENT_CLOSED_STATUS = 499
OTHER_STATUS_CLASS = "other"

# The failure counters are exported from 0 under every value their labels can take, as the worker
# replacements are (`watch_worker_pool`): a series born at its first failure reads as no increase to
# rate() and increase(), so a burst of 16 failures within one scrape interval (no series, then 16) had
# fired none of the alerts on them. Each label is a closed set, so the series are few (about 50 in all).
# The codes no counted failure can carry: the bulk commands' own, the HTTP parser's answers, which come
# from below the app (service.api.http_protocol), and the liveness probe's `unhealthy`: a probe's 503 is
# its outcome, not a request failure (service.api.routers.health), and no other answer carries it.
_UNCOUNTED_CODES = frozenset(
    {
        ErrorCode.INPUT_UNREADABLE,
        ErrorCode.HEADERS_TOO_LARGE,
        ErrorCode.HEAD_TIMEOUT,
        ErrorCode.MALFORMED_REQUEST,
        ErrorCode.UNSUPPORTED_TRANSFER_CODING,
        ErrorCode.UNHEALTHY,
    }
)
REQUEST_FAILURE_CODES = tuple(code for code in ErrorCode if code not in _UNCOUNTED_CODES)
# Besides those, the codes of a request, never of one of its documents (its key, route, method, body's
# arrival).
_REQUEST_ONLY_CODES = frozenset(
    {
        ErrorCode.UNAUTHORIZED,
        ErrorCode.NOT_FOUND,
        ErrorCode.METHOD_NOT_ALLOWED,
        ErrorCode.BODY_TIMEOUT,
    }
)
DOCUMENT_FAILURE_CODES = tuple(code for code in REQUEST_FAILURE_CODES if code not in _REQUEST_ONLY_CODES)
# A /v1/extract entry fails with the extractor's failure, or at the request's deadline.
EXTRACTION_FAILURE_CODES = (ErrorCode.EXTRACTION_FAILED, ErrorCode.TIMEOUT)
EXTRACTOR_NAMES = (UNION, *EXTRACTORS)  # what an entry may ask for (`schemas.ExtractorName`)


def status_class(status: int) -> str:
    """`2xx` for 200..299 and so on: the duration histogram's bounded stand-in for the status code."""
    return f"{status // 100}xx" if 100 <= status <= 599 else OTHER_STATUS_CLASS


class ServiceMetrics:
    """Every metric the service exports, registered in `registry`."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "htmllm_requests", "HTTP requests answered", ["route", "method", "status"], registry=r
        )
        # By status class too: a flood of 429s answered in milliseconds had pulled the route's p90 to
        # 0.1 s while every 200 and 504 took over a second, so a latency alert stayed quiet exactly when
        # the pod was overloaded. A class, not the code: at most six values whatever the server sends.
        self.request_duration = Histogram(
            "htmllm_request_duration_seconds",
            "HTTP request duration, body read to response sent, by status class (2xx for served requests' "
            "latency: fast 4xx refusals would hide it)",
            ["route", "method", "status_class"],
            buckets=_DURATION_BUCKETS,
            registry=r,
        )
        self.requests_in_progress = Gauge(
            "htmllm_requests_in_progress", "HTTP requests being handled", ["route"], registry=r
        )
        self.failures = Counter(
            "htmllm_request_failures",
            "Requests answered with an error, by error code (not the probes' 503s: /ready's is htmllm_ready)",
            ["code"],
            registry=r,
        )
        self.queue_size = Gauge(
            "htmllm_queue_size",
            "Documents accepted and not yet answered: preprocessing, queued or in a forward pass "
            "(what HTMLLM_MAX_QUEUE_DOCUMENTS bounds)",
            registry=r,
        )
        self.body_bytes_in_flight = Gauge(
            "htmllm_request_body_bytes_in_flight",
            "Bytes of request bodies held by requests not yet answered (HTMLLM_MAX_INFLIGHT_BYTES bounds it)",
            registry=r,
        )
        self.batch_size = Histogram(
            "htmllm_batch_size", "Documents per forward pass", buckets=_BATCH_SIZE_BUCKETS, registry=r
        )
        self.batch_tokens = Histogram(
            "htmllm_batch_tokens", "Real tokens per forward pass", buckets=_BATCH_TOKEN_BUCKETS, registry=r
        )
        self.batch_padded_tokens = Histogram(
            "htmllm_batch_padded_tokens",
            "Tokens a forward pass computed, padding included",
            buckets=_BATCH_TOKEN_BUCKETS,
            registry=r,
        )
        self.batch_inference = Histogram(
            "htmllm_batch_inference_seconds",
            "Forward-pass duration",
            buckets=_DURATION_BUCKETS,
            registry=r,
        )
        self.batch_host = Histogram(
            "htmllm_batch_host_seconds",
            "CUDA: the part of a forward pass the host spent issuing it, before waiting for the device "
            "(near the pass's duration: launches or the GIL bound it, not the GPU)",
            buckets=_DURATION_BUCKETS,
            registry=r,
        )
        self.stage_duration = Histogram(
            "htmllm_stage_duration_seconds",
            "Per-document time spent in each stage (prune, tokenize, queue, inference, total)",
            ["stage"],
            buckets=_DURATION_BUCKETS,
            registry=r,
        )
        self.documents = Counter(
            "htmllm_documents_processed",
            "Documents answered with a result, result-cache hits included (htmllm_result_cache_hits_total)",
            registry=r,
        )
        # From the forward passes (`batch_done`), not the answers: a cache hit answers its tokens without
        # the model, and counted there it had made throughput dashboards read more work than was done.
        self.tokens = Counter(
            "htmllm_tokens_processed",
            "Real tokens (no padding) of the documents the model ran in its forward passes for requests; "
            "not result-cache hits, the warm-up or probe passes",
            registry=r,
        )
        self.documents_failed = Counter(
            "htmllm_documents_failed",
            "Documents answered with an error, by code, each under its own (a failed all-or-nothing call "
            "counts the documents that failed or were late, not every document it held)",
            ["code"],
            registry=r,
        )
        # Per entry of /v1/extract, which is a 200 whatever its entries say: without this, extractions
        # failing or timing out show in no series. Both labels are closed sets (ErrorCode, extractor
        # names), every pair exported from 0 (`EXTRACTION_FAILURE_CODES`), as both failure counters above.
        self.extractions_failed = Counter(
            "htmllm_extractions_failed",
            "/v1/extract extractions answered with an error, by code and extractor asked for",
            ["code", "extractor"],
            registry=r,
        )
        # A worker process killed or replaced is otherwise one warning line (`service.core.workers`) among
        # millions of pages a day: no rate an alert can watch. Both labels are closed sets: the pools'
        # names, and `worker_health.REPLACEMENT_REASONS`, every pair of a pool the server runs from 0
        # (`watch_worker_pool`), so that a rate() has a series before the first replacement.
        self.worker_replacements = Counter(
            "htmllm_worker_replacements",
            "Preprocessing and extractor worker processes lost or replaced, by pool and reason (killed from "
            "outside, crashed, lost_status, time_limit, stalled, memory_retained, idle_died)",
            ["pool", "reason"],
            registry=r,
        )
        self.cache_hits = Counter(
            "htmllm_result_cache_hits",
            "Documents answered from the result cache, without the model",
            registry=r,
        )
        self.documents_skipped = Counter(
            "htmllm_documents_skipped",
            "Documents dropped before their forward pass (client gone, deadline passed, or another "
            "document failed their all-or-nothing call)",
            registry=r,
        )
        self.ready = Gauge(
            "htmllm_ready",
            "1 while /ready answers 200 (read at each scrape): 0 before the warm-up succeeded, while the "
            "backend fails (HTMLLM_UNREADY_AFTER_FAILURES), a pass has stalled or no preprocessing process "
            "can start, and once shutdown began",
            registry=r,
        )
        self.backend_failures = Gauge(
            "htmllm_backend_consecutive_failures",
            "Forward passes failed in a row (0 after one succeeds, the pass an inference process started "
            "anew runs before it serves included, or a check pass an idle pod runs 5 s after a failure); "
            "/ready is 503 from HTMLLM_UNREADY_AFTER_FAILURES on",
            registry=r,
        )
        # An info metric (value 1, the facts in its labels): in a rolling upgrade the old and the new pods
        # share a name and often a `version`, yet may embed a page differently. One process, one series.
        self.build_info = Gauge(
            "htmllm_build_info",
            "1, labelled with what decides a page's output: the service's version, the pruner it runs, the "
            "pruner the checkpoint was trained on, and the extraction code's version",
            list(BUILD_LABELS),
            registry=r,
        )
        self.gc_pause = Histogram(
            "htmllm_gc_pause_seconds",
            "CPython garbage collections by generation; each holds the GIL, so the event loop and the "
            "forward pass both wait it out",
            ["generation"],
            buckets=_GC_PAUSE_BUCKETS,
            registry=r,
        )
        for code in REQUEST_FAILURE_CODES:
            self.failures.labels(code=code.value)
        for code in DOCUMENT_FAILURE_CODES:
            self.documents_failed.labels(code=code.value)
        for code in EXTRACTION_FAILURE_CODES:
            for extractor in EXTRACTOR_NAMES:
                self.extractions_failed.labels(code=code.value, extractor=extractor)
        # The app's registry is its own, so nothing else adds the process's series to /metrics: without
        # these no metric told the server's memory (the pod's memory alert) or its open descriptors. A
        # registry given may have them already (prometheus_client's global one does); a second copy would
        # be refused there, or else scraped twice, so its own families are looked at first.
        present = {metric.name for metric in r.collect()}
        if "process_resident_memory_bytes" not in present:
            ProcessCollector(registry=r)
        if "python_info" not in present:
            PlatformCollector(registry=r)

    def watch_worker_pool(self, pool: str) -> None:
        """Export `htmllm_worker_replacements_total` for `pool` under every reason, at 0 until one comes."""
        for reason in REPLACEMENT_REASONS:
            self.worker_replacements.labels(pool=pool, reason=reason)

    def worker_replaced(self, pool: str, reason: str) -> None:
        """A worker of `pool` lost or replaced for `reason` (a `WorkerPool`'s `on_replaced`; any thread)."""
        self.worker_replacements.labels(pool=pool, reason=reason).inc()

    def set_build(self, **labels: str) -> None:
        """`htmllm_build_info` for the build and checkpoint `labels` name (every one of `BUILD_LABELS`),
        as its only series. Its values come from the code and the checkpoint, never from a client, so
        the series stay one per process."""
        self.build_info.clear()
        self.build_info.labels(**labels).set(1)


class _WithoutCreated:
    """A view of a registry without the `<name>_created` series prometheus_client adds to every counter
    and histogram child (a Unix timestamp per label set, doubling the series a scrape stores for a
    value no dashboard here reads). Its own switch, `disable_created_metrics()`, is process-wide: it
    would change every other registry in the process (a host's, the other apps of a test run)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._registry = registry

    def collect(self) -> Iterator[Metric]:
        for metric in self._registry.collect():
            created = f"{metric.name}_created"
            copy = Metric(metric.name, metric.documentation, metric.type, metric.unit)
            copy.samples = [sample for sample in metric.samples if sample.name != created]
            yield copy


def exposition(metrics: ServiceMetrics) -> bytes:
    """The text exposition of `metrics` (what /metrics answers), without `_created` series."""
    return generate_latest(_WithoutCreated(metrics.registry))


class GcPauseObserver:
    """A `gc.callbacks` hook that times every collection into `htmllm_gc_pause_seconds`.

    A full collection over unfrozen start-up objects stalls the whole server for a quarter of a second
    (service.engine.collector); this is how an operator sees whether that happens. Collections never
    overlap (CPython runs one at a time, under the GIL), so one start time suffices.
    """

    def __init__(self, metrics: ServiceMetrics) -> None:
        self._generations = [metrics.gc_pause.labels(generation=str(g)) for g in range(3)]
        self._started: float | None = None

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        elif self._started is not None:
            self._generations[info["generation"]].observe(time.perf_counter() - self._started)
            self._started = None

    def install(self) -> None:
        gc.callbacks.append(self)

    def remove(self) -> None:
        if self in gc.callbacks:
            gc.callbacks.remove(self)


class EngineMetricsObserver(EngineObserver):
    """The Engine's hooks, turned into this app's metrics."""

    def __init__(self, metrics: ServiceMetrics) -> None:
        self.metrics = metrics

    def batch_done(self, stats: BatchStats) -> None:
        m = self.metrics
        m.batch_size.observe(stats.documents)
        m.batch_tokens.observe(stats.tokens)
        m.batch_padded_tokens.observe(stats.padded_tokens)
        m.batch_inference.observe(stats.inference_s)
        if stats.host_s is not None:
            m.batch_host.observe(stats.host_s)
        m.tokens.inc(stats.tokens)  # the model's work: a result-cache hit runs no pass

    def documents_skipped(self, documents: int) -> None:
        self.metrics.documents_skipped.inc(documents)

    def stage(self, name: str, seconds: float) -> None:
        self.metrics.stage_duration.labels(stage=name).observe(seconds)

    def queue_size(self, documents: int) -> None:
        self.metrics.queue_size.set(documents)

    def documents_done(self, documents: int, tokens: int) -> None:
        """Documents answered; their `tokens` include those answered from the result cache, so the
        tokens the model ran are counted per pass (`batch_done`)."""
        self.metrics.documents.inc(documents)

    def documents_failed(self, code: ErrorCode, documents: int) -> None:
        self.metrics.documents_failed.labels(code=code.value).inc(documents)

    def cache_hit(self) -> None:
        self.metrics.cache_hits.inc()

    def worker_replaced(self, pool: str, reason: str) -> None:
        """A preprocessing process lost or replaced (`Engine._worker_replaced`)."""
        self.metrics.worker_replaced(pool, reason)


class RequestMetricsMiddleware:
    """Counts and times every HTTP request by route, method and status (its class for the times; pure ASGI,
    streams untouched). The status is the one the client got: the protocol's where it answered in the
    app's place (a malformed body's 400, service.api.connections)."""

    def __init__(self, app: ASGIApp, *, metrics: ServiceMetrics, routes: Iterable[str]) -> None:
        self.app = app
        self.metrics = metrics
        # The label is the route's path (its template where it has parameters: `/v1/models/{model_id}`)
        # and a constant otherwise: label cardinality stays bounded whatever paths scanners try, and
        # requests answered before routing (413 from the body limit) still count against their route.
        self.routes = frozenset(route for route in routes if "{" not in route)
        self.templates = tuple((compile_path(route)[0], route) for route in routes if "{" in route)

    def _template(self, path: str) -> str:
        return next((route for regex, route in self.templates if regex.match(path)), UNMATCHED_ROUTE)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        # No response at all means the client left first (nginx's 499); an exception means a 500.
        status = CLIENT_CLOSED_STATUS
        path = str(scope.get("path", ""))
        route = path if path in self.routes else self._template(path)
        method = str(scope.get("method", ""))
        if method not in _METHODS:
            method = OTHER_METHOD  # HTTP lets a client invent methods; each would be a new series

        async def send_wrapper(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        in_progress = self.metrics.requests_in_progress.labels(route=route)
        in_progress.inc()
        try:
            await self.app(scope, receive, send_wrapper)
        except Exception:
            status = 500
            raise
        finally:
            in_progress.dec()
            status = status_sent(scope, status)  # what the client got: the protocol's 400 for a bad body
            self.metrics.requests.labels(route=route, method=method, status=str(status)).inc()
            self.metrics.request_duration.labels(
                route=route, method=method, status_class=status_class(status)
            ).observe(time.perf_counter() - start)
