"""service/api/http_protocol.py: a connection whose answers stay unread for `head_timeout_s` is aborted.

uvicorn's send() waits for the transport's buffer to drain before writing, without a limit: a client
that pipelined two requests and read none of the answers held the second request, its memory and its
share of the in-flight body budget for as long as it liked (over 100 s measured, past every timeout).
"""

from __future__ import annotations

import asyncio
import logging
import re
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from uvicorn.server import ServerState

from service.api.app import create_app
from service.api.connections import status_sent
from service.api.http_protocol import protocol_class
from service.api.main import uvicorn_config
from service.api.settings import Settings
from tests.api.conftest import tiny_settings
from tests.api.live import bound_socket, wait_ready
from tests.api.protocol_harness import FakeTransport
from tests.api.test_server import metric
from tests.factories.waiting import until, until_async

_ROUTE = "/v1/preprocess"


@contextmanager
def _server_with_a_small_send_buffer(settings: Settings) -> Iterator[str]:
    """The service in a thread (as `tests.api.live.live_server`), its connections' kernel send buffers
    small and fixed (inherited from the listening socket): an answer of a megabyte then fills the
    transport's buffer whatever this machine's TCP autotuning would allow; its URL."""
    sock = bound_socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    config = uvicorn_config(create_app(settings), settings.model_copy(update={"log_level": "warning"}))
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    try:
        wait_ready(url)
        yield url
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()


def _post(html: bytes) -> bytes:
    head = b"POST /v1/preprocess HTTP/1.1\r\nHost: x\r\nContent-Type: text/html\r\nContent-Length: %d\r\n\r\n"
    return head % len(html) + html


def _state(url: str) -> tuple[float, float, float]:
    """(the route's requests ended, whatever their status, its requests in progress, the body bytes held)
    per /metrics."""
    text = httpx.get(url + "/metrics", timeout=10).text
    ended = re.findall(
        r'^htmllm_requests_total\{[^}]*route="' + re.escape(_ROUTE) + r'"[^}]*\} (\S+)$', text, re.M
    )
    answered = sum(float(value) for value in ended)
    in_progress = metric(text, "htmllm_requests_in_progress", route=_ROUTE)
    return answered, in_progress, metric(text, "htmllm_request_body_bytes_in_flight")


@pytest.mark.slow
def test_a_request_whose_client_reads_nothing_gives_back_its_body_charge(tiny_checkpoint: Path) -> None:
    """Two pipelined requests, a client that reads nothing: the first's answer (a megabyte of pruned
    HTML) fills the buffers, the second, its body read (charged), waits to write its answer. It waited
    for ever, its body charged; once writing has been paused for the head timeout the connection is
    aborted, the request ends and `htmllm_request_body_bytes_in_flight` is back to 0."""
    settings = tiny_settings(tiny_checkpoint, head_timeout_s=1.0)
    large = b"<html><body><p>" + b"word " * 200_000 + b"</p></body></html>"
    with _server_with_a_small_send_buffer(settings) as url:
        answered, _, _ = _state(url)
        client = socket.socket()
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        with client:
            client.connect((url.removeprefix("http://").split(":")[0], int(url.rsplit(":", 1)[1])))
            client.sendall(_post(large) + _post(b"<html><body><p>small</p></body></html>"))
            until(lambda: _state(url) == (answered + 2, 0.0, 0.0), "both requests ended, nothing held")
            client.settimeout(30)
            received = b""
            try:
                while chunk := client.recv(65536):  # (what the kernel had taken of the first answer)
                    received += chunk
            except ConnectionResetError:
                pass
        assert received.startswith(b"HTTP/1.1 200 ") and len(received) < len(large), received[:200]
        assert httpx.get(f"{url}/health", timeout=10).status_code == 200


class _AbortableTransport(FakeTransport):
    """A fake transport whose abort() loses the connection as asyncio's does (soon, without an error)."""

    def __init__(self, protocol: Any) -> None:
        super().__init__()
        self.aborted = False
        self.protocol = protocol

    def get_write_buffer_size(self) -> int:
        return 0  # (nothing of it read while writing is paused)

    def abort(self) -> None:
        self.aborted = self.closed = True
        asyncio.get_running_loop().call_soon(self.protocol.connection_lost, None)


async def test_writing_paused_for_the_head_timeout_aborts_and_ends_the_request() -> None:
    """Paused writing that resumes within the head timeout is left alone (its timer restarts at the next
    pause); paused for longer, the connection is aborted, and the app's send() returns instead of waiting
    for ever, so the request ends."""
    ended = asyncio.Event()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})
        ended.set()

    protocol_type = protocol_class(head_timeout_s=0.2)
    assert not isinstance(protocol_type, str)
    config = uvicorn.Config(app=app, http=protocol_type, log_level="warning", lifespan="off")
    protocol: Any = protocol_type(  # type: ignore[call-arg]
        config=config, server_state=ServerState(), app_state={}, _loop=asyncio.get_running_loop()
    )
    transport = _AbortableTransport(protocol)
    protocol.connection_made(transport)

    protocol.pause_writing()
    await asyncio.sleep(0.1)
    protocol.resume_writing()
    await asyncio.sleep(0.2)
    assert not transport.aborted

    protocol.pause_writing()
    protocol.data_received(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")  # its answer waits for the buffer
    await asyncio.sleep(0.05)
    assert not ended.is_set() and transport.written == b""
    await until_async(lambda: transport.aborted, "the connection aborted")
    await until_async(ended.is_set, "the request ended")
    assert transport.written == b""


class _BufferedTransport(_AbortableTransport):
    """As above, with a write buffer the test drains by hand (`left`), as a slow reader would."""

    def __init__(self, protocol: Any) -> None:
        super().__init__(protocol)
        self.left = 1_000_000

    def get_write_buffer_size(self) -> int:
        return self.left


async def test_a_slow_reader_making_progress_keeps_its_connection_and_a_stuck_one_reads_as_499(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """uvicorn writes an answer whole: the buffer of a large one stays over its high-water mark until
    nearly all of it is read, and a client reading it slowly, but reading, had been cut off mid-answer
    (a clean EOF, and a 200 in the log). Each period in which some of the buffer went out re-arms the
    timer; one in which none did aborts, logs it, and a request whose answer never started reads 499."""
    statuses: list[int] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})
        statuses.append(status_sent(scope, 200))

    protocol_type = protocol_class(head_timeout_s=0.2)
    assert not isinstance(protocol_type, str)
    config = uvicorn.Config(app=app, http=protocol_type, log_level="warning", lifespan="off", log_config=None)
    protocol: Any = protocol_type(  # type: ignore[call-arg]
        config=config, server_state=ServerState(), app_state={}, _loop=asyncio.get_running_loop()
    )
    transport = _BufferedTransport(protocol)
    protocol.connection_made(transport)
    protocol.pause_writing()
    protocol.data_received(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")  # its answer waits for the buffer
    for _ in range(4):  # four periods, each with some of the buffer read
        await asyncio.sleep(0.15)
        transport.left -= 100_000
    assert not transport.aborted
    with caplog.at_level(logging.WARNING):
        await until_async(lambda: transport.aborted, "the connection aborted once nothing was read")
        await until_async(lambda: statuses == [499], "the request recorded as never answered")
    assert "read nothing of its answers" in caplog.text
