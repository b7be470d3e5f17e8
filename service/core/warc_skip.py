"""Where reading goes on after FastWARC failed inside a file compressed per record: past the member it
failed on, at the next one that starts a record (`skip_member`), or at the file's end where the member a
record was read from whole does not decode (`last_member_fails`).

Where FastWARC fails inside a file compressed per record (a corrupt gzip member, zstd frame or LZ4 frame),
`skip_member` finds the member it failed on and the next one that starts a record, where reading can go
on: crawlers write a member per record precisely so that a reader can pass over a damaged one. Each of the
three formats lets a reader find the next one: a member or frame starts with its magic number, and a
candidate is taken only where it decodes to the start of a WARC record (`Framing`), after the damaged
member where its end can be told (a frame's block sizes; a gzip member's deflate data, where its trailer
fails one check alone), and never inside one whose record holds a stored WARC file
(`warc_fence.past_damage`: a crawled .warc.gz holds members of its own); else from the next byte on, since
a fence everywhere took the intact records after everyday damage. A file compressed as one stream has no
next one (FastWARC's offsets inside it are no member starts): it ends with one row.

Where a file's members are cut where its records are not (bgzip, pgzip), no member starts a record
after the damaged one: `warc_unaligned` reads on inside them.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import BinaryIO, NamedTuple

from service.core.warc_compression import file_framing, opens_record_member
from service.core.warc_fence import Fence, admitted, past_damage
from service.core.warc_frames import CHUNK, Framing, Undecodable
from service.core.warc_tail import walk_records


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
    from alone (`warc_bare_lf.bare_lf_record_end`), so a member starts there, whatever its first bytes
    say (its magic may be the damage). Reads the file once more at most: the members at `offset` and
    after it, then forward from the failed one to the next record's member.
    """
    with path.open("rb") as handle:
        framing = file_framing(path, handle)
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
        # there, or where `past_damage` says (never inside a damaged member).
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
        fence = Fence(failed_end) if failed_end is not None else past_damage(handle, failed, framing)
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
        framing = file_framing(path, handle)
        if framing is None or not opens_record_member(handle, offset, framing):
            return None
        end, _ = _member_walk(handle, offset, framing)
        size = handle.seek(0, io.SEEK_END)
    return None if end is not None else Skip(offset, size, member=framing.member, last=True)


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


def _next_record_member(
    handle: BinaryIO, start: int, framing: Framing, fence: Fence | None = None
) -> int | None:
    """The first byte from `start` on where a member starts that decodes to a WARC record's start, or
    None; where `fence` (`past_damage`) admits one. Each candidate (the member's magic, which compressed
    data holds by chance) is checked on a view of the chunk read, its first bytes of output at most (a
    zstd block: 128 KiB, where its first literals are not stored as they are), so a file of garbage is
    read once and never held."""
    fence = fence or Fence(start)
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
            if framing.starts_record(view[at : at + framing.probe]) and admitted(handle, start + at, fence):
                return start + at
            at = window.find(framing.start, at + 1)
        if limit > 0:
            window, start = window[limit:], start + limit
    return None
