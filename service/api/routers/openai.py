"""`POST /v1/embeddings`: OpenAI's embeddings API, with HTML pages as `input`; `GET /v1/models` lists the
one model.

Also at `POST /embeddings` (as text-embeddings-inference serves it) and `GET /models`, for clients whose
base URL has no `/v1`.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request, Response

from service.api import inference
from service.api.auth import require_api_key
from service.api.documents import check_dimensions, encode_embedding, read_json_body, timing_headers
from service.api.openapi import (
    EMBEDDING_STAGES,
    MODEL_ROUTE_ERRORS,
    UNAVAILABLE,
    error_responses,
    json_body_openapi,
    timing_responses,
)
from service.api.routers import get_route
from service.api.runtime import EngineDep, RuntimeDep
from service.api.schemas import (
    OpenAIEmbedding,
    OpenAIEmbeddingsRequest,
    OpenAIEmbeddingsResponse,
    OpenAIModel,
    OpenAIModelList,
    OpenAIUsage,
)
from service.core.errors import ErrorCode, HtmllmError, shown
from service.engine import Document

router = APIRouter(tags=["compatible"], dependencies=[Depends(require_api_key)], responses=MODEL_ROUTE_ERRORS)


@router.post(
    "/embeddings",
    response_model=OpenAIEmbeddingsResponse,
    summary="OpenAI-compatible embeddings (for a client whose base URL lacks /v1, as TEI allows)",
    responses=timing_responses(EMBEDDING_STAGES),
    openapi_extra=json_body_openapi(OpenAIEmbeddingsRequest),
)
@router.post(
    "/v1/embeddings",
    response_model=OpenAIEmbeddingsResponse,
    summary="OpenAI-compatible embeddings",
    responses=timing_responses(EMBEDDING_STAGES),
    openapi_extra=json_body_openapi(OpenAIEmbeddingsRequest),
)
async def embeddings(
    request: Request,
    response: Response,
    runtime: RuntimeDep,
    engine: EngineDep,
) -> OpenAIEmbeddingsResponse:
    """`model` is accepted and ignored (one model per server); no task heads are run."""
    body = await read_json_body(request, OpenAIEmbeddingsRequest)
    check_dimensions(body.dimensions, engine.info.embedding_dim)
    pages = [body.input] if isinstance(body.input, str) else body.input
    results = await inference.embed(
        request,
        runtime,
        engine,
        [Document(html=page) for page in pages],
        heads=[],
        normalize=True,
        truncate=body.truncate,
    )
    response.headers.update(timing_headers(results) | runtime.checkpoint_header())
    tokens = sum(r.tokens for r in results)
    return OpenAIEmbeddingsResponse(
        data=[
            OpenAIEmbedding(embedding=encode_embedding(r.embedding, body.encoding_format), index=i)
            for i, r in enumerate(results)
        ],
        model=engine.info.name,
        usage=OpenAIUsage(prompt_tokens=tokens, total_tokens=tokens),
    )


# Its own router: a GET answers none of the embedding routes' body errors, only not-ready.
models_router = APIRouter(
    tags=["compatible"],
    dependencies=[Depends(require_api_key)],
    responses=error_responses(503, codes=UNAVAILABLE),
)


@get_route(
    models_router,
    "/models",
    response_model=OpenAIModelList,
    summary="OpenAI-compatible model list (without /v1)",
)
@get_route(
    models_router, "/v1/models", response_model=OpenAIModelList, summary="OpenAI-compatible model list"
)
async def models(engine: EngineDep) -> OpenAIModelList:
    """The one model this server runs: `model` in an embeddings request may name it (it is not checked)."""
    return OpenAIModelList(data=[OpenAIModel(id=engine.info.name)])


# The lookup's one parameter, documented by hand: read from the path, as any string is, it is never
# validated, and a parameter of the function's would have documented a 422 no request can get.
_MODEL_ID: dict[str, Any] = {
    "parameters": [
        {
            "name": "model_id",
            "in": "path",
            "required": True,
            "schema": {"type": "string"},
            "description": "the model's name, as `/info` gives it (it may hold `/`)",
        }
    ]
}


@get_route(
    models_router,
    "/models/{model_id:path}",
    response_model=OpenAIModel,
    summary="OpenAI-compatible model lookup (without /v1)",
    responses=error_responses(404, codes={404: (ErrorCode.NOT_FOUND,)}),
    openapi_extra=_MODEL_ID,
)
@get_route(
    models_router,
    "/v1/models/{model_id:path}",
    response_model=OpenAIModel,
    summary="OpenAI-compatible model lookup",
    responses=error_responses(404, codes={404: (ErrorCode.NOT_FOUND,)}),
    openapi_extra=_MODEL_ID,
)
async def model(request: Request, engine: EngineDep) -> OpenAIModel:
    """`client.models.retrieve(name)`, which tools call to check a model exists before they embed with
    it (a bare 404 had read as a server without the route): the served model, or a 404 naming it."""
    model_id = str(request.path_params["model_id"])
    name = engine.info.name
    if model_id != name:
        raise HtmllmError(
            f"no model {shown([model_id])} here: this server runs {name!r} (which `model` in an embeddings "
            "request may name, or any name: it is not checked)",
            code=ErrorCode.NOT_FOUND,
        )
    return OpenAIModel(id=name)
