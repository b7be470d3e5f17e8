"""The one path from documents to results that every embedding route shares.

Limits are checked before anything is queued; the engine call is bounded by the request timeout and
cancelled when the client disconnects (the batcher then skips its documents).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from fastapi import Request

from service.api.limits import check_document_count
from service.api.runtime import Runtime, answer_or_cancel
from service.engine import Document, DocumentResult, Engine


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
    settings = runtime.settings
    check_document_count(documents, settings.max_documents)
    timeout_s = settings.request_timeout_s
    return await answer_or_cancel(
        request,
        engine.embed(
            documents,
            heads=heads,
            normalize=normalize,
            truncate=truncate,
            deadline=time.monotonic() + timeout_s,
        ),
        timeout_s=timeout_s,
    )
