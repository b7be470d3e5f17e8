"""Where a request's sections lie in a connection's bytes, and what a head's fields say of its body.

`http_protocol` parses with llhttp, which measures a head only once it is complete and counts neither the
whitespace after each colon nor a read it began in; these follow the bytes themselves, read by read
(`Framing`: heads, bodies by their length, chunk size lines, trailer sections), so that the caps
(`MAX_HEAD_BYTES`) are exact however the reads split. The transfer codings a head lists decide whether
its body can reach the app as sent (`transfer_coding_refusal`).
"""

from __future__ import annotations

import collections
import re
from collections.abc import Iterator
from typing import NamedTuple

from service.core.errors import ErrorCode, shown

# The most bytes of a request's head buffered before it is refused: 4x h11's default in uvicorn, room
# for large cookies and gateway headers (nginx allows 4 x 8 KiB by default). Also a trailer section's,
# and a chunk's size line's.
MAX_HEAD_BYTES = 64 * 1024
_HEX_DIGITS = frozenset(b"0123456789abcdefABCDEF")


def long_lines(data: bytes, carried: int) -> Iterator[int]:
    """Where each line of `data` that may be a chunk's size line over the cap begins (`data_received`):
    one with at least `MAX_HEAD_BYTES` bytes before the LF ending it in `data`, beginning after an LF
    with a hex digit (as a size line must: llhttp refuses any other at its first byte), or at 0 where
    `carried` bytes of it came before `data`. A read's lines are skipped a window of the cap at a time
    (the last LF in it), so that text is passed over in a few searches, each in C; a body's long lines
    that begin otherwise (a minified page's `<`) are not parsed apart."""
    start = -carried
    while start + MAX_HEAD_BYTES < len(data):  # (an LF ending a long line could still come in `data`)
        window_end = start + MAX_HEAD_BYTES
        last = data.rfind(b"\n", max(start, 0), window_end)
        if last >= 0:  # (every line ending in the window is shorter: on from the last one)
            start = last + 1
            continue
        end = data.find(b"\n", window_end)
        if end < 0:  # (the line is still open at the end: measured once `data` is parsed)
            return
        if start < 0 or data[start] in _HEX_DIGITS:
            yield max(start, 0)
        start = end + 1


_BLANK_LINE = b"\r\n\r\n"
_CRLF = b"\r\n"
_CR, _LF = 13, 10
_NOT_CRLF = re.compile(rb"[^\r\n]")
_HEX_RUN = re.compile(rb"[0-9a-fA-F]*")


def blank_line_end(data: bytes, before: bytes, start: int, end: int) -> int:
    """Where the first blank line (CRLF CRLF) in `data[start:end]` ends, or -1; `start` < 0 takes its first
    bytes from `before`, the end of the previous read (a blank line split between two reads)."""
    start = max(start, -len(before))
    if start < 0:
        joined = before[start:] + data[:3]
        found = joined.find(_BLANK_LINE)
        if found >= 0 and found + 4 + start <= end:
            return found + 4 + start
        start = 0
    found = data.find(_BLANK_LINE, start, end)
    return found + 4 if found >= 0 else -1


# `Framing`'s states: between requests, in a head, at the end of one whose body llhttp has not told yet,
# in a body of known length, in a chunk's size line, in its data (and the CRLF after it), in a trailer
# section, and no longer followed.
IDLE, HEAD, HEAD_END, BODY, SIZE, DATA, TRAILER, LOST = range(8)
# A chunk's size line that no trailer field line can be: hex digits, then its CR or its chunk extensions
# (a field line that llhttp takes has a colon after its name, which holds no `;`).
_SIZE_LINE = re.compile(rb"[0-9a-fA-F]+(?:;[^\r\n]*)?\r")


class Parsed(NamedTuple):
    """What llhttp said while it parsed the bytes fed to it since the framing last walked (`Framing.walk`),
    from `start` in the read up to where it has parsed it."""

    start: int
    chunk_events: int  # its chunk headers (a size line's end) and chunk ends (a chunk's CRLF after its data)
    other_events: int  # its message begins and ends, and trailer fields
    in_size_line: bool  # at the end, llhttp is in a chunk's size line (or not in a chunked body)
    chunk_data: int  # the bytes of data given since the last chunk header


class Framing:
    """Where each request's head, body and trailer section lie in a connection's bytes, followed read by
    read alongside llhttp, so that a head or a trailer section is known from its first byte on and can
    be refused exactly when `MAX_HEAD_BYTES` of it are parsed with it still open (`http_protocol`).

    A head begins at the first byte that is no CR or LF between requests (llhttp skips those) and ends
    with its blank line; its body is what llhttp makes of its head (`bodies`: its Content-Length, or
    chunked), known once llhttp has parsed the head, and is passed over by its length, never searched;
    a chunked body is followed by its size lines (the hex digits begin each) and their chunks' lengths,
    and its trailer section begins after the size line of 0 and ends with its blank line. Where llhttp
    refuses what does not frame so, the connection is refused: this is only ever followed for bytes
    llhttp takes.

    A chunked body is followed only as far as llhttp has parsed it, and what llhttp parsed of it from
    where the framing stands is passed over in one step where what llhttp said (`Parsed`) places the
    framing at its end (`_after_chunks`): only the size line or the chunk llhttp is in there is read.
    Followed size line by size line, a body of 1- to 256-byte chunks had cost the event loop 2.4 to 2.8
    times the CPU it took without the framing (a Python step per chunk, besides llhttp's callbacks); so,
    1.05 to 1.13 times (a chunked upload to uvicorn, uvloop, 256 KiB reads). Bytes where a body ends
    (its trailer section, a head after it) are followed size line by size line, as are bytes llhttp
    parsed before the framing stood where they begin (the first read of a body, after its head)."""

    def __init__(self) -> None:
        self.kind = IDLE
        self.start = 0  # HEAD, TRAILER: where it began, in the current read (< 0: in an earlier one)
        self.left = 0  # BODY, DATA: the bytes still to come (DATA: the CRLF after its chunk's data too)
        self.digits = b""  # SIZE: the chunk size's hex digits so far
        self.digits_done = False
        self.requests = 0  # the requests begun, as the protocol counts them
        self.bodies: collections.deque[int | None] = collections.deque()  # (heads parsed, not walked past)
        self.before = b""  # the last bytes of the previous read

    def restart(self, requests: int) -> None:
        """Follow a fresh parser from its first byte, `requests` begun before it."""
        self.kind, self.start, self.left = IDLE, 0, 0
        self.bodies.clear()
        self.before = b""
        self.requests = requests

    def walk(
        self, data: bytes, position: int, parsed: int, said: Parsed | None = None
    ) -> tuple[int, tuple[int, int, int] | None]:
        """Follow `data` from `position`, where llhttp has parsed it up to `parsed` (`said`: what it said
        while parsing the bytes fed since the last walk); where it stopped (at the end of a head that
        llhttp has not parsed yet, whose body is unknown, in a chunked body at `parsed`, or at the read's
        end) and, where a head or a trailer section would pass the cap still open, where
        `MAX_HEAD_BYTES` of it end: (that position, HEAD or TRAILER, its request)."""
        size = len(data)
        kind = self.kind
        try:
            while True:
                if kind == IDLE:
                    if position < size and data[position] not in _CRLF:
                        self.start = position
                    else:
                        found = _NOT_CRLF.search(data, position)
                        if found is None:
                            return size, None
                        self.start = position = found.start()
                    kind = HEAD
                    self.requests += 1
                elif kind in (HEAD, TRAILER):
                    limit = self.start + MAX_HEAD_BYTES
                    # (the size line's CRLF, with the blank line, ends a trailer section without fields)
                    first = self.start - 2 if kind == TRAILER else self.start
                    end = blank_line_end(data, self.before, first, min(size, limit))
                    if end < 0:
                        return size, None if limit > size else (limit, kind, self.requests)
                    position = end
                    kind = HEAD_END if kind == HEAD else IDLE
                elif kind == HEAD_END:
                    if position > parsed:
                        return position, None
                    body = self.bodies.popleft() if self.bodies else 0
                    kind = SIZE if body is None else BODY if body else IDLE
                    self.left = body or 0
                elif kind == BODY:
                    if position + self.left >= size:
                        self.left -= size - position
                        return size, None
                    position += self.left
                    kind = IDLE
                elif kind in (SIZE, DATA):
                    if position >= parsed:  # (what follows is followed once llhttp has parsed it)
                        return position, None
                    # (`said` tells of `data[position:parsed]` only where the bytes it tells of begin here)
                    after = None
                    if said is not None and said.start == position:
                        after = self._after_chunks(kind, data, position, parsed, said)
                    if after is None:
                        kind, position = self._chunks(kind, data, position, parsed)
                    else:
                        kind, position = after, parsed
                else:  # LOST
                    return size, None
        finally:
            self.kind = kind

    def _chunks(self, kind: int, data: bytes, position: int, bound: int) -> tuple[int, int]:
        """Follow a chunked body from `position`, in `kind` (SIZE or DATA), size line by size line up to
        `bound`: the kind and position where it stopped (`bound`, or where its trailer section begins)."""
        while position < bound:
            if kind == DATA:
                if position + self.left > bound:
                    self.left -= bound - position
                    return DATA, bound
                position += self.left
                kind = SIZE
                continue
            if not self.digits_done:
                run = _HEX_RUN.match(data, position, bound)
                assert run is not None  # (`*` matches the empty run)
                self.digits += run.group()
                self.digits_done = run.end() < bound
            line_end = data.find(b"\n", position, bound)
            if line_end < 0:
                return SIZE, bound
            position = line_end + 1
            chunk = int(self.digits or b"0", 16)
            self.digits, self.digits_done = b"", False
            if not chunk:
                self.left, self.start = 0, position
                return TRAILER, position
            kind, self.left = DATA, chunk + 2
        return kind, position

    def _after_chunks(self, kind: int, data: bytes, position: int, parsed: int, said: Parsed) -> int | None:
        """The kind at `parsed` (its state written) where what llhttp said while parsing
        `data[position:parsed]`, in the chunked body followed at `position` in `kind`, places the framing
        there; None where it does not (the body ended, or a size line is not where it would be).

        A size line has no LF and ends at one, so after a chunk's end llhttp is in the size line after
        the last LF; after a chunk's header it is in that chunk, past the data llhttp gave since, and
        before it in the CRLF after it or not, which the size line before the data tells (one of the two
        places has no size line, or one whose chunk is too small). Where no data came, the line is read
        as a size line only where it can be nothing else (a trailer field line, after the size line of 0)."""
        if said.other_events:
            return None
        if not said.chunk_events:  # (all of it in the size line or the chunk followed at `position`)
            if kind == DATA:
                if said.in_size_line or self.left <= parsed - position:
                    return None
                self.left -= parsed - position
                return DATA
            if not said.in_size_line or data.find(b"\n", position, parsed) >= 0:
                return None
            if not self.digits_done:
                run = _HEX_RUN.match(data, position, parsed)
                assert run is not None
                self.digits += run.group()
                self.digits_done = run.end() < parsed
            return SIZE
        if said.in_size_line:  # (the last event: a chunk's end, at the last LF)
            line = data.rfind(b"\n", position, parsed) + 1
            if not line:
                return None
            run = _HEX_RUN.match(data, line, parsed)
            assert run is not None
            self.digits, self.digits_done = run.group(), run.end() < parsed
            return SIZE
        seen = said.chunk_data  # (the last event: a chunk's header)
        for crlf in (0, 1) if seen else (0,):
            line_end = parsed - 1 - seen - crlf
            if line_end < position or data[line_end] != _LF or (crlf and data[parsed - 1] != _CR):
                continue
            line = data.rfind(b"\n", position, line_end) + 1
            if not line:  # (the size line began before `position`)
                return None
            if not seen and not _SIZE_LINE.fullmatch(data, line, line_end):
                return None
            run = _HEX_RUN.match(data, line, line_end)
            assert run is not None
            chunk = int(run.group() or b"0", 16)
            if not chunk or chunk < seen or (crlf and chunk != seen):
                continue
            self.left = chunk + 2 - seen - crlf
            self.digits, self.digits_done = b"", False
            return DATA
        return None

    def read_done(self, data: bytes) -> None:
        """`data`, the read followed, is parsed whole: positions for the next read."""
        self.start -= len(data)
        self.before = (self.before + data)[-3:]


def declared_body(headers: list[tuple[bytes, bytes]]) -> int | None:
    """The body a request's head declares, in bytes: None where it is chunked (its size unknown)."""
    length = 0
    for name, value in headers:
        if name == b"transfer-encoding":
            return None
        if name == b"content-length":
            try:
                length = int(value)
            except ValueError:  # (llhttp refuses such a head before it completes)
                return None
    return length


def transfer_codings(headers: list[tuple[bytes, bytes]]) -> list[bytes]:
    """The transfer codings a request's head lists, in order, over all its `Transfer-Encoding` fields
    (names lowercased, parameters and empty list elements left out)."""
    codings = []
    for name, value in headers:
        if name == b"transfer-encoding":
            for element in value.split(b","):
                coding = element.partition(b";")[0].strip(b" \t").lower()
                if coding:
                    codings.append(coding)
    return codings


def transfer_coding_refusal(codings: list[bytes]) -> tuple[ErrorCode, str] | None:
    """Why a request with these transfer codings is refused, if it is. Any coding but chunked: a body
    whose last coding is chunked can be framed, but the others would reach the app still applied
    (llhttp decodes only chunked: `gzip, chunked` passed the gzip stream on as the body), so 501, the
    answer RFC 9112 section 6.1 gives for a transfer coding the server does not implement. One whose
    last coding is not chunked has no length that can be known (400, RFC 9112 section 6.3, which llhttp
    refuses too: here with the reason)."""
    if not codings:
        return None
    if codings[-1] != b"chunked":
        return ErrorCode.MALFORMED_REQUEST, (
            "malformed HTTP/1.1 request: a Transfer-Encoding whose last coding is not chunked gives the body "
            "no length (RFC 9112 section 6.3)"
        )
    others = [coding.decode("latin-1") for coding in codings if coding != b"chunked"]
    if not others:
        return None
    return ErrorCode.UNSUPPORTED_TRANSFER_CODING, (
        f"Transfer-Encoding {shown(others)} is not implemented, only chunked is (RFC 9112 section 6.1): "
        "send the body chunked or with a Content-Length, compressed with Content-Encoding if need be"
    )
