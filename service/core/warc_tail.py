"""Whether a WARC file ends with whole records: the check `pages` makes where FastWARC stopped.

FastWARC ends quietly (or hands back an empty record) where a killed writer cut a file inside a
record's header, and stops without a word where an LZ4 frame or a single-member gzip stream is cut; a
page lost that way would be lost without a trace. So after the last record FastWARC framed, the rest
of the file is walked by the records' Content-Length, decompressed as it goes (one chunk in memory):

- a plain file, and a gzip file with one member per record, from that record's offset;
- a gzip file compressed as one stream, and any LZ4 file, from the start (an LZ4 file's reading, from
  the frame `skip_member` went on at after a corrupt one): FastWARC's offsets inside such a stream are
  positions of its read buffer, not of records (decompression is the cost: one more pass, at hundreds
  of MB/s for gzip and GB/s for LZ4); an LZ4 file's frames are checked first, since its decoder reads a
  cut frame header as a clean end;
- zstd files are not walked: FastWARC reports a cut zstd frame itself.

Where FastWARC fails inside a file compressed per record (a corrupt gzip member, zstd frame or LZ4 frame),
`skip_member` finds the member it failed on and the next one that starts a record, where reading can go
on: crawlers write a member per record precisely so that a reader can pass over a damaged one. Each of
the three formats lets a reader find the next one: a member or frame starts with its magic number, and a
candidate is taken only where it decodes to the start of a WARC record (`_Framing`). A file compressed
as one stream has no next one (FastWARC's offsets inside it are no member starts): it ends with one row.
The file's compression is told by its magic, else by its name, as FastWARC picks its decoder: a first
member whose header is corrupt is passed over too. A zstd file may start with the dictionary its frames
were compressed with (the IIPC zstd-WARC layout, as wget-at writes it): its frames are decoded with it.

Records are walked as FastWARC frames them: each starts with the version line FastWARC takes (WARC/1.0,
WARC/1.1 or WARC/0.x), so a member that decodes to anything else (a stray HTTP response, `warc/1.1`,
`WARC/2.0`) is the one FastWARC failed on, not the intact record before it. Padding that ends a file
(NULs, blank lines, as a writer pads to a block) is no member: FastWARC fails on it, `ends_in_padding`
tells that failure apart: only bytes after the last member's end, as its compression frames it, are
padding. A header over the bound FastWARC reads (`MAX_HEADER_BYTES`) is no record either.
"""

from __future__ import annotations

import io
import re
import zlib
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import BinaryIO, NamedTuple

import zstandard

GZIP_MAGIC = b"\x1f\x8b"
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_ZSTD_DICTIONARY_MAGIC = b"\x5d\x2a\x4d\x18"  # the skippable frame a zstd WARC's dictionary is kept in
_MAX_DICTIONARY = 64 << 20  # a dictionary frame claiming more is no dictionary (a corrupt size)
_LZ4_MAGIC = b"\x04\x22\x4d\x18"
_CHUNK = 1 << 20
_FIRST_PIECE = 64  # bytes of a gzip member fed first (see _gunzipped)
_PADDING = b"\0\r\n\t "  # may follow the last member (or record)
# The most bytes FastWARC reads of a record's WARC header, its CRLF CRLF included (`warc_pages` passes it
# as `max_header_len`, FastWARC's default; tried on FastWARC 2.0.1): a longer one is "Maximum header
# length exceeded", so the walk refuses it too. Walked up to 1 MiB, a record with a 40,000-character
# WARC-Target-URI (as wget writes one) was taken for whole, and the intact page before it blamed.
MAX_HEADER_BYTES = 32 << 10
_NO_END = f": no CRLF CRLF ends one within the {MAX_HEADER_BYTES} bytes FastWARC reads of a header"
_CONTENT_LENGTH = re.compile(rb"(?im)^content-length:[ \t]*(\d+)[ \t]*\r?$")
_MEMBER_START = GZIP_MAGIC + b"\x08"  # gzip's magic and its one compression method, deflate
_PROBE = 4096  # bytes of a candidate member inflated to tell whether it starts a record (see _starts_record)
# What FastWARC takes for a record's first bytes, and its whole version line (tried on FastWARC 2.0.1:
# WARC/1.0 and WARC/1.1, WARC/0. and up to two more characters, blanks after; `WARC/2.0`, `WARC/1.2`,
# `warc/1.1` and a blank before are "Invalid WARC header").
_RECORD_START = re.compile(rb"WARC/(?:1\.[01]|0\.)")
_START_BYTES = 8  # enough of a record's output to match `_RECORD_START`
_VERSION_LINE = re.compile(rb"WARC/(?:1\.[01]|0\.[^\r\n]{0,2})[ \t\r]*\n")
# A zstd frame's header is at most 18 bytes, and a block's compressed size at most 128 KiB (RFC 8878): a
# candidate frame's first block, whose output starts the record, is within these bytes.
_ZSTD_MAX_HEADER = 18
_ZSTD_BLOCK_HEADER = 3
_ZSTD_MAX_BLOCK = 128 << 10
_ZSTD_RAW, _ZSTD_RLE, _ZSTD_RESERVED = 0, 1, 3  # block types; compressed (2) ones hold their size in bytes
_ZSTD_PROBE = _ZSTD_MAX_HEADER + _ZSTD_BLOCK_HEADER + _ZSTD_MAX_BLOCK
_LZ4_UNCOMPRESSED = 0x80000000  # a block size's high bit: the block is stored as it is


class _Undecodable(Exception):
    """The compressed stream stops decoding before the file ends."""


def tail_problem(path: Path, offset: int, start: int = 0) -> str | None:
    """Why `path` does not end with complete records from the one at byte `offset` on, or None. `start`:
    where the reading began (0, or the member `skip_member` went on at): a file whose offsets are no
    member starts (LZ4, one gzip stream) is walked from there, since the members before it hold the
    corrupt one passed over."""
    with path.open("rb") as handle:
        compression = _compression(path, handle.read(4))
        if compression == "zstd":
            return None
        if compression == "lz4":
            return _lz4_problem(handle, start)
        handle.seek(offset)
        if compression == "gzip":
            if handle.read(2) == GZIP_MAGIC:
                handle.seek(offset)
                return _walk_problem(_gunzipped(handle), offset, "gzip")
            handle.seek(start)  # one gzip stream: FastWARC's offset is no member start
            return _walk_problem(_gunzipped(handle), 0, "gzip", start=start)
        return _walk_problem(iter(lambda: handle.read(_CHUNK), b""), offset, None)


class Skip(NamedTuple):
    """Where `skip_member` has reading go on."""

    failed: int  # where the member FastWARC could not read starts
    resume: int  # where the next member that starts a record starts
    # The member at `failed` decodes to its end, to bytes that are no WARC records FastWARC reads (a
    # stray HTTP response, `WARC/2.0`), rather than not decoding.
    stray: bool = False
    why: str = ""  # what the walk found wrong with a stray member's bytes (a header over FastWARC's limit)


def skip_member(path: Path, offset: int, *, framed: bool) -> Skip | None:
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
    and `Skip.why` says what is wrong. Reads the file once more at most: the members at `offset` and
    after it, then forward from the failed one to the next record's member.
    """
    with path.open("rb") as handle:
        framing = _file_framing(path, handle)
        if framing is None:
            return None
        offset = max(offset, framing.first)  # not the dictionary frame a zstd file starts with
        handle.seek(offset)
        # The file's first member, never framed, may be the one whose header is corrupt, magic and all.
        if (offset > framing.first or framed) and handle.read(len(framing.start)) != framing.start:
            return None  # one stream: FastWARC's offset is no member start
        failed, after, why = offset, offset + 1, None  # the member that failed, where the next may start
        if framed:
            end, problem = _member_walk(handle, offset, framing)
            if end is not None:
                next_end, next_problem = _member_at(handle, end, framing)
                if problem is None and next_problem is not None:
                    failed, after = end, end + 1
                    why = next_problem if next_end is not None else None
                else:
                    failed, after = offset, end
        else:  # reading began at this member: FastWARC failed on it, and may have on what it decodes to
            end, problem = _member_walk(handle, offset, framing)
            if end is not None and problem is not None:
                failed, after, why = offset, end, problem
        start = _next_record_member(handle, after, framing)
    if start is None:
        return None
    return Skip(failed, start, why is not None, "" if why is None else f"{why[0]}{why[2]}")


def ends_in_padding(path: Path, offset: int, start: int, *, here: int, since: int) -> bool:
    """Whether what FastWARC failed on, after reading the record it framed at `offset` whole, is the
    padding that ends the file (`_PADDING`: NULs, blank lines), which FastWARC takes for a member or a
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
        if size == 0 or handle.read(1) not in _PADDING:
            return False
        framing = _file_framing(path, handle)
        handle.seek(offset)
        at_member = framing is None or handle.read(len(framing.start)) == framing.start
        origin, records = (offset, here) if at_member else (start, since)
        padded: list[bool] = []
        try:
            if framing is None:  # the walk passes over the padding that ends a plain file
                chunks, padded = _decoded(handle, origin, size), [True]
            else:
                chunks = _members_to_padding(handle, origin, size, framing, padded)
            problem, count = _walk(chunks, most=records)
        except (_Undecodable, OSError):
            return False
    return problem is None and count == records and padded == [True]


def _members_to_padding(
    handle: BinaryIO, origin: int, size: int, framing: _Framing, padded: list[bool]
) -> Iterator[bytes]:
    """What the members from `origin` on decode to, member after member, until one ends where only
    padding is left of the file (True appended to `padded`) or at its end (False); `_Undecodable` where
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
        chunk = handle.read(min(_PROBE, size - position))
        if not chunk or chunk.strip(_PADDING):
            return False
        position += len(chunk)
    return True


def _decoded(handle: BinaryIO, origin: int, end: int) -> Iterator[bytes]:
    """A plain file's bytes from `origin` up to `end`, in bounded chunks."""
    position = origin
    handle.seek(origin)
    while position < end:
        chunk = handle.read(min(_CHUNK, end - position))
        if not chunk:
            raise _Undecodable("the file is shorter than it was")
        position += len(chunk)
        yield chunk


def dictionary_frame(path: Path) -> bytes:
    """The skippable frame holding the dictionary a zstd file starts with (the IIPC zstd-WARC layout),
    b"" for none. FastWARC reads a dictionary from a stream's first bytes only: reading that goes on
    after a corrupt frame hands it this frame first (`warc_pages`), or every frame after it fails."""
    with path.open("rb") as handle:
        return _dictionary_frame(handle)


def _dictionary_frame(handle: BinaryIO) -> bytes:
    handle.seek(0)
    header = handle.read(8)
    if len(header) < 8 or header[:4] != _ZSTD_DICTIONARY_MAGIC:
        return b""
    size = int.from_bytes(header[4:], "little")
    return b"" if size > _MAX_DICTIONARY else header + handle.read(size)


def member_start(path: Path, magic: bytes) -> bytes:
    """The bytes every member (frame) of the file `path`, whose first bytes are `magic`, starts with:
    gzip's magic and method, zstd's or LZ4's frame magic; b"" for a file of no compression
    `skip_member` knows (a plain WARC file, whose every record starts where FastWARC says)."""
    return _MEMBER_STARTS.get(_compression(path, magic) or "", b"")


class _Framing(NamedTuple):
    """How the members of a compression are found and checked (`skip_member`)."""

    start: bytes  # what every member starts with
    probe: int  # bytes of a candidate enough for `starts_record`
    # The output of the member at a byte, in bounded chunks; its end appended to the list once it decodes
    # to it, `_Undecodable` where it does not (corrupt or cut).
    decode: Callable[[BinaryIO, int, list[int]], Iterator[bytes]]
    starts_record: Callable[[memoryview], bool]  # whether a candidate decodes to a record's start
    first: int = 0  # where the first member starts: past the dictionary frame a zstd file may start with


def _compression(path: Path, magic: bytes) -> str | None:
    """The compression of the file `path` whose first four bytes are `magic` ("gzip", "zstd", "lz4"),
    None for a plain one: by its magic, else by its name's suffix, as FastWARC picks its decoder (a file
    whose first member's header is corrupt is still that compression's)."""
    if magic[:2] == GZIP_MAGIC:
        return "gzip"
    if magic in (_ZSTD_MAGIC, _ZSTD_DICTIONARY_MAGIC):
        return "zstd"
    if magic == _LZ4_MAGIC:
        return "lz4"
    name = path.name.lower()
    return next((compression for suffix, compression in _SUFFIXES if name.endswith(suffix)), None)


def _file_framing(path: Path, handle: BinaryIO) -> _Framing | None:
    """The framing of the file `path` open as `handle` (`_compression`), None for a plain one; a zstd
    file's decodes with the dictionary the file starts with, if any."""
    handle.seek(0)
    compression = _compression(path, handle.read(4))
    if compression == "zstd":
        return _Zstd.framing(handle)
    return _GZIP if compression == "gzip" else _LZ4 if compression == "lz4" else None


_NOT_DECODED = ("the member does not decode", 0, "")


def _member_at(
    handle: BinaryIO, offset: int, framing: _Framing
) -> tuple[int | None, tuple[str, int, str] | None]:
    """`_member_walk` of the member at `offset`, (None, a problem) where none starts there."""
    handle.seek(offset)
    if handle.read(len(framing.start)) != framing.start:
        return None, _NOT_DECODED
    return _member_walk(handle, offset, framing)


def _member_walk(
    handle: BinaryIO, offset: int, framing: _Framing
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
    except _Undecodable:
        return None, _NOT_DECODED
    return ends[0], problem


def _gunzip_member(handle: BinaryIO, offset: int, ends: list[int]) -> Iterator[bytes]:
    """What the gzip member at `offset` inflates to, at most `_CHUNK` bytes at a time (a member may be a
    bomb); its end appended to `ends` once it inflates to it, `_Undecodable` where it does not."""
    handle.seek(offset)
    decompressor = zlib.decompressobj(31)
    position = offset  # of data[0]
    for data in iter(lambda: handle.read(_CHUNK), b""):
        while data:
            try:
                out = decompressor.decompress(data, _CHUNK)
            except zlib.error as exc:
                raise _Undecodable(str(exc)) from exc
            if out:
                yield out
            if decompressor.eof:
                ends.append(position + len(data) - len(decompressor.unused_data))
                return
            left = decompressor.unconsumed_tail
            if len(left) == len(data) and not out:
                raise _Undecodable("the gzip member makes no progress")  # never seen; never spin
            position += len(data) - len(left)
            data = left
    raise _Undecodable("the gzip member is cut off")


def _next_record_member(handle: BinaryIO, start: int, framing: _Framing) -> int | None:
    """The first byte from `start` on where a member starts that decodes to a WARC record's start, or
    None. Each candidate (the member's magic, which compressed data holds by chance) is checked on a
    view of the chunk read, its first bytes of output at most (a zstd block: 128 KiB, where its first
    literals are not stored as they are), so a file of garbage is read once and never held."""
    handle.seek(start)
    window = b""  # the file from byte `start` on: what is left of the last chunk and the new one
    eof = False
    while not eof:
        chunk = handle.read(_CHUNK)
        eof = not chunk
        window += chunk
        # Candidates whose probe the window holds whole (all of them at the end of the file).
        limit = len(window) if eof else len(window) - framing.probe
        view = memoryview(window)
        at = window.find(framing.start)
        while 0 <= at < limit:
            if framing.starts_record(view[at : at + framing.probe]):
                return start + at
            at = window.find(framing.start, at + 1)
        if limit > 0:
            window, start = window[limit:], start + limit
    return None


def _starts(output: bytes | memoryview) -> bool:
    """Whether `output`, a member's first bytes out, are a record's first bytes as FastWARC reads them."""
    return _RECORD_START.match(bytes(output[:_START_BYTES])) is not None


def _starts_record(piece: memoryview) -> bool:
    """Whether `piece`, the start of a gzip member, inflates to the start of a WARC record."""
    try:
        return _starts(zlib.decompressobj(31).decompress(piece, _START_BYTES))
    except zlib.error:
        return False


def _zstd_block(data: bytes | memoryview) -> tuple[bool, int, int] | None:
    """A zstd block header's (whether the block is the frame's last, its type, the bytes its content
    takes), None for no valid one (cut off, the reserved type, a size over the format's bound)."""
    if len(data) < _ZSTD_BLOCK_HEADER:
        return None
    value = int.from_bytes(data[:_ZSTD_BLOCK_HEADER], "little")
    kind, size = (value >> 1) & 3, value >> 3
    if kind == _ZSTD_RESERVED or size > _ZSTD_MAX_BLOCK:
        return None
    return bool(value & 1), kind, 1 if kind == _ZSTD_RLE else size


def _zstd_dictionary(handle: BinaryIO) -> tuple[zstandard.ZstdCompressionDict | None, int]:
    """The dictionary a zstd file starts with (`dictionary_frame`; itself zstd-compressed or not), and
    the byte its first data frame starts at: (None, 0) where it starts with none; None for one that
    cannot be loaded (its frames then decode no more than FastWARC's reading of them)."""
    frame = _dictionary_frame(handle)
    if not frame:
        return None, 0
    content = frame[8:]
    try:
        if content.startswith(_ZSTD_MAGIC):
            content = zstandard.ZstdDecompressor().decompress(content, max_output_size=_MAX_DICTIONARY)
        dictionary = zstandard.ZstdCompressionDict(content)
        zstandard.ZstdDecompressor(dict_data=dictionary).decompressobj()  # loads it: a broken one fails here
    except zstandard.ZstdError:
        return None, len(frame)
    return dictionary, len(frame)


def _zstd_raw_literals(block: memoryview) -> bytes | None:
    """The first literals a compressed zstd block stores as they are; b"" where its literals cannot
    start a record in a frame without a dictionary (one byte repeated; a Huffman table of a block before
    it), None where they are Huffman-coded (decoding alone tells). Such a frame's output starts with
    literals (no match copies output not yet there, nor a repeat within a record's version line, which
    repeats no three bytes, zstd's shortest match). RFC 8878 3.1.1.3.1.1: the literals section header's
    first byte holds their type (0 raw, 1 RLE, 2 Huffman, 3 Huffman with the last table) and how many
    bytes give their size."""
    try:
        first = block[0]
        kind, size_format = first & 3, (first >> 2) & 3
        if kind == 2:
            return None
        if kind != 0:
            return b""
        if size_format in (0, 2):
            header, size = 1, first >> 3
        elif size_format == 1:
            header, size = 2, (first >> 4) + (block[1] << 4)
        else:
            header, size = 3, (first >> 4) + (block[1] << 4) + (block[2] << 12)
    except IndexError:
        return b""
    return bytes(block[header : header + min(size, _START_BYTES)])


class _Zstd:
    """A zstd file's frames (`_Framing`), decoded with the dictionary it starts with, if any, and by one
    decompressor. A decompressor made for each candidate, and its first block decoded whole (128 KiB of
    output for a fake raw block), took 2 to 4 s per MB of garbage full of frame headers; a candidate's
    first bytes of output are now read where they are stored as they are (a raw block, raw literals),
    and only a block whose first literals are Huffman-coded (or any, with a dictionary) is decoded, given
    up at its first error: 0.1 to 0.35 s per MB, as gzip's scan, for most garbage. Not bounded so for every
    kind: fake frames whose literals are Huffman-coded took 0.9 s per MB, and in a file with a
    dictionary, where every candidate is decoded (libzstd gives no byte of a block before the whole
    block), 20-byte fake frames took 5.6 s per MB (a re-review's adversarial files)."""

    def __init__(self, dictionary: zstandard.ZstdCompressionDict | None) -> None:
        self._dictionary = dictionary
        self._dictionary_id = 0 if dictionary is None else dictionary.dict_id()
        self._decompressor = zstandard.ZstdDecompressor(dict_data=dictionary)

    @classmethod
    def framing(cls, handle: BinaryIO) -> _Framing:
        dictionary, first = _zstd_dictionary(handle)
        zstd = cls(dictionary)
        return _Framing(_ZSTD_MAGIC, _ZSTD_PROBE, zstd.frame, zstd.starts_record, first)

    def frame(self, handle: BinaryIO, offset: int, ends: list[int]) -> Iterator[bytes]:
        """What the zstd frame at `offset` decodes to, a block at a time (at most 128 KiB of output: a
        frame of RLE blocks may be a bomb); its end appended to `ends` once it decodes to it,
        `_Undecodable` where it does not."""
        handle.seek(offset)
        header = handle.read(_ZSTD_MAX_HEADER)
        decompressor = self._decompressor.decompressobj()
        try:
            size = zstandard.frame_header_size(header)
            checksum = zstandard.get_frame_parameters(header).has_checksum
            decompressor.decompress(header[:size])
            position = offset + size
            last = False
            while not last:
                handle.seek(position)
                block_header = handle.read(_ZSTD_BLOCK_HEADER)
                block = _zstd_block(block_header)
                if block is None:
                    raise _Undecodable("a zstd block header is cut off or invalid")
                last, _, length = block
                content = handle.read(length)
                if len(content) < length:
                    raise _Undecodable("a zstd block is cut off")
                out = decompressor.decompress(block_header + content)
                position += _ZSTD_BLOCK_HEADER + length
                if out:
                    yield out
            if checksum:
                handle.seek(position)
                decompressor.decompress(handle.read(4))
                position += 4
        except zstandard.ZstdError as exc:
            raise _Undecodable(str(exc)) from exc
        if not decompressor.eof:
            raise _Undecodable("the zstd frame is cut off")
        ends.append(position)

    def starts_record(self, piece: memoryview) -> bool:
        """Whether `piece`, the start of a zstd frame, decodes to the start of a WARC record: its header
        is valid (naming no dictionary but the file's), and its first block (which a compressor never
        leaves empty but for an empty frame) starts with a record's first bytes."""
        try:
            size = zstandard.frame_header_size(piece[:_ZSTD_MAX_HEADER])
            dictionary = zstandard.get_frame_parameters(piece[:_ZSTD_MAX_HEADER]).dict_id
        except zstandard.ZstdError:
            return False
        if dictionary and dictionary != self._dictionary_id:
            return False  # compressed with a dictionary the file does not hold: FastWARC cannot read it
        block = _zstd_block(piece[size : size + _ZSTD_BLOCK_HEADER])
        end = size + _ZSTD_BLOCK_HEADER + (0 if block is None else block[2])
        if block is None or end > len(piece):
            return False
        content = piece[size + _ZSTD_BLOCK_HEADER : end]
        if block[1] != 2:  # raw: the output as it is; RLE: one byte repeated
            return block[1] == _ZSTD_RAW and _starts(content)
        if self._dictionary is None:
            literals = _zstd_raw_literals(content)
            if literals is not None:
                return _starts(literals)
        try:
            return _starts(self._decompressor.stream_reader(piece[:end]).read(_START_BYTES))
        except zstandard.ZstdError:
            return False


def _unlz4_frame(handle: BinaryIO, offset: int, ends: list[int]) -> Iterator[bytes]:
    """What the LZ4 frame at `offset` decodes to, at most `_CHUNK` bytes at a time; its end appended to
    `ends` once it decodes to it, `_Undecodable` where it does not. Its blocks are walked by their sizes
    (`_lz4_frame_size`), then the frame decoded by FastWARC's own reader (there is no other LZ4 decoder
    here)."""
    from fastwarc.stream_io import Lz4Reader

    file_size = handle.seek(0, io.SEEK_END)
    handle.seek(offset)
    size = _lz4_frame_size(handle, file_size)
    if isinstance(size, tuple):
        raise _Undecodable("".join(size))
    handle.seek(offset)
    reader = Lz4Reader(_Slice(handle, offset + size))
    try:
        while True:
            try:
                out = reader.read(_CHUNK)
            except OSError as exc:
                raise _Undecodable(str(exc)) from exc
            if not out:
                break
            yield out
    finally:
        reader.close()
    ends.append(offset + size)


class _Slice:
    """A file from its position up to byte `end`, as a reader FastWARC takes (`read`, `tell`)."""

    def __init__(self, handle: BinaryIO, end: int) -> None:
        self._handle = handle
        self._end = end

    def read(self, size: int = -1) -> bytes:
        left = max(0, self._end - self._handle.tell())
        return self._handle.read(left if size < 0 else min(size, left))

    def tell(self) -> int:
        return self._handle.tell()

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        return self._handle.seek(offset, whence)

    def close(self) -> None:
        """Nothing: the file is the caller's, read on after the frame (`skip_member`)."""


def _lz4_starts_record(piece: memoryview) -> bool:
    """Whether `piece`, the start of an LZ4 frame, decodes to the start of a WARC record: a valid frame
    descriptor (version 01, reserved bits clear, a block size 4 to 7) with no dictionary, then a first
    block stored as it is, or compressed with a literal run first, holding the record's first bytes. A
    block's first sequence starts with literals, and no match can come within a version line's first
    eight bytes ("WARC/1.1" repeats no four bytes), so a record's compressed first block has at least
    seven of them as literals."""
    try:
        flags, descriptor = piece[4], piece[5]
        if flags >> 6 != 1 or flags & 0x03 or descriptor & 0x8F or descriptor >> 4 < 4:
            return False  # another version, a reserved bit, a dictionary, or no valid block size
        at = 6 + 8 * bool(flags & 0x08) + 1  # the content size, then the header checksum
        block = int.from_bytes(piece[at : at + 4], "little")
        at += 4
        if block & _LZ4_UNCOMPRESSED:
            literals = block & ~_LZ4_UNCOMPRESSED
        else:
            token = piece[at]
            at += 1
            literals = token >> 4
            if literals == 15:  # the length goes on in bytes of 255 and a last one under it
                while piece[at] == 255:
                    literals += 255
                    at += 1
                literals += piece[at]
                at += 1
    except IndexError:
        return False
    return literals >= len("WARC/0.") and _starts(piece[at : at + min(literals, _START_BYTES)])


_GZIP = _Framing(_MEMBER_START, _PROBE, _gunzip_member, _starts_record)
_LZ4 = _Framing(_LZ4_MAGIC, _PROBE, _unlz4_frame, _lz4_starts_record)
_MEMBER_STARTS = {"gzip": _MEMBER_START, "zstd": _ZSTD_MAGIC, "lz4": _LZ4_MAGIC}
_SUFFIXES = ((".gz", "gzip"), (".zst", "zstd"), (".lz4", "lz4"))


def _lz4_problem(handle: BinaryIO, start: int) -> str | None:
    from fastwarc.stream_io import Lz4Reader

    framing = _lz4_frames_problem(handle, start)
    if framing is not None:
        return framing
    handle.seek(start)
    reader = Lz4Reader(handle)
    try:
        return _walk_problem(iter(lambda: reader.read(_CHUNK), b""), 0, "LZ4", start=start)
    finally:
        reader.close()


def _walk_problem(
    chunks: Iterable[bytes], offset: int, compression: str | None, *, start: int = 0
) -> str | None:
    """`walk_records` over `chunks`, its finding as a message (None: the stream ends between records).
    `offset`: the file's byte `chunks` starts at, for a file whose records start there (plain, a gzip
    member); else 0, and `start` the byte where the decompressed stream `chunks` is starts."""
    try:
        problem = walk_records(chunks)
    except (_Undecodable, OSError) as exc:
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


def _gunzipped(handle: BinaryIO) -> Iterator[bytes]:
    """The decompressed bytes of the gzip members from `handle`'s position on, in bounded chunks.

    Each member is fed in doubling slices of a view of the chunk read, so what it leaves over
    (`unused_data`, a copy) is about its own size: handing every member the rest of a 1 MiB chunk made
    a file of tiny members quadratic (a second per MiB).
    """
    decompressor: zlib._Decompress | None = None
    size = _FIRST_PIECE
    for data in iter(lambda: handle.read(_CHUNK), b""):
        view = memoryview(data)
        position = 0
        while position < len(data):
            if decompressor is None:
                if data[position] in _PADDING and not data[position:].strip(_PADDING):
                    break  # padding after the last member
                decompressor, size = zlib.decompressobj(31), _FIRST_PIECE
            piece = view[position : position + size]
            try:
                out = decompressor.decompress(piece, _CHUNK)
            except zlib.error as exc:
                raise _Undecodable(str(exc)) from exc
            if out:
                yield out
            if decompressor.eof:  # the next member, if any, starts in what this one left
                position += len(piece) - len(decompressor.unused_data)
                decompressor = None
                continue
            # Input held back by the output bound stays for the next call.
            consumed = len(piece) - len(decompressor.unconsumed_tail)
            if not consumed and not out:
                raise _Undecodable("the gzip stream makes no progress")  # never seen; never spin
            position += consumed
            size = min(2 * size, _CHUNK)
    if decompressor is not None:
        raise _Undecodable("a gzip member is cut off")


def _lz4_frames_problem(handle: BinaryIO, start: int = 0) -> str | None:
    """Why the LZ4 file from byte `start` on is not a sequence of whole frames (the LZ4 frame format), or
    None. Only headers and block sizes are read; the blocks are skipped by their sizes."""
    size = handle.seek(0, io.SEEK_END)
    position = handle.seek(start)
    while position < size:
        frame = position
        length = _lz4_frame_size(handle, size)
        if isinstance(length, tuple):
            what, why = length
            return f"{what} at byte {frame}{why}"
        position = handle.seek(frame + length)
    return None


def _lz4_frame_size(handle: BinaryIO, size: int) -> int | tuple[str, str]:
    """The bytes the LZ4 frame (or skippable frame) at `handle`'s position takes in a file of `size`
    bytes, by its header and block sizes; else what is wrong, and a suffix to the frame's byte (which
    the caller says)."""
    frame = handle.tell()
    magic = handle.read(4)
    if len(magic) < 4:
        return ("the file is cut off inside the LZ4 frame header", "")
    if magic[1:] == b"\x2a\x4d\x18" and magic[0] & 0xF0 == 0x50:  # a skippable frame
        skippable = handle.read(4)
        end = frame + 8 + int.from_bytes(skippable, "little")
        if len(skippable) < 4 or end > size:
            return ("the file is cut off inside the LZ4 skippable frame", "")
        return end - frame
    if magic != _LZ4_MAGIC:
        return ("the file holds no LZ4 frame", "")
    descriptor = handle.read(2)
    if len(descriptor) < 2:
        return ("the file is cut off inside the LZ4 frame header", "")
    flags = descriptor[0]
    extra = 8 * bool(flags & 0x08) + 4 * bool(flags & 0x01) + 1  # content size, dictionary id, checksum
    if len(handle.read(extra)) < extra:
        return ("the file is cut off inside the LZ4 frame header", "")
    block_checksum = 4 * bool(flags & 0x10)
    while True:
        block_size = handle.read(4)
        if len(block_size) < 4:
            return ("the file is cut off inside the LZ4 frame", ": no end mark")
        length = int.from_bytes(block_size, "little") & 0x7FFFFFFF
        if length == 0:
            break
        position = handle.tell() + length + block_checksum
        if position > size:
            return ("the file is cut off inside the LZ4 frame", ": a block is cut")
        handle.seek(position)
    checksum = 4 * bool(flags & 0x04)
    if len(handle.read(checksum)) < checksum:
        return ("the file is cut off inside the LZ4 frame", ": no content checksum")
    return handle.tell() - frame


def walk_records(chunks: Iterable[bytes]) -> tuple[str, int, str] | None:
    """Walk WARC records by their Content-Length through the byte stream `chunks` make up, each starting
    with a version line FastWARC reads (`_VERSION_LINE`).

    None when the stream ends between records; else (what is wrong, the stream position where the
    record starts, a suffix for the message). Holds at most one header and one chunk in memory.
    """
    return _walk(chunks)[0]


def _walk(chunks: Iterable[bytes], *, most: int | None = None) -> tuple[tuple[str, int, str] | None, int]:
    """`walk_records`' finding, and how many records it walked whole; a record's header after `most`
    records is a finding too (the walk goes no further)."""
    chunks = _coalesced(chunks)
    buffer = b""
    start = 0  # stream position of buffer[0]
    eof = False
    records = 0
    while True:
        stripped = buffer.lstrip(b"\r\n")  # the CRLF CRLF after each record
        start += len(buffer) - len(stripped)
        buffer = stripped
        header_end = buffer.find(b"\r\n\r\n")
        if header_end < 0:
            if eof:
                if not buffer.strip(_PADDING):  # blank lines, or a writer's padding, end the file
                    return None, records
                return ("the file ends inside the record header", start, ""), records
            if len(buffer) >= MAX_HEADER_BYTES:  # any header end found later makes it too long
                if buffer.strip(_PADDING):
                    return ("the file holds no WARC record header", start, _NO_END), records
                # Padding, of any length, may end the file; its first byte (no CR or LF, stripped
                # above) is kept, so that a header after it still fails the version line, at `start`.
                buffer = buffer[:1]
            chunk = next(chunks, b"")
            buffer += chunk
            eof = not chunk
            continue
        if _VERSION_LINE.match(buffer, 0, header_end + 2) is None:
            why = ": it starts with no version line FastWARC reads (WARC/1.0, WARC/1.1, WARC/0.x)"
            return ("the file holds no WARC record header", start, why), records
        if header_end + 4 > MAX_HEADER_BYTES:
            why = f": it takes {header_end + 4} bytes, over the {MAX_HEADER_BYTES} FastWARC reads"
            return ("the file holds a WARC record header longer than FastWARC reads", start, why), records
        if records == most:
            return ("the stream holds more records", start, f": over the {most} expected"), records
        match = _CONTENT_LENGTH.search(buffer, 0, header_end)
        if match is None:
            return ("the file ends inside the record header", start, ": no Content-Length"), records
        record_start, to_skip = start, header_end + 4 + int(match.group(1))
        while len(buffer) < to_skip:
            to_skip -= len(buffer)
            start += len(buffer)
            buffer = next(chunks, b"")
            if not buffer:
                return ("the file ends inside the record", record_start, ": it was cut off"), records
        start += to_skip
        buffer = buffer[to_skip:]
        records += 1


def _coalesced(chunks: Iterable[bytes]) -> Iterator[bytes]:
    """`chunks` joined into pieces of at least `_CHUNK` bytes (but the last).

    A header is looked for in the buffer again after each piece is added to it: pieces of a few bytes
    (a gzip file of one-byte members, at 21 bytes each) made that quadratic, minutes for a 20 MB file.
    """
    pending: list[bytes] = []
    size = 0
    for chunk in chunks:
        pending.append(chunk)
        size += len(chunk)
        if size >= _CHUNK:
            yield b"".join(pending)
            pending.clear()
            size = 0
    if size:
        yield b"".join(pending)
