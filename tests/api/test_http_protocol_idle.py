"""service/api/http_protocol.py: bytes after an answer that start no request, and bodies left unread.

uvicorn cancels its keep-alive timer on every read and re-arms it only after an answer: a bare CRLF, or
body bytes after the answer to a request that did not read its body, held the connection open without
end (still open at 30 s, the idle one closed at 5 s). And the rest of a body answered without being read
(a 401 or 413 for a 1 TB `Content-Length`) was read and dropped at the loop's pace: 9.8 GB in 5 s.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from service.api.http_protocol import DEFAULT_HEAD_TIMEOUT_S, protocol_class
from service.api.main import uvicorn_config
from service.api.settings import Settings
from tests.api.protocol_harness import protocol_on_fake_transport, threaded_server

_HEAD_TIMEOUT_S = 1.0
# Far above the head timeout (and the 2 s linger): a connection still open then was held past both.
_CLOSED_WITHIN_S = 15.0


@pytest.fixture(scope="module")
def address() -> Iterator[tuple[str, int]]:
    """uvicorn with the service's protocol in a thread, serving an app that answers 200 without reading
    the body (as the service's 401, 413 and GET routes do)."""

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})

    # timeout_keep_alive above `_CLOSED_WITHIN_S`: a close within it is not the keep-alive's
    with threaded_server(app, _HEAD_TIMEOUT_S, timeout_keep_alive=30) as port:
        yield "127.0.0.1", port


@contextmanager
def _connection(address: tuple[str, int]) -> Iterator[socket.socket]:
    with socket.create_connection(address, timeout=_CLOSED_WITHIN_S) as sock:
        yield sock


def _answer(sock: socket.socket) -> bytes:
    """One whole answer of the test app (its body is 2 bytes)."""
    data = b""
    while not (b"\r\n\r\n" in data and data.endswith(b"ok")):
        chunk = sock.recv(65536)
        assert chunk, f"closed before the answer: {data!r}"
        data += chunk
    return data


def _closed_within(sock: socket.socket, limit_s: float) -> bool:
    """Whether the server closes `sock` within `limit_s` (what it still sends is read and dropped)."""
    sock.settimeout(limit_s)
    try:
        while sock.recv(65536):
            pass
    except TimeoutError:
        return False
    except ConnectionResetError:
        pass
    return True


@pytest.mark.slow
@pytest.mark.parametrize(
    ("head", "after"),
    [
        (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", b"\r\n"),
        (b"GET / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n", b"5\r\nab"),
        (b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n", b"abc"),
    ],
    ids=["bare-crlf", "part-of-a-chunked-body", "part-of-a-small-body"],
)
def test_bytes_after_an_answer_that_start_no_request_do_not_hold_the_connection(
    address: tuple[str, int], head: bytes, after: bytes
) -> None:
    with _connection(address) as sock:
        sock.sendall(head)
        assert _answer(sock).startswith(b"HTTP/1.1 200 ")
        sock.sendall(after)
        assert _closed_within(sock, _CLOSED_WITHIN_S), "held open past the head and keep-alive timeouts"


def test_a_small_body_sent_after_its_answer_keeps_the_connection(address: tuple[str, int]) -> None:
    """A GET with a 10-byte body sent after its answer: the body is dropped, and the next request on the
    connection is answered (only a large rest ends the connection)."""
    with _connection(address) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n")
        assert _answer(sock).startswith(b"HTTP/1.1 200 ")
        sock.sendall(b"0123456789GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        assert _answer(sock).startswith(b"HTTP/1.1 200 ")


@pytest.mark.slow
@pytest.mark.parametrize(
    "head",
    [
        b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000000000\r\n\r\n",
        b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n",
    ],
    ids=["declared-1tb", "chunked"],
)
def test_a_large_body_left_unread_ends_the_connection_after_its_answer(
    address: tuple[str, int], head: bytes
) -> None:
    """The answer arrives whole, then the connection closes after a bounded read of what follows (the
    linger's 4 MiB / 2 s): sends block or fail long before 256 MiB. The rest had been read and dropped
    for as long as the client sent, the connection kept."""
    total = 256 * 1024 * 1024
    chunk = b"z" * (1024 * 1024)
    with _connection(address) as sock:
        sock.sendall(head)
        assert _answer(sock).startswith(b"HTTP/1.1 200 ")
        sock.settimeout(_CLOSED_WITHIN_S)
        sent = 0
        started = time.monotonic()
        try:
            while sent < total:
                sock.sendall(chunk if b"chunked" not in head else b"%x\r\n%s\r\n" % (len(chunk), chunk))
                sent += len(chunk)
        except (TimeoutError, BrokenPipeError, ConnectionResetError):
            pass
        assert sent < total, f"{sent >> 20} MiB read and dropped in {time.monotonic() - started:.1f} s"


async def _ok(scope: Any, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


@pytest.mark.parametrize("made_by", ["protocol_class", "uvicorn_config"])
async def test_without_a_head_timeout_named_bytes_after_an_answer_are_still_bounded(made_by: str) -> None:
    """A protocol made without naming a head timeout (`protocol_class()`) had none: a bare CRLF after an
    answer held its connection without end, uvicorn's keep-alive timer being cancelled by the read. It
    now gets the service's default, as the service's own config (default settings) does."""
    if made_by == "protocol_class":
        protocol_type = protocol_class()
    else:
        protocol_type = uvicorn_config(_ok, Settings()).http
        assert Settings().head_timeout_s == DEFAULT_HEAD_TIMEOUT_S
    protocol, transport = protocol_on_fake_transport(_ok, protocol_type=protocol_type)
    protocol.data_received(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    for _ in range(1000):  # the app's task answers on the loop's next turns
        if transport.written.endswith(b"ok"):
            break
        await asyncio.sleep(0)
    assert transport.written.startswith(b"HTTP/1.1 200 "), transport.written
    protocol.data_received(b"\r\n")
    timer = protocol._head_timer
    assert timer is not None, "nothing bounds the connection"
    left = timer.when() - asyncio.get_running_loop().time()
    assert left == pytest.approx(DEFAULT_HEAD_TIMEOUT_S, abs=1.0)
    protocol.connection_lost(None)
    assert timer.cancelled()
