"""service/api/http_protocol.py: a request of an HTTP version other than 1.x is a 505; 1.2 and up are 1.1.

llhttp takes HTTP/0.9 (a request line without a version reads as one) and HTTP/2.0, and uvicorn answered
such requests as HTTP/1.1 (`GET /health HTTP/2.0` got a 200). The server speaks HTTP/1.x only: such a
request is answered 505 HTTP Version Not Supported (RFC 9110 section 15.6.6), from below the app, and
its connection closed; so is HTTP/2's connection preface (`PRI * HTTP/2.0`, prior knowledge), which had
uvicorn's 400. A request line without a version is answered as soon as it ends, whatever follows it. A
higher minor version of HTTP/1 (`HTTP/1.2`), which llhttp refused (uvicorn's 400), is served as HTTP/1.1
(RFC 9110 section 2.5).
"""

from __future__ import annotations

import asyncio
import re
import socket
from typing import Any

import pytest

from tests.api.protocol_harness import protocol_on_fake_transport, threaded_server
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


@pytest.mark.parametrize("line_end", [b"\r\n", b"\n"], ids=["crlf", "lf"])
@pytest.mark.parametrize("whole", [True, False], ids=["one-read", "byte-by-byte"])
async def test_a_request_line_without_a_version_alone_is_a_505_at_once(line_end: bytes, whole: bool) -> None:
    """An HTTP/0.9 client sends its request line alone and waits: llhttp waits for headers after it, so
    the 505 came only with a blank line, and such a client got the head timeout's 408. It is answered as
    soon as the line has ended, whether it came in one read or a byte at a time."""
    started: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        started.append(scope["path"])
        await _app(scope, receive, send)

    protocol, transport = protocol_on_fake_transport(app, head_timeout_s=60.0)
    sent = b"GET /health" + line_end
    for data in [sent] if whole else [sent[i : i + 1] for i in range(len(sent))]:
        assert transport.written == b""
        protocol.data_received(data)
    assert _statuses(transport.written) == [b"505"] and transport.closed, transport.written[:300]
    assert b"without a version" in transport.written and started == []


async def test_a_request_line_without_a_version_behind_pipelined_requests_follows_their_answers() -> None:
    """Behind a request (and its body, whose last line looks like such a request line), the 505 for a
    line without a version goes out after their answers."""
    protocol, transport = protocol_on_fake_transport(_app, head_timeout_s=60.0)
    body = b"x\nGET /b\n"
    protocol.data_received(
        b"POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%sGET /b\r\n" % (len(body), body)
    )
    await until_async(lambda: transport.closed, "the connection closed")
    assert _statuses(transport.written) == [b"200", b"505"], transport.written


@pytest.mark.parametrize(
    "reads",
    [
        # A byte at a time, a header line that looks like the request line without its version.
        [bytes([byte]) for byte in b"GET /b HTTP/1.1\r\nX: GET /b\r\nHost: x\r\n\r\n"],
        # The line ending in one read, headers in the next ones, one of them a line end alone.
        [b"GET /b HTTP/1.1\r\nX:", b"GET /b\r\n", b"Host: x\r\n", b"\r\n"],
        # Behind a body whose last lines look like the request line without its version.
        [
            b"POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 8\r\n\r\nx\nGET /b",
            b"\nGET /b",
            b" HTTP/1.1\r\n\r\n",
        ],
        [
            b"POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 8\r\n\r\nx\nGET /b",
            b"GET /b HTTP/1.1\r",
            b"\nHost: x\r\n\r\n",
        ],
    ],
    ids=["byte-by-byte", "header-reads", "after-a-body", "after-a-body-split"],
)
async def test_requests_with_a_version_in_any_reads_are_served(reads: list[bytes]) -> None:
    """Only a line without a version is refused early: a request line with one, a header line, a body's
    lines, in whatever reads they come, are not."""
    protocol, transport = protocol_on_fake_transport(_app, head_timeout_s=60.0)
    for data in reads:
        protocol.data_received(data)
        await asyncio.sleep(0)
    expected = [b"200"] * (2 if reads[0].startswith(b"POST") else 1)
    await until_async(lambda: len(_statuses(transport.written)) == len(expected), "the requests answered")
    assert _statuses(transport.written) == expected and not transport.closed, transport.written


@pytest.mark.parametrize(
    "reads",
    [
        [b"GET /health\r\nHost: x\r\n"],
        [b"GET /health\nH"],
        [b"GET /health\r", b"\nHost: x\r\n"],
        [b"GET /health HTTP/0.9\r\nHost: x\r\n"],
    ],
    ids=["headers-in-the-same-read", "lf-then-a-byte", "split-in-its-line-end", "http-0.9"],
)
async def test_a_request_line_without_a_version_then_anything_is_a_505_at_once(reads: list[bytes]) -> None:
    """Not only the line alone: followed by header lines (or any byte) in the same read, it is no HTTP/1.x
    request either, and gets the same 505 at once; it had waited for a blank line, and a client that sent
    none got the head timeout's 408."""
    started: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        started.append(scope["path"])
        await _app(scope, receive, send)

    protocol, transport = protocol_on_fake_transport(app, head_timeout_s=60.0)
    for data in reads:
        protocol.data_received(data)
    assert _statuses(transport.written) == [b"505"] and transport.closed, transport.written[:300]
    assert b"without a version" in transport.written and started == []


@pytest.mark.parametrize(
    "reads",
    [
        [b"GET /health HTTP/1.1\r\nHost: x\r\n\r\nGET /", b"\r\n"],
        [b"\r\nGET /", b"\r\n"],
        [b"GET /health HTTP/1.1\r\nHost: x\r\n\r\nGET", b" /\r\n"],
    ],
    ids=["behind-a-request", "after-a-blank-line", "split-in-the-line"],
)
async def test_a_versionless_line_split_after_an_lf_is_a_505_at_once(reads: list[bytes]) -> None:
    """The partial line kept from a read that began with another message's LF had kept that LF, so the
    line, rebuilt when it ended in the next read, never matched the method and URL: the 505 came only as
    the head timeout's 408, 30 s later, where the same bytes in one read got it at once."""
    protocol, transport = protocol_on_fake_transport(_app, head_timeout_s=60.0)
    for data in reads:
        protocol.data_received(data)
        await asyncio.sleep(0)
    expected = [b"200", b"505"] if reads[0].startswith(b"GET /health") else [b"505"]
    await until_async(lambda: transport.closed, "the connection closed")
    assert _statuses(transport.written) == expected, transport.written[:300]


def test_a_request_line_without_a_version_then_headers_is_a_505_at_once_over_tcp() -> None:
    with threaded_server(_app, head_timeout_s=60.0) as port:
        # (behind a request with a version, whose answer comes first)
        answer = _until_closed(port, b"GET /a HTTP/1.1\r\nHost: x\r\n\r\nGET /b\r\nHost: x\r\n")
    assert _statuses(answer) == [b"200", b"505"], answer


@pytest.mark.parametrize("minor", [b"2", b"9"])
async def test_a_higher_http_1_minor_version_is_served_as_1_1(minor: bytes) -> None:
    """RFC 9110 section 2.5: a request of a higher minor version of HTTP/1 is served as HTTP/1.1 (llhttp
    had refused it, uvicorn's 400): the app sees 1.1, the answer's status line says 1.1, and the
    connection is kept as 1.1's is, closed where the request says `Connection: close`."""
    versions: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        versions.append(scope["http_version"])
        await _app(scope, receive, send)

    protocol, transport = protocol_on_fake_transport(app)
    protocol.data_received(b"GET /a HTTP/1.%s\r\nHost: x\r\n\r\n" % minor)
    await until_async(lambda: _statuses(transport.written), "an answer")
    protocol.data_received(b"GET /b HTTP/1.%s\r\nHost: x\r\nConnection: close\r\n\r\n" % minor)
    await until_async(lambda: transport.closed, "the connection closed")
    assert _statuses(transport.written) == [b"200", b"200"] and versions == ["1.1", "1.1"], transport.written


@pytest.mark.parametrize("version", [b"3.0", b"9.9", b"0.8"])
async def test_another_major_version_is_a_505(version: bytes) -> None:
    """HTTP/2.0 keeps its 505, and so does every version whose major is not 1 (llhttp had refused 3.0
    and 0.8 with uvicorn's 400)."""
    protocol, transport = protocol_on_fake_transport(_app)
    protocol.data_received(b"GET /health HTTP/" + version + b"\r\nHost: x\r\n\r\n")
    assert _statuses(transport.written) == [b"505"] and transport.closed, transport.written[:300]
    assert b"HTTP/" + version + b" is not supported" in transport.written


def test_http_1_2_is_served_as_1_1_over_tcp() -> None:
    with threaded_server(_app) as port:
        answer = _until_closed(port, b"GET / HTTP/1.2\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 200 OK\r\n") and answer.endswith(b"ok"), answer


def _until_closed(port: int, data: bytes) -> bytes:
    """Send `data`, then read until the server closes (a bound on each read: a server still waiting fails
    the test rather than hang it)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10.0) as sock:
        sock.sendall(data)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
        return answer
