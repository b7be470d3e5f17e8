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
member whose header is corrupt is passed over too.
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
_LZ4_MAGIC = b"\x04\x22\x4d\x18"
_CHUNK = 1 << 20
_FIRST_PIECE = 64  # bytes of a gzip member fed first (see _gunzipped)
_PADDING = b"\0\r\n\t "  # may follow the last gzip member
_MAX_HEADER_BYTES = 1 << 20  # a WARC header longer than this is not one
_CONTENT_LENGTH = re.compile(rb"(?im)^content-length:[ \t]*(\d+)[ \t]*\r?$")
_MEMBER_START = GZIP_MAGIC + b"\x08"  # gzip's magic and its one compression method, deflate
_PROBE = 4096  # bytes of a candidate member inflated to tell whether it starts a record (see _starts_record)
_RECORD_START = b"WARC/"
# A zstd frame's header is at most 18 bytes, and a block's compressed size at most 128 KiB (RFC 8878): a
# candidate frame's first block, whose output starts the record, is within these bytes.
_ZSTD_MAX_HEADER = 18
_ZSTD_BLOCK_HEADER = 3
_ZSTD_MAX_BLOCK = 128 << 10
_ZSTD_RLE, _ZSTD_RESERVED = 1, 3  # block types; raw (0) and compressed (2) blocks hold their size in bytes
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
        framing = _file_framing(path, handle.read(4))
        if framing is _ZSTD:
            return None
        if framing is _LZ4:
            return _lz4_problem(handle, start)
        handle.seek(offset)
        if framing is _GZIP:
            if handle.read(2) == GZIP_MAGIC:
                handle.seek(offset)
                return _walk_problem(_gunzipped(handle), offset, "gzip")
            handle.seek(start)  # one gzip stream: FastWARC's offset is no member start
            return _walk_problem(_gunzipped(handle), 0, "gzip", start=start)
        return _walk_problem(iter(lambda: handle.read(_CHUNK), b""), offset, None)


def skip_member(path: Path, offset: int, *, framed: bool) -> tuple[int, int] | None:
    """Where reading a file compressed per record (gzip members, zstd or LZ4 frames) can go on after
    FastWARC failed on it: (the byte where the member it could not read starts, the byte where the next
    member that starts a record starts), or None where it cannot (a file compressed as one stream, a
    plain one, no record after).

    `offset` is where the last record FastWARC framed starts; `framed`: that record was read whole, so
    the member FastWARC failed on is the next one, if that record's own member decodes to its end and to
    whole records and the next one does not. Else the failure was in its own: its rest unread, or its
    data decoded to bytes FastWARC frames otherwise (LZ4 without checksums cannot tell corrupt data, nor
    zstd's raw blocks), and reading goes on at the next member. Reads the file once more at most: the
    members at `offset` and after it, then forward from the failed one to the next record's member.
    """
    with path.open("rb") as handle:
        framing = _file_framing(path, handle.read(4))
        if framing is None:
            return None
        handle.seek(offset)
        # The file's first member, never framed, may be the one whose header is corrupt, magic and all.
        if (offset or framed) and handle.read(len(framing.start)) != framing.start:
            return None  # one stream: FastWARC's offset is no member start
        failed, after = offset, offset + 1  # the member that failed, and where the next may start
        if framed:
            end, whole = _member_walk(handle, offset, framing)
            if end is not None:
                next_whole = whole and _whole_member(handle, end, framing)
                failed, after = (end, end + 1) if whole and not next_whole else (offset, end)
        start = _next_record_member(handle, after, framing)
    return None if start is None else (failed, start)


def member_start(path: Path, magic: bytes) -> bytes:
    """The bytes every member (frame) of the file `path`, whose first bytes are `magic`, starts with:
    gzip's magic and method, zstd's or LZ4's frame magic; b"" for a file of no compression
    `skip_member` knows (a plain WARC file, whose every record starts where FastWARC says)."""
    framing = _file_framing(path, magic)
    return b"" if framing is None else framing.start


class _Framing(NamedTuple):
    """How the members of a compression are found and checked (`skip_member`)."""

    start: bytes  # what every member starts with
    probe: int  # bytes of a candidate enough for `starts_record`
    # The output of the member at a byte, in bounded chunks; its end appended to the list once it decodes
    # to it, `_Undecodable` where it does not (corrupt or cut).
    decode: Callable[[BinaryIO, int, list[int]], Iterator[bytes]]
    starts_record: Callable[[memoryview], bool]  # whether a candidate decodes to a record's start


def _file_framing(path: Path, magic: bytes) -> _Framing | None:
    """The framing of the file `path` whose first four bytes are `magic`, None for a plain one: by its
    magic, else by its name's suffix, as FastWARC picks its decoder (a file whose first member's header
    is corrupt is still that compression's)."""
    if magic[:2] == GZIP_MAGIC:
        return _GZIP
    if magic in (_ZSTD_MAGIC, _LZ4_MAGIC):
        return _ZSTD if magic == _ZSTD_MAGIC else _LZ4
    name = path.name.lower()
    return next((framing for suffix, framing in _SUFFIXES if name.endswith(suffix)), None)


def _whole_member(handle: BinaryIO, offset: int, framing: _Framing) -> bool:
    """Whether a member starts at `offset` that decodes to its end and to whole WARC records."""
    handle.seek(offset)
    if handle.read(len(framing.start)) != framing.start:
        return False
    end, whole = _member_walk(handle, offset, framing)
    return end is not None and whole


def _member_walk(handle: BinaryIO, offset: int, framing: _Framing) -> tuple[int | None, bool]:
    """(Where the member at `offset` ends, None if it does not decode to its end; whether what it decodes
    to is whole WARC records, `walk_records`). Its output is walked as it comes, one chunk in memory."""
    ends: list[int] = []
    chunks = framing.decode(handle, offset, ends)
    try:
        whole = walk_records(chunks) is None
        for _ in chunks:  # the rest of a member whose walk stopped early (no record in it): to its end
            pass
    except _Undecodable:
        return None, False
    return ends[0], whole


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
    None. Each candidate (the member's magic, which compressed data holds by chance) is decoded from a
    view of the chunk read, a few bytes of output at most (a zstd block: 128 KiB), so a file of garbage
    is read once and never held."""
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


def _starts_record(piece: memoryview) -> bool:
    """Whether `piece`, the start of a gzip member, inflates to the start of a WARC record."""
    try:
        return zlib.decompressobj(31).decompress(piece, len(_RECORD_START)) == _RECORD_START
    except zlib.error:
        return False


def _zstd_block(data: bytes | memoryview) -> tuple[bool, int] | None:
    """A zstd block header's (whether the block is the frame's last, the bytes its content takes), None
    for no valid one (cut off, the reserved type, a size over the format's bound)."""
    if len(data) < _ZSTD_BLOCK_HEADER:
        return None
    value = int.from_bytes(data[:_ZSTD_BLOCK_HEADER], "little")
    kind, size = (value >> 1) & 3, value >> 3
    if kind == _ZSTD_RESERVED or size > _ZSTD_MAX_BLOCK:
        return None
    return bool(value & 1), 1 if kind == _ZSTD_RLE else size


def _unzstd_frame(handle: BinaryIO, offset: int, ends: list[int]) -> Iterator[bytes]:
    """What the zstd frame at `offset` decodes to, a block at a time (at most 128 KiB of output: a frame
    of RLE blocks may be a bomb); its end appended to `ends` once it decodes to it, `_Undecodable` where
    it does not."""
    handle.seek(offset)
    header = handle.read(_ZSTD_MAX_HEADER)
    decompressor = zstandard.ZstdDecompressor().decompressobj()
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
            last, length = block
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


def _zstd_starts_record(piece: memoryview) -> bool:
    """Whether `piece`, the start of a zstd frame, decodes to the start of a WARC record: its header is
    valid and its first block (which a compressor never leaves empty but for an empty frame) decodes to
    a record's first bytes."""
    try:
        size = zstandard.frame_header_size(piece[:_ZSTD_MAX_HEADER])
        zstandard.get_frame_parameters(piece[:_ZSTD_MAX_HEADER])
        block = _zstd_block(piece[size : size + _ZSTD_BLOCK_HEADER])
        end = size + _ZSTD_BLOCK_HEADER + (0 if block is None else block[1])
        if block is None or end > len(piece):
            return False
        out = zstandard.ZstdDecompressor().decompressobj().decompress(piece[:end])
    except zstandard.ZstdError:
        return False
    return out[: len(_RECORD_START)] == _RECORD_START


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
    block's first sequence starts with literals, and no match can come within "WARC/" (it repeats no
    four bytes), so a record's compressed first block has at least those five as literals."""
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
    return literals >= len(_RECORD_START) and piece[at : at + len(_RECORD_START)] == _RECORD_START


_GZIP = _Framing(_MEMBER_START, _PROBE, _gunzip_member, _starts_record)
_ZSTD = _Framing(_ZSTD_MAGIC, _ZSTD_PROBE, _unzstd_frame, _zstd_starts_record)
_LZ4 = _Framing(_LZ4_MAGIC, _PROBE, _unlz4_frame, _lz4_starts_record)


_SUFFIXES = ((".gz", _GZIP), (".zst", _ZSTD), (".lz4", _LZ4))


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
