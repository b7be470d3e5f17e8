"""The one path from documents to results that every embedding route shares.

Limits are checked before anything is queued; the engine call is bounded by the request timeout and
cancelled when the client disconnects (the batcher then skips its documents).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from fastapi import Request

from service.api.limits import check_document_count
from service.api.runtime import Runtime, answer_or_cancel
from service.core.errors import HtmllmError
from service.engine import Document, DocumentResult, Engine
from service.engine.failures import naming_failures

T = TypeVar("T")

# The engine's own deadline (the request timeout) ends a late call, with a message that says where its
# documents were and, for `on_error: report`, with the results finished by then. The HTTP layer's timer
# is a backstop this much later, for an engine that failed to keep its deadline.
DEADLINE_GRACE_S = 1.0


async def embed(
    request: Request,
    runtime: Runtime,
    engine: Engine,
    documents: Sequence[Document],
    *,
    heads: Sequence[str] | None,
    normalize: bool,
    truncate: bool | None,
) -> list[DocumentResult]:
    """Every document's result, or the first failure as the request's error."""

    def call(deadline: float) -> Awaitable[list[DocumentResult]]:
        return engine.embed(documents, heads=heads, normalize=normalize, truncate=truncate, deadline=deadline)

    with naming_failures(documents):
        return await _bounded(request, runtime, documents, call)


async def embed_settled(
    request: Request,
    runtime: Runtime,
    engine: Engine,
    documents: Sequence[Document],
    *,
    heads: Sequence[str] | None,
    normalize: bool,
    truncate: bool | None,
) -> list[DocumentResult | HtmllmError]:
    """Each document's result or its own error (`on_error: report`)."""

    def call(deadline: float) -> Awaitable[list[DocumentResult | HtmllmError]]:
        return engine.embed_settled(
            documents, heads=heads, normalize=normalize, truncate=truncate, deadline=deadline
        )

    return await _bounded(request, runtime, documents, call)


async def _bounded(
    request: Request, runtime: Runtime, documents: Sequence[Document], call: Callable[[float], Awaitable[T]]
) -> T:
    settings = runtime.settings
    check_document_count(documents, settings.max_documents)
    timeout_s = settings.request_timeout_s
    return await answer_or_cancel(
        request, call(time.monotonic() + timeout_s), timeout_s=timeout_s + DEADLINE_GRACE_S
    )
