"""service/api/http_framing.py: a chunked body passed over by what llhttp said is where it is followed
size line by size line.

Following each chunk's size line in Python cost a body of small chunks 2.7 times the event loop's CPU
it had taken before the framing; what llhttp parsed of a chunked body is now passed over in one step,
from what it said (`Parsed`: its chunk events, the data given since the last chunk's header), reading
only the end of what it parsed. The framing must stay exact: after every read, its state (kind, bytes
left, size digits, where a head or a trailer section began) is the one of a framing that followed every
size line (`said` never given), for bodies of all chunk sizes, chunk extensions, trailer fields that
look like size lines, pipelined requests behind them, in reads of every size.
"""

from __future__ import annotations

import asyncio
import random
import re
from typing import Any

import pytest

from service.api.http_framing import BODY, DATA, HEAD, SIZE, TRAILER, Framing, Parsed
from tests.api.protocol_harness import protocol_on_fake_transport


async def _length(scope: Any, receive: Any, send: Any) -> None:
    """Answers 200 with the length of the request's body."""
    total = 0
    while True:
        message = await receive()
        total += len(message.get("body", b""))
        if not message.get("more_body"):
            break
    body = b"%d" % total
    await send(
        {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"%d" % len(body))]}
    )
    await send({"type": "http.response.body", "body": body})


_DATA_BYTES = b"\r\n0a;: X"  # (chunk data that holds LFs, hex digits and what a size line holds)
_EXTENSIONS = [b"", b"", b"", b";a=b", b";x", b';q="a:b;c"', b';y="\\""']
_TRAILERS = [b"", b"X-T: 1\r\n", b"abc: d\r\n0: 1\r\nA-B:c\r\n", b"Digest: " + b"f" * 300 + b"\r\n"]


def _chunked(rng: random.Random) -> tuple[bytes, int]:
    """A chunked POST of random chunks, extensions and trailer fields; its body's length."""
    parts = [b"POST /c HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"]
    total = 0
    for _ in range(rng.randint(0, 40)):
        length = rng.choice([1, 1, 2, 3, 10, 15, 16, 17, 100, 255, 256, 1000, 5000])
        size = (b"%x" if rng.random() < 0.5 else b"%X") % length
        if rng.random() < 0.1:
            size = b"000" + size
        data = bytes(rng.choice(_DATA_BYTES) for _ in range(length))
        parts.append(size + rng.choice(_EXTENSIONS) + b"\r\n" + data + b"\r\n")
        total += length
    parts.append(rng.choice([b"0", b"000", b"0;e=1"]) + b"\r\n" + rng.choice(_TRAILERS) + b"\r\n")
    return b"".join(parts), total


def _stream(rng: random.Random) -> tuple[bytes, list[int]]:
    """Pipelined requests, most of them chunked; the lengths of their bodies."""
    requests, lengths = [], []
    for _ in range(rng.randint(1, 4)):
        kind = rng.random()
        if kind < 0.7:
            request, length = _chunked(rng)
        elif kind < 0.85:
            body = bytes(rng.choice(_DATA_BYTES) for _ in range(rng.randint(0, 3000)))
            request = b"POST /l HTTP/1.1\r\nHost: a\r\nContent-Length: %d\r\n\r\n" % len(body) + body
            length = len(body)
        else:
            request, length = b"GET /g HTTP/1.1\r\nHost: a\r\n\r\n", 0
        requests.append((b"\r\n" if rng.random() < 0.2 else b"") + request)
        lengths.append(length)
    return b"".join(requests), lengths


def _reads(rng: random.Random, data: bytes, sizes: list[int]) -> list[bytes]:
    reads, at = [], 0
    while at < len(data):
        step = rng.choice(sizes)
        reads.append(data[at : at + step])
        at += step
    return reads


def _state(framing: Framing) -> list[Any]:
    state: list[Any] = [framing.kind, framing.requests, len(framing.bodies)]
    if framing.kind in (BODY, DATA):
        state.append(framing.left)
    elif framing.kind == SIZE:
        state += [framing.digits, framing.digits_done]
    elif framing.kind in (HEAD, TRAILER):
        state.append(framing.start)
    return state


class _SizeLineBySizeLine(Framing):
    """The reference: never told what llhttp said."""

    def walk(
        self, data: bytes, position: int, parsed: int, said: Parsed | None = None
    ) -> tuple[int, tuple[int, int, int] | None]:
        return super().walk(data, position, parsed, None)


_READ_SIZES = {
    "bytes": [1, 2, 3],
    "small": list(range(1, 41)),
    "mixed": [1, 5, 77, 1448, 9000],
    "large": [70_000, 100_000, 262_144],
}


@pytest.mark.parametrize("reads", list(_READ_SIZES), ids=list(_READ_SIZES))
async def test_a_chunked_body_passed_over_is_where_it_is_followed_size_line_by_size_line(reads: str) -> None:
    for seed in range(40 if reads != "bytes" else 8):
        rng = random.Random(seed)
        data, lengths = _stream(rng)
        passed, passed_transport = protocol_on_fake_transport(_length, head_timeout_s=60.0)
        followed, _ = protocol_on_fake_transport(_length, head_timeout_s=60.0)
        followed._framing = _SizeLineBySizeLine()
        for read in _reads(rng, data, _READ_SIZES[reads]):
            passed.data_received(read)
            followed.data_received(read)
            assert _state(passed._framing) == _state(followed._framing), (seed, len(read))
            await asyncio.sleep(0)
        for _ in range(20):
            await asyncio.sleep(0)
        answered = [int(length) for length in re.findall(rb"\r\n\r\n(\d+)", passed_transport.written)]
        assert answered == lengths, (seed, passed_transport.written[-300:])
        passed.connection_lost(None)
        followed.connection_lost(None)


@pytest.mark.parametrize("split", range(1, 12))
async def test_a_trailer_field_that_reads_as_a_size_line_is_no_chunk(split: int) -> None:
    """A read that ends with a whole trailer field line after the size line of 0: llhttp gives the field
    only once the next one begins, so what it said is the last chunk's header and no data since, as for
    a chunk whose data is still to come. `abc: d` begins with hex digits; read as a size line (of 2,748
    bytes), the framing would have passed the next request's head over as that chunk's data."""
    body = b"5\r\nhello\r\n0\r\nabc: d\r\n"
    rest = b"\r\nGET /g HTTP/1.1\r\nHost: a\r\n\r\n"
    head = b"POST /c HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
    protocol, transport = protocol_on_fake_transport(_length, head_timeout_s=60.0)
    protocol.data_received(head + body[:split])
    protocol.data_received(body[split:])
    assert protocol._framing.kind == TRAILER
    protocol.data_received(rest)
    for _ in range(20):
        await asyncio.sleep(0)
    assert re.findall(rb"HTTP/1\.1 (\d{3}) ", transport.written) == [b"200", b"200"], transport.written
    protocol.connection_lost(None)
