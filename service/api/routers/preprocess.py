"""`POST /v1/preprocess`: the pruned HTML the model would see and its token count, for debugging."""

from __future__ import annotations

import asyncio
import time
from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request, Response

from service.api.auth import require_api_key
from service.api.documents import read_body, to_documents
from service.api.limits import check_document_count
from service.api.openapi import MODEL_ROUTE_ERRORS, PREPROCESS_STAGES, raw_body_openapi, timing_responses
from service.api.rendering import json_response
from service.api.runtime import EngineDep, RuntimeDep, answer_or_cancel
from service.api.schemas import PreprocessRequest, PreprocessResponse, PreprocessResult
from service.api.timing import milliseconds
from service.core.preparation import Preprocessed
from service.engine import Document, Engine
from service.engine.collector import cancel_and_forget
from service.engine.failures import naming_failures

router = APIRouter(tags=["debug"], dependencies=[Depends(require_api_key)], responses=MODEL_ROUTE_ERRORS)


@router.post(
    "/v1/preprocess",
    response_model=PreprocessResponse,
    summary="Prune and tokenize pages without running the model",
    responses=timing_responses(PREPROCESS_STAGES),
    openapi_extra=raw_body_openapi(PreprocessRequest),
)
async def preprocess(
    request: Request,
    runtime: RuntimeDep,
    engine: EngineDep,
    id: Annotated[str | None, Query(description="raw body only: the page's id")] = None,
) -> Response:
    """A JSON body of documents, or one raw page (`text/html; charset=...` or an XHTML/XML type,
    `application/octet-stream`)."""
    parsed, raw = await read_body(request, PreprocessRequest, raw_options={"id": id})
    documents = [raw] if raw is not None else to_documents(parsed.documents if parsed else [])
    check_document_count(documents, runtime.settings.max_documents)
    # The engine admits these one by one: more than its queue holds would find it full of their own
    # first documents, a 429 to retry for ever. /v1/embed's 422, from the engine's one check.
    engine.check_call_size(len(documents))
    # The documents are preprocessed at once: the wall time of all of them is the slowest one's.
    started = time.perf_counter()
    with naming_failures(documents):
        outputs = await answer_or_cancel(
            request, _preprocess_all(engine, documents), timeout_s=runtime.settings.request_timeout_s
        )
    elapsed = milliseconds(time.perf_counter() - started)
    headers = {"x-preprocess-time": elapsed} | runtime.checkpoint_header()
    answer = PreprocessResponse(
        data=[
            PreprocessResult(id=doc.id, html=out.html, tokens=out.tokens, tokens_exact=out.tokens_exact)
            for doc, out in zip(documents, outputs, strict=True)
        ]
    )
    return await json_response(answer, text_chars=sum(len(out.html) for out in outputs), headers=headers)


async def _preprocess_all(engine: Engine, documents: list[Document]) -> list[Preprocessed]:
    """Every document preprocessed, or the first failure with the others cancelled: each holds a slot of
    the engine's queue until it ends, and a bare `gather` left them running for an answered request."""
    tasks = [asyncio.ensure_future(engine.preprocess(doc)) for doc in documents]
    try:
        return list(await asyncio.gather(*tasks))
    finally:
        cancel_and_forget(tasks)
