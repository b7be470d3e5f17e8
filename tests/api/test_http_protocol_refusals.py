"""service/api/http_protocol.py: refusals from below the app for a malformed body, and while one waits.

A 400 for a bad chunk in a request's body had waited for that same request's answer, which waits for a
body that never completes: the client got the 10 s stall's 408 `body_timeout` in place of uvicorn's
immediate 400. And while a refusal waited behind pipelined requests, what the client sent after it was
read and dropped without bound (uvicorn resumes reading for each of them): gigabytes, for one
connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from service.api.logs import ACCESS_LOGGER, FIELDS, AccessLogMiddleware
from service.api.metrics import RequestMetricsMiddleware, ServiceMetrics
from tests.api.conftest import tiny_settings
from tests.api.live import LiveServer, live_server
from tests.api.pages import page
from tests.api.protocol_harness import FakeTransport, protocol_on_fake_transport, threaded_server

# Well below the body's 10 s stall, which answered these before: an answer within it came at once.
_PROMPT_S = 5.0
_MALFORMED = b'{"error": {"code": "malformed_request", "message": "malformed HTTP/1.1 request: '
_H2C_OFFER = (
    b"Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQCAAAAAAIAAAAA\r\n"
)
_TLS_HELLO = b"\x16\x03\x01\x02\x00" * 8  # bytes that are no HTTP/1.1 request: uvicorn's 400


@pytest.fixture(scope="module")
def server(tiny_checkpoint: Path) -> Iterator[LiveServer]:
    with live_server(tiny_settings(tiny_checkpoint)) as live:
        yield live


def _statuses(answer: bytes) -> list[bytes]:
    return re.findall(rb"HTTP/1\.1 (\d{3}) ", answer)


def _chunked(path: str, content_type: bytes, first: bytes, bad: bytes, extra: bytes = b"") -> bytes:
    """A chunked request with one valid chunk, then `bad` where the next chunk's size belongs."""
    head = f"POST {path} HTTP/1.1\r\nHost: x\r\n".encode() + b"Content-Type: " + content_type + b"\r\n"
    return head + extra + b"Transfer-Encoding: chunked\r\n\r\n" + b"%x\r\n%s\r\n" % (len(first), first) + bad


@pytest.mark.slow
@pytest.mark.parametrize(
    ("request_bytes", "earlier"),
    [
        (_chunked("/v1/embed", b"text/html", page(1).encode(), b"zz\r\n"), []),
        (_chunked("/v1/embed", b"text/html", page(1).encode(), b"XX0\r\n\r\n"), []),
        (_chunked("/v1/embeddings", b"application/json", b'{"inp', b"Q\r\n"), []),
        (_chunked("/v1/embed", b"text/html", page(1).encode(), b"zz\r\n", _H2C_OFFER), []),
        (_chunked("/v1/embed", b"text/html", page(1).encode(), b"zz\r\n", b"Expect: 100-continue\r\n"), []),
        (
            b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
            + _chunked("/v1/embed", b"text/html", b"<p>", b"zz\r\n"),
            [b"200"],
        ),
    ],
    ids=["bad-size", "no-crlf-after-data", "json", "h2c-offer", "expect-100", "behind-a-pipelined-get"],
)
def test_a_malformed_chunked_body_is_a_prompt_400(
    server: LiveServer, request_bytes: bytes, earlier: list[bytes]
) -> None:
    """The request whose body is malformed is the one refused: answered at once (after the answers
    before it), not after its body's stall. A socket timeout below the stall fails the test otherwise."""
    parts = urlsplit(server.url)
    with socket.create_connection((parts.hostname, parts.port), timeout=_PROMPT_S) as sock:
        sock.sendall(request_bytes)
        answer = b""
        while chunk := sock.recv(65536):  # (a TimeoutError here: the 400 waited for the stall)
            answer += chunk
    assert _statuses(answer) == [*earlier, b"400"] and _MALFORMED in answer, answer[-300:]
    assert httpx.get(f"{server.url}/health", timeout=10).status_code == 200


def _embed_requests(url: str) -> dict[str, float]:
    """/v1/embed's requests so far, by status, as the server's /metrics counts them."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    counts: dict[str, float] = {}
    for labels, value in re.findall(r"htmllm_requests_total\{([^}]*)\} (\S+)", text):
        status = re.search(r'status="(\d+)"', labels)
        if 'route="/v1/embed"' in labels and status:
            counts[status[1]] = counts.get(status[1], 0.0) + float(value)
    return counts


@pytest.mark.slow
def test_a_malformed_body_is_counted_as_the_400_the_client_got(server: LiveServer) -> None:
    """The request was counted 499 (its app told that the client left), though the client got the
    protocol's 400: the metrics now agree with the wire."""
    before = _embed_requests(server.url)
    parts = urlsplit(server.url)
    with socket.create_connection((parts.hostname, parts.port), timeout=_PROMPT_S) as sock:
        sock.sendall(_chunked("/v1/embed", b"text/html", page(1).encode(), b"zz\r\n"))
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    assert _statuses(answer) == [b"400"], answer[-300:]
    new: dict[str, float] = {}
    for _ in range(200):  # (counted when the request's app returns, after the answer went out)
        after = _embed_requests(server.url)
        new = {status: count - before.get(status, 0.0) for status, count in after.items()}
        if sum(new.values()) >= 1:
            break
        time.sleep(0.05)
    assert {status: count for status, count in new.items() if count} == {"400": 1.0}, new


@contextmanager
def _holding_server() -> Iterator[tuple[str, Callable[[], None]]]:
    """uvicorn with the service's protocol in a thread, serving an app whose POST reads its body, then
    waits until the test calls `release`; its URL and `release`."""
    released = threading.Event()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        if scope["method"] == "POST":
            await receive()  # (uvicorn resumes reading here)
            await asyncio.get_running_loop().run_in_executor(None, released.wait)
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})

    with threaded_server(app) as port:
        try:
            yield f"http://127.0.0.1:{port}", released.set
        finally:
            released.set()


def test_what_follows_a_waiting_refusal_is_not_read_without_bound() -> None:
    """A request that holds, bytes that are no request (400), then 64 MiB more: the 400 waits for the
    request, and reading stays paused meanwhile, so the client's sends block once the socket buffers are
    full (a few MiB). They had all been read and dropped, as fast as the client sent."""
    total = 64 * 1024 * 1024
    with _holding_server() as (url, release):
        parts = urlsplit(url)
        with socket.create_connection((parts.hostname, parts.port), timeout=10) as sock:
            sock.sendall(b"POST /hold HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi" + _TLS_HELLO)
            sock.settimeout(2)  # a send blocked this long: the server stopped reading
            sent = 0
            chunk = b"z" * (1024 * 1024)
            with contextlib.suppress(TimeoutError):
                while sent < total:
                    sock.sendall(chunk)
                    sent += len(chunk)
            release()
        assert sent < total // 2, f"{sent >> 20} MiB read while the refusal waited"


def _fake_protocol(app: Any) -> tuple[Any, FakeTransport]:
    return protocol_on_fake_transport(app, half_close=True)


async def _until(condition: Callable[[], bool]) -> None:
    """Let the loop run until `condition()` holds (the app's task); fails after a generous bound."""
    for _ in range(1000):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the condition never held")


_CHUNKED_HEAD = b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"


async def test_a_bad_chunk_for_a_request_waiting_on_its_body_answers_400_at_once() -> None:
    """The app reads the first chunk and waits for more; the next chunk's size is malformed. The 400
    goes out then and there, the connection half-closes, and the app learns that its client left."""
    received: list[dict[str, Any]] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        while not received or received[-1].get("more_body"):
            received.append(await receive())
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    protocol, transport = _fake_protocol(app)
    protocol.data_received(_CHUNKED_HEAD + b"\r\n3\r\nabc\r\n")
    await _until(lambda: len(received) == 1)
    protocol.data_received(b"zz\r\n")
    assert _statuses(transport.written) == [b"400"] and transport.eof, transport.written
    await _until(lambda: len(received) == 2)
    assert received[1] == {"type": "http.disconnect"}
    assert _statuses(transport.written) == [b"400"]  # (the app's own answer is not written)
    protocol.connection_lost(None)


async def test_a_bad_chunk_after_its_answer_began_cuts_the_answer_short_without_a_400() -> None:
    """An app that starts its answer before reading the body: a 400 after that answer's head would be
    read as part of it; the connection is half-closed with no more written."""
    received: list[dict[str, Any]] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        received.append(await receive())
        received.append(await receive())
        await send({"type": "http.response.body", "body": b"ok"})

    protocol, transport = _fake_protocol(app)
    protocol.data_received(_CHUNKED_HEAD + b"\r\n3\r\nabc\r\n")
    await _until(lambda: len(received) == 1)
    protocol.data_received(b"zz\r\n")
    await _until(lambda: len(received) == 2)
    assert _statuses(transport.written) == [b"200"] and transport.eof, transport.written
    assert received[1] == {"type": "http.disconnect"}
    protocol.connection_lost(None)


async def test_a_refused_request_that_expects_100_continue_gets_no_interim_answer() -> None:
    """A client that sends its body without waiting for "100 Continue", a bad chunk in it: uvicorn would
    write the interim answer when the app first reads, after the 400 and the half-close (RuntimeError in
    the app, an error logged). The refused request reads that its client left."""
    received: list[Any] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        try:
            received.append(await receive())
        except RuntimeError as exc:
            received.append(exc)

    protocol, transport = _fake_protocol(app)
    protocol.data_received(_CHUNKED_HEAD + b"Expect: 100-continue\r\n\r\n3\r\nabc\r\nzz\r\n")
    await _until(lambda: len(received) == 1)
    assert received == [{"type": "http.disconnect"}]
    assert _statuses(transport.written) == [b"400"] and b"100 Continue" not in transport.written
    protocol.connection_lost(None)


async def test_reading_stays_paused_while_a_refusal_waits_behind_pipelined_answers() -> None:
    """Two requests and bytes that are no request, in one read. uvicorn resumes reading as a request
    reads its body and as one is answered; until the 400 goes out, what comes is dropped, counted, and
    reading pauses again."""
    from service.api import http_protocol

    gates = {"/a": asyncio.Event(), "/b": asyncio.Event()}

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["path"] == "/a":
            await receive()
        await gates[scope["path"]].wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    protocol, transport = _fake_protocol(app)
    protocol.data_received(
        b"GET /a HTTP/1.1\r\nHost: x\r\n\r\nGET /b HTTP/1.1\r\nHost: x\r\n\r\n" + _TLS_HELLO
    )
    assert not transport.reading
    await asyncio.sleep(0)  # /a reads its (empty) body: uvicorn resumes reading
    protocol.data_received(b"z" * 1000)
    assert not transport.reading and transport.written == b""
    gates["/a"].set()
    await _until(lambda: transport.written.startswith(b"HTTP/1.1 200 "))
    assert not transport.reading and _statuses(transport.written) == [b"200"]  # (/b runs, the 400 waits)
    protocol.data_received(b"z" * http_protocol._LINGER_BYTES)  # dropped, and the budget spent
    gates["/b"].set()
    await _until(lambda: transport.eof)
    assert _statuses(transport.written) == [b"200", b"200", b"400"] and not transport.closed
    protocol.data_received(b"z")  # the budget counted what came before the answer too
    assert transport.closed


async def test_a_bad_chunk_is_logged_and_counted_as_the_400_the_client_got(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The access log and the request metrics recorded what the app answered once told that its client
    left (the error handler's 499, never written): the client got the protocol's 400. Both record the
    400; an app whose answer had begun before the bad chunk keeps its own status (its head was sent)."""
    caplog.set_level(logging.INFO, logger=ACCESS_LOGGER)
    waiting: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["path"] == "/started":
            await send({"type": "http.response.start", "status": 200, "headers": []})
        waiting.append(scope["path"])
        while (await receive())["type"] != "http.disconnect":
            pass
        if scope["path"] != "/started":  # (as the error handler answers a client that left)
            await send({"type": "http.response.start", "status": 499, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    for path, status in (("/", 400), ("/started", 200)):
        caplog.clear()
        metrics = ServiceMetrics()
        stack = AccessLogMiddleware(RequestMetricsMiddleware(app, metrics=metrics, routes=[path]))
        protocol, transport = _fake_protocol(stack)
        protocol.data_received(
            _CHUNKED_HEAD.replace(b"POST / ", f"POST {path} ".encode()) + b"\r\n3\r\nabc\r\n"
        )
        await _until(lambda started=path: started in waiting)
        protocol.data_received(b"zz\r\n")
        await _until(lambda: any(record.name == ACCESS_LOGGER for record in caplog.records))
        assert _statuses(transport.written) == [str(status).encode()], transport.written
        logged = [
            getattr(record, FIELDS)["status"] for record in caplog.records if record.name == ACCESS_LOGGER
        ]
        assert logged == [status]
        labels = {"route": path, "method": "POST", "status": str(status)}
        assert metrics.registry.get_sample_value("htmllm_requests_total", labels) == 1.0
        protocol.connection_lost(None)


def _exchange(url: str, data: bytes) -> bytes:
    """Send `data` on a new connection; everything the server answers until it closes."""
    parts = urlsplit(url)
    with socket.create_connection((parts.hostname, parts.port), timeout=_PROMPT_S) as sock:
        sock.sendall(data)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
        return answer


def _allow(answer: bytes) -> bytes | None:
    found = re.search(rb"\r\nallow: ([^\r]*)\r\n", answer.partition(b"\r\n\r\n")[0], re.IGNORECASE)
    return None if found is None else found[1]


@pytest.mark.parametrize(
    ("target", "path"),
    [
        (b"example.com:443", b"/"),  # the authority form CONNECT is for: the root's methods
        (b"[::1]:8443", b"/"),
        (b"/v1/embed", b"/v1/embed"),
        (b"/health", b"/health"),
        (b"http://x/v1/embeddings?dimensions=8", b"/v1/embeddings"),
    ],
    ids=["authority", "ipv6-authority", "model-route", "probe", "absolute"],
)
def test_a_connect_is_a_405_whose_allow_names_what_its_target_takes(
    server: LiveServer, target: bytes, path: bytes
) -> None:
    """A 405 must name the target's methods in `Allow` (RFC 9110 section 15.5.6): the CONNECT's, answered
    below the app, named none. It now names what any other method refused at its target's path is told
    (a PUT's 405), the root's for a target that is no path. The connection closes after it, and the
    tunnel's first bytes, sent after the head, do not cost the client its answer."""
    put = _exchange(server.url, b"PUT " + path + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert put.startswith(b"HTTP/1.1 405 ") and _allow(put), put[:300]
    tunnel = _TLS_HELLO * 4096  # (160 KiB the server reads and drops)
    answer = _exchange(
        server.url, b"CONNECT " + target + b" HTTP/1.1\r\nHost: " + target + b"\r\n\r\n" + tunnel
    )
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 405 ") and b"connection: close" in head.lower(), answer[:300]
    assert _allow(answer) == _allow(put), answer[:300]
    assert json.loads(body)["error"]["code"] == "method_not_allowed"
    assert httpx.get(f"{server.url}/health", timeout=10).status_code == 200


def test_a_connect_behind_a_pipelined_request_is_answered_after_it(server: LiveServer) -> None:
    """The CONNECT waits for the answer before it on its connection; nothing after its head is read as
    a request (the GET after it gets no answer: it is the tunnel's, for all the server knows)."""
    answer = _exchange(
        server.url,
        b"GET /health HTTP/1.1\r\nHost: x\r\n\r\nCONNECT /v1/embed HTTP/1.1\r\nHost: x\r\n\r\n"
        b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n",
    )
    assert _statuses(answer) == [b"200", b"405"], answer[-300:]
    assert _allow(answer.rpartition(b"HTTP/1.1 405 ")[2]) == b"POST", answer[-300:]
