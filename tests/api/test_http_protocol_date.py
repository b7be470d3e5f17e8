"""service/api/http_protocol.py: the JSON answers written below the app carry a `Date`, as the app's do.

RFC 9110 section 6.6.1: an origin server with a clock must send `Date` in every answer of status 2xx,
3xx or 4xx. uvicorn adds its `date` (and `server`, where configured) to every answer the app writes, and
to its own plain-text 400; the protocol's own 408, 429 and 431, written before any request reaches the
app, had neither.
"""

from __future__ import annotations

import asyncio
import re
import socket
from collections.abc import Iterator
from typing import Any

import pytest

from service.api.http_protocol import MAX_HEAD_BYTES, MAX_PIPELINED
from tests.api.protocol_harness import threaded_server

_HEAD_TIMEOUT_S = 1.0
_READ_S = 30.0  # (a bound on each read, far above what any answer here takes)
# IMF-fixdate (RFC 9110 section 5.6.7), as uvicorn writes it.
_DATE = re.compile(rb"(?im)^date: [A-Z][a-z]{2}, \d{2} [A-Z][a-z]{2} \d{4} \d{2}:\d{2}:\d{2} GMT\r$")


@pytest.fixture(scope="module")
def port() -> Iterator[int]:
    """uvicorn with the service's protocol in a thread; its app answers 200, `/slow` after 0.3 s (long
    enough for the requests pipelined behind it to queue)."""

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        if scope["path"] == "/slow":
            await asyncio.sleep(0.3)
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})

    with threaded_server(app, _HEAD_TIMEOUT_S, timeout_keep_alive=30) as port:
        yield port


def _until_closed(port: int, data: bytes) -> bytes:
    """Send `data`, then read until the server closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=_READ_S) as sock:
        sock.sendall(data)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
        return answer


def _last_head(answer: bytes, status: bytes) -> bytes:
    """The head of the last answer in `answer`, which is of `status`."""
    last = answer[answer.rindex(b"HTTP/1.1 ") :]
    assert last.startswith(b"HTTP/1.1 " + status + b" "), answer[-500:]
    return last.partition(b"\r\n\r\n")[0] + b"\r\n"


def test_an_apps_answer_carries_a_date(port: int) -> None:
    """(What the refusals below are held to.)"""
    answer = _until_closed(port, b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert _DATE.search(_last_head(answer, b"200")), answer


def test_a_431_for_a_head_over_the_cap_carries_a_date(port: int) -> None:
    big = b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * MAX_HEAD_BYTES + b"\r\n\r\n"
    head = _last_head(_until_closed(port, big), b"431")
    assert _DATE.search(head) and b"content-type: application/json" in head, head


def test_a_429_past_the_pipeline_cap_carries_a_date(port: int) -> None:
    get = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"
    answer = _until_closed(port, b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n" + get * (MAX_PIPELINED + 1))
    head = _last_head(answer, b"429")
    assert _DATE.search(head) and b"retry-after: " in head, head


def test_a_408_for_a_head_too_slow_carries_a_date(port: int) -> None:
    """(Waits for the 1 s head timeout.)"""
    head = _last_head(_until_closed(port, b"GET / HTTP/1.1\r\nHost: x\r\n"), b"408")
    assert _DATE.search(head), head
