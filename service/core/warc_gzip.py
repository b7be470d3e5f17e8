"""Gzip members, as a WARC file is compressed record by record or as one stream: how a member inflates in
bounded chunks and whether one found by its magic starts a record (`GZIP`, the `Framing` that
`warc_skip` finds members with), the output of a file's members as one stream (`gunzipped`, and
`gunzipped_marked` with where a member follows empty ones, which `warc_tail` walks), and how far a member
that does not decode inflates before its damage (`inflate_damaged`, `inflate_member`), which `warc_fence`
looks for a stored WARC download in. Apart from the zstd and LZ4 frames (`warc_frames`): a gzip member
keeps no sizes, so where one ends, or where its damage is, is told only by inflating it.
"""

from __future__ import annotations

import io
import zlib
from collections.abc import Iterator
from typing import BinaryIO, NamedTuple, cast

from service.core.warc_frames import (
    CHUNK,
    GZIP_MEMBER_START,
    PADDING,
    START_BYTES,
    Framing,
    Undecodable,
    opens_record,
)

_FIRST_PIECE = 64  # bytes of a gzip member fed first (see gunzipped)
_GZIP_PROBE = 4096  # bytes of a candidate member inflated to tell whether it starts a record


def _gunzip_member(handle: BinaryIO, offset: int, ends: list[int]) -> Iterator[bytes]:
    """What the gzip member at `offset` inflates to, at most `CHUNK` bytes at a time (a member may be a
    bomb); its end appended to `ends` once it inflates to it, `Undecodable` where it does not."""
    handle.seek(offset)
    decompressor = zlib.decompressobj(31)
    position = offset  # of data[0]
    for data in iter(lambda: handle.read(CHUNK), b""):
        while data:
            try:
                out = decompressor.decompress(data, CHUNK)
            except zlib.error as exc:
                raise Undecodable(str(exc)) from exc
            if out:
                yield out
            if decompressor.eof:
                ends.append(position + len(data) - len(decompressor.unused_data))
                return
            left = decompressor.unconsumed_tail
            if len(left) == len(data) and not out:
                raise Undecodable("the gzip member makes no progress")  # never seen; never spin
            position += len(data) - len(left)
            data = left
    raise Undecodable("the gzip member is cut off")


def _gzip_starts_record(piece: memoryview) -> bool:
    """Whether `piece`, the start of a gzip member, inflates to the start of a WARC record."""
    try:
        return opens_record(zlib.decompressobj(31).decompress(piece, START_BYTES))
    except zlib.error:
        return False


def gunzipped(handle: BinaryIO) -> Iterator[bytes]:
    """The decompressed bytes of the gzip members from `handle`'s position on, in bounded chunks.

    Each member is fed in doubling slices of a view of the chunk read, so what it leaves over
    (`unused_data`, a copy) is about its own size: handing every member the rest of a 1 MiB chunk made
    a file of tiny members quadratic (a second per MiB).
    """
    return cast(Iterator[bytes], _gunzip(handle, marked=False))


def gunzipped_marked(handle: BinaryIO) -> Iterator[bytes | int]:
    """`gunzipped`, with the byte (an int) where a member starts that follows one empty member or more
    (members that decode to no byte: bgzip's end-of-file block, `gzip < /dev/null`) and itself decodes
    to some, before its output: where FastWARC stops reading without a word (`warc_tail.reading_end`).
    A member there that fails before its first byte of output has its mark before the failure: without
    one, the walk blamed the failure on the intact record before the empty members."""
    return _gunzip(handle, marked=True)


def _gunzip(handle: BinaryIO, *, marked: bool) -> Iterator[bytes | int]:
    """`gunzipped`'s chunks, and where `marked`, `gunzipped_marked`'s marks among them."""
    decompressor: zlib._Decompress | None = None
    size = _FIRST_PIECE
    base = handle.tell() if marked else 0  # the file's byte of the chunk read
    member = base  # where the member being inflated starts
    empty = False  # an empty member ended since the last output (`marked` only)
    output = 0  # what that member inflated to so far (`marked` only)
    for data in iter(lambda: handle.read(CHUNK), b""):
        view = memoryview(data)
        position = 0
        while position < len(data):
            if decompressor is None:
                if data[position] in PADDING and not data[position:].strip(PADDING):
                    break  # padding after the last member
                decompressor, size = zlib.decompressobj(31), _FIRST_PIECE
                member, output = base + position, 0
            piece = view[position : position + size]
            try:
                out = decompressor.decompress(piece, CHUNK)
            except zlib.error as exc:
                if empty:
                    yield member
                raise Undecodable(str(exc)) from exc
            if out:
                if empty:
                    yield member
                    empty = False
                output += len(out)
                yield out
            if decompressor.eof:  # the next member, if any, starts in what this one left
                position += len(piece) - len(decompressor.unused_data)
                decompressor = None
                empty = empty or (marked and not output)
                continue
            # Input held back by the output bound stays for the next call.
            consumed = len(piece) - len(decompressor.unconsumed_tail)
            if not consumed and not out:
                raise Undecodable("the gzip stream makes no progress")  # never seen; never spin
            position += consumed
            size = min(2 * size, CHUNK)
        base += len(data)
    if decompressor is not None:
        if empty:
            yield member
        raise Undecodable("a gzip member is cut off")


GZIP = Framing(GZIP_MEMBER_START, _GZIP_PROBE, _gunzip_member, _gzip_starts_record, "gzip member")
_GZIP_HEADER_ROOM = 1 << 10  # a gzip member's header, with a file name or comment (which records have none)
_GZIP_TRAILER = 8  # CRC-32 and size


class Inflated(NamedTuple):
    """What a gzip member that does not decode inflates to (`inflate_damaged`)."""

    head: bytes  # its first bytes of output, up to the damage
    # Where its deflate data inflate to an end, its trailer after it; None where they do not.
    end: int | None = None
    # Whether that is the member's end: one of its trailer's checks holds (a size or CRC byte flipped, or
    # a flip in data stored as they are), and a member, padding or the file's end follows. Else damaged
    # data may have inflated to garbage, on through the members after it, to a false end.
    whole: bool = False


def inflate_damaged(handle: BinaryIO, offset: int, look: int) -> Inflated:
    """The first `look` bytes (at most) the gzip member at `offset`, which does not decode, inflates to
    before its damage, and where it ends where its deflate data are whole. The data are inflated raw, so
    that a trailer that fails is told from data that do: zlib's gzip check says only that one failed.
    The first output comes from slices of the member a few bytes long (zlib gives no output of a call
    that fails), the rest in chunks, its output dropped: one more decode of the member at most."""
    return inflate_member(handle, offset, look)[0]


def inflate_member(handle: BinaryIO, offset: int, look: int, *, mend: bool = False) -> tuple[Inflated, int]:
    """`inflate_damaged`, and how many bytes the member inflated to up to its end or damage. `mend`: the
    member is known to start at `offset` (a member ended right before it), so a header whose first four
    bytes (magic, method, flags) are the damage is read as a record's member has it: gzip's magic and
    method, the flags as they are or none (a crawler writes no file name or comment), whichever inflates
    to more. Read as no member, its record's stored .warc.gz had been no reason to keep the download's
    members from being read as pages (`warc_fence.past_damage`)."""
    handle.seek(offset)
    data = handle.read(_GZIP_HEADER_ROOM)
    header = _gzip_header_size(data)
    if header is not None or not mend or len(data) < 10:
        return _inflate_raw(handle, offset, header, look)
    headers = {_gzip_header_size(GZIP_MEMBER_START + data[3:]), 10}  # its flags as they are, or none
    tries = [_inflate_raw(handle, offset, size, look) for size in sorted(headers, key=lambda size: size or 0)]
    return max(tries, key=lambda inflated: (inflated[0].end is not None, inflated[1]))


def _inflate_raw(handle: BinaryIO, offset: int, header: int | None, look: int) -> tuple[Inflated, int]:
    """`inflate_member` of the member at `offset` whose header takes `header` bytes (None: no header)."""
    if header is None:
        return Inflated(b""), 0
    start = offset + header
    handle.seek(start)
    decompressor = zlib.decompressobj(-15)
    head = b""
    read = size = crc = 0  # bytes read from `start` on; the output's size and CRC-32
    try:
        while not decompressor.eof:
            room = look - len(head)
            piece = decompressor.unconsumed_tail
            if not piece:
                piece = handle.read(_FIRST_PIECE if room > 0 else CHUNK)
                read += len(piece)
            if not piece:
                return Inflated(head), size  # cut off
            out = decompressor.decompress(piece, room if room > 0 else CHUNK)
            if room > 0:
                head += out
            size, crc = size + len(out), zlib.crc32(out, crc)
            if not out and len(decompressor.unconsumed_tail) == len(piece):
                return Inflated(head), size  # never seen; never spin
    except zlib.error:
        return Inflated(head), size
    trailer = start + read - len(decompressor.unused_data)
    handle.seek(trailer)
    checks = handle.read(_GZIP_TRAILER)
    end = trailer + _GZIP_TRAILER
    held = checks[:4] == crc.to_bytes(4, "little") or checks[4:] == (size % (1 << 32)).to_bytes(4, "little")
    return Inflated(head, end, held and member_follows(handle, end)), size


def _gzip_header_size(data: bytes) -> int | None:
    """The bytes the gzip member header `data` starts with takes (RFC 1952: its extra field, file name,
    comment and header CRC where its flags say so), None where `data` holds no whole one."""
    if len(data) < 10 or not data.startswith(GZIP_MEMBER_START):
        return None
    flags, at = data[3], 10
    if flags & 0x04:  # FEXTRA
        at += 2 + int.from_bytes(data[at : at + 2], "little")
    for flag in (0x08, 0x10):  # FNAME, FCOMMENT: zero-terminated
        if flags & flag:
            at = data.find(b"\0", at) + 1
            if at == 0:
                return None
    at += 2 * bool(flags & 0x02)  # FHCRC
    return at if at <= len(data) else None


def member_follows(handle: BinaryIO, end: int) -> bool:
    """Whether the file ends at `end`, or a gzip member or padding (to the end) starts there: the end of a
    member, rather than of damaged data inflated to a false end."""
    size = handle.seek(0, io.SEEK_END)
    if end >= size:
        return end == size
    handle.seek(end)
    piece = handle.read(len(GZIP_MEMBER_START))
    if piece == GZIP_MEMBER_START:
        return True
    while piece and not piece.strip(PADDING):
        piece = handle.read(CHUNK)
    return not piece


def holds_gzip_records(data: bytes) -> bool:
    """Whether `data` holds a gzip member that starts a WARC record, as a stored .warc.gz does."""
    view = memoryview(data)
    at = data.find(GZIP_MEMBER_START)
    while at >= 0:
        if _gzip_starts_record(view[at : at + _GZIP_PROBE]):
            return True
        at = data.find(GZIP_MEMBER_START, at + 1)
    return False
