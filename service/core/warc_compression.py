"""Which compression a WARC file is in, and where its members start: every reader of a file's members
(`warc_tail`, `warc_skip`, `warc_bare_lf`, `warc_reading`'s record ids) tells them by these, so that all
agree with FastWARC on what a member is.

The file's compression is told by its magic, else by its name, as FastWARC picks its decoder: a first
member whose header is corrupt is passed over too. How each compression's members are decoded and found
(a zstd file's dictionary included) is `warc_frames`' and `warc_gzip`'s.
"""

from __future__ import annotations

from pathlib import Path
from typing import BinaryIO

from service.core.warc_frames import (
    GZIP_MAGIC,
    GZIP_MEMBER_START,
    LZ4,
    LZ4_MAGIC,
    ZSTD_DICTIONARY_MAGIC,
    ZSTD_MAGIC,
    Framing,
    zstd_framing,
)
from service.core.warc_gzip import GZIP

_MEMBER_STARTS = {"gzip": GZIP_MEMBER_START, "zstd": ZSTD_MAGIC, "lz4": LZ4_MAGIC}
_SUFFIXES = ((".gz", "gzip"), (".zst", "zstd"), (".lz4", "lz4"))


def member_start(path: Path, magic: bytes) -> bytes:
    """The bytes every member (frame) of the file `path`, whose first bytes are `magic`, starts with:
    gzip's magic and method, zstd's or LZ4's frame magic; b"" for a file of no compression
    `warc_skip.skip_member` knows (a plain WARC file, whose every record starts where FastWARC says)."""
    return _MEMBER_STARTS.get(file_compression(path, magic) or "", b"")


def file_compression(path: Path, magic: bytes) -> str | None:
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


def file_framing(path: Path, handle: BinaryIO) -> Framing | None:
    """The framing of the file `path` open as `handle` (`file_compression`), None for a plain one; a zstd
    file's decodes with the dictionary the file starts with, if any."""
    handle.seek(0)
    compression = file_compression(path, handle.read(4))
    if compression == "zstd":
        return zstd_framing(handle)
    return GZIP if compression == "gzip" else LZ4 if compression == "lz4" else None


def opens_record_member(handle: BinaryIO, offset: int, framing: Framing) -> bool:
    """Whether a member starts at `offset` that decodes to a record's start. FastWARC's offsets are such
    in a file compressed per record; in one whose members are cut where records are not (bgzip, pgzip:
    fixed-size pieces of one stream), they are member starts inside records, and the records FastWARC
    framed are walked from where the reading began, as in one stream: walked from such an offset, a
    whole file had ended in a false error row."""
    handle.seek(offset)
    piece = handle.read(framing.probe)
    return piece.startswith(framing.start) and framing.starts_record(memoryview(piece))
