"""service/api/http_protocol.py: a chunked body's trailer fields are never request headers, and are bounded.

uvicorn appended trailer fields to the request's headers: a trailer `Authorization` passed the key check
(200 where the head carried no key), and `Content-Encoding`, `Content-Type` or `X-Request-Id` there took
effect (RFC 9110 section 6.5.2 forbids merging trailers into the header section). httptools buffered an
endless trailer value without bound (60 MB held the event loop 6.5 s), and llhttp, reading a trailer
`Connection: close` as a head's, silently dropped every request the connection brought after it.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import re
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from service.api.http_protocol import MAX_HEAD_BYTES
from tests.api.conftest import tiny_settings
from tests.api.live import LiveServer, live_server
from tests.api.pages import page
from tests.api.protocol_harness import echo_app, protocol_on_fake_transport, read_body, threaded_server
from tests.factories.waiting import until_async

KEY = "k1"
_AUTH = b"Authorization: Bearer " + KEY.encode() + b"\r\n"


@pytest.fixture(scope="module")
def server(tiny_checkpoint: Path) -> Iterator[LiveServer]:
    with live_server(tiny_settings(tiny_checkpoint, api_key=KEY)) as live:
        yield live


def _address(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    assert parts.hostname is not None and parts.port is not None
    return parts.hostname, parts.port


def _statuses(answer: bytes) -> list[bytes]:
    return re.findall(rb"HTTP/1\.1 (\d{3}) ", answer)


def _chunked(path: bytes, body: bytes, trailer: bytes, head: bytes = b"") -> bytes:
    """A chunked POST of `body` (HTML) in one chunk, then `trailer` (its fields, each ending in CRLF)."""
    start = b"POST " + path + b" HTTP/1.1\r\nHost: x\r\nContent-Type: text/html\r\n" + head
    return start + b"Transfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n%s\r\n" % (len(body), body, trailer)


def _exchange(url: str, data: bytes) -> bytes:
    """Send `data` in one write, then read until the server closes."""
    with socket.create_connection(_address(url), timeout=30) as sock:
        sock.sendall(data)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
        return answer


def _answer(sock: socket.socket, pending: bytes = b"") -> tuple[bytes, bytes, bytes]:
    """(head, body, what came after) of one answer with a Content-Length; the connection may stay open."""
    data = pending
    while b"\r\n\r\n" not in data:
        received = sock.recv(65536)
        assert received, f"closed before an answer: {data[:300]!r}"
        data += received
    head, _, rest = data.partition(b"\r\n\r\n")
    length = int(re.search(rb"(?i)\r\ncontent-length: (\d+)", head)[1])  # type: ignore[index]
    while len(rest) < length:
        received = sock.recv(65536)
        assert received, f"closed mid-answer: {head[:300]!r}"
        rest += received
    return head, rest[:length], rest[length:]


@pytest.mark.slow
def test_a_trailer_authorization_is_no_key(server: LiveServer) -> None:
    """The key sent only in a trailer (in the same write as the head, so it was parsed before the
    request started) passed the key check: the request is refused 401, as without it."""
    html = page(1).encode()
    answer = _exchange(server.url, _chunked(b"/v1/embed", html, _AUTH, b"Connection: close\r\n"))
    assert _statuses(answer) == [b"401"], answer[:300]
    answer = _exchange(server.url, _chunked(b"/v1/embed", html, b"", _AUTH + b"Connection: close\r\n"))
    assert _statuses(answer) == [b"200"], answer[:300]


@pytest.mark.slow
def test_trailer_fields_change_neither_the_body_nor_the_answer(server: LiveServer) -> None:
    """A trailer `Content-Encoding: gzip` had the plain body decoded as gzip (refused), a trailer
    `Content-Type` and `X-Request-Id` took effect too; the request is served as its head describes it.
    A gzip body whose head says so is still decoded (the head's fields are untouched)."""
    html = page(2).encode()
    trailer = b"Content-Encoding: gzip\r\nContent-Type: application/json\r\nX-Request-Id: from-trailer\r\n"
    head = _AUTH + b"X-Request-Id: from-head\r\nConnection: close\r\n"
    answer = _exchange(server.url, _chunked(b"/v1/embed", html, trailer, head))
    assert _statuses(answer) == [b"200"], answer[:300]
    assert b"\r\nx-request-id: from-head\r\n" in answer.partition(b"\r\n\r\n")[0].lower(), answer[:300]

    head = _AUTH + b"Content-Encoding: gzip\r\nConnection: close\r\n"
    answer = _exchange(server.url, _chunked(b"/v1/embed", gzip.compress(html), b"", head))
    assert _statuses(answer) == [b"200"], answer[:300]


@pytest.mark.slow
def test_a_trailer_connection_close_keeps_the_connection(server: LiveServer) -> None:
    """llhttp dropped, silently, every byte after a request whose trailer said `Connection: close`: the
    request pipelined behind it, and any sent later on the kept connection, went unanswered (until the
    head timeout closed it). Both are answered, and the connection stays open."""
    get = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
    with socket.create_connection(_address(server.url), timeout=30) as sock:
        sock.sendall(_chunked(b"/v1/embed", page(3).encode(), b"Connection: close\r\n", _AUTH) + get)
        head, body, rest = _answer(sock)
        assert head.startswith(b"HTTP/1.1 200 ") and b"connection: close" not in head.lower(), head
        assert json.loads(body)["data"], body[:300]
        head, _, rest = _answer(sock, rest)
        assert head.startswith(b"HTTP/1.1 200 "), head
        sock.sendall(get)
        head, _, _ = _answer(sock, rest)
        assert head.startswith(b"HTTP/1.1 200 "), head


@pytest.mark.slow
def test_an_endless_trailer_is_a_431_and_the_server_keeps_serving(server: LiveServer) -> None:
    """A trailer value that never ends was buffered whole, copied at each read: it is refused once past
    `MAX_HEAD_BYTES` (plus a read or two), as an endless header is."""
    start = _chunked(b"/v1/embed", page(4).encode(), b"", _AUTH)[: -len(b"\r\n")] + b"X-Endless: "
    with socket.create_connection(_address(server.url), timeout=30) as sock:
        sock.sendall(start)
        filler = b"a" * 8192
        try:
            for _ in range(40 * MAX_HEAD_BYTES // len(filler)):
                sock.sendall(filler)
        except OSError:  # the server refused, and stopped reading, while we were still sending
            pass
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 431 "), answer[:300]
    assert json.loads(body)["error"]["code"] == "headers_too_large", body
    assert httpx.get(f"{server.url}/health", timeout=10).status_code == 200


def test_the_app_sees_the_heads_fields_and_the_whole_body() -> None:
    """What the app reads: the head's fields only, in order, and the body complete (a trailer field's
    name and value had been appended to `scope["headers"]`)."""
    seen: list[Any] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        body = await read_body(receive)
        if scope["method"] == "POST":  # (not the server's readiness poll)
            seen.append((list(scope["headers"]), body))
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})

    with threaded_server(app) as port:
        trailer = b"Authorization: Bearer t\r\nX-Late: 1\r\n"
        answer = _exchange(
            f"http://127.0.0.1:{port}", _chunked(b"/", b"<p>hi</p>", trailer, b"Connection: close\r\n")
        )
    assert _statuses(answer) == [b"200"], answer
    assert seen == [
        (
            [
                (b"host", b"x"),
                (b"content-type", b"text/html"),
                (b"connection", b"close"),
                (b"transfer-encoding", b"chunked"),
            ],
            b"<p>hi</p>",
        )
    ]


def _trailer_of(size: int) -> bytes:
    """A trailer section (its fields and the blank line) of exactly `size` bytes, one field."""
    return b"X-Filler:" + b"a" * (size - len(b"X-Filler:\r\n\r\n")) + b"\r\n"


async def test_the_trailer_cap_is_that_of_a_head() -> None:
    """A trailer section of exactly `MAX_HEAD_BYTES` is dropped and its request served; one byte more is
    a 431, the request refused as for a malformed body (its app told that the client left)."""
    received: list[dict[str, Any]] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        while not received or received[-1].get("more_body"):
            received.append(await receive())
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})

    protocol, transport = protocol_on_fake_transport(app)
    protocol.data_received(_chunked(b"/", b"abc", _trailer_of(MAX_HEAD_BYTES)))
    await until_async(lambda: _statuses(transport.written), "an answer")
    assert _statuses(transport.written) == [b"200"] and not transport.closed
    assert b"".join(message["body"] for message in received) == b"abc" and not received[-1]["more_body"]

    received.clear()
    protocol, transport = protocol_on_fake_transport(app)
    protocol.data_received(_chunked(b"/", b"abc", _trailer_of(MAX_HEAD_BYTES + 1)))
    assert _statuses(transport.written) == [b"431"] and transport.closed
    await until_async(lambda: received and received[-1]["type"] == "http.disconnect", "a disconnect")
    await asyncio.sleep(0)
    assert _statuses(transport.written) == [b"431"]


_FRAMING_TRAILERS = {
    "content-length": b"Content-Length: 5\r\n",
    "transfer-encoding": b"Transfer-Encoding: chunked\r\n",
    "content-length-and-connection-close": b"Connection: close\r\nContent-Length: 9\r\n",
}


@pytest.mark.parametrize("trailer", list(_FRAMING_TRAILERS))
async def test_a_trailer_content_length_or_transfer_encoding_is_refused_and_nothing_after_it_read(
    trailer: str,
) -> None:
    """A trailer `Content-Length` or `Transfer-Encoding` is llhttp's 400 and the connection closes, the
    requests after it unread. Taken as any trailer field (llhttp's `lenient_chunked_length`), a trailer
    `Content-Length: 9` beside a trailer `Connection: close` (whose leniency restarts the parser) was
    added to the next head's: its `Content-Length: 3` read as 93, and the body swallowed the request after
    it, another client's head with its credentials behind a proxy sharing the connection (request
    smuggling). Nothing after the refused request may be answered."""
    protocol, transport = protocol_on_fake_transport(echo_app)
    after = (
        b"POST /b HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\n<p>"
        b"GET /c HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer VICTIM\r\n\r\n"
    )
    protocol.data_received(_chunked(b"/a", b"abc", _FRAMING_TRAILERS[trailer]) + after)
    await until_async(lambda: transport.closed, "the connection closed", polls=1000)
    assert b"VICTIM" not in transport.written, transport.written
    assert _statuses(transport.written)[-1:] == [b"400"], transport.written
    assert b"200" not in _statuses(transport.written)[1:], transport.written
