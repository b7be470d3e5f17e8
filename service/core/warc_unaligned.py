"""Where reading goes on after a corrupt gzip member in a .warc.gz whose members are cut where its records
are not (bgzip's BGZF blocks, pgzip's fixed-size pieces of one stream): the member after the damaged one
starts inside a record, so no member starts a record that `warc_skip.skip_member` could go on at, and the
first corrupt member had ended the file, every record after it lost.

The members from where the reading began are inflated again, one after another, and the records walked
through their output by the Content-Length of each (`_Chain`), up to the member that does not inflate.
Reading goes on in the first member after it that inflates whole (for BGZF, the block its header's size
says, so never a member of a stored download that deflate kept as it is inside the damaged block), at
the record the chain puts there: the damaged member's output is as long as its trailer's size says, so
where the damage spared the trailer and the record the damage fell in has its header before it, the
next record starts at a known byte of that member's output, and a version line there confirms it. Else
(the trailer damaged too, a header lost in the damage) at the first version line in the output that
starts a header with a Content-Length from which the records, walked by theirs, run on to the output's
end, none of them cut by the file's end (`_walks_out`: a stored download's record may be cut so);
never inside the record the damage fell in where that record shows a stored WARC file (`warc_fence`
keeps the same fence for per-record files), and where the damage took the header of a record that is
one, after the end of it that its last record's CR LF CR LF and its own together mark (a stored WARC
file whose last record lacks its CR LF CR LF is not told so), so none of its records becomes a page.
FastWARC then reads that output, from that record on, as a plain WARC stream (`Inflating`). The output is
looked through forward, the bytes before the position looked at dropped as they come (`_Output`): a
record gigabytes long costs its bytes once, never its size in memory.

Only a file whose members are seen cut where records are not is read on so (a member boundary inside a
record, or BGZF's extra field): in a file written a member per record, a member found by its magic inside
a damaged one may be a stored download's, which `skip_member` fences.
"""

from __future__ import annotations

import copy
import io
import re
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO, NamedTuple

from service.core.warc_fence import holds_stored_warc
from service.core.warc_frames import CHUNK, GZIP_MAGIC, GZIP_MEMBER_START, ForwardOnly, Undecodable
from service.core.warc_gzip import GZIP, gunzipped, member_follows
from service.core.warc_tail import MAX_HEADER_BYTES, record_length

_VERSION = re.compile(rb"WARC/(?:1\.[01]|0\.[^\r\n]{0,2})[ \t\r]*\n")
_CRLF = b"\r\n"
_BGZF_FLAGS = 0x04  # FEXTRA: a BGZF block's header holds its size there, under the subfield "BC"
_BGZF_MAX_OUTPUT = 1 << 16  # the most a BGZF block inflates to
_MORE_PIECES = 3  # members cut out of the file whose output the place of the next record is tried for


class Resync(NamedTuple):
    """Where `resync` has reading go on."""

    failed: int  # where the member that does not inflate starts
    member: int  # where the member reading goes on in starts
    skip: int  # bytes of the output of the members from `member` on before the record reading goes on at
    whole: int  # records walked whole before the damaged member's output (the rest reach into it)


def is_bgzf(path: Path, offset: int = 0) -> bool:
    """Whether the file's member at byte `offset` (its first by default) is a BGZF block (bgzip's layout,
    cut where records are not), by the rule every block is told by (`is_bgzf_block`: its extra field's
    subfields walked to "BC"). Its first subfield's bytes alone had been the rule here: a file whose
    blocks carry another subfield first was bgzip's to the walk and not to this. `offset`: files joined
    by `cat` may be compressed each its own way (a bgzip file, then one written a member per record)."""
    with path.open("rb") as handle:
        return is_bgzf_block(handle, offset)


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


def joined_unaligned(path: Path, start: int) -> bool:
    """Whether the members of a file joined to another at byte `start` (after empty members), whose first
    member does not decode, are cut where its records are not: that member is a BGZF block, or the first
    member after it that inflates whole to some bytes inflates to no record's start (pgzip's). The
    members before the empty ones are another file's, no sign of this one's; those after its damaged
    first one are, as the member at a record FastWARC framed is to `members_unaligned`. Empty members
    after it say nothing (taken for the member after it, a file written a member per record, with an
    empty one after each, was read as pgzip's, and its intact records after the damage were lost)."""
    if is_bgzf(path, start):
        return True
    with path.open("rb") as handle:
        size = handle.seek(0, io.SEEK_END)
        after = _next_whole_member(handle, start + 1, size)
        while after is not None:
            inflated = _inflated(handle, after)
            if inflated is None:  # never: it inflated whole
                return False
            if inflated[0]:
                handle.seek(after)
                return not GZIP.starts_record(memoryview(handle.read(GZIP.probe)))
            # An empty one: the next starts where it ends (no scan per empty member), else by its magic.
            after = inflated[1]
            if _inflated(handle, after) is None:
                after = _next_whole_member(handle, after, size)
    return False


def resync(path: Path, start: int, skip: int, *, unaligned: bool, at_member: bool = False) -> Resync | None:
    """Where reading can go on after the first member from byte `start` on (whose output, after `skip`
    bytes of it, starts a record) that does not inflate; None where it cannot: every member inflates, no
    member after the damaged one inflates whole, no record is found after it, or the members were not
    seen cut where records are not (`unaligned`: the caller saw it). `at_member`: a member starts at
    `start` whatever its first bytes say (its magic may be the damage): where reading went on after
    empty members. Inflates the file from `start` once more (not where no member after the first
    inflates whole), and from the damaged member on twice more at most (the records after it walked to
    the output's end, once, and read)."""
    with path.open("rb") as handle:
        handle.seek(start)
        if handle.read(2) != GZIP_MAGIC and not at_member:
            return None
        size = handle.seek(0, io.SEEK_END)
        # No member after the first that inflates whole (a file compressed as one stream): nowhere to go
        # on, told by its bytes and the few members its magic starts by chance, never by inflating it all.
        if _next_whole_member(handle, start + 1, size) is None:
            return None
        chain = _Chain(skip)
        position, piece = start, 0  # `piece`: the output of the last member that inflated
        while position < size:
            ends: list[int] = []
            # The chain as the member found it: what a damaged member gave before its damage (garbage,
            # where only its checksum fails) is counted in its trailer's size, not walked.
            before = copy.copy(chain)
            try:
                for chunk in GZIP.decode(handle, position, ends):
                    chain.feed(chunk)
            except Undecodable:
                chain = before
                break
            position, piece = ends[0], chain.out - before.out
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
        resumed = _after_damage(handle, position, size, piece)
        if resumed is None:
            return None
        after, lost, told = resumed
        found = _record_in(handle, after, chain, lost, piece, told=told)
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

    def fence(self, lost: int) -> int:
        """Bytes of the output after the damaged members (`lost` bytes of output, as their trailers tell;
        0 where they do not) that may belong to the record the damage fell in, where it shows a stored
        WARC file: its end. Not less the damaged members' output, the search had begun that far into the
        records after the download, and those before its start been lost."""
        return max(0, self.end - self.out - lost) if self.state == self._BLOCK and self.stored else 0


def _after_damage(handle: BinaryIO, failed: int, size: int, piece: int) -> tuple[int, int, bool] | None:
    """The first member after the one at byte `failed` that inflates whole, the output of those before it
    from `failed` on, by their trailers (a size no BGZF data block has, a trailer zeroed, taken for
    `piece`, the output of the member before: bgzip and pgzip cut the stream in pieces of one size), and
    whether their trailers told it (each a size such a member has: a BGZF block's, or pgzip's `piece`);
    None for none.

    A BGZF block says where it ends (its header's BSIZE): the blocks are walked so, their sizes summed,
    to the first that inflates. Looked for by its magic instead, the first member found may lie inside
    the damaged block, where deflate stored a .warc.gz download as it is: one of its members, whose
    records had become pages. Where the walk finds no block (a header damaged, bytes cut out), the
    members are looked for by their magic from the damaged one on, and in a bgzip file only BGZF blocks
    taken (a download's members are plain gzip)."""
    lost, at, told = 0, failed, True
    while (end := _bgzf_end(handle, at)) is not None and end < size:
        handle.seek(end - 4)
        block = int.from_bytes(handle.read(4), "little")
        told = told and 0 < block <= _BGZF_MAX_OUTPUT
        lost += block if 0 < block <= _BGZF_MAX_OUTPUT else piece
        if _inflates(handle, end):
            return end, lost, told
        at = end
    # No block where a damaged one's header says (the damage took bytes out, or a header): the first
    # member found that inflates, a BGZF block in a bgzip file. Where it comes after the blocks walked,
    # the one before it is the block whose header was damaged: the walked blocks' output and its own.
    bgzf = at != failed or is_bgzf_block(handle, 0)
    after = _next_whole_member(handle, failed + 1, size, bgzf=bgzf, piece=0 if bgzf else piece)
    if after is None:
        return None
    handle.seek(after - 4)
    last = int.from_bytes(handle.read(4), "little")  # the last damaged member's, by its trailer
    told = told and (0 < last <= _BGZF_MAX_OUTPUT if bgzf else 0 < last == piece)
    return after, last + (lost if after > at else 0), told


def is_bgzf_block(handle: BinaryIO, offset: int) -> bool:
    """Whether a BGZF block's header (its extra subfield "BC") is at byte `offset`."""
    return _bgzf_end(handle, offset) is not None


def _bgzf_end(handle: BinaryIO, offset: int) -> int | None:
    """Where the BGZF block at byte `offset` ends by its header's BSIZE, None where no BGZF header is
    there (none, or one the damage took)."""
    handle.seek(offset)
    header = handle.read(12)
    if len(header) < 12 or header[:3] != GZIP_MEMBER_START or not header[3] & _BGZF_FLAGS:
        return None
    extra = handle.read(int.from_bytes(header[10:12], "little"))
    at = 0
    while at + 4 <= len(extra):
        length = int.from_bytes(extra[at + 2 : at + 4], "little")
        if extra[at : at + 2] == b"BC" and length == 2 and at + 6 <= len(extra):
            return offset + int.from_bytes(extra[at + 4 : at + 6], "little") + 1
        at += 4 + length
    return None


def _next_whole_member(
    handle: BinaryIO, start: int, size: int, *, bgzf: bool = False, piece: int = 0
) -> int | None:
    """The first byte from `start` on where a gzip member starts that inflates whole (its checksum holds);
    `bgzf`: a BGZF block only; `piece`: one that inflates to that many bytes, or ends the file (pgzip
    cuts the stream in pieces of one size, and a stored download's member inside a damaged one, which
    inflates whole, holds a record of its own size)."""
    handle.seek(start)
    window, base = b"", start
    while base < size:
        handle.seek(base)
        window = handle.read(CHUNK)
        at = window.find(GZIP_MEMBER_START)
        while at >= 0:
            if not bgzf or is_bgzf_block(handle, base + at):
                inflated = _inflated(handle, base + at)
                if inflated is not None and (not piece or inflated[0] == piece or _ends(handle, inflated[1])):
                    return base + at
            at = window.find(GZIP_MEMBER_START, at + 1)
        base += max(1, len(window) - len(GZIP_MEMBER_START) + 1)
    return None


def _ends(handle: BinaryIO, end: int) -> bool:
    """Whether nothing but padding follows byte `end`."""
    handle.seek(end)
    return handle.read(len(GZIP_MEMBER_START)) != GZIP_MEMBER_START and member_follows(handle, end)


def _inflates(handle: BinaryIO, offset: int) -> bool:
    return _inflated(handle, offset) is not None


def _inflated(handle: BinaryIO, offset: int) -> tuple[int, int] | None:
    """What the member at `offset` inflates to (bytes) and where it ends; None where it does not inflate."""
    ends: list[int] = []
    out = 0
    try:
        for chunk in GZIP.decode(handle, offset, ends):
            out += len(chunk)
    except Undecodable:
        return None
    return out, ends[0]


def _record_in(
    handle: BinaryIO, member: int, chain: _Chain, lost: int, piece: int, *, told: bool = False
) -> int | None:
    """Where in the output of the members from `member` on the record reading goes on at starts: where
    the chain puts it, if a version line is there; else where it puts it were `_MORE_PIECES` members of
    `piece` bytes of output lost too (bytes cut out of the file took whole members, whose trailers say
    nothing), if the records from there on run on to the output's end (`_walks_out`: only a record's
    start does so); else the first header found past the fence (less the damaged members' output where
    their trailers `told` it) whose records do; None for none."""
    for more in range(_MORE_PIECES + 1 if piece else 1):
        known = chain.known_next(lost + more * piece)
        if known is None:
            break
        handle.seek(member)
        stream = _Output(gunzipped(handle))
        at = stream.past_crlf(known)
        if (
            at is not None
            and _VERSION.match(stream.peek(at, 64))
            and (more == 0 or _walks_out(stream, at) == at)
        ):
            return at
    handle.seek(member)
    stream = _Output(gunzipped(handle))
    at = chain.fence(lost if told else 0)
    while True:
        found = stream.find(b"WARC/", at)
        if found is None:
            return None
        start = _walks_out(stream, found)
        if start is not None:
            return start
        at = max(found + 1, stream.position)


def _walks_out(stream: _Output, at: int) -> int | None:
    """Where reading can go on from a header found at `at` where the damage took the header before it (or
    its record's end): there, where the records from it on, walked by their Content-Length, follow one
    another to the output's end (or the next damage) with no more than a record's CR LF CR LF between
    two; the first record after a longer run of them where one comes; None where the walk meets a byte
    that starts no header (`stream.position` says where the search goes on), or a record the output's
    end cuts, but where more damage ends it (the search ends: whatever follows lies inside it).

    A record the damage took the header of may be a stored WARC download, whose records lie in the
    output as they are: the first header found is then one of them, and read on from there, every one
    had become a page. Its last record's CR LF CR LF and its own come together at its end: the records
    read on from after them are the file's own. The walk reads the rest of the output once (its memory
    bounded by a chunk): a damaged file costs one more inflation of it, never one per candidate."""
    start = at
    while True:
        head = stream.peek(at, MAX_HEADER_BYTES)
        length = record_length(head) if _VERSION.match(head) else None
        if length is None:
            stream.position = max(stream.position, at + 1)
            return None
        end = at + length
        whole = bool(stream.peek(end - 1, 1))  # the output holds its last byte
        following = stream.past_crlf(end)
        if following is None:
            if whole or stream.broken:
                return start  # the output ends after it, or inside it at damage further on
            # The file's output ends inside it: a record cut so may be a stored download's, whose own
            # header declares more than the download kept of it (a download written with WARC-Truncated),
            # and the records walked to it its records too. No byte tells, so none is read on at: the
            # records after the damage are lost (an error row), never made pages of.
            stream.position = max(stream.position, end)
            return None
        if following - end > len(_CRLF) * 2:  # a stored WARC file's end: what came before may be its own
            start = following
        at = following


class _Output:
    """A stream of output read forward: the bytes from the last position asked for on held, those before
    it dropped as they come, so a record megabytes long costs its bytes once and no memory beyond a chunk
    (held as one growing bytes object and cut at each chunk, it had made the walk quadratic)."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = chunks
        self._buffer = bytearray()
        self._base = 0  # the output position of `_buffer[0]`
        self._done = False
        self.broken = False  # the output ended at a member that does not inflate, not at the file's end
        self.position = 0  # where a search goes on (`_walks_out`)

    def _fill(self, start: int, until: int) -> None:
        """Hold the output from `start` (nothing before it is asked for again) up to `until` at least."""
        self._drop(start)
        while self._base + len(self._buffer) < until and not self._done:
            try:
                chunk = next(self._chunks, b"")
            except Undecodable:  # damage further on: the output ends there, for this look
                chunk, self.broken = b"", True
            if not chunk:
                self._done = True
            elif self._base + len(self._buffer) + len(chunk) <= start:  # wholly before what is asked
                self._base += len(chunk)
            else:
                self._buffer += chunk
                self._drop(start)

    def _drop(self, start: int) -> None:
        """Drop what is held before `start`."""
        dropped = min(max(0, start - self._base), len(self._buffer))
        del self._buffer[:dropped]
        self._base += dropped

    def peek(self, position: int, count: int) -> bytes:
        self._fill(position, position + count)
        return bytes(self._buffer[position - self._base : position - self._base + count])

    def past_crlf(self, position: int) -> int | None:
        """The first position from `position` on that is no CR or LF, None where the stream ends first."""
        while True:
            self._fill(position, position + 1)
            rest = bytes(self._buffer[position - self._base : position - self._base + CHUNK])
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
            self._fill(position, position + CHUNK)
            at = self._buffer.find(needle, position - self._base)
            if at >= 0:
                return self._base + at
            if self._done:
                return None
            position = max(position, self._base + len(self._buffer) - len(needle) + 1)


class Inflating(ForwardOnly):
    """The output of the gzip members from a byte on, after its first `skip` bytes: a plain WARC stream
    FastWARC reads from its position 0 (its offsets are positions of it, no file's bytes). A member that
    does not inflate is an `OSError` (no errno: the content's fault), as FastWARC's own is."""

    _what = "the output of gzip members"

    def __init__(self, handle: BinaryIO, member: int, skip: int) -> None:
        super().__init__()
        handle.seek(member)
        self._chunks = gunzipped(handle)
        self._skip = skip
        self._pending = b""
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
