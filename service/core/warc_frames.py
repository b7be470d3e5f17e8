"""The members a WARC file may be compressed in, record by record or as one stream: gzip members, zstd and
LZ4 frames. What the three have in common is here: each one's magic, and how a member is found and checked
(`Framing`: its output in bounded chunks, and whether one found by its magic starts a WARC record, which
`warc_skip` finds members with). So are the zstd and LZ4 frames themselves: how each is decoded, and where
one ends by its structure alone. A gzip member keeps no sizes (where one ends is told only by inflating
it), so gzip's members are `warc_gzip`'s; whether a file ends with whole records is `warc_tail`'s, and
where reading goes on after a corrupt member, `warc_skip`'s.

A zstd file may start with the dictionary its frames were compressed with (the IIPC zstd-WARC layout, as
wget-at writes it): its frames are decoded with it. An LZ4 frame is decoded by FastWARC's own reader (no
other LZ4 decoder is installed), after its blocks are walked by their sizes: that reader takes a frame
cut inside its header for a clean end.
"""

from __future__ import annotations

import io
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO, ClassVar, NamedTuple

import zstandard

CHUNK = 1 << 20  # the most bytes of output (or of a file) handled at a time
# What may follow the last member (or record): NULs, blank lines, as a writer pads a file to a block.
PADDING = b"\0\r\n\t "
GZIP_MAGIC = b"\x1f\x8b"
GZIP_MEMBER_START = GZIP_MAGIC + b"\x08"  # gzip's magic and its one compression method, deflate


ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
ZSTD_DICTIONARY_MAGIC = b"\x5d\x2a\x4d\x18"  # the skippable frame a zstd WARC's dictionary is kept in
_MAX_DICTIONARY = 64 << 20  # a dictionary frame claiming more is no dictionary (a corrupt size)
LZ4_MAGIC = b"\x04\x22\x4d\x18"
_LZ4_PROBE = 4096  # bytes of a candidate frame enough for its first block's first literals
# What FastWARC takes for a record's first bytes (tried on FastWARC 2.0.1: WARC/1.0 and WARC/1.1, WARC/0.
# and up to two more characters; `WARC/2.0`, `WARC/1.2`, `warc/1.1` and a blank before are "Invalid WARC
# header"); `warc_tail` holds a record's whole version line to the same.
_RECORD_START = re.compile(rb"WARC/(?:1\.[01]|0\.)")
START_BYTES = 8  # enough of a record's output to match `_RECORD_START`
# A zstd frame's header is at most 18 bytes, and a block's compressed size at most 128 KiB (RFC 8878): a
# candidate frame's first block, whose output starts the record, is within these bytes.
_ZSTD_MAX_HEADER = 18
_ZSTD_BLOCK_HEADER = 3
_ZSTD_MAX_BLOCK = 128 << 10
_ZSTD_RAW, _ZSTD_RLE, _ZSTD_RESERVED = 0, 1, 3  # block types; compressed (2) ones hold their size in bytes
_ZSTD_PROBE = _ZSTD_MAX_HEADER + _ZSTD_BLOCK_HEADER + _ZSTD_MAX_BLOCK
_LZ4_UNCOMPRESSED = 0x80000000  # a block size's high bit: the block is stored as it is


class Undecodable(Exception):
    """The compressed stream stops decoding before the file ends."""


class Framing(NamedTuple):
    """How the members of a compression are found and checked (`warc_skip.skip_member`)."""

    start: bytes  # what every member starts with
    probe: int  # bytes of a candidate enough for `starts_record`
    # The output of the member at a byte, in bounded chunks; its end appended to the list once it decodes
    # to it, `Undecodable` where it does not (corrupt or cut).
    decode: Callable[[BinaryIO, int, list[int]], Iterator[bytes]]
    starts_record: Callable[[memoryview], bool]  # whether a candidate decodes to a record's start
    member: str  # what a member is called in messages: "gzip member", "zstd frame", "LZ4 frame"
    first: int = 0  # where the first member starts: past the dictionary frame a zstd file may start with
    # Where the member at a byte ends by its structure alone, whether or not its data decodes, None where
    # that cannot be told (gzip keeps no sizes; a block header that is corrupt itself).
    extent: Callable[[BinaryIO, int], int | None] = lambda handle, offset: None


def opens_record(output: bytes | memoryview) -> bool:
    """Whether `output`, a member's first bytes out, are a record's first bytes as FastWARC reads them."""
    return _RECORD_START.match(bytes(output[:START_BYTES])) is not None


def dictionary_frame(path: Path) -> bytes:
    """The skippable frame holding the dictionary a zstd file starts with (the IIPC zstd-WARC layout),
    b"" for none. FastWARC reads a dictionary from a stream's first bytes only: reading that goes on
    after a corrupt frame hands it this frame first (`warc_pages`), or every frame after it fails."""
    with path.open("rb") as handle:
        return _dictionary_frame(handle)


def _dictionary_frame(handle: BinaryIO) -> bytes:
    handle.seek(0)
    header = handle.read(8)
    if len(header) < 8 or header[:4] != ZSTD_DICTIONARY_MAGIC:
        return b""
    size = int.from_bytes(header[4:], "little")
    return b"" if size > _MAX_DICTIONARY else header + handle.read(size)


class ForwardOnly:
    """A stream FastWARC reads from its position 0, forward only (`BehindDictionary`,
    `warc_unaligned.Inflating`): its position, which each `read` moves on, the seeks FastWARC makes to
    where it is, and a `close` that leaves the file to its caller."""

    _what: ClassVar[str] = "the stream"  # what a move refuses names

    def __init__(self) -> None:
        self._position = 0

    def tell(self) -> int:
        return self._position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        """Where it is (FastWARC reads forward only); any move is `io.UnsupportedOperation`."""
        if (offset, whence) in ((0, io.SEEK_CUR), (self._position, io.SEEK_SET)):
            return self._position
        raise io.UnsupportedOperation(f"{self._what} reads forward only")

    def close(self) -> None:
        """Nothing: the file is the caller's."""


class BehindDictionary(ForwardOnly):
    """A zstd file from a frame on behind the frame holding its dictionary (`dictionary_frame`), as a
    stream FastWARC reads from its position 0: FastWARC loads a dictionary only there (from any other
    position every frame was a "Dictionary mismatch"), so its offsets are short of the file's by the
    bytes between that frame and the one reading goes on at (which `warc_pages` adds back)."""

    _what = "a stream behind a zstd dictionary frame"

    def __init__(self, prefix: bytes, handle: BinaryIO) -> None:
        super().__init__()
        self._prefix = prefix
        self._handle = handle

    def read(self, size: int = -1) -> bytes:
        out = self._prefix if size < 0 else self._prefix[:size]
        self._prefix = self._prefix[len(out) :]
        if size < 0 or len(out) < size:
            out += self._handle.read(-1 if size < 0 else size - len(out))
        self._position += len(out)
        return out


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
        if content.startswith(ZSTD_MAGIC):
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
    return bytes(block[header : header + min(size, START_BYTES)])


class _Zstd:
    """A zstd file's frames (`Framing`), decoded with the dictionary it starts with, if any, and by one
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
    def framing(cls, handle: BinaryIO) -> Framing:
        dictionary, first = _zstd_dictionary(handle)
        zstd = cls(dictionary)
        return Framing(
            ZSTD_MAGIC, _ZSTD_PROBE, zstd.frame, zstd.starts_record, "zstd frame", first, _zstd_extent
        )

    def frame(self, handle: BinaryIO, offset: int, ends: list[int]) -> Iterator[bytes]:
        """What the zstd frame at `offset` decodes to, a block at a time (at most 128 KiB of output: a
        frame of RLE blocks may be a bomb); its end appended to `ends` once it decodes to it,
        `Undecodable` where it does not."""
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
                    raise Undecodable("a zstd block header is cut off or invalid")
                last, _, length = block
                content = handle.read(length)
                if len(content) < length:
                    raise Undecodable("a zstd block is cut off")
                out = decompressor.decompress(block_header + content)
                position += _ZSTD_BLOCK_HEADER + length
                if out:
                    yield out
            if checksum:
                handle.seek(position)
                decompressor.decompress(handle.read(4))
                position += 4
        except zstandard.ZstdError as exc:
            raise Undecodable(str(exc)) from exc
        if not decompressor.eof:
            raise Undecodable("the zstd frame is cut off")
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
            return block[1] == _ZSTD_RAW and opens_record(content)
        if self._dictionary is None:
            literals = _zstd_raw_literals(content)
            if literals is not None:
                return opens_record(literals)
        try:
            return opens_record(self._decompressor.stream_reader(piece[:end]).read(START_BYTES))
        except zstandard.ZstdError:
            return False


def _zstd_extent(handle: BinaryIO, offset: int) -> int | None:
    """Where the zstd frame at `offset` ends by its header and block headers alone (its blocks are not
    decoded), None where they do not frame one that another frame, or the file's end, follows."""
    size = handle.seek(0, io.SEEK_END)
    handle.seek(offset)
    header = handle.read(_ZSTD_MAX_HEADER)
    try:
        position = offset + zstandard.frame_header_size(header)
        checksum = zstandard.get_frame_parameters(header).has_checksum
    except zstandard.ZstdError:
        return None
    last = False
    while not last and position < size:
        handle.seek(position)
        block = _zstd_block(handle.read(_ZSTD_BLOCK_HEADER))
        if block is None:
            return None
        last, _, length = block
        position += _ZSTD_BLOCK_HEADER + length
    return _frame_end(handle, position + 4 * checksum, size) if last else None


def _lz4_extent(handle: BinaryIO, offset: int) -> int | None:
    """Where the LZ4 frame at `offset` ends by its header and block sizes alone (`_lz4_frame_size`), None
    where they do not frame one that another frame, or the file's end, follows."""
    size = handle.seek(0, io.SEEK_END)
    handle.seek(offset)
    length = _lz4_frame_size(handle, size)
    return None if isinstance(length, tuple) else _frame_end(handle, offset + length, size)


def _frame_end(handle: BinaryIO, end: int, size: int) -> int | None:
    """`end`, where the file ends or a frame (or skippable frame) starts; else None: a frame's sizes walked
    through a block header that is itself corrupt land anywhere, past the frames after it too."""
    handle.seek(end)
    magic = handle.read(4)
    skippable = len(magic) == 4 and magic[1:] == b"\x2a\x4d\x18" and magic[0] & 0xF0 == 0x50
    return end if end == size or magic in (ZSTD_MAGIC, LZ4_MAGIC) or skippable else None


def _unlz4_frame(handle: BinaryIO, offset: int, ends: list[int]) -> Iterator[bytes]:
    """What the LZ4 frame at `offset` decodes to, at most `CHUNK` bytes at a time; its end appended to
    `ends` once it decodes to it, `Undecodable` where it does not. Its blocks are walked by their sizes
    (`_lz4_frame_size`), then the frame decoded by FastWARC's own reader (there is no other LZ4 decoder
    here)."""
    from fastwarc.stream_io import Lz4Reader

    file_size = handle.seek(0, io.SEEK_END)
    handle.seek(offset)
    size = _lz4_frame_size(handle, file_size)
    if isinstance(size, tuple):
        raise Undecodable("".join(size))
    handle.seek(offset)
    reader = Lz4Reader(_Slice(handle, offset + size))
    try:
        while True:
            try:
                out = reader.read(CHUNK)
            except OSError as exc:
                raise Undecodable(str(exc)) from exc
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
        """Nothing: the file is the caller's, read on after the frame (`warc_skip.skip_member`)."""


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
    return literals >= len("WARC/0.") and opens_record(piece[at : at + min(literals, START_BYTES)])


def lz4_frames_problem(handle: BinaryIO, start: int = 0) -> str | None:
    """Why the LZ4 file from byte `start` on is not a sequence of whole frames (the LZ4 frame format), or
    None. Only headers and block sizes are read; the blocks are skipped by their sizes."""
    problems: list[str] = []
    for _ in lz4_marks(handle, start, problems):
        pass
    return problems[0] if problems else None


def lz4_marks(handle: BinaryIO, start: int, problems: list[str]) -> Iterator[tuple[int, int, bool]]:
    """Each frame, from byte `start` on, that holds a block and follows one frame or more that hold none
    (an empty frame, which FastWARC's reader takes for the file's end where it starts the file or follows
    another: `warc_tail`), as (where the frames before it end, skippable ones left out; where it starts;
    True), in file order, as the frames' headers are read. The caller reads only as far as it needs: a
    walk that goes on at the first one had read every frame's header to the file's end at every stop,
    quadratic in a file with empty frames after every record.

    Skippable frames between are passed over: FastWARC stops at the empty frames before them and never
    reads them. Marked, a skippable frame was where reading went on, and failed ("Invalid WARC header"),
    every record after it lost; and a reader given the frames up to the next one fails on it (FastWARC's
    does, even after empty frames where its record iterator had stopped). So is one after a frame that
    holds a block, as (where it starts; where it ends; False), for the caller's reader to pass over: it
    holds no record, and FastWARC fails on it with a row of its own when it gets there. Read on through
    one, the walk of the rest of a file after damage had failed there and reading had not gone on at a
    mark before it (`warc_tail.reading_end`'s `trusted`), whose record then was a false error row.

    Why the frames are not whole frames (`lz4_frames_problem`) is appended to `problems` where the scan
    stops at that. The handle is sought to each frame: the caller may read the file between two."""
    size = handle.seek(0, io.SEEK_END)
    position = start
    after_empty = False  # the frame before, skippable frames passed over, held no block
    end = start  # where that frame ends
    while position < size:
        handle.seek(position)
        empty: list[bool] = []
        length = _lz4_frame_size(handle, size, empty)
        if isinstance(length, tuple):
            what, why = length
            problems.append(f"{what} at byte {position}{why}")
            return
        if empty:  # a frame, not a skippable one
            if after_empty and not empty[0]:
                yield end, position, True
            after_empty, end = empty[0], position + length
        elif not after_empty:
            yield position, position + length, False
        position += length


def lz4_output(handle: BinaryIO, start: int, end: int) -> Iterator[bytes]:
    """What the LZ4 frames from byte `start` up to byte `end` decode to, read by FastWARC's own reader in
    bounded chunks (its `OSError` where they do not decode)."""
    from fastwarc.stream_io import Lz4Reader

    handle.seek(start)
    reader = Lz4Reader(_Slice(handle, end))
    try:
        yield from iter(lambda: reader.read(CHUNK), b"")
    finally:
        reader.close()


def _lz4_frame_size(handle: BinaryIO, size: int, empty: list[bool] | None = None) -> int | tuple[str, str]:
    """The bytes the LZ4 frame (or skippable frame) at `handle`'s position takes in a file of `size`
    bytes, by its header and block sizes; else what is wrong, and a suffix to the frame's byte (which
    the caller says). `empty`: whether it is a frame that holds no block, appended; nothing for a skippable
    frame, which is neither (`lz4_marks`)."""
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
    if magic != LZ4_MAGIC:
        return ("the file holds no LZ4 frame", "")
    descriptor = handle.read(2)
    if len(descriptor) < 2:
        return ("the file is cut off inside the LZ4 frame header", "")
    flags = descriptor[0]
    extra = 8 * bool(flags & 0x08) + 4 * bool(flags & 0x01) + 1  # content size, dictionary id, checksum
    if len(handle.read(extra)) < extra:
        return ("the file is cut off inside the LZ4 frame header", "")
    block_checksum = 4 * bool(flags & 0x10)
    blocks = 0
    while True:
        block_size = handle.read(4)
        if len(block_size) < 4:
            return ("the file is cut off inside the LZ4 frame", ": no end mark")
        length = int.from_bytes(block_size, "little") & 0x7FFFFFFF
        if length == 0:
            break
        blocks += 1
        position = handle.tell() + length + block_checksum
        if position > size:
            return ("the file is cut off inside the LZ4 frame", ": a block is cut")
        handle.seek(position)
    checksum = 4 * bool(flags & 0x04)
    if len(handle.read(checksum)) < checksum:
        return ("the file is cut off inside the LZ4 frame", ": no content checksum")
    if empty is not None:
        empty.append(not blocks)
    return handle.tell() - frame


LZ4 = Framing(LZ4_MAGIC, _LZ4_PROBE, _unlz4_frame, _lz4_starts_record, "LZ4 frame", extent=_lz4_extent)


def zstd_framing(handle: BinaryIO) -> Framing:
    """The framing of the zstd file open as `handle`, its frames decoded with the dictionary it starts
    with, if any."""
    return _Zstd.framing(handle)
