"""Whether a WARC file ends with whole records: the check `pages` makes where FastWARC stopped.

FastWARC ends quietly (or hands back an empty record) where a killed writer cut a file inside a
record's header, and stops without a word where an LZ4 frame or a single-member gzip stream is cut; a
page lost that way would be lost without a trace. So after the last record FastWARC framed, the rest
of the file is walked by the records' Content-Length, decompressed as it goes (one chunk in memory):

- a plain file, and a gzip file with one member per record, from that record's offset;
- a gzip file compressed as one stream or in members cut where records are not (bgzip, pgzip), and any
  LZ4 file, from the start (an LZ4 file's reading, from the frame `warc_skip.skip_member` went on at
  after a corrupt one): FastWARC's offsets inside such a stream are positions of its read buffer, not of
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

Where FastWARC fails inside a file compressed per record, reading goes on past the damaged member
(`warc_skip`, its fence for a stored download `warc_fence`'s); which compression a file is in, and where
its members start, is `warc_compression`'s, and how each compression's members are decoded, `warc_frames`'
and `warc_gzip`'s.

Records are walked as FastWARC frames them (but for a header whose lines end in bare LF, which
`warc_pages` reads apart: `warc_bare_lf.bare_lf_record_end`): each starts with the version line FastWARC
takes (WARC/1.0, WARC/1.1 or WARC/0.x), so a member that decodes to anything else (a stray HTTP response,
`warc/1.1`, `WARC/2.0`) is the one FastWARC failed on, not the intact record before it. Padding that ends
a file (NULs, blank lines, as a writer pads to a block) is no member: FastWARC fails on it,
`ends_in_padding` tells that failure apart: only bytes after the last member's end, as its compression
frames it, are padding. A header over the bound FastWARC reads (`MAX_HEADER_BYTES`) is no record either.
"""

from __future__ import annotations

import io
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import BinaryIO, NamedTuple

from service.core.warc_compression import file_compression, file_framing, opens_record_member
from service.core.warc_frames import CHUNK, PADDING, Framing, Undecodable, lz4_marks, lz4_output
from service.core.warc_gzip import GZIP, gunzipped, gunzipped_marked

# The most bytes FastWARC reads of a record's WARC header, its CRLF CRLF included (`warc_pages` passes it
# as `max_header_len`, FastWARC's default; tried on FastWARC 2.0.1): a longer one is "Maximum header
# length exceeded", so the walk refuses it too. Walked up to 1 MiB, a record with a 40,000-character
# WARC-Target-URI (as wget writes one) was taken for whole, and the intact page before it blamed.
MAX_HEADER_BYTES = 32 << 10
_NO_END = f": no blank line ends one within the {MAX_HEADER_BYTES} bytes FastWARC reads of a header"
_CONTENT_LENGTH = re.compile(rb"(?im)^content-length:[ \t]*(\d+)[ \t]*\r?$")
_PADDING_PIECE = 4096  # bytes of what may be padding read at a time (`only_padding`)


# A record's whole version line as FastWARC reads it (tried on FastWARC 2.0.1: WARC/1.0 and WARC/1.1,
# WARC/0. and up to two more characters, blanks after; `warc_frames._RECORD_START` its first bytes).
_VERSION_LINE = re.compile(rb"WARC/(?:1\.[01]|0\.[^\r\n]{0,2})[ \t\r]*\n")
# A header's end, its blank line: after lines ended in CRLF, or in bare LF (a record read alone:
# `warc_bare_lf.bare_lf_record_end`).
HEADER_END = re.compile(rb"\r?\n\r?\n")


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
    damaged member, at one found by its magic (`warc_skip.skip_member`, which may land inside a stored
    .warc.gz download where the damage hid it), reading goes on at a mark only where the walk of the
    rest of the file finds whole records to its end: the walk is the whole one it was before marks were
    read, and its finding is kept. A download's members are followed by the bytes of the record that
    stores them, which are none, so its records never become pages (trusted, each of its members that
    follows an empty one had been read as the file's)."""
    with path.open("rb") as handle:
        if skip is not None:
            handle.seek(start)
            return ReadingEnd(_walk_problem(_skipped(gunzipped(handle), skip), 0, "gzip", start=start))
        compression = file_compression(path, handle.read(4))
        if compression == "zstd":  # FastWARC's zstd reader passes empty frames over
            return ReadingEnd(None)
        try:
            if compression == "lz4":
                at_mark = _Mark(since, trusted=trusted)
                return at_mark.finding(_lz4_problem(handle, start, at_mark))
            if compression == "gzip":
                if opens_record_member(handle, offset, GZIP):
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
    """What the walk does at a mark in the output (`warc_gzip.gunzipped_marked`): a member that decodes
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


def record_length(head: bytes) -> int | None:
    """The bytes of the record whose first bytes are `head`, header and block, by its header's first
    blank line (after lines ended in LF or CRLF) and its Content-Length; None for no such header."""
    blank = HEADER_END.search(head)
    if blank is None or _VERSION_LINE.match(head, 0, blank.end()) is None:
        return None
    length = _CONTENT_LENGTH.search(head, 0, blank.start())
    return None if length is None else blank.end() + int(length.group(1))


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
        framing = file_framing(path, handle)
        at_member = framing is None or opens_record_member(handle, offset, framing)
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
        if only_padding(handle, position, size):
            padded.append(True)
            return


def only_padding(handle: BinaryIO, position: int, size: int) -> bool:
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
    handle: BinaryIO, start: int, marks: Iterator[tuple[int, int, bool]], problems: list[str]
) -> Iterator[bytes | int]:
    """What the LZ4 frames from byte `start` on decode to, each of `marks` (where a frame starts that
    follows empty ones) among the output as `gunzipped_marked` puts its own: FastWARC's reader is given
    the frames between two marks, which its own stop at empty frames cannot cut short, and no skippable
    frame, which it fails on (`lz4_marks`). Up to the last mark where a frame is wrong after it
    (`problems`): the output up to there tells where FastWARC stopped."""
    for end, after, mark in marks:
        if start < end:
            yield from lz4_output(handle, start, end)
        if mark:
            yield after
        start = after
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
    starts that follows empty ones, `warc_gzip.gunzipped_marked`) is handed to `at_mark` with the
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
        blank = HEADER_END.search(buffer)  # its lines may end in bare LF, as `warc_pages` reads them
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
