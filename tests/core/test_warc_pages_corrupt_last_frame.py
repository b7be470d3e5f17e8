"""A per-record .warc.lz4 or .warc.zst whose last frame's data are corrupt where its checksum, checked at
the frame's end, is the only word of it (data stored as they are; a record over zstd's 128 KiB block, of
which FastWARC hands on the first blocks): the record's bytes are read before that check fails. As for a
frame in the middle of the file (`warc_failure.Failure._suspect`), the record's row is the failure's and
its page is not kept; with no frame after it to go on at, its page, garbage, had been kept."""

from __future__ import annotations

import gzip
import random
from collections.abc import Callable
from pathlib import Path

import pytest
import zstandard

from tests.factories.warc import HttpResponse, lz4_checked_frame, pages_and_errors, response

COUNT = 4
# Compressions whose frames keep a checksum of their content, and a file suffix.
FRAMES: dict[str, tuple[Callable[[bytes], bytes], str]] = {
    "lz4": (lz4_checked_frame, ".warc.lz4"),
    "zstd": (zstandard.ZstdCompressor(write_checksum=True).compress, ".warc.zst"),
}


@pytest.mark.parametrize("compression", FRAMES)
def test_a_page_from_a_corrupt_last_frame_is_not_kept(tmp_path: Path, compression: str) -> None:
    compress, suffix = FRAMES[compression]
    noise = random.Random(9)  # stored as they are (LZ4's uncompressed blocks, zstd's raw ones)
    records = [
        response(f"r{i}", HttpResponse(b"<p>" + noise.randbytes(200_000) + b"</p>")) for i in range(COUNT)
    ]
    frames = [compress(record) for record in records]
    last = bytearray(frames[-1])
    last[len(last) // 2] ^= 0x01
    path = tmp_path / f"crawl{suffix}"
    path.write_bytes(b"".join([*frames[:-1], bytes(last)]))

    good, errors = pages_and_errors(path)
    assert [p.id for p in good] == [f"<urn:uuid:r{i}>" for i in range(COUNT - 1)]
    assert [p.id for p in errors] == [f"<urn:uuid:r{COUNT - 1}>"]
    start, size = sum(map(len, frames[:-1])), path.stat().st_size
    assert "what was read of it may be garbage (its page was not kept)" in (errors[0].error or "")
    assert f"(bytes {start} to {size - 1}; the file ends with it)" in (errors[0].error or "")


def test_a_member_cut_where_records_are_not_is_no_suspect(tmp_path: Path) -> None:
    """A member that decodes to a record and part of the next (members cut where records are not) is as
    written: the corrupt member after it, the file's last, costs the record it holds a part of alone."""
    records = [response(f"r{i}", HttpResponse(f"<p>page {i}</p>".encode() * 50)) for i in range(3)]
    cut = 10  # within the next record's header: FastWARC frames it from the corrupt member alone
    members = [gzip.compress(piece, mtime=0) for piece in (records[0], records[1] + records[2][:cut])]
    last = bytearray(gzip.compress(records[2][cut:], mtime=0))
    last[len(last) // 2] ^= 0x55
    path = tmp_path / "crawl.warc.gz"
    path.write_bytes(b"".join([*members, bytes(last)]))

    good, errors = pages_and_errors(path)
    assert [p.id for p in good] == ["<urn:uuid:r0>", "<urn:uuid:r1>"]
    assert len(errors) == 1
