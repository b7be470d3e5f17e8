"""Whether a WARC file ends with whole records: the check `pages` makes where FastWARC stopped.

FastWARC ends quietly (or hands back an empty record) where a killed writer cut a file inside a
record's header, and stops without a word where an LZ4 frame or a single-member gzip stream is cut; a
page lost that way would be lost without a trace. So after the last record FastWARC framed, the rest
of the file is walked by the records' Content-Length, decompressed as it goes (one chunk in memory):

- a plain file, and a gzip file with one member per record, from that record's offset;
- a gzip file compressed as one stream, and any LZ4 file, from the start: FastWARC's offsets inside
  such a stream are positions of its read buffer, not of records (decompression is the cost: one
  more pass, at hundreds of MB/s for gzip and GB/s for LZ4); an LZ4 file's frames are checked first,
  since its decoder reads a cut frame header as a clean end;
- zstd files are not walked: FastWARC reports a cut zstd frame itself.

Where FastWARC fails inside a gzip file with one member per record (a corrupt member), `skip_member` finds
the member it failed on and the next one that starts a record, where reading can go on: crawlers write a
member per record precisely so that a reader can pass over a damaged one.
"""

from __future__ import annotations

import io
import re
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import BinaryIO

GZIP_MAGIC = b"\x1f\x8b"
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_LZ4_MAGIC = b"\x04\x22\x4d\x18"
_CHUNK = 1 << 20
_FIRST_PIECE = 64  # bytes of a gzip member fed first (see _gunzipped)
_PADDING = b"\0\r\n\t "  # may follow the last gzip member
_MAX_HEADER_BYTES = 1 << 20  # a WARC header longer than this is not one
_CONTENT_LENGTH = re.compile(rb"(?im)^content-length:[ \t]*(\d+)[ \t]*\r?$")
_MEMBER_START = GZIP_MAGIC + b"\x08"  # gzip's magic and its one compression method, deflate
_PROBE = 4096  # bytes of a candidate member inflated to tell whether it starts a record (see _starts_record)
_RECORD_START = b"WARC/"


class _Undecodable(Exception):
    """The compressed stream stops decoding before the file ends."""


def tail_problem(path: Path, offset: int) -> str | None:
    """Why `path` does not end with complete records from the one at byte `offset` on, or None."""
    with path.open("rb") as handle:
        magic = handle.read(4)
        if magic == _ZSTD_MAGIC:
            return None
        if magic == _LZ4_MAGIC:
            return _lz4_problem(path, handle)
        handle.seek(offset)
        if magic[:2] == GZIP_MAGIC:
            if handle.read(2) != GZIP_MAGIC:
                offset = 0  # one gzip stream: FastWARC's offset is no member start
            handle.seek(offset)
            return _walk_problem(_gunzipped(handle), offset, "gzip")
        return _walk_problem(iter(lambda: handle.read(_CHUNK), b""), offset, None)


def skip_member(path: Path, offset: int, *, framed: bool) -> tuple[int, int] | None:
    """Where reading a gzip file with one member per record can go on after FastWARC failed on it: (the
    byte where the member it could not read starts, the byte where the next member that starts a record
    starts), or None where it cannot (a file compressed as one stream, a plain one, no record after).

    `offset` is where the last record FastWARC framed starts; `framed`: that record was read whole, so
    the member FastWARC failed on is the next one, if that record's own member inflates to its end (else
    the failure was in its own, its rest unread). Reads the file once more at most: the member at
    `offset`, then forward from the failed one to the next record's member, never further.
    """
    with path.open("rb") as handle:
        if handle.read(2) != GZIP_MAGIC:
            return None
        handle.seek(offset)
        if handle.read(3) != _MEMBER_START:
            return None  # one gzip stream: FastWARC's offset is no member start
        failed = offset
        if framed:
            end = _member_end(handle, offset)
            failed = offset if end is None else end
        start = _next_record_member(handle, failed + 1)
    return None if start is None else (failed, start)


def _member_end(handle: BinaryIO, offset: int) -> int | None:
    """Where the gzip member at `offset` ends, None if it does not inflate to its end (corrupt or cut).
    What it inflates to is dropped as it comes, at most `_CHUNK` bytes at a time (a member may be a bomb)."""
    handle.seek(offset)
    decompressor = zlib.decompressobj(31)
    position = offset  # of data[0]
    for data in iter(lambda: handle.read(_CHUNK), b""):
        while data:
            try:
                out = decompressor.decompress(data, _CHUNK)
            except zlib.error:
                return None
            if decompressor.eof:
                return position + len(data) - len(decompressor.unused_data)
            left = decompressor.unconsumed_tail
            if len(left) == len(data) and not out:
                return None  # never seen; never spin
            position += len(data) - len(left)
            data = left
    return None


def _next_record_member(handle: BinaryIO, start: int) -> int | None:
    """The first byte from `start` on where a gzip member starts that inflates to a WARC record's start,
    or None. Each candidate (gzip's magic, which deflate data holds by chance) is inflated from a view of
    the chunk read, a few bytes of output at most, so a file of garbage is read once and never held."""
    handle.seek(start)
    window = b""  # the file from byte `start` on: what is left of the last chunk and the new one
    eof = False
    while not eof:
        chunk = handle.read(_CHUNK)
        eof = not chunk
        window += chunk
        # Candidates whose probe the window holds whole (all of them at the end of the file).
        limit = len(window) if eof else len(window) - _PROBE
        view = memoryview(window)
        at = window.find(_MEMBER_START)
        while 0 <= at < limit:
            if _starts_record(view[at : at + _PROBE]):
                return start + at
            at = window.find(_MEMBER_START, at + 1)
        if limit > 0:
            window, start = window[limit:], start + limit
    return None


def _starts_record(piece: memoryview) -> bool:
    """Whether `piece`, the start of a gzip member, inflates to the start of a WARC record."""
    try:
        return zlib.decompressobj(31).decompress(piece, len(_RECORD_START)) == _RECORD_START
    except zlib.error:
        return False


def _lz4_problem(path: Path, handle: BinaryIO) -> str | None:
    from fastwarc.stream_io import Lz4Reader

    framing = _lz4_frames_problem(handle)
    if framing is not None:
        return framing
    reader = Lz4Reader(str(path), fsspec_args=False)
    try:
        return _walk_problem(iter(lambda: reader.read(_CHUNK), b""), 0, "LZ4")
    finally:
        reader.close()


def _walk_problem(chunks: Iterable[bytes], offset: int, compression: str | None) -> str | None:
    """`walk_records` over `chunks`, its finding as a message (None: the stream ends between records)."""
    try:
        problem = walk_records(chunks)
    except (_Undecodable, OSError) as exc:
        where = f"the file is cut off or corrupt after byte {offset}"
        if compression is None:
            return f"{where}: it cannot be read ({exc})"
        return f"{where}: its {compression} stream does not decode ({exc})"
    if problem is None:
        return None
    what, at, why = problem
    if compression is None or offset:
        return f"{what} at byte {offset + at}{why}"
    return f"{what} at byte {at} of the decompressed stream{why}"


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


def _lz4_frames_problem(handle: BinaryIO) -> str | None:
    """Why the LZ4 file is not a sequence of whole frames (the LZ4 frame format), or None.

    Only headers and block sizes are read; the blocks are skipped by their sizes.
    """
    size = handle.seek(0, io.SEEK_END)
    position = handle.seek(0)
    while position < size:
        frame = position
        magic = handle.read(4)
        if len(magic) < 4:
            return f"the file is cut off inside the LZ4 frame header at byte {frame}"
        if magic[1:] == b"\x2a\x4d\x18" and magic[0] & 0xF0 == 0x50:  # a skippable frame
            skippable = handle.read(4)
            end = position + 8 + int.from_bytes(skippable, "little")
            if len(skippable) < 4 or end > size:
                return f"the file is cut off inside the LZ4 skippable frame at byte {frame}"
            position = handle.seek(end)
            continue
        if magic != _LZ4_MAGIC:
            return f"the file holds no LZ4 frame at byte {frame}"
        descriptor = handle.read(2)
        if len(descriptor) < 2:
            return f"the file is cut off inside the LZ4 frame header at byte {frame}"
        flags = descriptor[0]
        extra = 8 * bool(flags & 0x08) + 4 * bool(flags & 0x01) + 1  # content size, dictionary id, checksum
        if len(handle.read(extra)) < extra:
            return f"the file is cut off inside the LZ4 frame header at byte {frame}"
        block_checksum = 4 * bool(flags & 0x10)
        while True:
            block_size = handle.read(4)
            if len(block_size) < 4:
                return f"the file is cut off inside the LZ4 frame at byte {frame}: no end mark"
            length = int.from_bytes(block_size, "little") & 0x7FFFFFFF
            if length == 0:
                break
            position = handle.tell() + length + block_checksum
            if position > size:
                return f"the file is cut off inside the LZ4 frame at byte {frame}: a block is cut"
            handle.seek(position)
        checksum = 4 * bool(flags & 0x04)
        if len(handle.read(checksum)) < checksum:
            return f"the file is cut off inside the LZ4 frame at byte {frame}: no content checksum"
        position = handle.tell()
    return None


def walk_records(chunks: Iterable[bytes]) -> tuple[str, int, str] | None:
    """Walk WARC records by their Content-Length through the byte stream `chunks` make up.

    None when the stream ends between records; else (what is wrong, the stream position where the
    record starts, a suffix for the message). Holds at most one header and one chunk in memory.
    """
    chunks = _coalesced(chunks)
    buffer = b""
    start = 0  # stream position of buffer[0]
    eof = False
    while True:
        stripped = buffer.lstrip(b"\r\n")  # the CRLF CRLF after each record
        start += len(buffer) - len(stripped)
        buffer = stripped
        header_end = buffer.find(b"\r\n\r\n")
        if header_end < 0:
            if eof:
                return None if not buffer.strip() else ("the file ends inside the record header", start, "")
            if len(buffer) > _MAX_HEADER_BYTES:
                return ("the file holds no WARC record header", start, "")
            chunk = next(chunks, b"")
            buffer += chunk
            eof = not chunk
            continue
        match = _CONTENT_LENGTH.search(buffer, 0, header_end)
        if match is None:
            return ("the file ends inside the record header", start, ": no Content-Length")
        record_start, to_skip = start, header_end + 4 + int(match.group(1))
        while len(buffer) < to_skip:
            to_skip -= len(buffer)
            start += len(buffer)
            buffer = next(chunks, b"")
            if not buffer:
                return ("the file ends inside the record", record_start, ": it was cut off")
        start += to_skip
        buffer = buffer[to_skip:]


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
