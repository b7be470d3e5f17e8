"""Probes, model information and the Prometheus scrape: `/health`, `/ready`, `/info`, `/metrics`.

None needs an API key: probes and scrapers carry no secrets, and `/info` says nothing a client of the
model routes could not learn from their answers.
"""

from __future__ import annotations

from fastapi import APIRouter, Response
from prometheus_client import CONTENT_TYPE_LATEST

from service import __version__
from service.api.metrics import exposition
from service.api.openapi import UNAVAILABLE, error_responses
from service.api.routers import get_route
from service.api.runtime import EngineDep, RuntimeDep
from service.api.schemas import HeadInfo, HealthResponse, InfoResponse, Limits, ReadyResponse
from service.core.errors import ErrorCode, HtmllmError
from service.core.extract import EXTRACTION_VERSION
from service.engine import ModelInfo

router = APIRouter(tags=["operations"])


# Liveness fails with `unhealthy` alone (no Retry-After: a restart, not a wait, cures it); readiness and
# /info with the engine's `not_ready` / `shutting_down`.
_UNHEALTHY = error_responses(503, codes={503: [ErrorCode.UNHEALTHY]})
_UNAVAILABLE = error_responses(503, codes=UNAVAILABLE)


@get_route(
    router, "/ping", summary="Liveness (text-embeddings-inference's SageMaker route)", responses=_UNHEALTHY
)
@get_route(router, "/", summary="Liveness (text-embeddings-inference's `GET /`)", responses=_UNHEALTHY)
@get_route(router, "/health", summary="Liveness: the process answers", responses=_UNHEALTHY)
async def health(runtime: RuntimeDep) -> HealthResponse:
    """200 while the process can serve; 503 once the backend has failed every pass (or hung in one), the
    warm-up has kept failing, no preprocessing or extractor process could start, or one preprocessing
    job has run (a thread cannot be stopped: a restart frees it), for `HTMLLM_UNHEALTHY_AFTER_S`: a
    corrupted CUDA context does not heal in-process, a restart does. At once when the model's process
    (`HTMLLM_INFERENCE_PROCESS`) died and cannot be started again because the checkpoint changed since
    the server started (a restart serves the new checkpoint), and when no preprocessing or extractor
    process can start and the code on disk changed since the server started (a package upgraded in
    place: a restart runs the new code). Each turn to 503 is logged once, as an error with its reason
    ("a restart is needed"), and its end once: what a liveness restart leaves in the log."""
    reason = runtime.observe_health()
    if reason is not None:
        raise HtmllmError(f"the backend is unhealthy: {reason}", code=ErrorCode.UNHEALTHY)
    return HealthResponse()


@get_route(router, "/ready", summary="Readiness: model loaded and warmed", responses=_UNAVAILABLE)
async def ready(runtime: RuntimeDep) -> ReadyResponse:
    """200 once the model has run one full-size batch; 503 before, once shutdown began, while the
    backend fails (`HTMLLM_UNREADY_AFTER_FAILURES` passes in a row, until a pass or probe succeeds),
    while no preprocessing process can start (as many tries in a row refused for it, pages refused
    together counting once, until one or a probe page gets one), while a preprocessing job is stuck
    (on a thread, past `HTMLLM_UNREADY_AFTER_PASS_S`; one try on a process, past the request timeout, a
    worker's start (120 s) and 10 s), while no extractor process can start (as many tries in a row
    refused for it, a request's jobs refused together counting once, until one or a probe job gets one),
    and while one pass has run past `HTMLLM_UNREADY_AFTER_PASS_S` (the request timeout by default). A
    run of refusals below the threshold is checked by a probe page or job once it has lasted 5 s (by
    /ready and by the /metrics scrape): its success ends it. The condition is `Runtime.unready_reason`'s;
    while it holds every answer closes its connection. A 503 here is a probe's answer, not a request
    failure (not counted in `htmllm_request_failures_total`)."""
    engine = runtime.engine
    refused = runtime.not_serving()
    if refused is not None:
        raise refused
    assert engine is not None  # `not_serving` refuses without one
    # Both looked at on every probe: the stall's log lines must not depend on the failure count.
    stalled = runtime.observe_stall()
    pool = runtime.preprocessing_trouble()
    extraction = runtime.extraction_trouble(observe=True)
    trouble = runtime.backend_trouble() or pool or extraction or stalled
    if trouble is not None:  # out of the load balancer until a pass succeeds again
        raise HtmllmError(f"the model is not ready: {trouble}", code=ErrorCode.NOT_READY)
    return ReadyResponse(model=engine.info.name)


def build_identity(model: ModelInfo) -> dict[str, str]:
    """What decides the output for a page beyond the checkpoint, as /info reports it and
    `htmllm_build_info` labels it: `version` alone is not bumped by every change, and in a rolling
    upgrade pods that prune or extract differently had looked identical over HTTP."""
    return {
        "version": __version__,
        "prune_version": model.prune_version,
        "checkpoint_prune_version": model.checkpoint_prune_version,
        "extraction_version": EXTRACTION_VERSION,
    }


@get_route(router, "/info", summary="The model, its heads and the server's limits", responses=_UNAVAILABLE)
async def info(runtime: RuntimeDep, engine: EngineDep) -> InfoResponse:
    model = engine.info
    checkpoint = runtime.checkpoint
    assert checkpoint is not None  # read by the lifespan before the engine is in place
    settings = runtime.settings
    config = engine.config  # the limits the engine runs with
    processes = config.preprocess_pool == "process"  # threads can be neither stopped nor limited
    limits = Limits(
        max_body_bytes=settings.max_body_bytes,
        # What one request may carry: the engine refuses a call larger than its whole queue too, and a
        # TEI client sizing its batches by `max_client_batch_size` had every full batch refused (422).
        max_documents=min(settings.max_documents, settings.max_queue_documents),
        request_timeout_s=settings.request_timeout_s,
        max_length=model.max_length,
        truncate=settings.truncate,
        max_batch_tokens=settings.max_batch_tokens,
        max_batch_requests=settings.max_batch_requests,
        max_wait_ms=settings.max_wait_ms,
        max_queue_documents=settings.max_queue_documents,
        max_inflight_bytes=settings.max_inflight_bytes,
        extract_timeout_s=settings.extract_limit_s,  # what the route runs with, as preprocess's
        preprocess_timeout_s=config.preprocess_timeout_s if processes else None,
        preprocess_memory_limit_mb=config.preprocess_memory_limit_mb if processes else None,
    )
    return InfoResponse(
        model=model.name,
        checkpoint_sha256=checkpoint.sha256,
        training_run_id=checkpoint.training_run_id,
        **build_identity(model),
        embedding_dim=model.embedding_dim,
        max_length=model.max_length,
        backend=model.backend,
        device=model.device,
        dtype=model.dtype,
        threads=model.threads,
        attention=model.attention,
        preprocess_pool=settings.preprocess_pool,
        preprocess_workers=settings.preprocess_workers,
        inference_process=settings.inference_process,
        heads=[
            HeadInfo(name=h.name, kind=h.kind, labels=list(h.labels), metrics=dict(h.metrics))
            for h in model.heads
        ],
        limits=limits,
        auth=runtime.api_keys.enabled,
        model_id=model.name,
        model_type={"embedding": {"pooling": model.pooling}},
        max_input_length=limits.max_length,
        max_client_batch_size=limits.max_documents,
        max_batch_tokens=limits.max_batch_tokens,
        auto_truncate=limits.truncate,
    )


@get_route(
    router,
    "/metrics",
    summary="Prometheus metrics",
    response_class=Response,
    responses={200: {"content": {CONTENT_TYPE_LATEST: {}}, "description": "the text exposition format"}},
)
async def metrics(runtime: RuntimeDep) -> Response:
    # At scrape time, from the condition /ready answers by (`unready_reason`, without /ready's side
    # effects): set on events (1 after the warm-up, 0 at shutdown), the gauge said 1 through every 503
    # of failing or stalled passes and of the drain.
    runtime.metrics.ready.set(1 if runtime.unready_reason() is None else 0)
    # A run of failed passes that no traffic follows is checked (at most every few seconds), so that
    # the gauge below returns to 0 on an idle pod whose backend serves, not only /ready's count; and so
    # is a run of refused worker starts below /ready's threshold, which `htmllm_ready` then follows
    # without a readiness probe.
    runtime.check_failed_passes()
    runtime.check_refused_starts()
    if runtime.engine is not None:  # read at scrape time: the engine keeps the count
        runtime.metrics.backend_failures.set(runtime.engine.health.failures)
        runtime.metrics.set_build(**build_identity(runtime.engine.info))
    return Response(exposition(runtime.metrics), media_type=CONTENT_TYPE_LATEST)
