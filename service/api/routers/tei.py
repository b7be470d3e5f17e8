"""text-embeddings-inference's API, with HTML pages as `inputs`: `POST /embed`, `/tokenize` and `/decode`.

The embed route is also at TEI's other addresses for it: `POST /` (where
`huggingface_hub.InferenceClient(model=URL)` posts `feature_extraction`, as TEI serves an embedding
model there) and `POST /invocations` (the route Amazon SageMaker calls), so those clients work unchanged
too. `/tokenize` lists the tokens the model reads of each page: those of its pruned HTML, which the same
preprocessing as `/v1/preprocess` makes (pool, queue, limits), so its offsets are into the pruned HTML.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

from fastapi import APIRouter, Depends, Request, Response

from service.api import inference
from service.api.auth import require_api_key
from service.api.documents import check_dimensions, read_json_body, timing_headers
from service.api.limits import check_document_count
from service.api.openapi import (
    EMBEDDING_STAGES,
    MODEL_ROUTE_ERRORS,
    PREPROCESS_STAGES,
    TOKENS_EXACT_HEADER,
    TOKENS_EXACT_RESPONSE,
    json_body_openapi,
    timing_responses,
)
from service.api.runtime import EngineDep, RuntimeDep, answer_or_cancel
from service.api.schemas import TeiDecodeRequest, TeiEmbedRequest, TeiTokenizeRequest, TeiTokenizeResponse
from service.api.timing import milliseconds
from service.core.errors import ErrorCode, HtmllmError
from service.engine import Document, Engine
from service.engine.collector import cancel_and_forget
from service.engine.failures import naming_failures

router = APIRouter(tags=["compatible"], dependencies=[Depends(require_api_key)], responses=MODEL_ROUTE_ERRORS)


def _refuse_prompt(prompt_name: str | None) -> None:
    """A `prompt_name` is a 422: ignored, it would answer for another input than the one asked for."""
    if prompt_name is not None:
        raise HtmllmError(
            f"prompt_name {prompt_name[:100]!r}: this model defines no prompts", code=ErrorCode.VALIDATION
        )


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
    _refuse_prompt(body.prompt_name)
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


_TOKENIZE_RESPONSES = timing_responses(PREPROCESS_STAGES)
_TOKENIZE_RESPONSES[200]["headers"][TOKENS_EXACT_HEADER] = TOKENS_EXACT_RESPONSE


@router.post(
    "/tokenize",
    response_model=TeiTokenizeResponse,
    summary="text-embeddings-inference-compatible tokenize: the tokens the model reads of each page",
    responses=_TOKENIZE_RESPONSES,
    openapi_extra=json_body_openapi(TeiTokenizeRequest),
)
async def tokenize(request: Request, runtime: RuntimeDep, engine: EngineDep) -> Response:
    """One list of tokens per input, in order: the tokens of the page's pruned HTML (what /v1/preprocess
    answers as `html`), so `start` and `stop` are character offsets into the pruned HTML, not into the
    page sent. With `add_special_tokens` (the default) the list is framed by [CLS] and [SEP] and its
    length is the page's tokens as /v1/preprocess counts them. Pages are not truncated to the model's
    length (TEI's /tokenize has no `truncate`): a list stops at 16 times the model's max length, where
    /v1/preprocess stops counting, and `x-tokens-exact` is then `false`."""
    body = await read_json_body(request, TeiTokenizeRequest)
    _refuse_prompt(body.prompt_name)
    pages = [body.inputs] if isinstance(body.inputs, str) else body.inputs
    documents = [Document(html=page) for page in pages]
    check_document_count(documents, runtime.settings.max_documents)
    engine.check_call_size(len(documents))  # as /v1/preprocess, which admits documents one by one too
    work = _tokenized(engine, documents, add_special_tokens=body.add_special_tokens)
    started = time.perf_counter()
    with naming_failures(documents):
        rendered, exact = await answer_or_cancel(request, work, timeout_s=runtime.settings.request_timeout_s)
    headers = {
        "x-preprocess-time": milliseconds(time.perf_counter() - started),
        TOKENS_EXACT_HEADER: "true" if exact else "false",
    }
    return Response(rendered, media_type="application/json", headers=headers | runtime.checkpoint_header())


async def _tokenized(
    engine: Engine, documents: list[Document], *, add_special_tokens: bool
) -> tuple[bytes, bool]:
    """The answer's JSON, each page's list made and rendered by the engine (`Engine.tokenize`: admitted as
    /v1/preprocess's pages are, on the preprocessing threads), and whether every list is whole.

    As /v1/preprocess, the first failure cancels the other documents: each holds a slot of the engine's
    queue until its listing ends, and a bare `gather` left them running for an answered request.
    """
    tasks = [
        asyncio.ensure_future(engine.tokenize(doc, add_special_tokens=add_special_tokens))
        for doc in documents
    ]
    try:
        lists = await asyncio.gather(*tasks)
    finally:
        cancel_and_forget(tasks)
    return b"[" + b",".join(rendered for rendered, _ in lists) + b"]", all(whole for _, whole in lists)


@router.post(
    "/decode",
    response_model=list[str],
    summary="text-embeddings-inference-compatible decode: token ids back to text",
    responses=timing_responses({}),
    openapi_extra=json_body_openapi(TeiDecodeRequest),
)
async def decode(request: Request, response: Response, runtime: RuntimeDep, engine: EngineDep) -> list[str]:
    """The text of each list of ids (flat ids: a list of one text, as TEI answers), by this model's
    tokenizer, tags kept. As every JSON body, one of more than 10,000 list items is a 422."""
    body = await read_json_body(request, TeiDecodeRequest)
    if not body.ids:
        raise HtmllmError("ids is empty: send token ids, or a list of lists of them", code=ErrorCode.EMPTY)
    nested = isinstance(body.ids[0], list)
    lists: list[list[int]] = body.ids if nested else [body.ids]  # type: ignore[assignment,list-item]
    check_document_count(lists, runtime.settings.max_documents)
    tokenizer = engine.tokenizer
    _check_ids(lists, tokenizer.vocab_size, nested=nested)
    work = asyncio.to_thread(
        tokenizer.backend.decode_batch, lists, skip_special_tokens=body.skip_special_tokens
    )
    texts = await answer_or_cancel(request, work, timeout_s=runtime.settings.request_timeout_s)
    response.headers.update(runtime.checkpoint_header())
    return list(texts)


def _check_ids(lists: Sequence[Sequence[int]], vocab_size: int, *, nested: bool) -> None:
    """422 naming the first id outside the vocabulary (the tokenizer would raise an untyped error)."""
    for i, ids in enumerate(lists):
        for j, token_id in enumerate(ids):
            if not 0 <= token_id < vocab_size:
                where = f"ids[{i}][{j}]" if nested else f"ids[{j}]"
                raise HtmllmError(
                    f"{where}: token id {token_id} is outside the vocabulary (0 to {vocab_size - 1})",
                    code=ErrorCode.VALIDATION,
                )
