"""service/api/http_protocol.py: a chunk's size line (its chunk extensions) is bounded as a head is.

llhttp reads a chunk extension (`5;name=value`) without a callback until its line ends: an endless one
(`5;aaaa...`) was read and dropped at the client's pace, the connection held until the body stalled (no
byte of the body came), megabytes later. Past `MAX_HEAD_BYTES` it is now a 431, the request refused as
for a malformed body (its app told that the client left).
"""

from __future__ import annotations

import re
from typing import Any

from service.api.http_protocol import MAX_HEAD_BYTES
from tests.api.protocol_harness import protocol_on_fake_transport
from tests.factories.waiting import until_async

_HEAD = b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
_READ = 16 * 1024  # (what one read brings)


def _statuses(answer: bytes) -> list[bytes]:
    return re.findall(rb"HTTP/1\.1 (\d{3}) ", answer)


def _reading_app(received: list[dict[str, Any]]) -> Any:
    """An app that reads its whole body into `received`, then answers 200."""

    async def app(scope: Any, receive: Any, send: Any) -> None:
        while not received or received[-1].get("more_body"):
            received.append(await receive())
            if received[-1]["type"] == "http.disconnect":
                return
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})

    return app


async def test_an_endless_chunk_extension_is_a_431() -> None:
    """Refused once the reads inside one size line pass the cap (at most two reads past it); what the
    client sends next is not parsed, and the app is told that its client left."""
    received: list[dict[str, Any]] = []
    protocol, transport = protocol_on_fake_transport(_reading_app(received))
    protocol.data_received(_HEAD + b"5;")
    sent = 0
    while not transport.written and sent < 64 * MAX_HEAD_BYTES:  # (unbounded, it never stops)
        protocol.data_received(b"a" * _READ)
        sent += _READ
    assert _statuses(transport.written) == [b"431"] and transport.closed, transport.written[:300]
    assert b'"headers_too_large"' in transport.written and b"chunk" in transport.written
    assert sent <= MAX_HEAD_BYTES + 2 * _READ, sent
    await until_async(lambda: received and received[-1]["type"] == "http.disconnect", "a disconnect")


async def test_an_endless_extension_of_a_later_chunk_or_the_last_is_a_431_too() -> None:
    for before in (b"3\r\nabc\r\n5;", b"3\r\nabc\r\n0;"):
        received: list[dict[str, Any]] = []
        protocol, transport = protocol_on_fake_transport(_reading_app(received))
        protocol.data_received(_HEAD + before)
        for _ in range(MAX_HEAD_BYTES // _READ + 2):
            protocol.data_received(b"a" * _READ)
        assert _statuses(transport.written) == [b"431"], (before, transport.written[:300])


async def test_chunk_extensions_within_the_cap_are_served() -> None:
    """Extensions of each chunk, the last one's too, sent a byte per read (each read inside a size line
    counts): the body is the chunks' data, answered 200, the connection kept."""
    extension = b";name=" + b"v" * 1000
    body = b"5" + extension + b"\r\nhello\r\n6" + extension + b"\r\n world\r\n0" + extension + b"\r\n\r\n"
    received: list[dict[str, Any]] = []
    protocol, transport = protocol_on_fake_transport(_reading_app(received))
    protocol.data_received(_HEAD)
    for index in range(len(body)):
        protocol.data_received(body[index : index + 1])
    await until_async(lambda: _statuses(transport.written), "an answer")
    assert _statuses(transport.written) == [b"200"] and not transport.closed
    assert b"".join(message.get("body", b"") for message in received) == b"hello world"

    # One size line of just under the cap, in whole reads: not refused.
    received.clear()
    protocol, transport = protocol_on_fake_transport(_reading_app(received))
    protocol.data_received(_HEAD + b"5;")
    filler = b"a" * (MAX_HEAD_BYTES - _READ)
    for start in range(0, len(filler), _READ):
        protocol.data_received(filler[start : start + _READ])
    protocol.data_received(b"\r\nhello\r\n0\r\n\r\n")
    await until_async(lambda: _statuses(transport.written), "an answer")
    assert _statuses(transport.written) == [b"200"], transport.written[:300]
