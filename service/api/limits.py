"""Cheap checks before expensive work: the body size cap (before any parsing) and the document cap.

`BodyLimitMiddleware` reads the body itself, so the cap holds for a declared `Content-Length` (refused
before a byte is read) and for chunked bodies alike (refused as soon as the running total passes it);
the app then sees the body replayed and, after it, the connection's real messages, so a disconnect is
still noticed while the request waits in the batcher.

A body that does not arrive within `body_timeout_s` is answered 408 and its connection closed: uvicorn
times out idle connections only, so a client stalled mid-body held its connection, and what it had sent,
without end.

It also undoes a request's `Content-Encoding` (gzip, deflate, br, zstd), so every route reads plain
bytes. The cap holds for the decoded body too, checked while decoding: a small gzip bomb is refused
with 413 after at most `max_body_bytes` of output, never inflated in full.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sized

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.api.errors import STATUS, error_response
from service.api.metrics import ServiceMetrics
from service.api.runtime import START_KEY
from service.core.content_coding import ContentCodingError, decode_content
from service.core.errors import ErrorCode, HtmllmError

# Compressed bodies above this are decoded on a worker thread, off the event loop.
INLINE_DECODE_BYTES = 64 * 1024
_LIMIT_NAME = "HTMLLM_MAX_BODY_BYTES"  # the setting a too-large message tells the reader to raise


class BodyLimitMiddleware:
    """Refuses bodies over `max_body_bytes` with 413 and the usual error body."""

    def __init__(
        self, app: ASGIApp, *, max_body_bytes: int, metrics: ServiceMetrics, body_timeout_s: float = 60.0
    ) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.body_timeout_s = body_timeout_s
        self.metrics = metrics

    async def _refuse(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        code: ErrorCode,
        message: str,
        headers: dict[str, str] | None = None,
    ) -> None:
        response = error_response(code, message, STATUS[code], metrics=self.metrics, headers=headers)
        await response(scope, receive, send)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        scope[START_KEY] = time.perf_counter()
        limit = self.max_body_bytes
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None:
            try:
                length = int(declared)
            except ValueError:
                await self._refuse(scope, receive, send, ErrorCode.VALIDATION, "invalid Content-Length")
                return
            if length > limit:
                await self._refuse(
                    scope, receive, send, ErrorCode.PAYLOAD_TOO_LARGE, _too_large(f"{length} bytes", limit)
                )
                return

        chunks: list[bytes] = []
        size = 0
        try:
            # A client that stalls mid-body would hold its connection and what it sent (up to the cap)
            # for as long as it likes: uvicorn times out idle connections, not slow bodies.
            async with asyncio.timeout(self.body_timeout_s):
                while True:
                    message = await receive()
                    if message["type"] == "http.disconnect":
                        return  # the client left before sending its body: there is no one to answer
                    chunk = message.get("body", b"")
                    size += len(chunk)
                    if size > limit:
                        too_large = _too_large(f"over {size} bytes", limit)
                        await self._refuse(scope, receive, send, ErrorCode.PAYLOAD_TOO_LARGE, too_large)
                        return
                    chunks.append(chunk)
                    if not message.get("more_body", False):
                        break
        except TimeoutError:
            message_text = (
                f"the request body did not arrive within {self.body_timeout_s:g} s "
                f"({size} bytes came; HTMLLM_BODY_TIMEOUT_S)"
            )
            # The rest of the body may still come: the connection cannot carry another request.
            await self._refuse(
                scope, receive, send, ErrorCode.BODY_TIMEOUT, message_text, headers={"connection": "close"}
            )
            return

        body = b"".join(chunks)
        # Repeated Content-Encoding headers are one list, in order (RFC 9110 §5.3).
        codings = [v.decode("latin-1") for k, v in scope["headers"] if k == b"content-encoding"]
        if codings and body:  # nothing to decode in an empty body (a GET), whatever it claims
            try:
                body = await _decode(body, ", ".join(codings), limit)
            except ContentCodingError as exc:
                await self._refuse(scope, receive, send, exc.code, exc.message)
                return
            scope = _plain_scope(scope, len(body))
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


async def _decode(body: bytes, coding: str, limit: int) -> bytes:
    if len(body) > INLINE_DECODE_BYTES:
        return await asyncio.to_thread(decode_content, body, coding, limit=limit, limit_name=_LIMIT_NAME)
    return decode_content(body, coding, limit=limit, limit_name=_LIMIT_NAME)


def _plain_scope(scope: Scope, length: int) -> Scope:
    """The scope as if the decoded body had been sent: no Content-Encoding, its real Content-Length."""
    headers = [(k, v) for k, v in scope["headers"] if k not in (b"content-encoding", b"content-length")]
    headers.append((b"content-length", str(length).encode("ascii")))
    return {**scope, "headers": headers}


def _too_large(size: str, limit: int) -> str:
    return f"the request body is {size}; the limit is {limit} bytes ({_LIMIT_NAME})"


def check_document_count(documents: Sized, max_documents: int) -> None:
    """400 for no documents, 422 for more than a request may carry."""
    count = len(documents)
    if count == 0:
        raise HtmllmError("the request has no documents", code=ErrorCode.EMPTY)
    if count > max_documents:
        raise HtmllmError(
            f"the request has {count} documents; the limit is {max_documents} (HTMLLM_MAX_DOCUMENTS)",
            code=ErrorCode.TOO_MANY_DOCUMENTS,
        )
