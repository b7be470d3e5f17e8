"""The in-flight body budget holds bytes that came, never bytes a request head only declares.

Charged at once, a declared `Content-Length` let 32 heads of about 100 bytes, each declaring 16 MiB and
sending none of it, fill the default 512 MiB budget: every client, keyed or not, got 429 until the body
timeout, and the sender reconnected. Requests that no route reads a body for (a GET, an unknown path, a
wrong method) and those the key gate refuses are answered without a byte of their bodies read or held;
bodies to the model routes are charged as they come, and one that passes the budget mid-way gets 429.
"""

from __future__ import annotations

import contextlib
import functools
import gzip
import json
import operator
import re
import select
import signal
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from starlette.types import Message, Receive, Scope, Send

from service.api import limits
from service.api.metrics import ServiceMetrics
from service.api.runtime import BodyReaders
from tests.api.conftest import tiny_settings
from tests.api.live import LiveServer, ServerProcess, live_server, server_process
from tests.api.pages import page
from tests.api.test_server import metric
from tests.api.test_shutdown import server_env

MIB = 1024 * 1024
DECLARED = 16 * MIB  # the default HTMLLM_MAX_BODY_BYTES: 32 of them are the default budget
KEY = "k1"
ATTACKERS = 32


def _address(live: LiveServer | ServerProcess) -> tuple[str, int]:
    host, port = live.url.removeprefix("http://").split(":")
    return host, int(port)


@contextlib.contextmanager
def _connections(live: LiveServer | ServerProcess, requests: list[bytes]) -> Iterator[list[socket.socket]]:
    """One connection per request, each sent as given (a head, maybe the start of its body)."""
    sockets: list[socket.socket] = []
    try:
        for request in requests:
            sock = socket.create_connection(_address(live), timeout=30)
            sockets.append(sock)
            sock.sendall(request)
        yield sockets
    finally:
        for sock in sockets:
            sock.close()


def _answer(sock: socket.socket) -> tuple[bytes, bytes]:
    """(head, body) of one response with a Content-Length; the connection may stay open."""
    data = b""
    while b"\r\n\r\n" not in data:
        received = sock.recv(65536)
        assert received, f"closed before an answer: {data[:300]!r}"
        data += received
    head, _, body = data.partition(b"\r\n\r\n")
    fields = dict(line.split(b": ", 1) for line in head.lower().split(b"\r\n")[1:])
    while len(body) < int(fields[b"content-length"]):
        body += sock.recv(65536)
    return head, body


def _until_closed(sock: socket.socket) -> bytes:
    answer = b""
    while data := sock.recv(65536):
        answer += data
    return answer


def _held(live: LiveServer | ServerProcess) -> float:
    return metric(httpx.get(live.url + "/metrics").text, "htmllm_request_body_bytes_in_flight")


def _wait_for_held(live: LiveServer | ServerProcess, condition: Callable[[float], bool]) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if condition(_held(live)):
            return
        time.sleep(0.02)
    raise AssertionError(f"the server holds {_held(live)} bytes")


def _head(request_line: bytes, *headers: bytes) -> bytes:
    """A request head declaring a DECLARED-byte body, none of which follows."""
    return b"\r\n".join([request_line, b"Host: x", *headers, b"content-length: %d" % DECLARED, b"", b""])


def _embed(live: LiveServer, headers: dict[str, str] | None = None) -> httpx.Response:
    return httpx.post(
        live.url + "/v1/embed", json={"documents": [{"html": page(1)}]}, headers=headers, timeout=60
    )


def _is_answered(sock: socket.socket, status: int) -> None:
    head, body = _answer(sock)
    assert head.startswith(b"HTTP/1.1 %d " % status), head
    if status >= 400:
        assert json.loads(body)["error"]["code"], body


def test_declared_bodies_to_routes_that_read_none_hold_nothing(tiny_checkpoint: Path) -> None:
    """The measured attack: 32 heads to /health and to an unknown path, no key, each declaring 16 MiB.
    They are answered at once, nothing of the budget is held, and a keyed request is served."""
    settings = tiny_settings(tiny_checkpoint, api_key=KEY)
    assert settings.max_inflight_bytes == ATTACKERS * DECLARED  # the defaults: the attack fills it
    heads = [_head(b"GET /health HTTP/1.1")] * (ATTACKERS // 2)
    heads += [_head(b"POST /does-not-exist HTTP/1.1", b"content-type: text/html")] * (ATTACKERS // 2)
    with live_server(settings) as live, _connections(live, heads) as attackers:
        for i, sock in enumerate(attackers):
            _is_answered(sock, 200 if i < ATTACKERS // 2 else 404)
        served = _embed(live, {"authorization": f"Bearer {KEY}"})
        assert served.status_code == 200, served.text[:300]
        assert _held(live) == 0


def test_a_model_route_refused_before_its_body_holds_nothing(tiny_checkpoint: Path) -> None:
    """With auth on, a model route's path without a key (401), with a wrong key (401), with a method it
    does not take (401 without a key, as any method on its path) or a trailing slash (404): answered
    without the body read or charged."""
    settings = tiny_settings(tiny_checkpoint, api_key=KEY)
    kinds = [
        (_head(b"POST /v1/embed HTTP/1.1", b"content-type: text/html"), 401),
        (_head(b"POST /v1/embed HTTP/1.1", b"content-type: text/html", b"authorization: Bearer no"), 401),
        (_head(b"GET /v1/embed HTTP/1.1"), 401),
        (_head(b"POST /v1/embed/ HTTP/1.1", b"content-type: text/html"), 404),
    ]
    requests = [kinds[i % len(kinds)] for i in range(ATTACKERS)]
    with live_server(settings) as live, _connections(live, [head for head, _ in requests]) as attackers:
        for sock, (_, status) in zip(attackers, requests, strict=True):
            _is_answered(sock, status)
        served = _embed(live, {"authorization": f"Bearer {KEY}"})
        assert served.status_code == 200, served.text[:300]
        assert _held(live) == 0


def test_declared_but_unsent_bodies_to_a_model_route_do_not_block_a_real_one(tiny_checkpoint: Path) -> None:
    """Without a key configured the model route itself reads the attackers' bodies: each is charged for
    the 3 bytes it sent, not the 16 MiB it declared, and a real request is served beside them."""
    settings = tiny_settings(tiny_checkpoint)
    head = _head(b"POST /v1/embed HTTP/1.1", b"content-type: text/html") + b"<p>"
    with live_server(settings) as live:
        with _connections(live, [head] * ATTACKERS):
            _wait_for_held(live, lambda held: held == ATTACKERS * 3)  # every attacker is being read
            served = _embed(live)
            assert served.status_code == 200, served.text[:300]
        _wait_for_held(live, lambda held: held == 0)  # what they sent is given back when they leave


def test_a_body_that_passes_the_budget_mid_way_is_a_429_and_its_connection_closes(
    tiny_checkpoint: Path,
) -> None:
    """A declared length that fits what is free when its head comes is not reserved: other bodies may
    take the room while it uploads, and the byte that passes the budget gets it 429 with Retry-After
    (after the rest was read and dropped, so the client reads it), then its connection is closed."""
    size = MIB
    settings = tiny_settings(
        tiny_checkpoint, max_body_bytes=size, max_inflight_bytes=2 * size, retry_after_s=3
    )
    post = b"POST /v1/embed HTTP/1.1\r\nHost: x\r\ncontent-type: text/html\r\ncontent-length: %d\r\n\r\n"
    with live_server(settings) as live, socket.create_connection(_address(live), timeout=30) as sock:
        holder = post % size + b"x" * (size - 1)  # holds all but a byte of its body
        with _connections(live, [holder]):
            _wait_for_held(live, lambda held: held == size - 1)
            sock.sendall(post % size + b"y" * (size // 2))  # fits what is free: read and charged
            _wait_for_held(live, lambda held: held == size - 1 + size // 2)
            with _connections(live, [post % (size // 2) + b"z" * (size // 2 - 1)]):  # takes the rest
                _wait_for_held(live, lambda held: held == 2 * size - 2)
                sock.sendall(b"y" * (size - size // 2))  # its second half passes the budget
                answer = _until_closed(sock)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 429 "), answer[:300]
    assert b"retry-after: 3" in head.lower() and b"connection: close" in head.lower()
    error = json.loads(body)["error"]
    assert error["code"] == "overloaded" and "HTMLLM_MAX_INFLIGHT_BYTES" in error["message"]


def test_a_body_that_stops_arriving_is_a_408_before_the_body_timeout(
    tiny_checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A body none of which comes for the stall window gets the body timeout's 408 then, its connection
    closed: the whole body's timeout (here far longer than this test waits) no longer bounds a client
    that sends nothing."""
    monkeypatch.setattr(limits, "STALL_TIMEOUT_S", 0.5)
    settings = tiny_settings(tiny_checkpoint, body_timeout_s=600)
    with live_server(settings) as live:
        head = b"POST /v1/embed HTTP/1.1\r\nHost: x\r\ncontent-type: text/html\r\ncontent-length: 500\r\n\r\n"
        with _connections(live, [head + b"<p>stalled"]) as (sock,):
            answer = _until_closed(sock)  # the socket's 30 s timeout: well before the 600 s
        head_, _, body = answer.partition(b"\r\n\r\n")
        assert head_.startswith(b"HTTP/1.1 408 "), answer[:300]
        assert b"connection: close" in head_.lower()
        error = json.loads(body)["error"]
        assert error["code"] == "body_timeout"
        assert "no byte of it came for 0.5 s (10 bytes came" in error["message"]
        assert _embed(live).status_code == 200
        assert _held(live) == 0


_POST = b"POST /v1/embed HTTP/1.1\r\nHost: x\r\ncontent-type: text/html\r\ncontent-length: %d\r\n\r\n"


@pytest.mark.parametrize("refused", [False, True], ids=["read", "refused-up-front"])
def test_a_body_none_of_which_comes_is_answered_at_the_body_timeout(
    tiny_checkpoint: Path, refused: bool
) -> None:
    """A head declaring 100 bytes and no byte after it: 408 at the body timeout where the body is read,
    429 once the drain times out where its declared length does not fit (the budget is held); either
    way the connection is closed. The first deadline was given to `asyncio.timeout` (a delay) as a time
    of the loop's clock: such a request waited hours. 3 s: the holder, which stalls too, must still hold
    its bytes when the request comes."""
    size = MIB
    settings = tiny_settings(tiny_checkpoint, max_body_bytes=size, max_inflight_bytes=size, body_timeout_s=3)
    with live_server(settings) as live:
        holders = [_POST % size + b"x" * (size // 2)] if refused else []
        with _connections(live, holders):
            _wait_for_held(live, lambda held: held == (size // 2 if refused else 0))
            declared = 100 if not refused else size
            with _connections(live, [_POST % declared]) as (sock,):
                answer = _until_closed(sock)  # the socket's 30 s timeout bounds the wait
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 429 " if refused else b"HTTP/1.1 408 "), answer[:300]
        assert b"connection: close" in head.lower()
        error = json.loads(body)["error"]
        if refused:
            assert error["code"] == "overloaded"
            assert f"holds {size // 2} bytes of request bodies and {size} more" in error["message"]
        else:
            assert error["code"] == "body_timeout" and "(0 bytes came" in error["message"]
        _wait_for_held(live, lambda held: held == 0)


def test_concurrent_uploads_past_the_budget_serve_those_that_fit(
    tiny_checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three 1 MiB uploads against 2 1/8 MiB, sent in turns of 256 KiB: the piece that passes the budget
    (the third upload's third) gets its upload a 429, which gives back what it held before the rest of
    it is dropped, and the two others, which fit without it, are served. Kept while the rest came, its
    charge pushed the two others past the budget as well: all three failed. The 429 says what the
    budget held when the body was refused (built after the drain, its figures did not add up)."""
    # The refused upload waits, stalled, while the two others are served.
    monkeypatch.setattr(limits, "STALL_TIMEOUT_S", 60.0)
    size, piece = MIB, MIB // 4
    budget = 2 * size + size // 8  # passed mid-body: a finished body may be answered and given back
    settings = tiny_settings(tiny_checkpoint, max_body_bytes=size, max_inflight_bytes=budget)
    bodies = [page(i).encode().ljust(size) for i in range(3)]
    with live_server(settings) as live, _connections(live, [_POST % size] * 3) as socks:
        sent = [0, 0, 0]
        refused: int | None = None
        held_before_refusal = 0
        for start in range(0, size, piece):
            for i, sock in enumerate(socks):
                if i == refused:
                    continue  # the rest of its body is sent once the others are answered
                sock.sendall(bodies[i][start : start + piece])
                if refused is None and sum(sent) + piece > budget:
                    refused, held_before_refusal = i, sum(sent)
                else:
                    sent[i] += piece
                if start + piece < size:  # a whole body is served, then given back: no gauge to wait for
                    _wait_for_held(live, functools.partial(operator.eq, _kept(sent, refused)))
        assert refused == 2  # the three do not fit together
        for sock in socks[:2]:
            head, body = _answer(sock)
            assert head.startswith(b"HTTP/1.1 200 "), (head, body[:300])
        socks[refused].sendall(bodies[refused][sent[refused] + piece :])
        head, body = _answer(socks[refused])
    assert head.startswith(b"HTTP/1.1 429 "), (head, body[:300])
    message = json.loads(body)["error"]["message"]
    figures = re.search(r"holds (\d+) bytes of request bodies and (\d+) more would pass its (\d+)", message)
    assert figures is not None, message
    held, more, limit = map(int, figures.groups())
    # The refused piece may come in more than one read (a loaded machine splits it): what fit of it before
    # the read that passed the budget is held too. Never less than before it (the figures had been built
    # after the drain), never the whole piece.
    assert limit == budget and held_before_refusal <= held < held_before_refusal + piece, message
    assert held + more > limit, message


def _kept(sent: list[int], refused: int | None) -> int:
    """What the uploads not refused sent, all charged."""
    return sum(count for i, count in enumerate(sent) if i != refused)


def test_an_unread_body_awaiting_100_continue_closes_its_connection(tiny_checkpoint: Path) -> None:
    """Answered without its body read (no route reads one; the key gate refused it), a client that waits
    for `100 Continue` may send its body or not: the parser, waiting for it, took the next request on
    the connection for body bytes (and its client timed out). The answer now closes the connection.
    With no body declared, or a body sent without waiting, the connection carries the next request."""
    expected = [
        (b"GET /health HTTP/1.1", 200),
        (b"POST /v1/nope HTTP/1.1", 404),
        (b"GET /v1/embed HTTP/1.1", 401),  # without a key, any method on a model route's path
        (b"POST /v1/embed HTTP/1.1", 401),
    ]
    next_request = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
    with live_server(tiny_settings(tiny_checkpoint, api_key=KEY)) as live:
        for request_line, status in expected:
            for framing in (b"content-length: 5000", b"transfer-encoding: chunked"):
                head = b"\r\n".join([request_line, b"Host: x", framing, b"Expect: 100-continue", b"", b""])
                with _connections(live, [head]) as (sock,):
                    answer, _ = _answer(sock)
                    assert answer.startswith(b"HTTP/1.1 %d " % status), answer
                    assert b"connection: close" in answer.lower(), answer
                    assert _until_closed(sock) == b""  # closed, not waiting for a body
        kept = [
            b"GET /health HTTP/1.1\r\nHost: x\r\ncontent-length: 0\r\nexpect: 100-continue\r\n\r\n",
            b"GET /health HTTP/1.1\r\nHost: x\r\nexpect: 100-continue\r\n\r\n",
            b"GET /health HTTP/1.1\r\nHost: x\r\ncontent-length: 5000\r\n\r\n" + b"x" * 5000,
            b"POST /v1/embed HTTP/1.1\r\nHost: x\r\ncontent-length: 5000\r\n\r\n" + b"x" * 5000,
        ]
        for request in kept:
            with _connections(live, [request]) as (sock,):
                first, _ = _answer(sock)
                assert b"connection: close" not in first.lower(), first
                sock.sendall(next_request)
                second, _ = _answer(sock)
                assert second.startswith(b"HTTP/1.1 200 "), (first, second)


def _expect_head(length: bytes) -> bytes:
    return _POST.replace(b"%d", length).replace(b"\r\n\r\n", b"\r\nexpect: 100-continue\r\n\r\n")


def test_a_declared_body_over_the_cap_awaiting_100_continue_closes_its_connection(
    tiny_checkpoint: Path,
) -> None:
    """413 for a declared length over the cap, the client waiting for `100 Continue`: the answer kept
    the connection open, and the parser took the next request on it for body bytes (the 401/404/405
    case, fixed before, was not this one). It now closes the connection, nothing read as a body."""
    settings = tiny_settings(tiny_checkpoint, max_body_bytes=MIB)
    with live_server(settings) as live, _connections(live, [_expect_head(b"%d" % (5 * MIB))]) as (sock,):
        sock.settimeout(10)  # kept open, the connection waits for its body: the test fails here
        head, body = _answer(sock)
        assert head.startswith(b"HTTP/1.1 413 "), head
        assert b"connection: close" in head.lower(), head
        assert json.loads(body)["error"]["code"] == "payload_too_large"
        assert _until_closed(sock) == b""  # closed: nothing after is read as its body


async def test_an_invalid_content_length_awaiting_100_continue_closes_its_connection() -> None:
    """The parsers refuse an invalid `Content-Length` before any app sees it; were one to pass, its 400
    (422 validation_error) is given before the body is read, and closes the connection as every such
    answer does."""
    sent: list[Message] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        raise AssertionError("the request reached the app")

    async def receive() -> Message:
        raise AssertionError("the body was read")

    async def send(message: Message) -> None:
        sent.append(message)

    middleware = limits.BodyLimitMiddleware(
        app,
        max_body_bytes=MIB,
        metrics=ServiceMetrics(),
        max_inflight_bytes=MIB,
        retry_after_s=1,
        readers=BodyReaders(),
    )
    headers = [(b"content-length", b"12x"), (b"expect", b"100-continue")]
    scope = {"type": "http", "method": "POST", "path": "/v1/embed", "headers": headers}
    await middleware(scope, receive, send)
    assert sent[0]["status"] == 422
    assert (b"connection", b"close") in sent[0]["headers"]


def _is_readable(sock: socket.socket) -> bool:
    return bool(select.select([sock], [], [], 0)[0])


def test_a_refused_body_still_coming_is_a_429_not_a_stall(
    tiny_checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A body refused mid-way whose client keeps sending, never pausing as long as the stall window:
    its rest was dropped inside the read's own timeout, whose deadline no longer moved, and the client
    got the stall's 408 ("no byte of it came") while it was sending. It now reads the 429 once its
    body is done. The holder keeps the budget held, sending a byte a turn so that it does not stall."""
    monkeypatch.setattr(limits, "STALL_TIMEOUT_S", 2.0)  # a margin for a loaded machine
    size = 64 * 1024
    settings = tiny_settings(tiny_checkpoint, max_body_bytes=size, max_inflight_bytes=size)
    chunked = (
        b"POST /v1/embed HTTP/1.1\r\nHost: x\r\ncontent-type: text/html\r\ntransfer-encoding: chunked\r\n\r\n"
    )
    with live_server(settings) as live, _connections(live, [_POST % size + b"x" * (size // 2)]) as (holder,):
        _wait_for_held(live, lambda held: held == size // 2)
        passing = size * 5 // 8  # past what the holder leaves, not past the cap
        with _connections(live, [chunked + b"%x\r\n%s\r\n" % (passing, b"y" * passing)]) as (sock,):
            for _ in range(120):  # 6 s of sending: three stall windows
                if _is_readable(sock):
                    break  # answered while it sends: the test fails below
                holder.sendall(b"x")
                sock.sendall(b"10\r\n" + b"y" * 16 + b"\r\n")
                time.sleep(0.05)
            with contextlib.suppress(OSError):
                sock.sendall(b"0\r\n\r\n")
            head, body = _answer(sock)
    assert head.startswith(b"HTTP/1.1 429 "), (head, body[:300])
    assert json.loads(body)["error"]["code"] == "overloaded"


def _answer_until_closed(sock: socket.socket) -> tuple[bytes, bytes]:
    head, _, body = _until_closed(sock).partition(b"\r\n\r\n")
    return head, body


@pytest.mark.slow
def test_refused_bodies_being_dropped_at_shutdown_get_their_429(tiny_checkpoint: Path) -> None:
    """SIGTERM while two refused bodies are being dropped (one refused on its declared length, one
    mid-body) and one accepted body is still coming: the drop's waits were unseen by the cut-off, and
    uvicorn's graceful timeout cancelled them into a bare plain-text 500. The dropped ones now get the
    429 decided for them, their connections closed; the accepted one gets the cut-off's 503."""
    size = 64 * 1024
    env = server_env(
        tiny_checkpoint,
        drain_timeout_s="2",
        body_timeout_s="60",
        max_body_bytes=str(size),
        max_inflight_bytes=str(size),
    )
    chunked = (
        b"POST /v1/embed HTTP/1.1\r\nHost: x\r\ncontent-type: text/html\r\ntransfer-encoding: chunked\r\n\r\n"
    )
    with server_process(env) as server:
        with _connections(server, [_POST % size + b"x" * (size // 2)]) as (holder,):
            _wait_for_held(server, lambda held: held == size // 2)
            with _connections(
                server, [_POST % size + b"y", chunked + b"10\r\n" + b"z" * 16 + b"\r\n"]
            ) as dropped:
                _wait_for_held(server, lambda held: held == size // 2 + 16)  # the chunked one is read
                passing = size * 5 // 8  # past what the holder leaves, not past the cap
                dropped[1].sendall(b"%x\r\n%s\r\n" % (passing, b"z" * passing))
                _wait_for_held(server, lambda held: held == size // 2)  # refused: it gave its 16 back
                _wait_for_in_progress(server, 3)
                server.proc.send_signal(signal.SIGTERM)
                answers = [_answer_until_closed(sock) for sock in (holder, *dropped)]
        server.proc.wait(timeout=60)
    (head, body), *refused = answers
    assert head.startswith(b"HTTP/1.1 503 ") and json.loads(body)["error"]["code"] == "shutting_down", head
    for head, body in refused:
        assert head.startswith(b"HTTP/1.1 429 "), (head, body[:300])
        assert b"connection: close" in head.lower() and b"retry-after" in head.lower(), head
        assert json.loads(body)["error"]["code"] == "overloaded"


def _wait_for_in_progress(server: ServerProcess, count: int) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        text = httpx.get(server.url + "/metrics").text
        if metric(text, "htmllm_requests_in_progress", route="/v1/embed") == count:
            return
        time.sleep(0.02)
    raise AssertionError(f"{count} requests never reached the server")


_CHUNKED = b"POST /v1/embed HTTP/1.1\r\nHost: x\r\ncontent-type: text/html\r\ntransfer-encoding: chunked\r\n"
_TOO_LARGE = re.compile(
    r"the request body is over \d+ bytes; the limit is (\d+) bytes \(HTMLLM_MAX_BODY_BYTES\)"
)


def _chunked_answer(live: LiveServer, body: bytes, *headers: bytes) -> tuple[bytes, dict[str, str]]:
    """The head and error of the answer to `body` sent to /v1/embed in chunks of 16 KiB (as a client
    streams a page whose size it does not know), with `headers` more."""
    pieces = [body[start : start + 16 * 1024] for start in range(0, len(body), 16 * 1024)]
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(piece), piece) for piece in pieces) + b"0\r\n\r\n"
    request = _CHUNKED + b"".join(header + b"\r\n" for header in headers) + b"\r\n" + chunks
    with _connections(live, [request]) as (sock,):
        head, answer = _answer(sock)
    return head, json.loads(answer)["error"]


def test_a_body_larger_than_the_budget_is_a_413_however_full_the_budget(
    tiny_checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A chunked body's size is learnt only as it comes: one larger than the cap (and the budget, here
    the same) sent while another upload holds half the budget was refused 429 at its first piece that
    did not fit what was free, and its client retried for ever a body no server could take. It gets the
    413 an idle server gives it; a body that would fit alone still gets the 429. A gzip body whose
    compressed bytes fit now and whose decoded size passes the cap gets the decoder's 413, as on an idle
    server."""
    monkeypatch.setattr(limits, "STALL_TIMEOUT_S", 60.0)  # the holder stalls while the others are answered
    size = 256 * 1024
    settings = tiny_settings(tiny_checkpoint, max_body_bytes=size, max_inflight_bytes=size, retry_after_s=3)
    too_large = page(1).encode().ljust(2 * size)
    with live_server(settings) as live:
        with _connections(live, [_POST % size + b"x" * (size // 2)]):
            _wait_for_held(live, lambda held: held == size // 2)
            busy_head, busy = _chunked_answer(live, too_large)
            fits_alone_head, fits_alone = _chunked_answer(live, page(2).encode().ljust(size * 5 // 8))
            bomb_head, bomb = _chunked_answer(
                live, gzip.compress(b" " * (2 * size)), b"content-encoding: gzip"
            )
            _wait_for_held(live, lambda held: held == size // 2)
        _wait_for_held(live, lambda held: held == 0)
        idle_head, idle = _chunked_answer(live, too_large)
    assert idle_head.startswith(b"HTTP/1.1 413 ") and _TOO_LARGE.fullmatch(idle["message"]), idle
    assert busy_head.startswith(b"HTTP/1.1 413 "), (busy_head, busy)
    assert busy["code"] == idle["code"] == "payload_too_large"
    assert _TOO_LARGE.fullmatch(busy["message"]), busy  # (the figure is where the body passed the cap)
    assert fits_alone_head.startswith(b"HTTP/1.1 429 ") and b"retry-after: 3" in fits_alone_head.lower()
    assert fits_alone["code"] == "overloaded", fits_alone
    assert bomb_head.startswith(b"HTTP/1.1 413 ") and "gzip body decodes to more than" in bomb["message"]
