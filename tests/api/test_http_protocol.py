"""service/api/http_protocol.py: a real server refuses an endless request head and keeps serving."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

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
