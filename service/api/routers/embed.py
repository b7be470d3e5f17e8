"""`POST /v1/embed`: the native API, embedding and task-head scores from one forward pass."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request, Response

from service.api import inference
from service.api.auth import require_api_key
from service.api.documents import encode_embedding, read_body, timing_headers, to_documents
from service.api.openapi import EMBEDDING_STAGES, MODEL_ROUTE_ERRORS, raw_body_openapi, timing_responses
from service.api.runtime import EngineDep, RuntimeDep
from service.api.schemas import (
    EmbedRequest,
    EmbedResponse,
    EmbedResult,
    EmbedUsage,
    EncodingFormat,
    ErrorDetail,
    OnError,
)
from service.core.errors import HtmllmError
from service.engine import DocumentResult

router = APIRouter(tags=["embed"], dependencies=[Depends(require_api_key)], responses=MODEL_ROUTE_ERRORS)


@router.post(
    "/v1/embed",
    response_model=EmbedResponse,
    summary="Embed pages and score them with the task heads",
    responses=timing_responses(EMBEDDING_STAGES, every_stage=False),
    openapi_extra=raw_body_openapi(EmbedRequest),
)
async def embed(
    request: Request,
    response: Response,
    runtime: RuntimeDep,
    engine: EngineDep,
    id: Annotated[str | None, Query(description="raw body only: the page's id")] = None,
    url: Annotated[str | None, Query(description="raw body only: the page's URL")] = None,
    heads: Annotated[
        list[str] | None, Query(description="raw body only: heads to score (one empty `heads=`: none)")
    ] = None,
    normalize: Annotated[bool | None, Query(description="raw body only (default true)")] = None,
    truncate: Annotated[bool | None, Query(description="raw body only (default: server policy)")] = None,
    encoding_format: Annotated[EncodingFormat | None, Query(description="raw body only")] = None,
    on_error: Annotated[OnError | None, Query(description="raw body only (default fail)")] = None,
) -> EmbedResponse:
    """A JSON body of documents, or one raw page (`text/html; charset=...` or an XHTML/XML type,
    `application/octet-stream`) with its options in the query string."""
    if heads == [""]:  # `?heads=`: no heads, as the JSON body's `"heads": []`
        heads = []
    options = {
        "id": id,
        "url": url,
        "heads": heads,
        "normalize": normalize,
        "truncate": truncate,
        "encoding_format": encoding_format,
        "on_error": on_error,
    }
    parsed, raw = await read_body(request, EmbedRequest, raw_options=options)
    if parsed is None:
        parsed = EmbedRequest(
            documents=[],
            heads=heads,
            normalize=True if normalize is None else normalize,
            truncate=truncate,
            encoding_format=encoding_format or "float",
            on_error=on_error or "fail",
        )
    documents = [raw] if raw is not None else to_documents(parsed.documents)
    call = inference.embed_settled if parsed.on_error == "report" else inference.embed
    outcomes: Sequence[DocumentResult | HtmllmError] = await call(
        request,
        runtime,
        engine,
        documents,
        heads=parsed.heads,
        normalize=parsed.normalize,
        truncate=parsed.truncate,
    )
    results = [o for o in outcomes if isinstance(o, DocumentResult)]
    response.headers.update(timing_headers(results) | runtime.checkpoint_header())
    return EmbedResponse(
        model=engine.info.name,
        data=[
            _failed(doc.id, o) if isinstance(o, HtmllmError) else _embedded(o, parsed.encoding_format)
            for doc, o in zip(documents, outcomes, strict=True)
        ],
        usage=EmbedUsage(documents=len(results), tokens=sum(r.tokens for r in results)),
    )


def _embedded(result: DocumentResult, encoding_format: EncodingFormat) -> EmbedResult:
    return EmbedResult(
        id=result.id,
        embedding=encode_embedding(result.embedding, encoding_format),
        scores=result.scores,
        tokens=result.tokens,
        truncated=result.truncated,
        error=None,
    )


def _failed(doc_id: str | None, error: HtmllmError) -> EmbedResult:
    return EmbedResult(
        id=doc_id,
        embedding=None,
        scores={},
        tokens=None,
        truncated=None,
        error=ErrorDetail.of(error),
    )
