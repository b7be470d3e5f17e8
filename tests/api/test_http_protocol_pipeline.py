"""service/api/http_protocol.py: a connection queues at most `MAX_PIPELINED` requests behind the running one.

uvicorn queued every request a read held, and read on after each answer and at each receive(): one
connection sending `GET /health` without pause queued 330,000 request cycles (300 MB, never given back),
no key needed. The request past the cap is refused, 429 `overloaded`, after the answers before it.
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from service.api.http_protocol import DEFAULT_RETRY_AFTER_S, MAX_PIPELINED, protocol_class
from service.api.main import uvicorn_config
from service.api.settings import Settings
from tests.api.conftest import tiny_settings
from tests.api.live import LiveServer, live_server
from tests.api.protocol_harness import protocol_on_fake_transport
from tests.factories.waiting import until_async

_GET = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"


def _statuses(answer: bytes) -> list[bytes]:
    return re.findall(rb"HTTP/1\.1 (\d{3}) ", answer)


@pytest.fixture(scope="module")
def server(tiny_checkpoint: Path) -> Iterator[LiveServer]:
    with live_server(tiny_settings(tiny_checkpoint)) as live:
        yield live


@pytest.mark.slow
def test_a_pipelined_flood_is_answered_up_to_the_cap_then_refused(server: LiveServer) -> None:
    """2,000 requests in one write (68 KB): the running one and the `MAX_PIPELINED` queued behind it are
    answered, then a 429 `overloaded`, and the connection closes; the server keeps serving. All 2,000 had
    been queued and answered, and a client sending more was never stopped."""
    parts = urlsplit(server.url)
    answer = b""
    with socket.create_connection((parts.hostname, parts.port), timeout=30) as sock:
        sock.sendall(_GET * 2000)
        # (without the cap every request is answered: stop reading once past what the cap allows)
        while len(_statuses(answer)) <= MAX_PIPELINED + 2 and (chunk := sock.recv(65536)):
            answer += chunk
    assert _statuses(answer) == [b"200"] * (MAX_PIPELINED + 1) + [b"429"], _statuses(answer)[-5:]
    refusal = answer[answer.rindex(b"HTTP/1.1 429 ") :]
    head, _, body = refusal.partition(b"\r\n\r\n")
    assert b"connection: close" in head, head
    error = json.loads(body)["error"]
    assert error["code"] == "overloaded" and "pipelined" in error["message"], error
    assert httpx.get(f"{server.url}/health", timeout=10).status_code == 200


async def test_the_cap_counts_the_requests_queued_behind_the_running_one() -> None:
    """Exactly `MAX_PIPELINED` wait behind a running request: the next one, a CONNECT too (which the app
    answers, not the parser), is never queued, and its 429 follows their answers."""
    gate = asyncio.Event()
    started: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        started.append(scope["path"])
        await gate.wait()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})

    for excess in (b"GET /excess HTTP/1.1\r\nHost: x\r\n\r\n", b"CONNECT example.com:443 HTTP/1.1\r\n\r\n"):
        gate.clear()
        started.clear()
        protocol, transport = protocol_on_fake_transport(app)
        protocol.data_received(_GET * (MAX_PIPELINED + 1))
        assert len(protocol.pipeline) == MAX_PIPELINED and _statuses(transport.written) == []
        protocol.data_received(excess + _GET)
        assert len(protocol.pipeline) == MAX_PIPELINED and not transport.closed
        gate.set()
        await until_async(lambda sent=transport: sent.closed, "the connection closed")
        assert _statuses(transport.written) == [b"200"] * (MAX_PIPELINED + 1) + [b"429"]
        assert started == ["/health"] * (MAX_PIPELINED + 1)


@pytest.mark.parametrize("retry_after_s", [None, 7], ids=["default", "configured"])
async def test_the_caps_429_says_when_to_retry(retry_after_s: int | None) -> None:
    """Every other 429 of the service carries `Retry-After` (HTMLLM_RETRY_AFTER_S); the cap's, answered
    from below the app, had none: a client had no pace to retry at. A protocol made without the setting
    uses its default; the server's is made from the settings (`uvicorn_config`)."""
    if retry_after_s is None:
        protocol_type = protocol_class()
    else:
        protocol_type = uvicorn_config(object(), Settings(retry_after_s=retry_after_s)).http

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})

    protocol, transport = protocol_on_fake_transport(app, protocol_type=protocol_type)
    protocol.data_received(_GET * (MAX_PIPELINED + 2))
    await until_async(lambda sent=transport: sent.closed, "the connection closed")
    assert _statuses(transport.written)[-1] == b"429", _statuses(transport.written)
    head = transport.written[transport.written.rindex(b"HTTP/1.1 429 ") :].partition(b"\r\n\r\n")[0]
    expected = Settings().retry_after_s if retry_after_s is None else retry_after_s
    assert Settings().retry_after_s == DEFAULT_RETRY_AFTER_S
    assert b"\r\nretry-after: %d\r\n" % expected in head, head
