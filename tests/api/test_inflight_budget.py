"""The in-flight body budget holds bytes that came, never bytes a request head only declares.

Charged at once, a declared `Content-Length` let 32 heads of about 100 bytes, each declaring 16 MiB and
sending none of it, fill the default 512 MiB budget: every client, keyed or not, got 429 until the body
timeout, and the sender reconnected. Requests that no route reads a body for (a GET, an unknown path, a
wrong method) and those the key gate refuses are answered without a byte of their bodies read or held;
bodies to the model routes are charged as they come, and one that passes the budget mid-way gets 429.
"""

from __future__ import annotations

import contextlib
import json
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from service.api import limits
from tests.api.conftest import tiny_settings
from tests.api.live import LiveServer, live_server
from tests.api.pages import page
from tests.api.test_server import metric

MIB = 1024 * 1024
DECLARED = 16 * MIB  # the default HTMLLM_MAX_BODY_BYTES: 32 of them are the default budget
KEY = "k1"
ATTACKERS = 32


def _address(live: LiveServer) -> tuple[str, int]:
    host, port = live.url.removeprefix("http://").split(":")
    return host, int(port)


@contextlib.contextmanager
def _connections(live: LiveServer, requests: list[bytes]) -> Iterator[list[socket.socket]]:
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


def _held(live: LiveServer) -> float:
    return metric(httpx.get(live.url + "/metrics").text, "htmllm_request_body_bytes_in_flight")


def _wait_for_held(live: LiveServer, condition: Callable[[float], bool]) -> None:
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
    does not take (405) or a trailing slash (404): answered without the body read or charged."""
    settings = tiny_settings(tiny_checkpoint, api_key=KEY)
    kinds = [
        (_head(b"POST /v1/embed HTTP/1.1", b"content-type: text/html"), 401),
        (_head(b"POST /v1/embed HTTP/1.1", b"content-type: text/html", b"authorization: Bearer no"), 401),
        (_head(b"GET /v1/embed HTTP/1.1"), 405),
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
