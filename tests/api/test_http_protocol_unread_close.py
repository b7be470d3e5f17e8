"""service/api/http_protocol.py: a closing connection whose client reads nothing is aborted in bounded time.

A transport's close waits for its write buffer to drain. The write timer that aborts a client reading
nothing ran only while the buffer was over its high-water mark (64 KiB): an answer that filled the
kernel's buffers and left less than that unsent held the socket for as long as the client stayed,
whichever way the connection was closing (a refusal's lingering close, the keep-alive timeout, the
client's half-close). Each is now aborted after `head_timeout_s` in which the client read none of it.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import uvicorn

from service.api.http_protocol import protocol_class
from tests.factories.waiting import until

_HEAD_TIMEOUT_S = 0.5
# Larger than what the kernel holds for a connection whose buffers are this small (about 13 KB on
# loopback), smaller than that plus the transport's high-water mark: some of it stays unsent, below it.
_ANSWER = 40_000
_SMALL_BUFFER = 4096
_BIG = b"GET /big HTTP/1.1\r\nHost: x\r\n\r\n"


async def _app(scope: Any, receive: Any, send: Any) -> None:
    """`/big`: `_ANSWER` bytes; anything else: a 401 that reads none of its body."""
    if scope["type"] != "http":
        return
    big = scope["path"] == "/big"
    body = b"x" * _ANSWER if big else b"no"
    headers = [(b"content-length", b"%d" % len(body))]
    await send({"type": "http.response.start", "status": 200 if big else 401, "headers": headers})
    await send({"type": "http.response.body", "body": body})


@contextmanager
def _server() -> Iterator[tuple[uvicorn.Server, int]]:
    """uvicorn with the service's protocol in a thread, its accepted sockets' send buffers small (a
    listening socket's are inherited), so that a client that reads nothing soon leaves answers unsent."""
    protocol_type = protocol_class(_HEAD_TIMEOUT_S)
    assert not isinstance(protocol_type, str)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _SMALL_BUFFER)
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(
        _app, http=protocol_type, lifespan="off", log_level="error", log_config=None, timeout_keep_alive=1
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        until(lambda: server.started, "the server started")
        yield server, sock.getsockname()[1]
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[uvicorn.Server, int]]:
    with _server() as running:
        yield running


def _unsent(server: uvicorn.Server) -> int:
    """What the server's one connection has not written yet (0 when there is none)."""
    connections = list(server.server_state.connections)
    return sum(connection.transport.get_write_buffer_size() for connection in connections)


@pytest.mark.parametrize(
    ("sent", "half_close"),
    [
        # A 401 that leaves 10 MB of its body unread: a lingering close after the answer before it.
        (_BIG + b"POST /refused HTTP/1.1\r\nHost: x\r\nContent-Length: 10000000\r\n\r\nxxxx", False),
        (_BIG, False),  # the keep-alive timeout's close
        (_BIG, True),  # the client's half-close (its leaving)
    ],
    ids=["refusal", "keep-alive", "half-close"],
)
def test_a_closing_connection_whose_client_reads_nothing_is_aborted(
    server: tuple[uvicorn.Server, int], sent: bytes, half_close: bool
) -> None:
    running, port = server
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as client:
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, _SMALL_BUFFER)
        client.connect(("127.0.0.1", port))
        client.sendall(sent)
        # (the premise: some of the answer is left unsent, less than the high-water mark)
        unsent = until(lambda: _unsent(running), "an answer left unsent")
        assert unsent < 64 * 1024, unsent
        if half_close:
            client.shutdown(socket.SHUT_WR)
        # Held until the client left, before: the bound only keeps a broken server from hanging the test.
        until(lambda: not running.server_state.connections, "the connection aborted", bound_s=30)
