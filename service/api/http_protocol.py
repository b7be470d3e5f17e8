"""The HTTP/1.1 parser uvicorn runs for the service: httptools, with a cap on each request's head.

Why httptools: uvicorn's pure-Python h11 parser was about 15% of the event loop's time under load, and
httptools with uvloop cut the loop's CPU per request by 13-20% (docs/benchmarks.md, "The front end's
CPU per request"). Why a subclass: uvicorn bounds a request's head (request line and headers) only on
its h11 path (`h11_max_incomplete_event_size`, 16 KiB); with httptools a client can stream one endless
header and the server buffers all of it (200 MB sent, 312 MB resident, measured). Here a head still
incomplete after `MAX_HEAD_BYTES` is answered 431 with the service's error body, and its connection is
closed. Such an answer comes from below the app, so it is not counted in
`htmllm_request_failures_total`. And a client that pipelines requests and leaves is noticed by the
request that is running, not only by the last one queued (`connection_lost`). Each request's scope
carries its connection's age and request number (`service.api.connections`), which ASGI gives the app
no other way to know, so that a connection's life can be bounded.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from service.api.connections import CONNECTION_KEY, ConnectionAge
from service.api.errors import STATUS
from service.core.errors import ErrorCode

# The most bytes of a request's head buffered before it is refused: 4x h11's default in uvicorn, room
# for large cookies and gateway headers (nginx allows 4 x 8 KiB by default).
MAX_HEAD_BYTES = 64 * 1024


def _head_too_large_response() -> bytes:
    body = json.dumps(
        {
            "error": {
                "code": ErrorCode.HEADERS_TOO_LARGE.value,
                "message": f"the request line and headers exceed {MAX_HEAD_BYTES} bytes",
            }
        }
    ).encode()
    status = STATUS[ErrorCode.HEADERS_TOO_LARGE]
    head = (
        f"HTTP/1.1 {status} Request Header Fields Too Large\r\n"
        "content-type: application/json\r\n"
        f"content-length: {len(body)}\r\n"
        "connection: close\r\n\r\n"
    )
    return head.encode("ascii") + body


def protocol_class() -> type[asyncio.Protocol] | str:
    """uvicorn's `http` setting: the bounded httptools protocol, or "h11" where httptools is missing."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:  # httptools is in the serve extra; a bare uvicorn falls back to h11
        return "h11"

    class BoundedHttpToolsProtocol(HttpToolsProtocol):
        """httptools' protocol that refuses a head longer than `MAX_HEAD_BYTES` (431, then closes).

        httptools reports no offsets, so the head is counted in whole chunks: after each parse, a chunk
        counts when the head still open began in an earlier one. The chunk a message begins in is not
        counted (it may hold a pipelined request's body before it), so a head is refused after at most
        `MAX_HEAD_BYTES` plus one read (asyncio reads up to 256 KiB at a time): bounded either way.
        """

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._in_head = False
            self._began_in_chunk = False
            self._head_bytes = 0
            self._running: Any = None  # the request cycle whose app runs (not always `self.cycle`)
            # uvicorn makes one protocol per connection, just before the connection is made.
            self._opened = time.monotonic()
            self._requests = 0

        def _start_asgi_task(self, cycle: Any, app: Any) -> None:
            self._running = cycle
            super()._start_asgi_task(cycle, app)

        def connection_lost(self, exc: Exception | None) -> None:
            """uvicorn tells only the newest request cycle that the client left; with requests
            pipelined behind a running one, that is a queued one, and the running request then wrote
            its response into the closed transport (a RuntimeError under uvloop: a 500 and a traceback
            for a client that left, its page still embedded). Tell the running one too: it stops like
            any request whose client left (499)."""
            running = self._running
            if running is not None and running is not self.cycle and not running.response_complete:
                running.disconnected = True
                running.message_event.set()
            super().connection_lost(exc)

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._in_head = True
            self._began_in_chunk = True
            self._head_bytes = 0

        def on_headers_complete(self) -> None:
            self._in_head = False
            self._requests += 1
            age = ConnectionAge(opened=self._opened, request=self._requests)
            self.scope[CONNECTION_KEY] = age  # type: ignore[literal-required]  # an extension key
            super().on_headers_complete()

        def data_received(self, data: bytes) -> None:
            self._began_in_chunk = False
            super().data_received(data)
            if not self._in_head or self._began_in_chunk or self.transport.is_closing():
                return
            self._head_bytes += len(data)
            if self._head_bytes > MAX_HEAD_BYTES:
                self._in_head = False
                self.transport.write(_head_too_large_response())
                self.transport.close()

    return BoundedHttpToolsProtocol
