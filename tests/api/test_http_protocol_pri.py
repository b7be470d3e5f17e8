"""service/api/http_protocol.py: a request of the method PRI other than HTTP/2's preface is refused at once.

llhttp reads any request line of the method PRI as the start of HTTP/2's connection preface (`PRI *
HTTP/2.0`, then a blank line, `SM` and another blank line) and waits for the rest of it, whatever the
version: `PRI * HTTP/1.1` and a blank line, or `PRI * HTTP/1.2`, were answered only by the head timeout's
408. PRI is no method of HTTP/1.x (RFC 9113 section 3.4 reserves it for the preface): such a request is
malformed, a 400 `malformed_request` as soon as its line has ended, its connection closed; the preface
itself stays a 505.
"""

from __future__ import annotations

import json
import re
import socket
from typing import Any

import pytest

from tests.api.protocol_harness import protocol_on_fake_transport, threaded_server
from tests.factories.waiting import until_async

# Far above the time the answers take, far below the head timeout the servers here are given (60 s): a
# request still waiting fails its read rather than hang the test.
_READ_BOUND_S = 10.0


def _statuses(answer: bytes) -> list[bytes]:
    return re.findall(rb"HTTP/1\.1 (\d{3}) ", answer)


async def _app(scope: Any, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


def _error(answer: bytes) -> dict[str, str]:
    head, _, body = answer.rpartition(b"\r\n\r\n")
    assert b"content-type: application/json" in head and b"connection: close" in head, head
    error: dict[str, str] = json.loads(body)["error"]
    return error


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"PRI * HTTP/1.1\r\n\r\n",
        b"PRI * HTTP/1.2\r\n\r\n",
        b"PRI * HTTP/1.1\r\n",
        b"PRI / HTTP/1.0\r\n\r\nSM",
    ],
    ids=["1.1-and-a-blank-line", "1.2", "the-line-alone", "1.0-and-part-of-the-preface"],
)
@pytest.mark.parametrize("whole", [True, False], ids=["one-read", "byte-by-byte"])
async def test_a_pri_request_of_http_1_is_a_400_at_once(request_bytes: bytes, whole: bool) -> None:
    started: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        started.append(scope["path"])
        await _app(scope, receive, send)

    protocol, transport = protocol_on_fake_transport(app, head_timeout_s=60.0)
    for data in [request_bytes] if whole else [request_bytes[i : i + 1] for i in range(len(request_bytes))]:
        if not transport.closed:
            protocol.data_received(data)
    assert _statuses(transport.written) == [b"400"] and transport.closed, transport.written
    error = _error(transport.written)
    assert error["code"] == "malformed_request" and "PRI" in error["message"], error
    assert started == []


@pytest.mark.parametrize("rest", [b"", b"SM\r\n\r\n"], ids=["without-its-end", "whole"])
async def test_http2s_preface_stays_a_505(rest: bytes) -> None:
    """HTTP/2's preface without its last line had waited for the head timeout too."""
    protocol, transport = protocol_on_fake_transport(_app, head_timeout_s=60.0)
    protocol.data_received(b"PRI * HTTP/2.0\r\n\r\n" + rest)
    assert _statuses(transport.written) == [b"505"] and transport.closed, transport.written


async def test_a_pri_request_behind_a_pipelined_request_follows_its_answer() -> None:
    protocol, transport = protocol_on_fake_transport(_app, head_timeout_s=60.0)
    protocol.data_received(b"GET /a HTTP/1.1\r\nHost: x\r\n\r\nPRI * HTTP/1.1\r\n\r\n")
    await until_async(lambda: transport.closed, "the connection closed")
    assert _statuses(transport.written) == [b"200", b"400"], transport.written


def test_a_pri_request_of_http_1_1_is_a_400_at_once_over_tcp() -> None:
    with (
        threaded_server(_app, head_timeout_s=60.0) as port,
        socket.create_connection(("127.0.0.1", port), timeout=_READ_BOUND_S) as sock,
    ):
        sock.sendall(b"PRI * HTTP/1.1\r\n\r\n")
        answer = b""
        while chunk := sock.recv(65536):  # (a TimeoutError here: the request waited for the head timeout)
            answer += chunk
    assert _statuses(answer) == [b"400"] and _error(answer)["code"] == "malformed_request", answer
