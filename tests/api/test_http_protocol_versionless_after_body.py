"""service/api/http_protocol.py: a request line without a version right behind a body is a 505 at once.

Such a line, pipelined after a body that does not end with an LF, was taken from the LF before it, in the
earlier request's head: the body glued to it, it was not recognised, and the client, which sends nothing
more (HTTP/0.9), got the head timeout's 408 30 s later instead of the 505 after the earlier answers. The
line is taken from where the framing (`Framing`) has its head begin.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from tests.api.protocol_harness import protocol_on_fake_transport
from tests.factories.waiting import until_async

_BODY = b'{"ids":[[101,102,7592]]}'
_POST = b"POST /decode HTTP/1.1\r\nHost: a\r\nContent-Length: %d\r\n\r\n" % len(_BODY)
_LARGE = b"x" * 100_000  # (a read over the cap: parsed in parts, `_section_points`)
_POST_LARGE = b"POST /decode HTTP/1.1\r\nHost: a\r\nContent-Length: %d\r\n\r\n%s" % (len(_LARGE), _LARGE)
_CHUNKED = b"POST /decode HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n" % (
    len(_BODY),
    _BODY,
)


async def _app(scope: Any, receive: Any, send: Any) -> None:
    while (await receive()).get("more_body"):
        pass
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


@pytest.mark.parametrize(
    "reads",
    [
        [_POST + _BODY + b"GET /\r\n"],  # (the review's: one write)
        [_POST + _BODY + b"GET /\n"],
        [_POST + _BODY[:5], _BODY[5:] + b"GET /\r\n"],
        [_POST + _BODY + b"GE", b"T /\r\n"],
        [_POST + _BODY + b"G", b"ET", b" /\r", b"\n"],
        [_POST, _BODY + b"GET /\r\n"],
        [_CHUNKED + b"GET /\r\n"],
        [_POST + _BODY + _POST + _BODY + b"GET /\r\n"],
        [_POST_LARGE + b"GET /\r\n"],
        [_POST_LARGE[:70_000], _POST_LARGE[70_000:] + b"GET /\r\n"],
    ],
    ids=[
        "one-read",
        "bare-lf",
        "body-split",
        "line-split",
        "line-in-pieces",
        "head-apart",
        "chunked",
        "two",
        "large-read",
        "large-reads",
    ],
)
async def test_a_versionless_line_behind_a_body_is_a_505_at_once(reads: list[bytes]) -> None:
    protocol, transport = protocol_on_fake_transport(_app, head_timeout_s=60.0)
    for data in reads:
        protocol.data_received(data)
    await until_async(lambda: transport.closed, "the connection closed (the head timeout is 60 s)")
    statuses = re.findall(rb"HTTP/1\.1 (\d{3}) ", transport.written)
    assert statuses == [b"200"] * (len(statuses) - 1) + [b"505"] and len(statuses) >= 2, transport.written
    assert b"without a version" in transport.written


@pytest.mark.parametrize(
    "reads",
    [
        [_POST + _BODY[:-6] + b"GET /\n", b"GET /b HTTP/1.1\r\nHost: a\r\n\r\n"],
        [_POST + _BODY + b"GET /b HTTP/1.1\r\nX: GET /b\r\n", b"Host: a\r\n\r\n"],
        [_POST + _BODY + b"GET /b", b" HTTP/1.1\r\n", b"X: GET /b\r\n", b"\r\n"],
    ],
    ids=["a-body-line-like-one", "a-header-like-one", "split"],
)
async def test_requests_with_a_version_behind_a_body_are_served(reads: list[bytes]) -> None:
    """Body bytes that read as such a line, and header lines that do, are no request line."""
    protocol, transport = protocol_on_fake_transport(_app, head_timeout_s=60.0)
    for data in reads:
        protocol.data_received(data)
    await until_async(lambda: transport.written.count(b"HTTP/1.1 200") == 2, "both requests answered")
    assert re.findall(rb"HTTP/1\.1 (\d{3}) ", transport.written) == [b"200", b"200"], transport.written
    assert not transport.closed
