"""Whether a WARC file ends with whole records: the check `pages` makes where FastWARC stopped.

FastWARC ends quietly (or hands back an empty record) where a killed writer cut a file inside a
record's header, and stops without a word where an LZ4 frame or a single-member gzip stream is cut; a
page lost that way would be lost without a trace. So after the last record FastWARC framed, the rest
of the file is walked by the records' Content-Length, decompressed as it goes (one chunk in memory):

- a plain file, and a gzip file with one member per record, from that record's offset;
- a gzip file compressed as one stream or in members cut where records are not (bgzip, pgzip), and any
  LZ4 file, from the start (an LZ4 file's reading, from the frame `skip_member` went on at after a
  corrupt one): FastWARC's offsets inside such a stream are positions of its read buffer, not of
  records (decompression is the cost: one more pass, at hundreds of MB/s for gzip and GB/s for LZ4); an
  LZ4 file's frames are checked first, since its decoder reads a cut frame header as a clean end;
- zstd files are not walked: FastWARC reports a cut zstd frame itself.

FastWARC also ends quietly at an empty gzip member (a valid one whose payload is 0 bytes: bgzip ends every
file with one, so two bgzip files joined by `cat`, as WARC allows, hold one between them) and at an empty
LZ4 frame that starts the file or follows another: its reader hands back no byte there, which its record
iterator takes for the end. The same walk marks where a member that decodes to bytes follows such ones
(`gunzipped_marked`; an LZ4 file's by its frame headers), and where the records walked whole before a
mark are as many as FastWARC framed, reading goes on at that member (`reading_end`, `_Mark`), as if the
empty members were not there; the walk goes no further than that mark. An intact file has no mark: its
walk is the one it had. Where reading went on past damage, at a member found by its magic (which may be
one of a stored download's), only where the whole rest of the file walks as whole records (`trusted`).

Where FastWARC fails inside a file compressed per record (a corrupt gzip member, zstd frame or LZ4 frame),
`skip_member` finds the member it failed on and the next one that starts a record, where reading can go
on: crawlers write a member per record precisely so that a reader can pass over a damaged one. Each of
the three formats lets a reader find the next one: a member or frame starts with its magic number, and a
candidate is taken only where it decodes to the start of a WARC record (`Framing`), after the damaged
member where its end can be told (a frame's block sizes; a gzip member's deflate data, where its trailer
fails one check alone), and never inside one whose record holds a stored WARC file (`_past_damage`: a
crawled .warc.gz holds members of its own); else from the next byte on, since a fence everywhere took the
intact records after everyday damage. A file compressed as one stream has no next one (FastWARC's offsets
inside it are no member starts): it ends with one row.
The file's compression is told by its magic, else by its name, as FastWARC picks its decoder: a first
member whose header is corrupt is passed over too. How each compression's members are decoded and found
(a zstd file's dictionary included) is `warc_frames`'.

Records are walked as FastWARC frames them (but for a header whose lines end in bare LF, which `warc_pages`
reads apart: `bare_lf_record_end`): each starts with the version line FastWARC takes (WARC/1.0,
WARC/1.1 or WARC/0.x), so a member that decodes to anything else (a stray HTTP response, `warc/1.1`,
`WARC/2.0`) is the one FastWARC failed on, not the intact record before it. Padding that ends a file
(NULs, blank lines, as a writer pads to a block) is no member: FastWARC fails on it, `ends_in_padding`
tells that failure apart: only bytes after the last member's end, as its compression frames it, are
padding. A header over the bound FastWARC reads (`MAX_HEADER_BYTES`) is no record either.
"""

from __future__ import annotations

import io
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import BinaryIO, NamedTuple

from service.core.warc_frames import (
    CHUNK,
    GZIP,
    GZIP_MAGIC,
    GZIP_MEMBER_START,
    LZ4,
    LZ4_MAGIC,
    PADDING,
    ZSTD_DICTIONARY_MAGIC,
    ZSTD_MAGIC,
    Framing,
    Undecodable,
    gunzipped,
    gunzipped_marked,
    holds_gzip_records,
    inflate_member,
    lz4_marks,
    lz4_output,
    member_follows,
    zstd_framing,
)

# The most bytes FastWARC reads of a record's WARC header, its CRLF CRLF included (`warc_pages` passes it
# as `max_header_len`, FastWARC's default; tried on FastWARC 2.0.1): a longer one is "Maximum header
# length exceeded", so the walk refuses it too. Walked up to 1 MiB, a record with a 40,000-character
# WARC-Target-URI (as wget writes one) was taken for whole, and the intact page before it blamed.
MAX_HEADER_BYTES = 32 << 10
_NO_END = f": no blank line ends one within the {MAX_HEADER_BYTES} bytes FastWARC reads of a header"
_CONTENT_LENGTH = re.compile(rb"(?im)^content-length:[ \t]*(\d+)[ \t]*\r?$")
_PADDING_PIECE = 4096  # bytes of what may be padding read at a time (`_only_padding`)
_GZIP_HEADER_ROOM = 1 << 10  # a gzip member's header, with a file name or comment (which records have none)
_LOOK = 64 << 10  # bytes of a damaged gzip member's output looked at for a stored WARC file
# The media types of a WARC file, compressed or not, in a record's WARC header or HTTP head (not a
# warcinfo record's application/warc-fields).
_WARC_MEDIA_TYPE = re.compile(
    rb"(?im)^content-type:[ \t]*application/(?:x-)?(?:warc|gzip|gzip-compressed|zstd|lz4)[ \t]*(?:;|\r?$)"
)
# What a stored WARC file starts with whose members are no gzip members (`holds_stored_warc`).
_NO_GZIP_MEMBERS = (b"WARC/", ZSTD_MAGIC, ZSTD_DICTIONARY_MAGIC, LZ4_MAGIC)
# A record's whole version line as FastWARC reads it (tried on FastWARC 2.0.1: WARC/1.0 and WARC/1.1,
# WARC/0. and up to two more characters, blanks after; `warc_frames._RECORD_START` its first bytes).
_VERSION_LINE = re.compile(rb"WARC/(?:1\.[01]|0\.[^\r\n]{0,2})[ \t\r]*\n")
# A header's end, its blank line: after lines ended in CRLF, or in bare LF (`bare_lf_record_end`).
_HEADER_END = re.compile(rb"\r?\n\r?\n")


class ReadingEnd(NamedTuple):
    """What `reading_end` finds after the last record FastWARC read without an error."""

    problem: str | None  # why the file does not end with whole records there; None where it does
    # Where a member starts that reading goes on at: FastWARC stopped at the empty members before it.
    resume: int | None = None


class _Resume(Exception):
    """The walk found where FastWARC stopped at empty members: reading goes on at `member`."""

    def __init__(self, member: int) -> None:
        super().__init__(member)
        self.member = member


class _Retry(Exception):
    """The records walked from the record FastWARC framed last are not those it framed there: the walk
    is made again from where the reading began."""


def reading_end(
    path: Path,
    offset: int,
    start: int = 0,
    *,
    skip: int | None = None,
    here: int = 0,
    since: int = 0,
    trusted: bool = True,
) -> ReadingEnd:
    """Whether `path` ends with complete records from the one at byte `offset` on (else why not), and
    where reading goes on where FastWARC stopped before the file's end at empty members (`_Mark`).
    `start`: where the reading began (0, or the member reading went on at): a file whose offsets are no
    member starts (LZ4, one gzip stream) is walked from there, since the members before it were read
    before. `skip`: the reading was of the output of the gzip members from `start` on, after that many
    bytes of it (`warc_unaligned`), and `offset` is a position of that output (which FastWARC read from
    this module's decoder: no empty member stops it). `here`: the records FastWARC framed at `offset`;
    `since`: from `start` on.

    `trusted`: the reading began where no damage was passed over before it. Where it went on after a
    damaged member, at one found by its magic (`skip_member`, which may land inside a stored .warc.gz
    download where the damage hid it), reading goes on at a mark only where the walk of the rest of the
    file finds whole records to its end: the walk is the whole one it was before marks were read, and
    its finding is kept. A download's members are followed by the bytes of the record that stores them,
    which are none, so its records never become pages (trusted, each of its members that follows an
    empty one had been read as the file's)."""
    with path.open("rb") as handle:
        if skip is not None:
            handle.seek(start)
            return ReadingEnd(_walk_problem(_skipped(gunzipped(handle), skip), 0, "gzip", start=start))
        compression = _compression(path, handle.read(4))
        if compression == "zstd":  # FastWARC's zstd reader passes empty frames over
            return ReadingEnd(None)
        try:
            if compression == "lz4":
                at_mark = _Mark(since, trusted=trusted)
                return at_mark.finding(_lz4_problem(handle, start, at_mark))
            if compression == "gzip":
                if _opens_record_member(handle, offset, GZIP):
                    at_mark = _Mark(here, first=True, trusted=trusted)
                    handle.seek(offset)
                    try:
                        marked = gunzipped_marked(handle)
                        return at_mark.finding(_walk_problem(marked, offset, "gzip", at_mark=at_mark))
                    except _Retry:
                        pass
                # One gzip stream, or members cut where records are not (bgzip, pgzip): FastWARC's offset
                # is no record's start.
                at_mark = _Mark(since, trusted=trusted)
                handle.seek(start)
                marked = gunzipped_marked(handle)
                return at_mark.finding(_walk_problem(marked, 0, "gzip", start=start, at_mark=at_mark))
        except _Resume as found:
            return ReadingEnd(None, found.member)
        handle.seek(offset)
        return ReadingEnd(_walk_problem(iter(lambda: handle.read(CHUNK), b""), offset, None))


class _Mark:
    """What the walk does at a mark in the output (`warc_frames.gunzipped_marked`): a member that decodes
    to bytes follows one empty member or more, where FastWARC's reader hands back no byte and FastWARC
    takes that for the file's end (FastWARC 2.0.1: an empty gzip member, an empty LZ4 frame where it
    starts the file or follows another). Reading goes on at that member where the records walked whole
    before the mark, the walk between two records there, are as many as FastWARC framed (`expected`).
    Fewer: FastWARC passed that mark over (it does, where a read of it ends with the member before),
    and the walk goes on to the next; more: FastWARC stopped before it, which the walk tells or not, as
    before.

    `first`: the walk began at the member of the record FastWARC framed last, so FastWARC stopped at the
    first mark, if at one (a record after it would have been framed at a later member); the records
    walked before it are `expected` only where that member's offset was each record's own (a member per
    record: bgzip's and pgzip's members cut where records are not, and FastWARC names a record by the
    member its reading had reached, not always the one it starts in), else the walk is made again from
    where the reading began (`_Retry`).

    Not `trusted` (`reading_end`): nothing is raised; the first mark that decides is kept (`resume`), and
    the walk goes on to the file's end as it did before marks were read (`finding`)."""

    def __init__(self, expected: int, first: bool = False, *, trusted: bool = True) -> None:
        self.expected = expected
        self.first = first
        self.trusted = trusted
        self.decided = False
        self.resume: int | None = None

    def __call__(self, member: int, records: int, between: bool) -> None:
        if self.decided or records > self.expected:
            return
        if between and records == self.expected:
            if self.trusted:
                raise _Resume(member)
            self.resume, self.decided = member, True
        elif self.first:
            if self.trusted:
                raise _Retry
            self.decided = True  # walked on from the member, as before marks were read: no resume

    def finding(self, problem: str | None) -> ReadingEnd:
        """`reading_end`'s finding where the walk ended with `problem`: a resume kept (not `trusted`)
        only where the rest of the file is whole records."""
        return ReadingEnd(problem, self.resume if problem is None else None)


def _skipped(chunks: Iterator[bytes], skip: int) -> Iterator[bytes]:
    """`chunks` but for their first `skip` bytes."""
    for chunk in chunks:
        if skip >= len(chunk):
            skip -= len(chunk)
            continue
        yield chunk[skip:]
        skip = 0


def bare_lf_record_end(path: Path, offset: int) -> int | None:
    """Where the record at byte `offset`, whose WARC header lines end in bare LF, ends, so that reading
    can go on after it: in a plain file, after its header's blank line and its Content-Length; in one
    compressed per record, at the end of its member, where that member holds this record alone. None
    where that cannot be told: no such header with a Content-Length there, a member that holds more, a
    file compressed as one stream (FastWARC's offsets in it are no record starts); `Undecodable` where
    its member does not decode (damaged or cut: the failure FastWARC meets there is the record's row).

    FastWARC (2.0.1) reads a header's lines by CRLF alone: the LF-ended lines are one value of the first
    field, and the header runs on to the next CRLF CRLF (the HTTP head's, or the next record's), so the
    record was skipped as of an unknown type, with no row. Its quirks mode reads them, but it also
    passes over bytes that are no record without a word, so `warc_pages` reads only this record in it."""
    with path.open("rb") as handle:
        framing = _file_framing(path, handle)
        if framing is None:
            handle.seek(offset)
            declared = record_length(handle.read(MAX_HEADER_BYTES))
            return None if declared is None else offset + declared
        if not _opens_record_member(handle, offset, framing):
            return None
        ends: list[int] = []
        head, declared, position = b"", None, 0  # `position`: the output before `chunk`
        for chunk in framing.decode(handle, offset, ends):
            if declared is None:
                head += chunk[: MAX_HEADER_BYTES - len(head)]
                declared = record_length(head)
                if declared is None and len(head) >= MAX_HEADER_BYTES:
                    return None
            if declared is not None and chunk[max(0, declared - position) :].strip(PADDING):
                return None  # the member holds more than this record
            position += len(chunk)
    return ends[0] if declared is not None and position >= declared else None


def nothing_after(path: Path, offset: int) -> bool:
    """Whether the file holds nothing after byte `offset` but the padding that may end it (`PADDING`) and,
    in a zstd or LZ4 file, skippable frames (which FastWARC's decoders pass over): where reading would go
    on after a record read alone (`bare_lf_record_end`), there is nothing to read. Read from there,
    FastWARC took such bytes for a record it cannot read (a false error row), and the end of a zstd file
    with a dictionary (the dictionary frame handed to it alone) for a cut frame."""
    with path.open("rb") as handle:
        skippable = _compression(path, handle.read(4)) in ("zstd", "lz4")
        size = handle.seek(0, io.SEEK_END)
        position = offset
        while position < size:
            handle.seek(position)
            head = handle.read(8)
            if not (skippable and len(head) == 8 and head[1:4] == b"\x2a\x4d\x18" and head[0] & 0xF0 == 0x50):
                return _only_padding(handle, position, size)
            position += 8 + int.from_bytes(head[4:], "little")
    return position == size  # not a skippable frame cut off


def record_length(head: bytes) -> int | None:
    """The bytes of the record whose first bytes are `head`, header and block, by its header's first
    blank line (after lines ended in LF or CRLF) and its Content-Length; None for no such header."""
    blank = _HEADER_END.search(head)
    if blank is None or _VERSION_LINE.match(head, 0, blank.end()) is None:
        return None
    length = _CONTENT_LENGTH.search(head, 0, blank.start())
    return None if length is None else blank.end() + int(length.group(1))


class Skip(NamedTuple):
    """Where `skip_member` has reading go on."""

    failed: int  # where the member FastWARC could not read starts
    resume: int  # where the next member that starts a record starts
    # The member at `failed` decodes to its end, to bytes that are no WARC records FastWARC reads (a
    # stray HTTP response, `WARC/2.0`), rather than not decoding.
    stray: bool = False
    why: str = ""  # what the walk found wrong with a stray member's bytes (a header over FastWARC's limit)
    member: str = "member"  # what the compression's members are called: "gzip member", "zstd frame", ...
    decodes: bool = False  # the member at `failed` decodes to its end (to records or not)
    last: bool = False  # the file ends with the member at `failed`: `resume` is the file's size


def skip_member(path: Path, offset: int, *, framed: bool, at_member: bool = False) -> Skip | None:
    """Where reading a file compressed per record (gzip members, zstd or LZ4 frames) can go on after
    FastWARC failed on it, or None where it cannot (a file compressed as one stream, a plain one, no
    record after).

    `offset` is where the last record FastWARC framed starts; `framed`: that record was read whole, so
    the member FastWARC failed on is the next one, if that record's own member decodes to its end and to
    whole records and the next one does not. Else the failure was in its own: its rest unread, or its
    data decoded to bytes FastWARC frames otherwise (LZ4 without checksums cannot tell corrupt data, nor
    zstd's raw blocks), and reading goes on at the next member. Where no record was framed (reading
    began at `offset`), the member there is the one that failed: stray where it decodes to its end but
    to no records FastWARC reads (a header over its bound, which wget writes for a 40,000-character URL),
    and `Skip.why` says what is wrong. `at_member`: `offset` is where a member ends that a record was read
    from alone (`bare_lf_record_end`), so a member starts there, whatever its first bytes say (its magic
    may be the damage). Reads the file once more at most: the members at `offset` and after it, then
    forward from the failed one to the next record's member.
    """
    with path.open("rb") as handle:
        framing = _file_framing(path, handle)
        if framing is None:
            return None
        offset = max(offset, framing.first)  # not the dictionary frame a zstd file starts with
        handle.seek(offset)
        # A member starts at the file's first one (never framed) and `at_member`, whose magic may be the
        # damage; elsewhere only where its magic says so.
        known = at_member or (offset == framing.first and not framed)
        if not known and handle.read(len(framing.start)) != framing.start:
            return None  # one stream: FastWARC's offset is no member start
        # The member that failed, and where it ends where it decodes to its end: the next one may start
        # there, or where `_past_damage` says (never inside a damaged member).
        failed, failed_end, why = offset, None, None
        end, problem = _member_walk(handle, offset, framing)
        if framed and end is not None:
            next_end, next_problem = _member_at(handle, end, framing)
            if problem is None and next_problem is not None:
                failed, failed_end = end, next_end
                why = next_problem if next_end is not None else None
            else:
                failed_end = end
        elif end is not None:  # reading began at this member: FastWARC failed on it, or on what it decodes to
            failed_end, why = end, problem
        fence = _Fence(failed_end) if failed_end is not None else _past_damage(handle, failed, framing)
        start = _next_record_member(handle, failed + 1, framing, fence)
    if start is None:
        return None
    what = "" if why is None else f"{why[0]}{why[2]}"
    return Skip(failed, start, why is not None, what, framing.member, failed_end is not None)


def last_member_fails(path: Path, offset: int) -> Skip | None:
    """The member at byte `offset`, which FastWARC read a record from whole before it failed and after
    which `skip_member` found none, as a `Skip` to the end of the file (`Skip.last`) where it does not
    decode to its end: the record read from it may be garbage (an LZ4 or zstd frame's checksum is checked
    at its end, after FastWARC handed its bytes on). None where it decodes (the failure is after it; a
    member cut where records are not, as bgzip writes them, decodes to part of a record) or no record's
    member starts there (a plain file; a file compressed as one stream, its offsets no member starts)."""
    with path.open("rb") as handle:
        framing = _file_framing(path, handle)
        if framing is None or not _opens_record_member(handle, offset, framing):
            return None
        end, _ = _member_walk(handle, offset, framing)
        size = handle.seek(0, io.SEEK_END)
    return None if end is not None else Skip(offset, size, member=framing.member, last=True)


def ends_in_padding(path: Path, offset: int, start: int, *, here: int, since: int) -> bool:
    """Whether what FastWARC failed on, after reading the record it framed at `offset` whole, is the
    padding that ends the file (`PADDING`: NULs, blank lines), which FastWARC takes for a member or a
    record it cannot read. So only where the bytes before the padding decode to whole records, exactly
    as many as FastWARC framed: `here` from `offset` where a member starts there (or the file is plain),
    else `since` from `start` (a file compressed as one stream: FastWARC's offsets are no member starts).

    Padding is what follows the end of the last member as its compression frames it, never bytes of a
    member: an LZ4 frame ends in its four-NUL end mark, a gzip member in its size (NULs high), a zstd
    frame without checksum in its last record's CRLF CRLF. Taken from the file's last bytes, that was
    padding in every such file, and the last record, corrupt where its compression cannot tell, was lost
    without a row. Costs a look at the file's last byte where no padding can end it; else a decode of
    the records FastWARC framed, and of one more at most.
    """
    with path.open("rb") as handle:
        size = handle.seek(0, io.SEEK_END)
        handle.seek(size - 1)
        if size == 0 or handle.read(1) not in PADDING:
            return False
        framing = _file_framing(path, handle)
        at_member = framing is None or _opens_record_member(handle, offset, framing)
        origin, records = (offset, here) if at_member else (start, since)
        padded: list[bool] = []
        try:
            if framing is None:  # the walk passes over the padding that ends a plain file
                chunks, padded = _decoded(handle, origin, size), [True]
            else:
                chunks = _members_to_padding(handle, origin, size, framing, padded)
            problem, count = _walk(chunks, most=records)
        except (Undecodable, OSError):
            return False
    return problem is None and count == records and padded == [True]


def _members_to_padding(
    handle: BinaryIO, origin: int, size: int, framing: Framing, padded: list[bool]
) -> Iterator[bytes]:
    """What the members from `origin` on decode to, member after member, until one ends where only
    padding is left of the file (True appended to `padded`) or at its end (False); `Undecodable` where
    one does not decode, or bytes that are neither padding nor a member follow one."""
    position = origin
    while True:
        ends: list[int] = []
        yield from framing.decode(handle, position, ends)
        position = ends[0]
        if position >= size:
            padded.append(False)
            return
        if _only_padding(handle, position, size):
            padded.append(True)
            return


def _only_padding(handle: BinaryIO, position: int, size: int) -> bool:
    """Whether the file's bytes from `position` to its end, `size`, are padding; reads up to the first
    that is not (the next member's magic, in a file that goes on)."""
    handle.seek(position)
    while position < size:
        chunk = handle.read(min(_PADDING_PIECE, size - position))
        if not chunk or chunk.strip(PADDING):
            return False
        position += len(chunk)
    return True


def _decoded(handle: BinaryIO, origin: int, end: int) -> Iterator[bytes]:
    """A plain file's bytes from `origin` up to `end`, in bounded chunks."""
    position = origin
    handle.seek(origin)
    while position < end:
        chunk = handle.read(min(CHUNK, end - position))
        if not chunk:
            raise Undecodable("the file is shorter than it was")
        position += len(chunk)
        yield chunk


def member_start(path: Path, magic: bytes) -> bytes:
    """The bytes every member (frame) of the file `path`, whose first bytes are `magic`, starts with:
    gzip's magic and method, zstd's or LZ4's frame magic; b"" for a file of no compression
    `skip_member` knows (a plain WARC file, whose every record starts where FastWARC says)."""
    return _MEMBER_STARTS.get(_compression(path, magic) or "", b"")


def _compression(path: Path, magic: bytes) -> str | None:
    """The compression of the file `path` whose first four bytes are `magic` ("gzip", "zstd", "lz4"),
    None for a plain one: by its magic, else by its name's suffix, as FastWARC picks its decoder (a file
    whose first member's header is corrupt is still that compression's)."""
    if magic[:2] == GZIP_MAGIC:
        return "gzip"
    if magic in (ZSTD_MAGIC, ZSTD_DICTIONARY_MAGIC):
        return "zstd"
    if magic == LZ4_MAGIC:
        return "lz4"
    name = path.name.lower()
    return next((compression for suffix, compression in _SUFFIXES if name.endswith(suffix)), None)


def _file_framing(path: Path, handle: BinaryIO) -> Framing | None:
    """The framing of the file `path` open as `handle` (`_compression`), None for a plain one; a zstd
    file's decodes with the dictionary the file starts with, if any."""
    handle.seek(0)
    compression = _compression(path, handle.read(4))
    if compression == "zstd":
        return zstd_framing(handle)
    return GZIP if compression == "gzip" else LZ4 if compression == "lz4" else None


_NOT_DECODED = ("the member does not decode", 0, "")


def _member_at(
    handle: BinaryIO, offset: int, framing: Framing
) -> tuple[int | None, tuple[str, int, str] | None]:
    """`_member_walk` of the member at `offset`, (None, a problem) where none starts there."""
    handle.seek(offset)
    if handle.read(len(framing.start)) != framing.start:
        return None, _NOT_DECODED
    return _member_walk(handle, offset, framing)


def _member_walk(
    handle: BinaryIO, offset: int, framing: Framing
) -> tuple[int | None, tuple[str, int, str] | None]:
    """(Where the member at `offset` ends, None if it does not decode to its end; what `walk_records`
    finds wrong with what it decodes to, None for whole WARC records). Its output is walked as it comes,
    one chunk in memory."""
    ends: list[int] = []
    chunks = framing.decode(handle, offset, ends)
    try:
        problem = walk_records(chunks)
        for _ in chunks:  # the rest of a member whose walk stopped early (no record in it): to its end
            pass
    except Undecodable:
        return None, _NOT_DECODED
    return ends[0], problem


class _Fence(NamedTuple):
    """Where the member after one that does not decode may start (`_past_damage`)."""

    after: int  # not before this byte
    until: int = 0  # before this byte, only right after a gzip trailer whose size is `size` (or 4 less)
    size: int = 0  # the damaged member's output up to its stored WARC file's record's end, as declared


def _past_damage(handle: BinaryIO, offset: int, framing: Framing) -> _Fence:
    """Where the member after the one at `offset`, which does not decode, may start. A zstd or LZ4 frame
    ends where its block sizes say (`Framing.extent`), a gzip member where its deflate data end, where its
    trailer says they are whole (`inflate_damaged`: a trailer byte flipped). Else the next byte on, as for
    every member but one case: a record whose payload is a WARC file (a .warc.gz served as a file) holds
    members of its own, stored as they are (deflate's stored blocks), and resumed at one of those,
    reading had made pages of the download's records, and failed again at its end.

    So where what the damaged member inflates to before its damage shows such a payload
    (`holds_stored_warc`), the fence is the member's output up to that record's end (`_stored_warc_end`:
    the records before it in the member count too; deflate stores no more than that plus a few bytes per
    block), or where its deflate data inflate to an end, if before (its trailer damaged too), that end
    moved on by the output the record still lacks there (a false end of garbage, far short of the record),
    and until then a candidate is taken only right after a trailer whose size is that output's (the member
    ends there), which no member of a download nested in it follows (the record is bigger than any of
    them). A member whose first four bytes are the damage is read as a record's member starts
    (`inflate_member`'s `mend`): read as none, it had had no fence. Only then: the trailer of a damaged
    member is often damaged too (a sector zeroed across two members, a member cut where a restarted
    crawler appended), and one holding two records never matches, so fenced so, every damaged member had
    taken the intact records after it, up to its record's size."""
    end = framing.extent(handle, offset)
    if end is not None:
        return _Fence(end)
    if framing is not GZIP:
        return _Fence(offset + 1)
    inflated, out = inflate_member(handle, offset, _LOOK, mend=True)
    if inflated.end is not None and inflated.whole:
        return _Fence(inflated.end)
    size = _stored_warc_end(inflated.head)
    if size is None:
        return _Fence(offset + 1)
    deflated = size + (size >> 5) + (size >> 7) + (size >> 11) + 7  # zlib's deflateBound, for any level
    until = offset + _GZIP_HEADER_ROOM + deflated + 8
    # Where its data inflate to an end, its trailer failing: that end, moved on by the output the record
    # still lacks there, which a stored WARC file's data (gzip members: deflate cannot shrink them) take
    # at least as many bytes to hold. Damage inside the download that inflates to an end near the
    # member's (a stored block's length hit), then garbage across its trailer and the next member's
    # header, so costs no intact record after it (fenced to deflateBound, all within it had been lost);
    # garbage inflated to a false end far short of the record keeps the download's members, which lie
    # before the bytes it lacks, fenced (lowered to that end, they had become pages). Where a member (or
    # the file's end) follows that end, it is the member's whatever the output: bytes cut out leave it short.
    if inflated.end is not None:
        lacks = 0 if member_follows(handle, inflated.end) else max(0, size - 4 - out)
        until = min(until, inflated.end + lacks)
    return _Fence(offset + 1, until, size)


def _stored_warc_end(head: bytes) -> int | None:
    """Where, in a damaged member's output whose first bytes (up to the damage) are `head`, the first
    record ends whose payload shows a stored WARC file (`holds_stored_warc`), its CRLF CRLF included;
    None where no record does before the damage. The member's records are walked by their
    Content-Length: the fence had been sized by its first record's, so a request record before the
    download (one member holding both, as some crawlers write them) let the download's members in."""
    position = 0
    while position < len(head):
        length = record_length(head[position:])  # a header whose lines end in CRLF, or in bare LF
        if length is None:
            return None
        if holds_stored_warc(head[position : position + length]):
            return position + length + 4
        position += length
        while head[position : position + 1] in (b"\r", b"\n"):  # the CRLF CRLF after it
            position += 1
    return None


def holds_stored_warc(head: bytes) -> bool:
    """Whether `head`, a record's first bytes (up to the damage), shows a payload that is a WARC file in
    gzip members, which deflate stores as they are: a gzip member that starts a WARC record in it, or a
    media type that says so (WARC, gzip) in its WARC header or HTTP head, but for a body whose first bytes
    say otherwise (a plain WARC file, zstd or LZ4 frames: none of theirs is a gzip member reading could go
    on at, and a fence for them had taken the intact records after a damaged trailer)."""
    header = _HEADER_END.search(head)
    if header is None:
        return False
    payload = head[header.end() :]
    if holds_gzip_records(payload):
        return True
    heads, body = header.end(), payload  # the heads' end; the payload's body (a resource record's all)
    if payload.startswith(b"HTTP/"):
        http = _HEADER_END.search(payload)
        heads += len(payload) if http is None else http.end()
        body = b"" if http is None else payload[http.end() :]
    return _WARC_MEDIA_TYPE.search(head, 0, heads) is not None and not body.startswith(_NO_GZIP_MEMBERS)


def _admitted(handle: BinaryIO, at: int, fence: _Fence) -> bool:
    """Whether the next member may start at `at` by `fence` (`_past_damage`); the handle's position kept."""
    if at >= fence.until:
        return True
    if at < 4:
        return False
    position = handle.tell()
    handle.seek(at - 4)
    size = int.from_bytes(handle.read(4), "little")  # a gzip trailer's: the member's output, modulo 2**32
    handle.seek(position)
    return 0 <= fence.size % (1 << 32) - size <= 4  # a record written without its CRLF CRLF, too


def _next_record_member(
    handle: BinaryIO, start: int, framing: Framing, fence: _Fence | None = None
) -> int | None:
    """The first byte from `start` on where a member starts that decodes to a WARC record's start, or
    None; where `fence` (`_past_damage`) admits one. Each candidate (the member's magic, which compressed
    data holds by chance) is checked on a view of the chunk read, its first bytes of output at most (a
    zstd block: 128 KiB, where its first literals are not stored as they are), so a file of garbage is
    read once and never held."""
    fence = fence or _Fence(start)
    start = max(start, fence.after)
    handle.seek(start)
    window = b""  # the file from byte `start` on: what is left of the last chunk and the new one
    eof = False
    while not eof:
        chunk = handle.read(CHUNK)
        eof = not chunk
        window += chunk
        # Candidates whose probe the window holds whole (all of them at the end of the file).
        limit = len(window) if eof else len(window) - framing.probe
        view = memoryview(window)
        at = window.find(framing.start)
        while 0 <= at < limit:
            if framing.starts_record(view[at : at + framing.probe]) and _admitted(handle, start + at, fence):
                return start + at
            at = window.find(framing.start, at + 1)
        if limit > 0:
            window, start = window[limit:], start + limit
    return None


def _opens_record_member(handle: BinaryIO, offset: int, framing: Framing) -> bool:
    """Whether a member starts at `offset` that decodes to a record's start. FastWARC's offsets are such
    in a file compressed per record; in one whose members are cut where records are not (bgzip, pgzip:
    fixed-size pieces of one stream), they are member starts inside records, and the records FastWARC
    framed are walked from where the reading began, as in one stream: walked from such an offset, a
    whole file had ended in a false error row."""
    handle.seek(offset)
    piece = handle.read(framing.probe)
    return piece.startswith(framing.start) and framing.starts_record(memoryview(piece))


_MEMBER_STARTS = {"gzip": GZIP_MEMBER_START, "zstd": ZSTD_MAGIC, "lz4": LZ4_MAGIC}
_SUFFIXES = ((".gz", "gzip"), (".zst", "zstd"), (".lz4", "lz4"))


def _lz4_problem(handle: BinaryIO, start: int, at_mark: _Mark) -> str | None:
    """`reading_end`'s problem for an LZ4 file read from byte `start` on; `_Resume` where FastWARC stopped
    at an empty frame (`at_mark`), found by the frames' headers, which are read only up to there."""
    problems: list[str] = []
    marks = lz4_marks(handle, start, problems)
    output = _lz4_marked(handle, start, marks, problems)
    problem = _walk_problem(output, 0, "LZ4", start=start, at_mark=at_mark)
    if problem is not None:  # the walk stopped before the last frame: one wrong after it is the finding
        for _ in marks:
            pass
    return problems[0] if problems else problem


def _lz4_marked(
    handle: BinaryIO, start: int, marks: Iterator[tuple[int, int]], problems: list[str]
) -> Iterator[bytes | int]:
    """What the LZ4 frames from byte `start` on decode to, each of `marks` (where a frame starts that
    follows empty ones) among the output as `gunzipped_marked` puts its own: FastWARC's reader is given
    the frames between two marks, which its own stop at empty frames cannot cut short. Up to the last
    mark where a frame is wrong after it (`problems`): the output up to there tells where FastWARC
    stopped."""
    for end, mark in marks:
        yield from lz4_output(handle, start, end)
        yield mark
        start = mark
    end = handle.seek(0, io.SEEK_END)
    if start < end and not problems:
        yield from lz4_output(handle, start, end)


def _walk_problem(
    chunks: Iterable[bytes | int],
    offset: int,
    compression: str | None,
    *,
    start: int = 0,
    at_mark: _Mark | None = None,
) -> str | None:
    """`walk_records` over `chunks`, its finding as a message (None: the stream ends between records).
    `offset`: the file's byte `chunks` starts at, for a file whose records start there (plain, a gzip
    member); else 0, and `start` the byte where the decompressed stream `chunks` is starts. `at_mark`:
    what to do at each mark among `chunks` (`_Mark`)."""
    try:
        problem = _walk(chunks, at_mark=at_mark)[0]
    except (Undecodable, OSError) as exc:
        where = f"the file is cut off or corrupt after byte {offset or start}"
        if compression is None:
            return f"{where}: it cannot be read ({exc})"
        return f"{where}: its {compression} stream does not decode ({exc})"
    if problem is None:
        return None
    what, at, why = problem
    if compression is None or offset:
        return f"{what} at byte {offset + at}{why}"
    stream = f"the stream decompressed from byte {start}" if start else "the decompressed stream"
    return f"{what} at byte {at} of {stream}{why}"


def walk_records(chunks: Iterable[bytes]) -> tuple[str, int, str] | None:
    """Walk WARC records by their Content-Length through the byte stream `chunks` make up, each starting
    with a version line FastWARC reads (`_VERSION_LINE`).

    None when the stream ends between records; else (what is wrong, the stream position where the
    record starts, a suffix for the message). Holds at most one header and one chunk in memory.
    """
    return _walk(chunks)[0]


def _walk(
    chunks: Iterable[bytes | int], *, most: int | None = None, at_mark: _Mark | None = None
) -> tuple[tuple[str, int, str] | None, int]:
    """`walk_records`' finding, and how many records it walked whole; a record's header after `most`
    records is a finding too (the walk goes no further). A mark among `chunks` (an int: where a member
    starts that follows empty ones, `warc_frames.gunzipped_marked`) is handed to `at_mark` with the
    records walked whole before it, and whether the walk is between two records there."""
    pieces = _coalesced(chunks)
    buffer = b""
    start = 0  # stream position of buffer[0]
    eof = False
    records = 0

    def pull(between: bool) -> bytes:
        """The stream's next piece, b"" at its end; the marks before it handed to `at_mark`."""
        for piece in pieces:
            if isinstance(piece, bytes):
                return piece
            if at_mark is not None:
                at_mark(piece, records, between)
        return b""

    while True:
        stripped = buffer.lstrip(b"\r\n")  # the CRLF CRLF after each record
        start += len(buffer) - len(stripped)
        buffer = stripped
        blank = _HEADER_END.search(buffer)  # its lines may end in bare LF, as `warc_pages` reads them
        if blank is None:
            if eof:
                if not buffer.strip(PADDING):  # blank lines, or a writer's padding, end the file
                    return None, records
                return ("the file ends inside the record header", start, ""), records
            if len(buffer) >= MAX_HEADER_BYTES:  # any header end found later makes it too long
                if buffer.strip(PADDING):
                    return ("the file holds no WARC record header", start, _NO_END), records
                # Padding, of any length, may end the file; its first byte (no CR or LF, stripped
                # above) is kept, so that a header after it still fails the version line, at `start`.
                buffer = buffer[:1]
            chunk = pull(not buffer)
            buffer += chunk
            eof = not chunk
            continue
        header_end, header_size = blank.start(), blank.end()
        if _VERSION_LINE.match(buffer, 0, header_size) is None:
            why = ": it starts with no version line FastWARC reads (WARC/1.0, WARC/1.1, WARC/0.x)"
            return ("the file holds no WARC record header", start, why), records
        if header_size > MAX_HEADER_BYTES:
            why = f": it takes {header_size} bytes, over the {MAX_HEADER_BYTES} FastWARC reads"
            return ("the file holds a WARC record header longer than FastWARC reads", start, why), records
        if records == most:
            return ("the stream holds more records", start, f": over the {most} expected"), records
        match = _CONTENT_LENGTH.search(buffer, 0, header_end)
        if match is None:
            return ("the file ends inside the record header", start, ": no Content-Length"), records
        record_start, to_skip = start, header_size + int(match.group(1))
        while len(buffer) < to_skip:
            to_skip -= len(buffer)
            start += len(buffer)
            buffer = pull(False)
            if not buffer:
                return ("the file ends inside the record", record_start, ": it was cut off"), records
        start += to_skip
        buffer = buffer[to_skip:]
        records += 1


def _coalesced(chunks: Iterable[bytes | int]) -> Iterator[bytes | int]:
    """`chunks` joined into pieces of at least `CHUNK` bytes (but the last), a mark among them (an int)
    between the pieces before and after it.

    A header is looked for in the buffer again after each piece is added to it: pieces of a few bytes
    (a gzip file of one-byte members, at 21 bytes each) made that quadratic, minutes for a 20 MB file.
    """
    pending: list[bytes] = []
    size = 0
    for chunk in chunks:
        if not isinstance(chunk, bytes):  # a mark: what came before it is one piece
            if size:
                yield b"".join(pending)
                pending.clear()
                size = 0
            yield chunk
            continue
        pending.append(chunk)
        size += len(chunk)
        if size >= CHUNK:
            yield b"".join(pending)
            pending.clear()
            size = 0
    if size:
        yield b"".join(pending)
