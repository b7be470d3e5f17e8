"""service.api.documents: the Content-Type header, read once and bounded, over a real server.

A 60 KB Content-Type (`text/html; a=b; a=b; ...`, under the 64 KiB head cap) had cost the email parser
about 100 ms of the event loop per request; two different Content-Type headers had been resolved silently
by the first one (`text/html` then `application/json` embedded the JSON as a page).
"""

from __future__ import annotations

import json
import re
import socket
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from service.api import documents
from service.api.documents import MAX_CONTENT_TYPE_CHARS
from service.core.media_types import parse_content_type
from tests.api.conftest import tiny_settings
from tests.api.live import LiveServer, live_server
from tests.api.pages import page

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tiny_checkpoint: Path) -> Iterator[LiveServer]:
    with live_server(tiny_settings(tiny_checkpoint)) as live:
        yield live


def _post(url: str, path: str, headers: list[tuple[str, str]], body: bytes) -> httpx.Response:
    with httpx.Client(base_url=url, timeout=60) as client:
        return client.post(path, content=body, headers=headers)


@pytest.mark.parametrize("path", ["/v1/preprocess", "/v1/embed", "/v1/embeddings"])
def test_a_content_type_over_the_bound_is_a_415_and_never_parsed(
    server: LiveServer, path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    parsed: list[str] = []
    monkeypatch.setattr(documents, "extract_media_type", lambda value: parsed.append(value) or ("x/y", None))
    header = "text/html" + "; a=b" * 12_000  # 60 KB, the measured one
    response = _post(server.url, path, [("content-type", header)], page(1).encode())
    assert response.status_code == 415, response.text
    error = response.json()["error"]
    assert (
        error["code"] == "unsupported_media_type" and f"at most {MAX_CONTENT_TYPE_CHARS}" in error["message"]
    )
    assert len(response.text) < 1000 and parsed == []  # not echoed back, not parsed


def test_a_content_type_within_the_bound_is_read_as_before(server: LiveServer) -> None:
    header = "text/html; " + "a=b; " * 40 + "charset=windows-1251"
    assert len(header) <= MAX_CONTENT_TYPE_CHARS
    assert parse_content_type(header) == ("text/html", "windows-1251")
    html = "<html><body><p>Привет, мир: страница в windows-1251.</p></body></html>".encode("windows-1251")
    response = _post(server.url, "/v1/preprocess", [("content-type", header)], html)
    assert response.status_code == 200, response.text
    assert "Привет" in json.dumps(response.json(), ensure_ascii=False)


@pytest.mark.parametrize(
    "first, second", [("text/html", "application/json"), ("application/json", "text/html")]
)
@pytest.mark.parametrize("path", ["/v1/embed", "/v1/embeddings"])
def test_two_different_content_types_are_a_415(
    server: LiveServer, path: str, first: str, second: str
) -> None:
    body = json.dumps({"documents": [{"html": page(1)}], "input": page(1)}).encode()
    response = _post(server.url, path, [("content-type", first), ("content-type", second)], body)
    assert response.status_code == 415, response.text
    error = response.json()["error"]
    assert error["code"] == "unsupported_media_type" and "2 Content-Type headers" in error["message"]


def test_identical_content_types_pass(server: LiveServer) -> None:
    body = json.dumps({"documents": [{"html": page(1)}]}).encode()
    twice = [("content-type", "application/json")] * 2
    response = _post(server.url, "/v1/embed", twice, body)
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["documents"] == 1


def test_the_raw_head_with_two_content_types_is_refused_too(server: LiveServer) -> None:
    """As a client writes it on the wire (httpx keeps both as well, this is what the server parses)."""
    html = page(1).encode()
    head = (
        "POST /v1/preprocess HTTP/1.1\r\nHost: x\r\nContent-Type: text/html\r\n"
        f"Content-Type: application/octet-stream\r\nContent-Length: {len(html)}\r\nConnection: close\r\n\r\n"
    )
    parts = urlsplit(server.url)
    with socket.create_connection((parts.hostname, parts.port), timeout=60) as sock:
        sock.sendall(head.encode() + html)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    assert re.match(rb"HTTP/1\.1 415 ", answer), answer[:300]
