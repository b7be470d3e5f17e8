"""`POST /v1/extract`: plain text per extractor (resiliparse, trafilatura, jusText, or their union).

Extraction is CPU-bound and runs in the runtime's own threads and extractor processes
(`service.core.extract`), never on the event loop; the request limits and errors are /v1/embed's. One
extractor failing on one page is reported in that entry, so the rest of the request still counts; so is
one still queued or running at the request timeout (`timeout`), as `/v1/embed` reports a late document
with `on_error: report`: the extractions finished by then keep their results. An extractor process
killed from outside under a page in each of its tries (the OOM killer: `ExtractorLostError`) is no
failure of the page: the request gets the retryable 503 `not_ready`, with Retry-After.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request, Response
from pydantic import ValidationError

from service.api.auth import require_api_key
from service.api.documents import read_body, to_documents, validation_error
from service.api.inference import DEADLINE_GRACE_S
from service.api.limits import check_document_count
from service.api.metrics import ServiceMetrics
from service.api.openapi import EXTRACT_STAGES, MODEL_ROUTE_ERRORS, raw_body_openapi, timing_responses
from service.api.rendering import json_response
from service.api.runtime import RuntimeDep, answer_or_cancel
from service.api.schemas import (
    ErrorDetail,
    ExtractionOut,
    ExtractorName,
    ExtractRequest,
    ExtractResponse,
    ExtractResult,
)
from service.api.timing import milliseconds
from service.core.errors import ErrorCode, HtmllmError
from service.core.extract import (
    DEFAULT_ORDER,
    JUSTEXT,
    UNION,
    ExtractionError,
    ExtractorPool,
    extract,
    normalize_language,
)
from service.engine import DeadlineExceededError, Document

router = APIRouter(tags=["extract"], dependencies=[Depends(require_api_key)], responses=MODEL_ROUTE_ERRORS)
# The extractors a `language` reaches: jusText's, and the union's, whose order (`extract`'s default, the
# only one this route runs) ends with jusText.
_READ_LANGUAGE = frozenset({JUSTEXT, UNION} if JUSTEXT in DEFAULT_ORDER else {JUSTEXT})


def _extract_one(
    doc: Document,
    extractor: str,
    *,
    min_words: int,
    language: str | None,
    timeout_s: float,
    pool: ExtractorPool,
    metrics: ServiceMetrics,
) -> ExtractionOut:
    try:
        result = extract(
            doc.html,
            extractor,
            encoding=doc.encoding,
            timeout_s=timeout_s,
            min_words=min_words,
            language=language,
            runner=pool,
        )
    except ExtractionError as exc:
        return _failed(extractor, exc, metrics=metrics)
    # The chosen output's attempt says why it failed the filter; a union tries each extractor once.
    reason = next((a.reason for a in result.attempts if a.extractor == result.extractor), None)
    return ExtractionOut(
        extractor=extractor,
        chosen=result.extractor,
        text=result.text,
        words=result.words,
        passed=result.passed,
        language=result.language,
        encoding=result.encoding,
        reason=reason,
    )


def _failed(extractor: str, error: HtmllmError, *, metrics: ServiceMetrics) -> ExtractionOut:
    """A failed entry, counted: the response is a 200 whatever its entries say, so only the metric shows
    failures to an operator."""
    metrics.extractions_failed.labels(code=error.code.value, extractor=extractor).inc()
    return ExtractionOut(
        extractor=extractor,
        chosen=None,
        text=None,
        words=0,
        passed=False,
        language=None,
        encoding=None,
        error=ErrorDetail.of(error),
    )


async def _settle(
    jobs: Sequence[Future[ExtractionOut]],
    extractors: Sequence[str],
    *,
    timeout_s: float,
    metrics: ServiceMetrics,
) -> list[ExtractionOut]:
    """Every job's output, in order; one not finished `timeout_s` from now is cancelled and answered as a
    `timeout` entry, so a few slow pages do not cost the batch the results of all the others.

    A job still queued never starts; one running has no way to be stopped from here, and ends at its
    extractor time limit (the backlog counts it until then). Cancelled from outside (the client went
    away, the backstop timer), every job is cancelled with it.
    """
    waiting = [asyncio.wrap_future(job) for job in jobs]
    try:
        done, _ = await asyncio.wait(waiting, timeout=timeout_s)
        outputs: list[ExtractionOut] = []
        for job, wrapped, extractor in zip(jobs, waiting, extractors, strict=True):
            if wrapped in done or (job.done() and not job.cancelled()):  # the latter: ended just now
                # Raises `ExtractorLostError` (the request's 503) or a bug in the route (a 500).
                outputs.append(job.result())
                continue
            where = "running" if job.running() else "queued"
            late = DeadlineExceededError(
                f"the request timeout ({timeout_s:g} s) passed while this extraction was {where}"
            )
            outputs.append(_failed(extractor, late, metrics=metrics))
        return outputs
    finally:
        for wrapped in waiting:
            wrapped.cancel()  # a queued job's thread future with it (`wrap_future` passes the cancel on)


def _raw_request(
    extractors: list[ExtractorName] | None, min_words: int | None, language: str | None
) -> ExtractRequest:
    """A raw body's query options as the JSON body's fields: the same defaults and the same limits.

    `min_words=0` is an option like any other (an `or` default turned it into 50), and too many
    `extractors` are a 422 naming the field, not a 500 from a model built outside the request parser.
    """
    fields: dict[str, object] = {"documents": []}
    if extractors is not None:
        fields["extractors"] = extractors
    if min_words is not None:
        fields["min_words"] = min_words
    if language is not None:
        fields["language"] = language
    try:
        return ExtractRequest.model_validate(fields)
    except ValidationError as exc:
        raise validation_error(exc) from exc


def _check_language_is_read(parsed: ExtractRequest) -> None:
    """422 for a `language` that no extractor asked for reads: it had been dropped in silence (a 200 whose
    texts the client took for German-aware ones), where `htmllm extract` refuses it as a usage error."""
    if parsed.language is None or _READ_LANGUAGE.intersection(parsed.extractors):
        return
    raise HtmllmError(
        f"language is jusText's, which none of extractors {parsed.extractors} runs: add {JUSTEXT!r} or "
        f"{UNION!r} to them, or leave language out",
        code=ErrorCode.VALIDATION,
    )


@router.post(
    "/v1/extract",
    response_model=ExtractResponse,
    summary="Extract the plain text of pages",
    responses=timing_responses(EXTRACT_STAGES, checkpoint=False),
    openapi_extra=raw_body_openapi(ExtractRequest),
)
async def extract_text(
    request: Request,
    runtime: RuntimeDep,
    id: Annotated[str | None, Query(description="raw body only: the page's id")] = None,
    extractors: Annotated[
        list[ExtractorName] | None,
        Query(
            description="raw body only (default union); at most four, each named once",
            json_schema_extra={"maxItems": 4, "uniqueItems": True},  # checked as the JSON body's are
        ),
    ] = None,
    min_words: Annotated[int | None, Query(ge=0, description="raw body only (default 50)")] = None,
    language: Annotated[
        str | None, Query(max_length=64, description="raw body only (default: detected per page)")
    ] = None,
) -> Response:
    """A JSON body of documents, or one raw page with its options in the query string."""
    if runtime.stopping:
        raise HtmllmError("the server is shutting down", code=ErrorCode.SHUTTING_DOWN)
    options = {"id": id, "extractors": extractors, "min_words": min_words, "language": language}
    parsed, raw = await read_body(request, ExtractRequest, raw_options=options)
    if parsed is None:
        parsed = _raw_request(extractors, min_words, language)
    # Checked here, for the whole request: in an extraction it would be each entry's failure in a 200.
    justext_language = normalize_language(parsed.language)  # ExtractionOptionsError: a typed 422
    repeated = sorted({name for name in parsed.extractors if parsed.extractors.count(name) > 1})
    if repeated:  # the same work twice, and twice the backlog it holds
        raise HtmllmError(f"extractors repeats {repeated}: name each once", code=ErrorCode.VALIDATION)
    _check_language_is_read(parsed)
    documents = [raw] if raw is not None else to_documents(parsed.documents)
    check_document_count(documents, runtime.settings.max_documents)
    pool, threads = await runtime.extraction()
    timeout_s = runtime.settings.extract_limit_s
    calls = [
        functools.partial(
            _extract_one,
            doc,
            name,
            min_words=parsed.min_words,
            language=justext_language,
            timeout_s=timeout_s,
            pool=pool,
            metrics=runtime.metrics,
        )
        for doc in documents
        for name in parsed.extractors
    ]
    runtime.admit_extraction(len(calls))  # 429 beyond the bound, like the engine's queue
    started = time.perf_counter()
    jobs = []
    for call in calls:
        future = threads.submit(call)
        future.add_done_callback(runtime.extraction_done)  # counts down when the job really ends
        jobs.append(future)
    per_doc = len(parsed.extractors)
    # As for /v1/embed: the settling deadline answers a late request with what finished by then, and
    # the HTTP layer's timer is only a backstop; a client that goes away cancels the jobs.
    deadline_s = runtime.settings.request_timeout_s
    settled = _settle(jobs, parsed.extractors * len(documents), timeout_s=deadline_s, metrics=runtime.metrics)
    outputs = await answer_or_cancel(request, settled, timeout_s=deadline_s + DEADLINE_GRACE_S)
    stages = {"x-extract-time": milliseconds(time.perf_counter() - started)}
    answer = ExtractResponse(
        data=[
            ExtractResult(id=doc.id, extractions=outputs[i * per_doc : (i + 1) * per_doc])
            for i, doc in enumerate(documents)
        ]
    )
    return await json_response(answer, text_chars=sum(len(out.text or "") for out in outputs), headers=stages)
