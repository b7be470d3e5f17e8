"""`create_app(settings, engine=None)`: the FastAPI app, its middleware, routers and lifespan.

The lifespan owns the engine's life: it loads the checkpoint when no engine was given, starts the
batcher, warms the model in the background (`/ready` turns 200 after a full-size batch; a failed
warm-up is retried with backoff) and, on shutdown, drains the queue within `drain_timeout_s` so every
accepted request is answered. A given engine is handed over: the app starts and stops it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from fastapi import FastAPI
from fastapi.routing import APIRoute
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service import __version__
from service.api.api_keys import ApiKeys
from service.api.auth import key_gate, require_api_key
from service.api.checkpoint_identity import served_identity
from service.api.compression import NegotiatedGZipMiddleware
from service.api.connections import ConnectionLifetimeMiddleware
from service.api.errors import ROUTES_STATE, install_error_handlers
from service.api.limits import BodyLimitMiddleware
from service.api.logs import AccessLogMiddleware
from service.api.metrics import (
    EngineMetricsObserver,
    GcPauseObserver,
    RequestMetricsMiddleware,
    ServiceMetrics,
)
from service.api.openapi import install_openapi
from service.api.request_id import RequestIdMiddleware
from service.api.routers import embed, extract, health, openai, preprocess, tei
from service.api.runtime import Runtime
from service.api.schemas import (
    EmbedRequest,
    ExtractRequest,
    OpenAIEmbeddingsRequest,
    PreprocessRequest,
    TeiEmbedRequest,
)
from service.api.settings import Settings
from service.api.timing import TimingMiddleware
from service.core.errors import HtmllmError
from service.core.extract.pool import POOL_NAME as EXTRACTOR_POOL
from service.engine import Engine, ShuttingDownError, collector
from service.engine.preprocessing import POOL_NAME as PREPROCESSING_POOL

logger = logging.getLogger(__name__)

DESCRIPTION = (
    "Embeddings and task-head scores for raw HTML pages from one forward pass. Errors are "
    '`{"error": {"code", "message"}}`; a full queue, or a body past the bytes the server holds at once '
    "(`HTMLLM_MAX_INFLIGHT_BYTES`), answers 429 with `Retry-After`. Request bodies may "
    "be compressed (`Content-Encoding: gzip`, `deflate`, `br` or `zstd`); responses are gzipped for "
    "clients that accept it. Every response the app answers carries `x-request-id` (the client's, if "
    "usable) and `x-total-time` (milliseconds from the request's arrival to its answer); a model "
    "route's 200 adds the stages its work ran through, in milliseconds (`x-prune-time`, "
    "`x-tokenize-time`, `x-queue-time`, `x-inference-time` for embeddings, `x-preprocess-time`, "
    "`x-extract-time`), and, but for `/v1/extract`, `x-checkpoint-sha256`: the checkpoint that answered "
    "(`/info`'s `checkpoint_sha256`). Besides what each operation lists, any request may be answered "
    "404 `not_found` (no such route), 405 `method_not_allowed` (with `Allow`: the methods the path "
    "takes), 431 `headers_too_large` (request line and headers over 64 KiB) or 408 `head_timeout` (they "
    "took longer than `HTMLLM_HEAD_TIMEOUT_S`), the connection then closed, with the same error body. "
    "The 431 and 408 `head_timeout`, the 400 `malformed_request` the HTTP parser sends for bytes that "
    "are not HTTP/1.1 (an unknown method, TLS on the plain port, a bad chunk size), and the 501 "
    "`unsupported_transfer_coding` for a transfer coding other than chunked, come from below the app, "
    "the connection then closed: they carry no `x-request-id` or `x-total-time`. "
    "A request that offers to switch protocols (`Upgrade: h2c`) is "
    "answered over HTTP/1.1 as if it had not."
)


# A failed warm-up is tried again after this long, then twice as long each time, up to the cap: a
# transient fault clears within seconds, and a lasting one costs a full-size batch every 30 s at most.
WARMUP_RETRY_FIRST_S = 1.0
WARMUP_RETRY_MAX_S = 30.0


def load_engine(settings: Settings) -> Engine:
    """The engine for `settings.model_path` (strict checkpoint loading: a bad checkpoint raises)."""
    return Engine.from_checkpoint(settings.model_path, settings.engine_config())


async def _warm_up(runtime: Runtime, engine: Engine) -> None:
    """Warm the model, retrying a failed warm-up with capped exponential backoff until one succeeds.

    A warm-up that failed once (a transient CUDA error, a child process that died) used to leave the
    server live and never ready, for good. Now each failure is logged and retried; /ready says why it
    is not ready meanwhile, and once the warm-up has failed for `HTMLLM_UNHEALTHY_AFTER_S` /health turns
    503 (`Runtime.unhealthy`), so the liveness probe restarts the container. /health rather than an
    exit: the warm-up runs beside the server uvicorn already runs, the app does not own that server
    (tests and benchmarks run several apps in one process), and the liveness probe is already how this
    server asks for a restart (a fault that passes cannot clear), with the kubelet's back-off between
    restarts. Retries go on past that point: a warm-up that succeeds makes the server ready again.
    They end when shutdown begins (SIGTERM): uvicorn drains its connections before the lifespan cancels
    this task, and a full-size pass started then would hold the inference thread the drain needs.
    """
    if runtime.settings.warmup:
        delay = WARMUP_RETRY_FIRST_S
        while True:
            if runtime.drain_deadline is not None or runtime.stopping:
                logger.info("shutting down: no more warm-up attempts after %d", runtime.warmup_attempts)
                return
            runtime.warmup_attempts += 1
            try:
                await engine.warmup()
            except ShuttingDownError:
                return  # stopping: nothing to get ready for
            except Exception as exc:
                runtime.warmup_failed(f"{type(exc).__name__}: {exc}")
                # The traceback once; later failures of the same fault would repeat it every few seconds.
                logger.error(
                    "warm-up attempt %d failed (%s); /ready stays 503, retrying in %.1f s",
                    runtime.warmup_attempts,
                    runtime.warmup_error,
                    delay,
                    exc_info=runtime.warmup_attempts == 1,
                )
                await asyncio.sleep(delay)
                delay = min(WARMUP_RETRY_MAX_S, delay * 2)
                continue
            if runtime.warmup_failing_since is not None:
                logger.warning("warm-up attempt %d succeeded", runtime.warmup_attempts)
            runtime.warmup_succeeded()
            break
    # Everything loaded is in place: freeze it out of full collections (service.engine.collector).
    runtime.collector = collector.prepare_for_serving()
    runtime.ready = True
    logger.info("model %s ready", engine.info.name)


async def _warm_up_then_collect(runtime: Runtime, engine: Engine, gc_pauses: GcPauseObserver) -> None:
    """The warm-up, then, for the app's life, the periodic full collections that the freeze after it
    makes cheap: the net for reference cycles nobody broke (service.engine.collector).

    Collections are timed (`gc_pauses`) from the freeze on, which is when the server turns ready: the
    full collection `prepare_for_serving` runs on purpose before it walks every object loaded (0.1 to
    0.25 s), and had been the one slow full collection of a healthy server: the p99 of
    `htmllm_gc_pause_seconds{generation="2"}` stayed over the GC alert's 0.1 s until a hundred periodic
    ones (one a second) outnumbered it, so every pod start paged. Those of the load and the warm-up come
    before any traffic is served, and are as slow for the same reason. No await between `runtime.ready`
    and the install: every collection while ready is timed."""
    await _warm_up(runtime, engine)
    if runtime.collector is not None:
        gc_pauses.install()
        await collector.collect_cycles()


async def _stop(engine: Engine, drain_timeout_s: float) -> bool:
    """Drain within the time left; what cannot be answered in time fails with ShuttingDownError.
    Whether every document accepted was answered (`serve`'s exit status says so).

    A stop that runs out of time with nothing accepted still owed failed no one: what held it was a
    forward pass nobody waits for (one whose callers all left). That is no drain cut short; it had
    made a pod deleted during a long warm-up exit 1 with an ERROR line, though it had accepted nothing."""
    try:
        async with asyncio.timeout(drain_timeout_s):
            await engine.stop(drain=True)
    except TimeoutError:
        owed = engine.queue_size  # accepted and unanswered: what the stop below fails
        if owed:
            logger.error(
                "the queue did not drain within %.1f s; failing the %d documents left", drain_timeout_s, owed
            )
        else:
            logger.warning(
                "the engine did not stop within %.1f s, though every document accepted was answered: "
                "not waiting for the forward pass in flight, which serves no one",
                drain_timeout_s,
            )
        await engine.stop(drain=False)
        return not owed
    return True


async def _start(runtime: Runtime) -> Engine:
    """The lifespan's start: the engine loaded (unless given), fingerprinted, observed and started."""
    settings, metrics = runtime.settings, runtime.metrics
    if runtime.engine is None:
        runtime.engine = await asyncio.to_thread(load_engine, settings)
    running = runtime.engine
    # The fingerprint the engine's loading process took of what it loaded (a given engine was
    # loaded from `settings.model_path` too, `serve`): not the files there now.
    runtime.checkpoint = await asyncio.to_thread(served_identity, running.info, settings.model_path)
    running.observer = EngineMetricsObserver(metrics)
    if running.config.preprocess_pool == "process":  # threads are never replaced: no series for them
        metrics.watch_worker_pool(PREPROCESSING_POOL)
    runtime.loop = asyncio.get_running_loop()
    await running.start()
    runtime.started = True
    return running


class StartFailureLine:
    """The lifespan's start failed with a typed error (`Runtime.start_failure`: a worker process that could
    not start, out of file descriptors): uvicorn logs it as one line, not Starlette's whole traceback
    (about 100 lines, the cause buried at their end), which is what a failed start sends it. Any other
    failure keeps its traceback: a bug's is what to read. Other scopes pass through untouched."""

    def __init__(self, app: ASGIApp, *, runtime: Runtime) -> None:
        self.app = app
        self.runtime = runtime

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "lifespan":
            await self.app(scope, receive, send)
            return

        async def send_one_line(message: Message) -> None:
            failure = self.runtime.start_failure
            if message["type"] == "lifespan.startup.failed" and failure is not None:
                message = {**message, "message": f"the server cannot start: {failure}"}
            await send(message)

        await self.app(scope, receive, send_one_line)


def create_app(
    settings: Settings, engine: Engine | None = None, *, api_keys: ApiKeys | None = None
) -> FastAPI:
    """The app for `settings`; `engine` (not started) is used instead of loading `settings.model_path`, and
    `api_keys` (`settings`' own, as `serve` checked them before the load) instead of reading them again:
    each reading logs what it found, and a key file holding no key had been said twice."""
    metrics = ServiceMetrics()
    # Started on the first /v1/extract (`Runtime.extraction`), counted from 0 before it: a rate() alert
    # on its replacements has a series from the start.
    metrics.watch_worker_pool(EXTRACTOR_POOL)
    if api_keys is None:
        api_keys = ApiKeys(settings.api_key, settings.api_key_file)  # an unusable key file fails here
    runtime = Runtime(settings=settings, metrics=metrics, api_keys=api_keys, engine=engine)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        try:
            running = await _start(runtime)
        except HtmllmError as exc:  # said in one line (`StartFailureLine`)
            runtime.start_failure = exc.message
            raise
        gc_pauses = GcPauseObserver(metrics)  # installed once the warm-up has frozen what was loaded
        warm = asyncio.create_task(_warm_up_then_collect(runtime, running, gc_pauses))
        try:
            yield
        finally:
            gc_pauses.remove()
            runtime.stopping = True
            runtime.ready = False
            warm.cancel()
            await asyncio.gather(warm, return_exceptions=True)
            # After the periodic collections ended: one now would walk every object the freeze spared.
            if runtime.collector is not None:  # for a process that outlives the app (tests, a host)
                collector.restore(runtime.collector)
            await runtime.cancel_cutoff()
            await runtime.cancel_probe()
            # At least a second, so a stop with nothing queued is never cut short mid-way.
            if not await _stop(running, max(1.0, runtime.drain_time_left())):
                runtime.drain_cut_short = True
            running.close()
            runtime.close_extraction()

    # No redirect from `/v1/embed/` to `/v1/embed`: a 307 that clients do not follow for a POST (httpx
    # never follows by default) read as an empty answer; a path no route has is a 404 `not_found`. The
    # routers' own flag is moot: included, their routes are matched by the app's router.
    app = FastAPI(
        title="htmllm", version=__version__, lifespan=lifespan, docs_url="/docs", redirect_slashes=False
    )
    app.state.runtime = runtime
    install_error_handlers(app)
    routers = (
        health.router,
        embed.router,
        openai.router,
        openai.models_router,
        tei.router,
        preprocess.router,
        extract.router,
    )
    for router in routers:
        app.include_router(router)
    api_routes = [route for router in routers for route in router.routes if isinstance(route, APIRoute)]
    docs_routes = [route for route in app.routes if isinstance(route, Route)]
    setattr(app.state, ROUTES_STATE, [*api_routes, *docs_routes])  # a 405's `Allow` (service.api.errors)
    paths = {route.path for route in api_routes}
    # The routes that need a key (`require_api_key`): the body limit refuses them before reading a body.
    keyed = {
        (method, route.path)
        for router in routers
        if any(dependency.dependency is require_api_key for dependency in router.dependencies)
        for route in router.routes
        if isinstance(route, APIRoute)
        for method in route.methods or ()
    }
    # The requests whose body a route reads: any other (a GET, a 404, a 405) is answered without the body
    # limit reading, holding or charging a byte of it. Matched by exact path: no such route has a
    # parameter in its path.
    bodied = {
        (method, route.path)
        for route in api_routes
        for method in route.methods or ()
        if method not in ("GET", "HEAD")
    }
    if any("{" in path for _, path in bodied):
        raise RuntimeError(f"a route that reads a body has a path parameter: {sorted(bodied)}")
    paths |= {path for path in (app.openapi_url, app.docs_url, app.redoc_url) if path}
    # Added innermost first: metrics see every request, including those the body limit refuses, every
    # response, compressed or not, carries its request id, and any may end its connection.
    app.add_middleware(
        BodyLimitMiddleware,
        max_body_bytes=settings.max_body_bytes,
        body_timeout_s=settings.body_timeout_s,
        max_inflight_bytes=settings.max_inflight_bytes,
        retry_after_s=settings.retry_after_s,
        readers=runtime.body_readers,
        metrics=metrics,
        gate=key_gate(api_keys, keyed),
        body_routes=frozenset(bodied),
    )
    if settings.gzip_min_bytes > 0:
        # Level 1: most of gzip's gain on float JSON for a fraction of level 9's CPU, which the model needs.
        app.add_middleware(NegotiatedGZipMiddleware, minimum_size=settings.gzip_min_bytes, compresslevel=1)
    app.add_middleware(RequestMetricsMiddleware, metrics=metrics, routes=paths)
    # Outside the body limit and compression: x-total-time covers the body's read and the answer's gzip.
    app.add_middleware(TimingMiddleware)
    if settings.access_log:
        # Inside the request id (it names it), outside the rest: every answer, the body limit's included.
        app.add_middleware(AccessLogMiddleware)
    app.add_middleware(RequestIdMiddleware)
    # Outermost: it sees every answer the app gives, the body limit's 429 included.
    app.add_middleware(
        ConnectionLifetimeMiddleware,
        max_requests=settings.connection_max_requests,
        max_age_s=settings.connection_max_age_s,
        unready=runtime.unready_reason,
    )
    app.add_middleware(StartFailureLine, runtime=runtime)  # the lifespan's alone
    install_openapi(
        app,
        description=DESCRIPTION,
        body_models=(
            EmbedRequest,
            PreprocessRequest,
            ExtractRequest,
            OpenAIEmbeddingsRequest,
            TeiEmbedRequest,
        ),
        auth=api_keys.enabled,
    )
    return app
