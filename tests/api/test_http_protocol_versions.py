"""service/api/http_protocol.py: a request of an HTTP version other than 1.0 or 1.1 is a 505.

llhttp takes HTTP/0.9 (a request line without a version reads as one) and HTTP/2.0, and uvicorn answered
such requests as HTTP/1.1 (`GET /health HTTP/2.0` got a 200). The server speaks HTTP/1.x only: such a
request is answered 505 HTTP Version Not Supported (RFC 9110 section 15.6.6), from below the app, and
its connection closed; so is HTTP/2's connection preface (`PRI * HTTP/2.0`, prior knowledge), which had
uvicorn's 400.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from tests.api.protocol_harness import protocol_on_fake_transport
from tests.factories.waiting import until_async

_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
_SETTINGS = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"  # an empty SETTINGS frame, what follows the preface


def _statuses(answer: bytes) -> list[bytes]:
    return re.findall(rb"HTTP/1\.1 (\d{3}) ", answer)


async def _app(scope: Any, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


@pytest.mark.parametrize(
    "request_line",
    [b"GET /health HTTP/2.0", b"GET /health HTTP/0.9", b"GET /health"],
    ids=["2.0", "0.9", "no-version"],
)
async def test_a_request_of_another_version_is_a_505(request_line: bytes) -> None:
    started: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        started.append(scope["path"])
        await _app(scope, receive, send)

    protocol, transport = protocol_on_fake_transport(app)
    protocol.data_received(request_line + b"\r\nHost: x\r\n\r\n")
    assert _statuses(transport.written) == [b"505"] and transport.closed, transport.written[:300]
    head, _, body = transport.written.partition(b"\r\n\r\n")
    assert b"HTTP Version Not Supported" in head and b"connection: close" in head
    assert b"HTTP/1.1" in body
    assert started == []  # never reached the app


async def test_http2_prior_knowledge_is_a_505() -> None:
    protocol, transport = protocol_on_fake_transport(_app)
    protocol.data_received(_PREFACE + _SETTINGS)
    assert _statuses(transport.written) == [b"505"] and transport.closed, transport.written[:300]


async def test_a_505_behind_pipelined_requests_follows_their_answers() -> None:
    """A 2.0 request pipelined behind 1.1 ones gets its 505 after their answers, and nothing after it
    is read as a request; a 1.0 request is served as before."""
    protocol, transport = protocol_on_fake_transport(_app)
    protocol.data_received(
        b"GET /a HTTP/1.1\r\nHost: x\r\n\r\nGET /b HTTP/1.1\r\nHost: x\r\n\r\n"
        b"GET /c HTTP/2.0\r\nHost: x\r\n\r\nGET /d HTTP/1.1\r\nHost: x\r\n\r\n"
    )
    await until_async(lambda: transport.closed, "the connection closed")
    assert _statuses(transport.written) == [b"200", b"200", b"505"], transport.written

    protocol, transport = protocol_on_fake_transport(_app)
    protocol.data_received(b"GET /e HTTP/1.0\r\nHost: x\r\n\r\n")
    await until_async(lambda: transport.closed, "the connection closed")
    assert _statuses(transport.written) == [b"200"], transport.written
