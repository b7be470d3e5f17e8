"""What the row of a record read whole from a gzip member that then fails its checksum says
(`warc_failure.Failure._suspect`): that the member does not decompress, where it had said "corrupt data its
compression cannot tell" (gzip tells: its checksum), and a WARC-Type WARC does not define quoted and cut,
where a mangled one had been pasted whole into the message."""

from __future__ import annotations

import gzip
import random
from pathlib import Path

from service.core.errors import ErrorCode
from tests.factories.warc import HttpResponse, pages_and_errors, response, warc_record


def _bad_checksum(member: bytes) -> bytes:
    """`member` with its CRC-32 changed: it inflates to its end, and fails there."""
    out = bytearray(member)
    out[-8] ^= 0xFF
    return bytes(out)


def _file(tmp_path: Path, record_type: str) -> tuple[Path, int, int]:
    """A .warc.gz of a page, a record of `record_type` whose member has a bad checksum, and a page; where
    that member starts and ends. The record is no page (its block is not read) and its member is big, so
    that FastWARC reads its header before the member's end and fails at the next record: a member it reads
    whole fails before its record is framed, and a page's block, read, fails with it."""
    block = random.Random(1).randbytes(200_000).hex().encode()
    middle = warc_record("odd", block, record_type=record_type, content_type="application/warc-fields")
    first = gzip.compress(response("r0", HttpResponse(b"<p>first</p>")), mtime=0)
    last = gzip.compress(response("r2", HttpResponse(b"<p>last</p>")), mtime=0)
    damaged = _bad_checksum(gzip.compress(middle, mtime=0))
    path = tmp_path / "crawl.warc.gz"
    path.write_bytes(first + damaged + last)
    return path, len(first), len(first) + len(damaged)


def test_a_gzip_member_that_fails_its_checksum_is_said_not_to_decompress(tmp_path: Path) -> None:
    path, start, resume = _file(tmp_path, "metadata")
    good, errors = pages_and_errors(path)
    assert [p.id for p in good] == ["<urn:uuid:r0>", "<urn:uuid:r2>"]
    (row,) = errors
    assert row.id == f"crawl.warc.gz@{start}" and row.error_code == ErrorCode.VALIDATION
    message = row.error or ""
    assert (
        f"the record <urn:uuid:odd>, a metadata record at byte {start} was read, but its gzip member does "
        "not decompress (Gzip decompression error: "
    ) in message
    assert (
        "what was read of it may be garbage (it holds no page); the rest of that gzip member was skipped "
        f"(bytes {start} to {resume - 1}; reading goes on at the record at byte {resume})"
    ) in message
    assert "cannot tell" not in message


def test_a_warc_type_warc_does_not_define_is_quoted_and_cut(tmp_path: Path) -> None:
    record_type = "metadata\tmangled" + "z" * 500
    path, start, _ = _file(tmp_path, record_type)
    _, errors = pages_and_errors(path)
    (row,) = errors
    quoted = repr(record_type[:40])
    assert f"the record <urn:uuid:odd>, a record of WARC-Type {quoted}... at byte {start} was read" in (
        row.error or ""
    )
    assert "z" * 41 not in (row.error or "")
