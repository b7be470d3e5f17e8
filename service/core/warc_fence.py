"""Where the member after a damaged one may start, so that reading never goes on inside a stored WARC
download: a record whose payload is a WARC file (a .warc.gz served as a file) holds gzip members of its
own, stored as they are (deflate's stored blocks), and reading that went on at one of those had made pages
of the download's records. Where what the damaged member inflates to before its damage shows such a
payload (`holds_stored_warc`), the next member is taken only past that record's end (`past_damage`,
`Fence`, `admitted`). `warc_skip` looks for the next member behind this fence; `warc_unaligned` keeps the
same one (`holds_stored_warc`) inside members cut where records are not.
"""

from __future__ import annotations

import re
from typing import BinaryIO, NamedTuple

from service.core.warc_frames import LZ4_MAGIC, ZSTD_DICTIONARY_MAGIC, ZSTD_MAGIC, Framing
from service.core.warc_gzip import GZIP, holds_gzip_records, inflate_member, member_follows
from service.core.warc_tail import HEADER_END, record_length

_GZIP_HEADER_ROOM = 1 << 10  # a gzip member's header, with a file name or comment (which records have none)
_LOOK = 64 << 10  # bytes of a damaged gzip member's output looked at for a stored WARC file
# The media types of a WARC file, compressed or not, in a record's WARC header or HTTP head (not a
# warcinfo record's application/warc-fields).
_WARC_MEDIA_TYPE = re.compile(
    rb"(?im)^content-type:[ \t]*application/(?:x-)?(?:warc|gzip|gzip-compressed|zstd|lz4)[ \t]*(?:;|\r?$)"
)
# What a stored WARC file starts with whose members are no gzip members (`holds_stored_warc`).
_NO_GZIP_MEMBERS = (b"WARC/", ZSTD_MAGIC, ZSTD_DICTIONARY_MAGIC, LZ4_MAGIC)


class Fence(NamedTuple):
    """Where the member after one that does not decode may start (`past_damage`)."""

    after: int  # not before this byte
    until: int = 0  # before this byte, only right after a gzip trailer whose size is `size` (or 4 less)
    size: int = 0  # the damaged member's output up to its stored WARC file's record's end, as declared


def past_damage(handle: BinaryIO, offset: int, framing: Framing) -> Fence:
    """Where the member after the one at `offset`, which does not decode, may start. A zstd or LZ4 frame
    ends where its block sizes say (`Framing.extent`), a gzip member where its deflate data end, where its
    trailer says they are whole (`warc_gzip.inflate_damaged`: a trailer byte flipped). Else the next
    byte on, as for every member but one case: a record whose payload is a WARC file (a .warc.gz served
    as a file) holds members of its own, stored as they are (deflate's stored blocks), and resumed at
    one of those, reading had made pages of the download's records, and failed again at its end.

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
        return Fence(end)
    if framing is not GZIP:
        return Fence(offset + 1)
    inflated, out = inflate_member(handle, offset, _LOOK, mend=True)
    if inflated.end is not None and inflated.whole:
        return Fence(inflated.end)
    size = _stored_warc_end(inflated.head)
    if size is None:
        return Fence(offset + 1)
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
    return Fence(offset + 1, until, size)


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
    header = HEADER_END.search(head)
    if header is None:
        return False
    payload = head[header.end() :]
    if holds_gzip_records(payload):
        return True
    heads, body = header.end(), payload  # the heads' end; the payload's body (a resource record's all)
    if payload.startswith(b"HTTP/"):
        http = HEADER_END.search(payload)
        heads += len(payload) if http is None else http.end()
        body = b"" if http is None else payload[http.end() :]
    return _WARC_MEDIA_TYPE.search(head, 0, heads) is not None and not body.startswith(_NO_GZIP_MEMBERS)


def admitted(handle: BinaryIO, at: int, fence: Fence) -> bool:
    """Whether the next member may start at `at` by `fence` (`past_damage`); the handle's position kept."""
    if at >= fence.until:
        return True
    if at < 4:
        return False
    position = handle.tell()
    handle.seek(at - 4)
    size = int.from_bytes(handle.read(4), "little")  # a gzip trailer's: the member's output, modulo 2**32
    handle.seek(position)
    return 0 <= fence.size % (1 << 32) - size <= 4  # a record written without its CRLF CRLF, too
