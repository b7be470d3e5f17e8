"""service/api/http_protocol.py: a chunk's size line (its chunk extensions) is bounded as a head is.

llhttp reads a chunk extension (`5;name=value`) without a callback until its line ends: an endless one
(`5;aaaa...`) was read and dropped at the client's pace, the connection held until the body stalled (no
byte of the body came), megabytes later. Past `MAX_HEAD_BYTES` it is now a 431, the request refused as
for a malformed body (its app told that the client left), wherever the reads' bounds fall.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from typing import Any

import pytest

from service.api.http_protocol import MAX_HEAD_BYTES
from tests.api.protocol_harness import protocol_on_fake_transport
from tests.factories.waiting import until_async

_HEAD = b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
_READ = 16 * 1024  # (what one read brings)
_POLLS = 1000  # (5 s of event-loop turns: these answers come within a few, a test that fails fails soon)


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
    """Refused once the size line passes the cap (the read that takes it there); what the client sends
    next is not parsed, and the app is told that its client left."""
    received: list[dict[str, Any]] = []
    protocol, transport = protocol_on_fake_transport(_reading_app(received))
    protocol.data_received(_HEAD + b"5;")
    sent = 0
    while not transport.written and sent < 64 * MAX_HEAD_BYTES:  # (unbounded, it never stops)
        protocol.data_received(b"a" * _READ)
        sent += _READ
    assert _statuses(transport.written) == [b"431"] and transport.closed, transport.written[:300]
    assert b'"headers_too_large"' in transport.written and b"chunk" in transport.written
    assert sent <= MAX_HEAD_BYTES, sent
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


def _reads_of(data: bytes, ends: list[int]) -> list[bytes]:
    """`data` in reads that end at `ends` (offsets, negative from its end), the last read to its end."""
    bounds = sorted({end % len(data) for end in ends} - {0})
    return [data[start:end] for start, end in zip([0, *bounds], [*bounds, len(data)], strict=True)]


# Where the reads of a request (`before`, a size line of `MAX_HEAD_BYTES` or one byte more, its chunk and
# the last) end: all in one; the size line's first byte alone, then the rest; most of the line in the
# read it begins in; its CR ending a read; its LF beginning one; reads of 1000 bytes.
_SPLITS: dict[str, Callable[[int], list[int]]] = {
    "one-read": lambda line_at: [],
    "first-byte": lambda line_at: [line_at + 1],
    "most-in-its-first-read": lambda line_at: [line_at + MAX_HEAD_BYTES - 100],
    "cr-ends-a-read": lambda line_at: [line_at + MAX_HEAD_BYTES - 1],
    "lf-begins-a-read": lambda line_at: [line_at + MAX_HEAD_BYTES],
    "reads-of-1000": lambda line_at: list(range(1000, line_at + MAX_HEAD_BYTES + 100, 1000)),
}
# What may come before the size line in its read: the head alone, a request answered before it (the head
# completing mid-read), a chunk before it.
_BEFORE = {
    "first-chunk": _HEAD,
    "pipelined": b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n" + _HEAD,
    "later-chunk": _HEAD + b"3\r\nabc\r\n",
}


@pytest.mark.parametrize("split", list(_SPLITS))
@pytest.mark.parametrize("before", list(_BEFORE))
@pytest.mark.parametrize("over", [True, False], ids=["over-the-cap", "at-the-cap"])
async def test_the_size_line_cap_is_exact_however_the_reads_split_it(
    split: str, before: str, over: bool
) -> None:
    """A size line of one byte more than `MAX_HEAD_BYTES` (with its CRLF) is a 431, one of the cap is
    served, wherever the reads' bounds fall: the read a line began in had not been counted, nor had a
    line that ended in the read it began in, so up to one read (256 KiB) more than the cap had passed."""
    received: list[dict[str, Any]] = []
    reading_app = _reading_app(received)

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["method"] == "POST":
            await reading_app(scope, receive, send)
            return
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})

    protocol, transport = protocol_on_fake_transport(app)
    line = b"5;" + b"a" * (MAX_HEAD_BYTES - 4 + over) + b"\r\n"
    data = _BEFORE[before] + line + b"hello\r\n0\r\n\r\n"
    for read in _reads_of(data, _SPLITS[split](len(_BEFORE[before]))):
        protocol.data_received(read)
        await asyncio.sleep(0)
    answered = [b"200"] * (before == "pipelined")  # (GET /a's)
    if over:
        await until_async(lambda: transport.closed, "the connection closed", polls=_POLLS)
        assert _statuses(transport.written) == [*answered, b"431"], transport.written[-300:]
        assert b"size line" in transport.written
        if received:  # (its app had started: it is told that its client left)
            await until_async(lambda: received[-1]["type"] == "http.disconnect", "a disconnect", polls=_POLLS)
    else:
        await until_async(
            lambda: _statuses(transport.written) == [*answered, b"200"], "the answers", polls=_POLLS
        )
        assert (
            b"".join(message.get("body", b"") for message in received)
            == b"abc" * (before == "later-chunk") + b"hello"
        )
        assert not transport.closed


_H2C_OFFER = (
    b"Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQCAAAAAAIAAAAA\r\n"
)


@pytest.mark.parametrize("framing", ["chunked", "content-length", "chunked-offering-h2c"])
async def test_a_body_with_long_lines_is_served_whole(framing: str) -> None:
    """Data without an LF for far longer than the cap (a minified page), in one read, is a body, not a size
    line: served whole; so is a size line of the cap just after it. Parsed in parts where such lines
    begin, the read is whole to the parser: a head that offers a protocol switch (given again without
    the offer, `_give_head_again`) takes the rest of the read with it."""
    received: list[dict[str, Any]] = []
    protocol, transport = protocol_on_fake_transport(_reading_app(received))
    data = b"x" * (3 * MAX_HEAD_BYTES) + b"\n" + b"y" * (MAX_HEAD_BYTES + 10)
    if framing.startswith("chunked"):
        line = b"5;" + b"a" * (MAX_HEAD_BYTES - 4) + b"\r\n"
        body = b"%x\r\n%s\r\n%shello\r\n0\r\n\r\n" % (len(data), data, line)
        offer = _H2C_OFFER if framing == "chunked-offering-h2c" else b""
        protocol.data_received(_HEAD.replace(b"Host: x\r\n", b"Host: x\r\n" + offer) + body)
        data += b"hello"
    else:
        protocol.data_received(
            b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(data), data)
        )
    await until_async(lambda: _statuses(transport.written), "the answer", polls=_POLLS)
    assert _statuses(transport.written) == [b"200"] and not transport.closed, transport.written[:300]
    assert b"".join(message.get("body", b"") for message in received) == data
