"""service/api/http_protocol.py: a real server refuses an endless request head and keeps serving."""

from __future__ import annotations

import asyncio
import json
import re
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from service.api.http_protocol import MAX_HEAD_BYTES, protocol_class
from tests.api.conftest import tiny_settings
from tests.api.live import LiveServer, live_server
from tests.api.pages import page
from tests.api.protocol_harness import protocol_on_fake_transport

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tiny_checkpoint: Path) -> Iterator[LiveServer]:
    with live_server(tiny_settings(tiny_checkpoint)) as live:
        yield live


def _exchange(url: str, head: bytes, filler: int) -> bytes:
    """Send `head`, then up to `filler` bytes of one header's value; what the server answers."""
    parts = urlsplit(url)
    with socket.create_connection((parts.hostname, parts.port), timeout=30) as sock:
        sock.sendall(head)
        chunk = b"a" * 8192
        try:
            for _ in range(filler // len(chunk)):
                sock.sendall(chunk)
        except OSError:  # the server closed the connection while we were still sending
            pass
        answer = b""
        try:
            while data := sock.recv(65536):
                answer += data
        except OSError:
            pass
        return answer


def test_the_service_parses_with_httptools() -> None:
    protocol = protocol_class()
    assert not isinstance(protocol, str) and protocol.__name__ == "BoundedHttpToolsProtocol"


def test_an_endless_header_is_a_431_and_the_server_keeps_serving(server: LiveServer) -> None:
    answer = _exchange(server.url, b"GET /health HTTP/1.1\r\nHost: x\r\nX-Endless: ", 40 * MAX_HEAD_BYTES)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 431 "), answer[:200]
    assert b"connection: close" in head.lower()
    assert json.loads(body)["error"]["code"] == "headers_too_large"
    # An endless request line too.
    answer = _exchange(server.url, b"GET /health?q=", 40 * MAX_HEAD_BYTES)
    assert answer.startswith(b"HTTP/1.1 431 "), answer[:200]
    assert httpx.get(f"{server.url}/health", timeout=10).status_code == 200


def test_large_heads_under_the_cap_and_large_bodies_pass(server: LiveServer) -> None:
    cookie = "c=" + "x" * (MAX_HEAD_BYTES // 2)  # a big cookie, as gateways and trackers make them
    assert httpx.get(f"{server.url}/health", headers={"cookie": cookie}, timeout=10).status_code == 200
    html = page(1).encode() + b"<!-- " + b"y" * (4 * MAX_HEAD_BYTES) + b" -->"
    response = httpx.post(
        f"{server.url}/v1/embed",
        content=html,
        headers={"content-type": "application/octet-stream", "cookie": cookie},
        timeout=60,
    )
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["documents"] == 1


def test_a_pipelined_head_after_a_large_body_is_not_counted_with_the_body(server: LiveServer) -> None:
    """Two requests in one write (a crawler pipelining): a 200 KB page, then the start of a second head
    that the next write completes. Both are answered; the body before the head is not head bytes."""
    html = page(2).encode() + b"<!-- " + b"z" * (200 * 1024) + b" -->"
    first = (
        b"POST /v1/embed HTTP/1.1\r\nHost: x\r\ncontent-type: application/octet-stream\r\n"
        + f"content-length: {len(html)}\r\n\r\n".encode()
        + html
    )
    parts = urlsplit(server.url)
    with socket.create_connection((parts.hostname, parts.port), timeout=60) as sock:
        sock.sendall(first + b"GET /health HTTP/1.1\r\nHost: x\r\nX-Half: ")
        sock.sendall(b"done\r\nConnection: close\r\n\r\n")
        answer = b""
        while data := sock.recv(65536):
            answer += data
    assert re.findall(rb"HTTP/1\.1 (\d{3}) ", answer) == [b"200", b"200"], answer[-300:]


async def _ok(scope: Any, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


async def test_only_the_bytes_after_a_heads_first_chunk_count() -> None:
    """One read holding a request with a large body and the start of the next head (pipelining) is not
    counted against that head; the reads after it are, and the head is refused once over the cap."""
    protocol, transport = protocol_on_fake_transport(_ok, head_timeout_s=None)
    body = b"y" * (3 * MAX_HEAD_BYTES)
    first = b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body) + body
    protocol.data_received(first + b"GET / HTTP/1.1\r\nHost: x\r\nX-Half: ")
    await asyncio.sleep(0.05)  # the first request is answered
    assert not transport.closed and b" 431 " not in transport.written
    assert transport.written.startswith(b"HTTP/1.1 200 ")
    protocol.data_received(b"a" * (MAX_HEAD_BYTES // 2))
    assert not transport.closed
    protocol.data_received(b"a" * (MAX_HEAD_BYTES // 2 + 1))
    assert transport.closed and b"HTTP/1.1 431 " in transport.written


def test_a_client_that_pipelines_and_leaves_is_no_server_error(server: LiveServer) -> None:
    """A page, a second request behind it in the same write, then the client closes: the running
    request learns that its client left (uvicorn only told the queued one, and the page's response then
    went into a closed transport: a 500 with a traceback). Nothing counts as a server fault."""
    parts = urlsplit(server.url)
    html = page(3).encode()
    request = (
        b"POST /v1/embed HTTP/1.1\r\nHost: x\r\ncontent-type: text/html\r\n"
        + f"content-length: {len(html)}\r\n\r\n".encode()
        + html
        + b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
    )

    def embed_requests() -> dict[str, float]:
        text = httpx.get(server.url + "/metrics").text
        found = re.findall(r'htmllm_requests_total\{([^}]*route="/v1/embed"[^}]*)\} (\S+)', text)
        return {labels: float(value) for labels, value in found}

    before = embed_requests()
    for _ in range(5):
        with socket.create_connection((parts.hostname, parts.port), timeout=30) as sock:
            sock.sendall(request)
    for _ in range(200):  # each request is counted when its handler returns
        after = embed_requests()
        if sum(after.values()) - sum(before.values()) >= 5:
            break
        time.sleep(0.05)
    new = {labels: value - before.get(labels, 0.0) for labels, value in after.items()}
    assert sum(new.values()) == 5, new
    assert not any('status="500"' in labels and count for labels, count in new.items()), new
    assert httpx.get(server.url + "/health").status_code == 200


def _send(url: str, data: bytes, timeout: float = 60) -> bytes:
    """Send `data` on a new connection; everything the server answers until it closes."""
    parts = urlsplit(url)
    with socket.create_connection((parts.hostname, parts.port), timeout=timeout) as sock:
        sock.sendall(data)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
        return answer


_H2C_OFFER = (
    b"Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQCAAAAAAIAAAAA\r\n"
)


def test_a_request_that_offers_a_protocol_switch_is_answered_with_its_body(server: LiveServer) -> None:
    """`Upgrade: h2c` (Java's HttpClient, Spring's RestClient, `curl --http2` on a plain URL): llhttp
    stops at the head, and uvicorn had started the request with an empty body (400 `empty_input`). The
    page is embedded as without the offer, with a Content-Length or chunked, and a request pipelined
    behind it is answered too."""
    html = page(4).encode()
    plain = httpx.post(
        f"{server.url}/v1/embed", content=html, headers={"content-type": "text/html"}, timeout=60
    ).json()["data"][0]["embedding"]
    framings = {
        "length": f"content-length: {len(html)}\r\n\r\n".encode() + html,
        "chunked": b"transfer-encoding: chunked\r\n\r\n"
        + b"".join(b"%x\r\n%s\r\n" % (len(part), part) for part in (html[:100], html[100:]))
        + b"0\r\n\r\n",
    }
    for framing, rest in framings.items():
        request = b"POST /v1/embed HTTP/1.1\r\nHost: x\r\ncontent-type: text/html\r\n" + _H2C_OFFER + rest
        answer = _send(server.url, request + b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert re.findall(rb"HTTP/1\.1 (\d{3}) ", answer) == [b"200", b"200"], (framing, answer[-300:])
        first = answer.split(b"\r\n\r\n", 1)[1]
        embedding = json.loads(first[: first.index(b"HTTP/1.1 ")])["data"][0]["embedding"]
        assert embedding == pytest.approx(plain, abs=1e-5), framing
    # A WebSocket offer is no switch either (no route takes one): answered as HTTP.
    answer = _send(
        server.url,
        b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: Upgrade, close\r\nUpgrade: websocket\r\n"
        b"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n",
    )
    assert answer.startswith(b"HTTP/1.1 200 ") and answer.endswith(b'{"status":"ok"}'), answer[-300:]


def test_connect_is_refused_typed_and_the_server_keeps_serving(server: LiveServer) -> None:
    answer = _send(server.url, b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n")
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 405 ") and b"connection: close" in head, answer[:300]
    assert json.loads(body)["error"]["code"] == "method_not_allowed"
    assert httpx.get(f"{server.url}/health", timeout=10).status_code == 200


async def _slow_ok(scope: Any, receive: Any, send: Any) -> None:
    await asyncio.sleep(0.5)
    await _ok(scope, receive, send)


async def test_a_head_slower_than_the_timeout_is_a_408_and_the_connection_closes() -> None:
    """uvicorn times out only idle connections between requests: one that sent half a head, or nothing,
    was held without end. Half a head gets 408 `head_timeout`; nothing gets a close."""
    protocol, transport = protocol_on_fake_transport(_ok, head_timeout_s=0.2)
    protocol.data_received(b"GET / HTTP/1.1\r\nHost: x\r\n")
    await asyncio.sleep(0.1)
    assert not transport.closed
    await asyncio.sleep(0.3)
    assert transport.closed and transport.written.startswith(b"HTTP/1.1 408 "), transport.written
    assert json.loads(transport.written.partition(b"\r\n\r\n")[2])["error"]["code"] == "head_timeout"

    protocol, transport = protocol_on_fake_transport(_ok, head_timeout_s=0.2)
    await asyncio.sleep(0.4)
    assert transport.closed and transport.written == b""


async def test_the_head_timeout_spares_heads_that_came_and_requests_being_answered() -> None:
    """A head that arrived in time is answered however long its answer takes; a pipelined half head
    behind it is not cut off while the request before it runs (its clock restarts), and is timed out
    once that request is answered; without a timeout nothing is closed."""
    protocol, transport = protocol_on_fake_transport(_slow_ok, head_timeout_s=0.2)
    protocol.data_received(b"GET / HTTP/1.1\r\nHost: x\r\n\r\nGET / HTTP/1.1\r\nHost: x\r\n")
    await asyncio.sleep(0.45)
    assert not transport.closed and transport.written == b""
    await asyncio.sleep(0.5)  # the first answer at 0.5 s; the half head's clock runs out after it
    assert transport.written.startswith(b"HTTP/1.1 200 "), transport.written
    assert transport.closed and b"HTTP/1.1 408 " in transport.written

    protocol, transport = protocol_on_fake_transport(_ok, head_timeout_s=None)
    protocol.data_received(b"GET / HTTP/1.1\r\nHost: x\r\n")
    await asyncio.sleep(0.3)
    assert not transport.closed


async def test_a_connection_reset_after_its_answer_cancels_the_keep_alive_timer() -> None:
    """uvicorn cancels the keep-alive timer in `connection_lost` only for a close without error; a client
    that resets its connection after the answer (RST) left the timer armed, and through it the protocol,
    its request cycle and the request's charge against the body budget, for HTMLLM_KEEP_ALIVE_TIMEOUT_S
    (75 s)."""
    protocol, transport = protocol_on_fake_transport(_ok, head_timeout_s=None)
    protocol.data_received(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    for _ in range(1000):  # the app's task answers on the loop's next turns
        if protocol.timeout_keep_alive_task is not None:
            break
        await asyncio.sleep(0)
    assert transport.written.startswith(b"HTTP/1.1 200 "), transport.written
    timer = protocol.timeout_keep_alive_task
    assert timer is not None, "no keep-alive timer after the answer"

    protocol.connection_lost(ConnectionResetError(104, "Connection reset by peer"))

    assert timer.cancelled(), "the timer keeps the protocol and its request for the keep-alive timeout"
    assert protocol.timeout_keep_alive_task is None


def _head(total: int, method: bytes = b"GET /health", headers: bytes = b"") -> bytes:
    """A request head of exactly `total` bytes, most of them one header's value, that closes. Its
    headers are written "Name:value": the space clients put before a value is not counted (llhttp drops
    it), so a head written so is counted exactly."""
    start = method + b" HTTP/1.1\r\nHost:x\r\nConnection:close\r\n" + headers + b"X-Filler:"
    return start + b"a" * (total - len(start) - 4) + b"\r\n\r\n"


def _one_write(url: str, data: bytes) -> bytes:
    """Send `data` in one write, then read the answer until the server closes; a reset fails the test."""
    parts = urlsplit(url)
    with socket.create_connection((parts.hostname, parts.port), timeout=60) as sock:
        sock.sendall(data)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
        return answer


def test_a_head_over_the_cap_in_one_read_is_a_431(server: LiveServer) -> None:
    """A head that arrives whole in one read was not counted (the chunk a head begins in is not): 70 KiB
    got a 200. Its size is known once it is parsed, and a head over the cap is refused there."""
    for total in (70 * 1024, MAX_HEAD_BYTES + 1):
        answer = _one_write(server.url, _head(total))
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 431 "), (total, answer[:200])
        assert json.loads(body)["error"]["code"] == "headers_too_large"
    for total in (60 * 1024, MAX_HEAD_BYTES):
        answer = _one_write(server.url, _head(total))
        assert answer.startswith(b"HTTP/1.1 200 "), (total, answer[:200])


@pytest.mark.parametrize(
    "headers",
    [b"".join(b"X-%05d:v\r\n" % i for i in range(3000)), b"E:\r\n"],
    ids=["3000-headers-without-a-space", "an-empty-header"],
)
def test_a_head_within_the_cap_is_not_over_counted(server: LiveServer, headers: bytes) -> None:
    """Each header was counted with ": " between name and value, though llhttp gives no sign of the
    space: a head of 3,000 "Name:value" headers got a 431 at 62,537 bytes, one with an empty "E:" header
    at exactly the cap. A head is never counted longer than it was sent; one byte over is still a 431."""
    answer = _one_write(server.url, _head(MAX_HEAD_BYTES, headers=headers))
    assert answer.startswith(b"HTTP/1.1 200 "), answer[:200]
    answer = _one_write(server.url, _head(MAX_HEAD_BYTES + 1, headers=headers))
    assert answer.startswith(b"HTTP/1.1 431 "), answer[:200]


def test_the_431_for_a_large_head_sent_in_one_write_reaches_the_client(server: LiveServer) -> None:
    """The server stopped reading and closed with the rest of the head unread: the kernel answered with a
    reset, and the client lost the 431 (ConnectionResetError). It now reads the whole answer, then EOF."""
    for _ in range(5):
        answer = _one_write(server.url, _head(200 * 1000))
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 431 "), answer[:200]
        assert json.loads(body)["error"]["code"] == "headers_too_large"
    assert httpx.get(f"{server.url}/health", timeout=10).status_code == 200


def test_the_400_for_an_invalid_request_with_a_large_body_reaches_the_client(server: LiveServer) -> None:
    """A head the parser refuses (a space in a header's name), a 1 MB body behind it in the same write:
    the body was left unread at the close, and the client got a reset in place of the 400."""
    body = b"b" * 1_000_000
    request = b"POST /v1/embed HTTP/1.1\r\nHost: x\r\nBad Name: 1\r\nContent-Length: %d\r\n\r\n" % len(body)
    for _ in range(3):
        answer = _one_write(server.url, request + body)
        assert answer.startswith(b"HTTP/1.1 400 "), answer[:200]
        message = b'"message": "malformed HTTP/1.1 request: Invalid header token"}}'
        assert answer.endswith(message), answer[-200:]


async def _until(condition: Any) -> None:
    """Let the loop run until `condition()` holds (the app's task, a timer); fails after a generous bound."""
    for _ in range(1000):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the condition never held")


def _answers(written: bytes) -> list[bytes]:
    return re.findall(rb"HTTP/1\.1 (\d{3}) ", written)


async def test_the_cap_is_exact_for_a_head_that_arrives_in_one_read() -> None:
    """The read a head begins in is not counted, so a whole head in one read passed up to 256 KiB. Once
    parsed its size is known: one byte over the cap (trailing whitespace in a value counts) is a 431,
    and no request starts; a head of exactly the cap is served. (Heads written "Name:value", as `_head`
    writes them: the space before a value is not counted.)"""
    calls: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        calls.append(scope["path"])
        await _ok(scope, receive, send)

    protocol, transport = protocol_on_fake_transport(app, head_timeout_s=None)
    protocol.data_received(_head(MAX_HEAD_BYTES, b"GET /exact"))
    await _until(lambda: transport.closed)
    assert _answers(transport.written) == [b"200"] and calls == ["/exact"], transport.written[:200]

    for over in (_head(MAX_HEAD_BYTES + 1), _head(MAX_HEAD_BYTES).replace(b"a\r\n", b"a \r\n")):
        protocol, transport = protocol_on_fake_transport(app, head_timeout_s=None)
        protocol.data_received(over + b"GET /next HTTP/1.1\r\nHost: x\r\n\r\n")
        assert transport.closed and _answers(transport.written) == [b"431"], transport.written[:200]
        await asyncio.sleep(0)
        assert calls == ["/exact"]


async def test_a_refusal_behind_a_pipelined_request_waits_for_its_answer() -> None:
    """A request and an over-cap head (or bytes that are no request) in one read: the refusal went out
    at once and the client read it as the first request's answer. Answers now come in order."""
    for refused, status in ((_head(MAX_HEAD_BYTES + 1), b"431"), (b"\x16\x03\x01\x02\x00" * 8, b"400")):
        protocol, transport = protocol_on_fake_transport(_slow_ok, head_timeout_s=None)
        first = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"
        protocol.data_received(first + first + refused)
        assert transport.written == b"" and not transport.closed
        protocol.data_received(b"more")  # dropped: the connection is refused past this point
        await _until(lambda sent=transport: sent.closed)
        assert _answers(transport.written) == [b"200", b"200", status], transport.written


async def test_a_refusal_half_closes_and_reads_on_for_a_bounded_time_and_amount(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Closing with the client's input unread made the kernel reset the connection, and the client lost
    the answer. The answer is written, the connection half-closed, and what the client still sends is
    dropped, up to `_LINGER_BYTES` or for `_LINGER_S`, then the connection closes."""
    from service.api import http_protocol

    protocol, transport = protocol_on_fake_transport(_ok, head_timeout_s=None, half_close=True)
    protocol.data_received(_head(MAX_HEAD_BYTES + 1))
    assert transport.eof and not transport.closed and _answers(transport.written) == [b"431"]
    protocol.data_received(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + b"a" * (http_protocol._LINGER_BYTES - 100))
    assert not transport.closed and _answers(transport.written) == [b"431"]
    protocol.data_received(b"a" * 200)
    assert transport.closed

    monkeypatch.setattr(http_protocol, "_LINGER_S", 0.01)
    protocol, transport = protocol_on_fake_transport(_ok, head_timeout_s=None, half_close=True)
    protocol.data_received(b"\x16\x03\x01\x02\x00" * 8)
    assert transport.eof and transport.written.startswith(b"HTTP/1.1 400 ")
    await _until(lambda: transport.closed)

    # The client's close ends the wait (the transport closes itself); the timer goes with the connection.
    monkeypatch.setattr(http_protocol, "_LINGER_S", 60.0)
    protocol, transport = protocol_on_fake_transport(_ok, head_timeout_s=None, half_close=True)
    protocol.data_received(_head(MAX_HEAD_BYTES + 1))
    timer = protocol._linger_timer
    assert protocol.eof_received() is None  # (asyncio closes a transport whose protocol says so)
    protocol.connection_lost(None)
    assert timer is not None and timer.cancelled()


async def test_a_head_timeout_half_closes_too() -> None:
    """The 408 went out with a close: a client still sending its head had its input reset, answer and all."""
    protocol, transport = protocol_on_fake_transport(_ok, head_timeout_s=0.05, half_close=True)
    protocol.data_received(b"GET / HTTP/1.1\r\nHost: x\r\n")
    await _until(lambda: transport.eof)
    assert transport.written.startswith(b"HTTP/1.1 408 ") and not transport.closed
    protocol.data_received(b"X-Late: 1\r\n")  # dropped, no second answer
    assert _answers(transport.written) == [b"408"]
    protocol.connection_lost(None)
