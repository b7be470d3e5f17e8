"""service/api/auth.py: with keys configured, a model route's path needs the key whatever the method.

A wrong method (`PUT /v1/embed`) was answered 405 before the key check, its `Allow` naming the route's
method: a client without a key learnt which model routes exist. It now gets the 401 a POST gets; with a
key, the 405 is as before. The probes and the documentation stay open, `GET /` (the liveness probe beside
TEI's `POST /`) included, and a CONNECT is still answered by the app and closes its connection.
"""

from __future__ import annotations

import json
import re
import socket
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.api.conftest import tiny_settings
from tests.api.live import LiveServer, live_server

KEY = "k3y-for-methods"
_KEYED = b"Authorization: Bearer " + KEY.encode() + b"\r\n"
_TLS_HELLO = b"\x16\x03\x01\x02\x00" * 8  # a tunnel's first bytes, sent after a CONNECT's head


@pytest.fixture(scope="module")
def server(tiny_checkpoint: Path) -> Iterator[LiveServer]:
    with live_server(tiny_settings(tiny_checkpoint, api_key=KEY)) as live:
        yield live


def _exchange(url: str, data: bytes) -> bytes:
    """Send `data` on a new connection; everything the server answers until it closes."""
    parts = urlsplit(url)
    with socket.create_connection((parts.hostname, parts.port), timeout=10) as sock:
        sock.sendall(data)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
        return answer


def _request(method: bytes, target: bytes, extra: bytes = b"") -> bytes:
    return method + b" " + target + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" + extra + b"\r\n"


def _head(answer: bytes) -> bytes:
    return answer.partition(b"\r\n\r\n")[0].lower()


def _allow(answer: bytes) -> bytes | None:
    found = re.search(rb"\r\nallow: ([^\r]*)", _head(answer))
    return None if found is None else found[1]


@pytest.mark.parametrize(
    ("method", "target"),
    [
        (b"PUT", b"/v1/embed"),
        (b"GET", b"/v1/embed"),
        (b"DELETE", b"/v1/embeddings"),
        (b"OPTIONS", b"/v1/extract"),
        (b"PATCH", b"/embed"),
        (b"PUT", b"/v1/models"),
        (b"POST", b"/v1/models/some-model"),  # (a route with a parameter in its path)
        (b"PUT", b"/"),  # the root takes TEI's POST beside the probe's GET
    ],
)
def test_a_wrong_method_on_a_model_route_without_a_key_is_a_401(
    server: LiveServer, method: bytes, target: bytes
) -> None:
    """No key: 401 `unauthorized` with `WWW-Authenticate`, no `Allow`; with the key: the 405 it was."""
    refused = _exchange(server.url, _request(method, target))
    assert refused.startswith(b"HTTP/1.1 401 "), refused[:300]
    assert b"www-authenticate: bearer" in _head(refused) and _allow(refused) is None, refused[:300]
    assert json.loads(refused.partition(b"\r\n\r\n")[2])["error"]["code"] == "unauthorized"
    wrong_key = _exchange(server.url, _request(method, target, b"Authorization: Bearer nope\r\n"))
    assert wrong_key.startswith(b"HTTP/1.1 401 "), wrong_key[:300]
    keyed = _exchange(server.url, _request(method, target, _KEYED))
    assert keyed.startswith(b"HTTP/1.1 405 ") and _allow(keyed), keyed[:300]


@pytest.mark.parametrize(
    ("method", "target", "status"),
    [
        (b"GET", b"/", 200),
        (b"HEAD", b"/", 200),
        (b"GET", b"/health", 200),
        (b"GET", b"/openapi.json", 200),
        (b"PUT", b"/health", 405),  # no model route there: routing's answer, as before
        (b"POST", b"/nowhere", 404),
    ],
)
def test_open_paths_answer_without_a_key_as_before(
    server: LiveServer, method: bytes, target: bytes, status: int
) -> None:
    answer = _exchange(server.url, _request(method, target))
    assert answer.startswith(b"HTTP/1.1 %d " % status), answer[:300]


@pytest.mark.parametrize("target", [b"example.com:443", b"/v1/embed"], ids=["authority", "model-route"])
def test_a_connect_without_a_key_is_a_401_that_closes_its_connection(
    server: LiveServer, target: bytes
) -> None:
    """A CONNECT to a model route's path, or to a host and port (the root, which takes TEI's POST), is
    a 401 without a key, still answered by the app, closing its connection with the tunnel's first bytes
    unread; with the key, the 405 naming what its target takes."""
    head = b"CONNECT " + target + b" HTTP/1.1\r\nHost: " + target + b"\r\n"
    refused = _exchange(server.url, head + b"\r\n" + _TLS_HELLO * 4096)
    assert refused.startswith(b"HTTP/1.1 401 ") and b"connection: close" in _head(refused), refused[:300]
    keyed = _exchange(server.url, head + _KEYED + b"\r\n" + _TLS_HELLO * 4096)
    assert keyed.startswith(b"HTTP/1.1 405 ") and b"connection: close" in _head(keyed), keyed[:300]
    assert _allow(keyed) == (b"get, head, post" if target == b"example.com:443" else b"post"), keyed[:300]
