"""JSON responses too large to serialize on the event loop.

FastAPI serializes a route's return value on the loop. For `/v1/extract` that is up to four texts of a
16 MiB page (31.6 MB of JSON, ~0.2-0.5 s of escaping), and for `/v1/preprocess` the pruned HTML of every
document: while it ran, `/health`, `/ready` and every other request waited (`/health` took 556 ms behind
one such answer). Routes whose answers carry page text render them here instead; gzip is Starlette's,
which compresses bodies over 128 KiB in a thread already.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

from fastapi import Response
from pydantic import BaseModel

# An answer whose text is at most this many characters is rendered on the loop: the thread hop costs
# more than its serialization (~1 ms for 64 Ki characters).
INLINE_CHARS = 64 * 1024


def render_json(model: BaseModel) -> bytes:
    """`model` as FastAPI writes a `response_model` (by field name, unset and None fields included)."""
    return type(model).__pydantic_serializer__.to_json(model)


async def json_response(
    model: BaseModel, *, text_chars: int, headers: Mapping[str, str] | None = None
) -> Response:
    """`model` as a JSON response, serialized in a worker thread when it carries more than
    `INLINE_CHARS` characters of text (`text_chars`, the caller's count of what dominates its size).

    The serializer still holds the GIL while it escapes one string, so the loop can wait up to the
    longest string's share (~60 ms for 8.5 MB), not the whole answer's.
    """
    if text_chars <= INLINE_CHARS:
        body = render_json(model)
    else:
        body = await asyncio.to_thread(render_json, model)
    return Response(body, media_type="application/json", headers=headers)
