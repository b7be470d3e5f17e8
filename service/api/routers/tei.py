"""`POST /embed`: text-embeddings-inference's embed API, with HTML pages as `inputs`.

Also at TEI's other addresses for it: `POST /` (where `huggingface_hub.InferenceClient(model=URL)`
posts `feature_extraction`, as TEI serves an embedding model there) and `POST /invocations` (the route
Amazon SageMaker calls), so those clients work unchanged too.
"""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request, Response

from service.api import inference
from service.api.auth import require_api_key
from service.api.documents import check_dimensions, read_json_body, timing_headers
from service.api.openapi import EMBEDDING_STAGES, MODEL_ROUTE_ERRORS, json_body_openapi, timing_responses
from service.api.runtime import EngineDep, RuntimeDep
from service.api.schemas import TeiEmbedRequest
from service.core.errors import ErrorCode, HtmllmError
from service.engine import Document

router = APIRouter(tags=["compatible"], dependencies=[Depends(require_api_key)], responses=MODEL_ROUTE_ERRORS)


@router.post(
    "/invocations",
    summary="text-embeddings-inference-compatible embed (SageMaker's route)",
    responses=timing_responses(EMBEDDING_STAGES),
    openapi_extra=json_body_openapi(TeiEmbedRequest),
)
@router.post(
    "/",
    summary="text-embeddings-inference-compatible embed (huggingface_hub's InferenceClient posts here)",
    responses=timing_responses(EMBEDDING_STAGES),
    openapi_extra=json_body_openapi(TeiEmbedRequest),
)
@router.post(
    "/embed",
    summary="text-embeddings-inference-compatible embed",
    responses=timing_responses(EMBEDDING_STAGES),
    openapi_extra=json_body_openapi(TeiEmbedRequest),
)
async def embed(
    request: Request, response: Response, runtime: RuntimeDep, engine: EngineDep
) -> list[list[float]]:
    """One embedding per input, in order; truncation defaults to the server's policy."""
    body = await read_json_body(request, TeiEmbedRequest)
    check_dimensions(body.dimensions, engine.info.embedding_dim)
    if body.prompt_name is not None:  # ignored, it would answer another kind of embedding than asked for
        raise HtmllmError(
            f"prompt_name {body.prompt_name[:100]!r}: this model defines no prompts",
            code=ErrorCode.VALIDATION,
        )
    pages = [body.inputs] if isinstance(body.inputs, str) else body.inputs
    results = await inference.embed(
        request,
        runtime,
        engine,
        [Document(html=page) for page in pages],
        heads=[],
        normalize=body.normalize,
        truncate=body.truncate,
    )
    response.headers.update(timing_headers(results) | runtime.checkpoint_header())
    return [r.embedding.astype("float32").tolist() for r in results]
