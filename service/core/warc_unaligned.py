"""Where reading goes on after a corrupt gzip member in a .warc.gz whose members are cut where its records
are not (bgzip's BGZF blocks, pgzip's fixed-size pieces of one stream): the member after the damaged one
starts inside a record, so no member starts a record that `warc_tail.skip_member` could go on at, and the
first corrupt member had ended the file, every record after it lost.

The members from where the reading began are inflated again, one after another, and the records walked
through their output by the Content-Length of each (`_Chain`), up to the member that does not inflate.
Reading goes on in the first member after it that inflates whole, at the record the chain puts there: the
damaged member's output is as long as its trailer's size says, so where the damage spared the trailer and
the record the damage fell in has its header before it, the next record starts at a known byte of that
member's output, and a version line there confirms it. Else (the trailer damaged too, a header lost in
the damage) at the first version line in the output that starts a header with a Content-Length whose
record is followed by another such header or the stream's end; never inside the record the damage fell
in where that record shows a stored WARC file (`warc_tail` keeps the same fence for per-record files), so
none of its records becomes a page. FastWARC then reads that output, from that record on, as a plain
WARC stream (`Inflating`).

Only a file whose members are seen cut where records are not is read on so (a member boundary inside a
record, or BGZF's extra field): in a file written a member per record, a member found by its magic inside
a damaged one may be a stored download's, which `skip_member` fences.
"""

from __future__ import annotations

import io
import re
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO, NamedTuple

from service.core.warc_frames import (
    CHUNK,
    GZIP,
    GZIP_MAGIC,
    GZIP_MEMBER_START,
    Undecodable,
    gunzipped,
    member_follows,
)
from service.core.warc_tail import MAX_HEADER_BYTES, holds_stored_warc, record_length

_VERSION = re.compile(rb"WARC/(?:1\.[01]|0\.[^\r\n]{0,2})[ \t\r]*\n")
_CRLF = b"\r\n"
_BGZF_FLAGS = 0x04  # FEXTRA: a BGZF block's header holds its size there, under the subfield "BC"
_MAX_CHECKED = 64 << 20  # the largest record whose end a candidate header is checked at (held in memory)


class Resync(NamedTuple):
    """Where `resync` has reading go on."""

    failed: int  # where the member that does not inflate starts
    member: int  # where the member reading goes on in starts
    skip: int  # bytes of the output of the members from `member` on before the record reading goes on at
    whole: int  # records walked whole before the damaged member's output (the rest reach into it)


def is_bgzf(path: Path) -> bool:
    """Whether the file's first member is a BGZF block (bgzip's layout, cut where records are not)."""
    with path.open("rb") as handle:
        header = handle.read(16)
    return header[:3] == GZIP_MEMBER_START and bool(header[3] & _BGZF_FLAGS) and header[12:14] == b"BC"


def members_unaligned(path: Path, offset: int) -> bool:
    """Whether the file's members are cut where its records are not, as far as the record FastWARC framed
    last at byte `offset` tells: a member starts there that inflates to no record's start (FastWARC's
    offsets in such a file are the members its records start in), or the file is bgzip's."""
    with path.open("rb") as handle:
        handle.seek(offset)
        piece = handle.read(GZIP.probe)
    if piece.startswith(GZIP_MEMBER_START) and not GZIP.starts_record(memoryview(piece)):
        return True
    return is_bgzf(path)


def resync(path: Path, start: int, skip: int, *, unaligned: bool) -> Resync | None:
    """Where reading can go on after the first member from byte `start` on (whose output, after `skip`
    bytes of it, starts a record) that does not inflate; None where it cannot: every member inflates, no
    member after the damaged one inflates whole, no record is found after it, or the members were not
    seen cut where records are not (`unaligned`: the caller saw it). Inflates the file from `start` once
    more, and from the damaged member on once more at most."""
    with path.open("rb") as handle:
        handle.seek(start)
        if handle.read(2) != GZIP_MAGIC:
            return None
        chain = _Chain(skip)
        position = start
        size = handle.seek(0, io.SEEK_END)
        while position < size:
            ends: list[int] = []
            try:
                for chunk in GZIP.decode(handle, position, ends):
                    chain.feed(chunk)
            except Undecodable:
                break
            position = ends[0]
            chain.boundary()
            handle.seek(position)
            if handle.read(len(GZIP_MEMBER_START)) != GZIP_MEMBER_START:
                if member_follows(handle, position):
                    return None  # padding, or the file's end: nothing failed here
                break  # a member whose first bytes are the damage
        else:
            return None
        if not (unaligned or chain.unaligned):
            return None
        after = _next_whole_member(handle, position + 1, size)
        if after is None:
            return None
        handle.seek(after - 4)
        lost = int.from_bytes(handle.read(4), "little")  # the damaged member's output, by its trailer
        found = _record_in(handle, after, chain, lost)
    return None if found is None else Resync(position, after, found, chain.whole)


class _Chain:
    """The records walked through a stream of output by their Content-Length, as it comes: where the next
    one starts, and whether a member ended inside one."""

    _HEADER, _BLOCK, _GAP, _LOST = range(4)

    def __init__(self, skip: int) -> None:
        self.out = 0  # output seen
        self.state = self._HEADER
        self.next = skip  # where the record whose header is read starts
        self.header = b""  # that header as far as it came
        self.end = 0  # in a block: where its record ends (its CRLF CRLF after)
        self.stored = False  # that record shows a stored WARC file
        self.whole = 0  # records walked to their end
        self.unaligned = False  # a member ended inside a record
        self._gap_boundary: int | None = None  # a member ended among the CR and LF after a record

    def feed(self, chunk: bytes) -> None:
        at = 0
        while at < len(chunk) and self.state != self._LOST:
            if self.state == self._BLOCK:
                if self.end > self.out + len(chunk):
                    break
                at, self.state, self.whole = self.end - self.out, self._GAP, self.whole + 1
            elif self.state == self._GAP:
                rest = chunk[at:].lstrip(_CRLF)
                at = len(chunk) - len(rest)
                if rest:
                    self.state, self.next, self.header = self._HEADER, self.out + at, b""
                    if self._gap_boundary is not None and self._gap_boundary != self.next:
                        self.unaligned = True
                    self._gap_boundary = None
            else:
                if self.next >= self.out + len(chunk):
                    break
                at = max(at, self.next - self.out)
                piece = chunk[at : at + MAX_HEADER_BYTES - len(self.header)]
                self.header += piece
                length = record_length(self.header)
                if length is None:
                    if len(self.header) >= MAX_HEADER_BYTES:
                        self.state = self._LOST  # no record header FastWARC reads: the chain ends
                    at += len(piece)
                    continue
                self.stored = holds_stored_warc(self.header[:length])
                self.state, self.end, self.header = self._BLOCK, self.next + length, b""
                at = self.next - self.out
        self.out += len(chunk)

    def boundary(self) -> None:
        """A member ends here: inside a record unless the next one starts here."""
        if self.state == self._GAP:
            self._gap_boundary = self.out
        elif self.state == self._BLOCK or (self.state == self._HEADER and self.next < self.out):
            self.unaligned = True

    def known_next(self, lost: int) -> int | None:
        """Where in the output after the damaged member (`lost` bytes of output) the next record starts
        (CR and LF may come first), None where the damage took its header (or a header before it)."""
        if self.state == self._BLOCK:
            after = self.end - self.out - lost
        elif self.state == self._HEADER and not self.header:
            after = self.next - self.out - lost
        elif self.state == self._GAP:
            after = 0 if lost == 0 else -1
        else:
            return None
        return after if after >= 0 else None

    def fence(self) -> int:
        """Bytes of the output after the damaged member that may belong to the record the damage fell
        in, where it shows a stored WARC file: its end, were the damaged member's output nothing."""
        return max(0, self.end - self.out) if self.state == self._BLOCK and self.stored else 0


def _next_whole_member(handle: BinaryIO, start: int, size: int) -> int | None:
    """The first byte from `start` on where a gzip member starts that inflates whole (its checksum holds)."""
    handle.seek(start)
    window, base = b"", start
    while base < size:
        handle.seek(base)
        window = handle.read(CHUNK)
        at = window.find(GZIP_MEMBER_START)
        while at >= 0:
            if _inflates(handle, base + at):
                return base + at
            at = window.find(GZIP_MEMBER_START, at + 1)
        base += max(1, len(window) - len(GZIP_MEMBER_START) + 1)
    return None


def _inflates(handle: BinaryIO, offset: int) -> bool:
    try:
        for _ in GZIP.decode(handle, offset, []):
            pass
    except Undecodable:
        return False
    return True


def _record_in(handle: BinaryIO, member: int, chain: _Chain, lost: int) -> int | None:
    """Where in the output of the members from `member` on the record reading goes on at starts: where
    the chain puts it, if a version line is there, else the first header found that the record after it
    confirms, past the fence; None for none."""
    known = chain.known_next(lost)
    if known is not None:
        handle.seek(member)
        stream = _Output(gunzipped(handle))
        at = stream.past_crlf(known)
        if at is not None and _VERSION.match(stream.peek(at, 64)):
            return at
    handle.seek(member)
    stream = _Output(gunzipped(handle))
    at = chain.fence()
    while True:
        found = stream.find(b"WARC/", at)
        if found is None:
            return None
        if _confirmed(stream, found):
            return found
        at = found + 1


def _confirmed(stream: _Output, at: int) -> bool:
    """Whether a record header starts at `at` whose record is followed by another one's header, or by
    the stream's end (a record over `_MAX_CHECKED` is taken on its header alone)."""
    head = stream.peek(at, MAX_HEADER_BYTES)
    length = record_length(head) if _VERSION.match(head) else None
    if length is None:
        return False
    if length > _MAX_CHECKED:
        return True
    after = stream.past_crlf(at + length)
    if after is None:
        return stream.reaches(at + length)  # the stream ends after it, not inside it
    following = stream.peek(after, MAX_HEADER_BYTES)
    return _VERSION.match(following) is not None and record_length(following) is not None


class _Output:
    """A stream of output read forward: the bytes from the last position asked for by `find` on held."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = chunks
        self._buffer = b""
        self._base = 0  # the output position of `_buffer[0]`
        self._done = False

    def _fill(self, until: int) -> None:
        while self._base + len(self._buffer) < until and not self._done:
            try:
                chunk = next(self._chunks, b"")
            except Undecodable:  # damage further on: the output ends there, for this look
                chunk = b""
            if not chunk:
                self._done = True
            self._buffer += chunk

    def reaches(self, position: int) -> bool:
        """Whether the stream holds `position` bytes at least."""
        self._fill(position)
        return self._base + len(self._buffer) >= position

    def peek(self, position: int, count: int) -> bytes:
        self._fill(position + count)
        return self._buffer[position - self._base : position - self._base + count]

    def past_crlf(self, position: int) -> int | None:
        """The first position from `position` on that is no CR or LF, None where the stream ends first."""
        while True:
            self._fill(position + 1)
            rest = self._buffer[position - self._base : position - self._base + CHUNK]
            if not rest:
                return None
            stripped = rest.lstrip(_CRLF)
            position += len(rest) - len(stripped)
            if stripped:
                return position

    def find(self, needle: bytes, position: int) -> int | None:
        """The first position from `position` on where `needle` starts, None for none; the output before
        `position` is dropped."""
        while True:
            if position > self._base:
                self._fill(position)
                self._buffer, self._base = self._buffer[position - self._base :], position
            self._fill(position + CHUNK)
            at = self._buffer.find(needle)
            if at >= 0:
                return self._base + at
            if self._done:
                return None
            position = max(position, self._base + len(self._buffer) - len(needle) + 1)


class Inflating:
    """The output of the gzip members from a byte on, after its first `skip` bytes: a plain WARC stream
    FastWARC reads from its position 0 (its offsets are positions of it, no file's bytes). A member that
    does not inflate is an `OSError` (no errno: the content's fault), as FastWARC's own is."""

    def __init__(self, handle: BinaryIO, member: int, skip: int) -> None:
        handle.seek(member)
        self._chunks = gunzipped(handle)
        self._skip = skip
        self._pending = b""
        self._position = 0
        self._error: Undecodable | None = None

    def read(self, size: int = -1) -> bytes:
        while self._error is None and (self._skip or size < 0 or len(self._pending) < size):
            try:
                chunk = next(self._chunks, b"")
            except Undecodable as exc:  # raised once what came before it is read
                self._error = exc
                break
            if not chunk:
                break
            if self._skip:
                dropped = min(self._skip, len(chunk))
                chunk, self._skip = chunk[dropped:], self._skip - dropped
            self._pending += chunk
        if not self._pending and self._error is not None:
            raise OSError(f"Gzip decompression error: {self._error}")
        out = self._pending if size < 0 else self._pending[:size]
        self._pending = self._pending[len(out) :]
        self._position += len(out)
        return out

    def tell(self) -> int:
        return self._position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        """Where it is (FastWARC reads forward only); any move is `io.UnsupportedOperation`."""
        if (offset, whence) in ((0, io.SEEK_CUR), (self._position, io.SEEK_SET)):
            return self._position
        raise io.UnsupportedOperation("the output of gzip members reads forward only")

    def close(self) -> None:
        """Nothing: the file is the caller's."""
