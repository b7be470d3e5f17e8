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
import uvicorn
from uvicorn.server import ServerState

from service.api.http_protocol import MAX_HEAD_BYTES, protocol_class
from tests.api.conftest import tiny_settings
from tests.api.live import LiveServer, live_server
from tests.api.pages import page

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


class _Transport(asyncio.Transport):
    """What the protocol writes, and whether it closed, without a socket."""

    def __init__(self) -> None:
        super().__init__()
        self.written = b""
        self.closed = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written += bytes(data)

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


async def _ok(scope: Any, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


async def test_only_the_bytes_after_a_heads_first_chunk_count() -> None:
    """One read holding a request with a large body and the start of the next head (pipelining) is not
    counted against that head; the reads after it are, and the head is refused once over the cap."""
    protocol_type = protocol_class()
    assert not isinstance(protocol_type, str)
    config = uvicorn.Config(app=_ok, http=protocol_type, log_level="warning", lifespan="off")
    protocol: Any = protocol_type(  # type: ignore[call-arg]
        config=config, server_state=ServerState(), app_state={}, _loop=asyncio.get_running_loop()
    )
    transport = _Transport()
    protocol.connection_made(transport)
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
