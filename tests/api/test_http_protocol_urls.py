"""service/api/http_protocol.py: a URL too long for httptools is the JSON 431 that longer heads get.

The head cap had counted whole socket reads, so a request line between 64 KB and about 200 KB reached the
parser, whose URL parser stops at 65,535 bytes: uvicorn answered its plain-text 400 "Invalid HTTP request
received." (now the service's 400 `malformed_request`) where a longer one got the documented 431
`headers_too_large`. (A head that completes is now
measured exactly.)
"""

from __future__ import annotations

import contextlib
import json
import socket
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from service.api.http_protocol import MAX_HEAD_BYTES
from tests.api.conftest import tiny_settings
from tests.api.live import LiveServer, live_server

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tiny_checkpoint: Path) -> Iterator[LiveServer]:
    with live_server(tiny_settings(tiny_checkpoint)) as live:
        yield live


def _send(url: str, data: bytes) -> bytes:
    """Send `data` in one write on a new connection; everything the server answers until it closes."""
    parts = urlsplit(url)
    with socket.create_connection((parts.hostname, parts.port), timeout=60) as sock:
        with contextlib.suppress(OSError):  # the server closed the connection while we were still sending
            sock.sendall(data)
        answer = b""
        with contextlib.suppress(OSError):
            while chunk := sock.recv(65536):
                answer += chunk
        return answer


@pytest.mark.parametrize("url_bytes", [65_536, 70_000, 150_000, 200_000])
@pytest.mark.parametrize("method", ["GET /health", "POST /v1/embed"])
def test_a_url_over_httptools_limit_is_a_json_431(server: LiveServer, method: str, url_bytes: int) -> None:
    verb, path = method.split()
    target = path + "?q=" + "a" * (url_bytes - len(path) - 3)
    answer = _send(server.url, f"{verb} {target} HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n".encode())
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 431 "), answer[:200]
    assert b"connection: close" in head.lower() and b"content-type: application/json" in head.lower()
    error = json.loads(body)["error"]
    assert error == {"code": "headers_too_large", "message": error["message"]}
    assert str(MAX_HEAD_BYTES) in error["message"]
    assert httpx.get(f"{server.url}/health", timeout=10).status_code == 200


def test_a_url_within_the_limit_is_served_and_other_bad_requests_stay_400(server: LiveServer) -> None:
    target = "/health?q=" + "a" * (MAX_HEAD_BYTES - 100)  # the whole head within the cap
    answer = _send(server.url, f"GET {target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
    assert answer.startswith(b"HTTP/1.1 200 "), answer[:200]
    # Bytes that are no HTTP/1.1 request keep their 400 (uvicorn's log line, the service's error body).
    answer = _send(server.url, b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\0" * 64)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 ") and json.loads(body)["error"]["code"] == "malformed_request", (
        answer
    )
