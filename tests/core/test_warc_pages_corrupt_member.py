"""A corrupt gzip member in a WARC file written with one member per record (`warc_pages.iter_warc`,
`warc_skip.skip_member`): it is one error row, and the records after it are read, where the first
corrupt member had ended the file (a hundred good pages lost for 60 flipped bytes)."""

from __future__ import annotations

import gzip
import random
from pathlib import Path

from service.core.errors import ErrorCode
from service.core.pages import iter_pages
from tests.factories.warc import HttpResponse, pages_and_errors, response, warc_record

COUNT = 40


def _records(count: int = COUNT) -> list[bytes]:
    return [
        response(f"r{i}", HttpResponse(f"<p>page {i}</p>".encode() * 20), uri=f"https://example.com/{i}")
        for i in range(count)
    ]


def _members(records: list[bytes]) -> list[bytes]:
    return [gzip.compress(r, mtime=0) for r in records]


def _flipped(member: bytes, start: int = 20, count: int = 60) -> bytes:
    """`member` with `count` bytes from `start` on inverted: its deflate data no longer inflates."""
    out = bytearray(member)
    for at in range(start, min(start + count, len(out) - 8)):
        out[at] ^= 0xFF
    return bytes(out)


def _offset(members: list[bytes], index: int) -> int:
    return sum(len(m) for m in members[:index])


def test_a_corrupt_member_is_skipped_and_the_records_after_it_are_read(tmp_path: Path) -> None:
    members = _members(_records())
    bad = {COUNT // 2, COUNT // 2 + 1, COUNT - 5}  # two in a row, and one more later
    for index in bad:
        members[index] = _flipped(members[index])
    path = tmp_path / "crawl.warc.gz"
    path.write_bytes(b"".join(members))
    good, errors = pages_and_errors(path)
    kept = [i for i in range(COUNT) if i not in bad]
    assert [p.id for p in good] == [f"<urn:uuid:r{i}>" for i in kept]
    assert [p.url for p in good] == [f"https://example.com/{i}" for i in kept]
    assert all(f"page {i}".encode() in p.html for i, p in zip(kept, good, strict=True))
    # Two corrupt members in a row are one row with the range skipped, the second's start being no
    # longer one a reader can tell from bytes of deflate data.
    rows = [(COUNT // 2, COUNT // 2 + 2), (COUNT - 5, COUNT - 4)]
    assert [p.id for p in errors] == [f"crawl.warc.gz@{_offset(members, i)}" for i, _ in rows]
    for (first, after), row in zip(rows, errors, strict=True):
        start, resume = _offset(members, first), _offset(members, after)
        assert row.error_code == ErrorCode.VALIDATION
        assert (
            f"the record at byte {start} could not be decompressed and was skipped (bytes {start} to "
            f"{resume - 1}; reading goes on at the record at byte {resume})"
        ) in (row.error or "")
    # The rows come where the records were: the corrupt member's row before the pages after it.
    order = [p.id for p in iter_pages(path, bad_rows="report")]
    # Before it: the records before it but the two corrupt ones in a row, and their one row.
    assert order.index(f"crawl.warc.gz@{_offset(members, COUNT - 5)}") == COUNT - 5 - 2 + 1


def test_a_corrupt_first_member_or_one_inside_a_record_body(tmp_path: Path) -> None:
    """The first member (no record framed yet) and a member whose record FastWARC framed but could not
    read to its end (the corruption deep in a body of random bytes) are each the row of their own
    offset, not of the record before."""
    noise = random.Random(7).randbytes(200_000)
    records = _records(6)
    records[3] = warc_record("big", HttpResponse(b"<p>" + noise.hex().encode() + b"</p>").block())
    members = _members(records)
    members[0] = _flipped(members[0])
    members[3] = _flipped(members[3], start=len(members[3]) - 5_000, count=200)
    path = tmp_path / "crawl.warc.gz"
    path.write_bytes(b"".join(members))
    good, errors = pages_and_errors(path)
    assert [p.id for p in good] == ["<urn:uuid:r1>", "<urn:uuid:r2>", "<urn:uuid:r4>", "<urn:uuid:r5>"]
    assert [p.id for p in errors] == ["crawl.warc.gz@0", f"crawl.warc.gz@{_offset(members, 3)}"]


def test_a_corrupt_last_member_or_one_gzip_stream_ends_the_file_with_one_row(tmp_path: Path) -> None:
    """Nothing to go on reading at: the one row says so, as before (no member follows, or the file is
    one gzip stream, whose offsets FastWARC gives are no member starts)."""
    members = _members(_records(6))
    members[-1] = _flipped(members[-1])
    path = tmp_path / "last.warc.gz"
    path.write_bytes(b"".join(members))
    good, errors = pages_and_errors(path)
    assert [p.id for p in good] == [f"<urn:uuid:r{i}>" for i in range(5)]
    assert len(errors) == 1 and "cannot read the records after byte" in (errors[0].error or "")

    stream = bytearray(gzip.compress(b"".join(_records()), mtime=0))
    middle = len(stream) // 2
    stream[middle : middle + 60] = bytes(b ^ 0xFF for b in stream[middle : middle + 60])
    path = tmp_path / "stream.warc.gz"
    path.write_bytes(bytes(stream))
    good, errors = pages_and_errors(path)
    assert len(errors) == 1 and "cannot read the records after byte" in (errors[0].error or "")
    assert len(good) < COUNT


def test_garbage_after_a_corrupt_member_ends_the_scan(tmp_path: Path) -> None:
    """Gzip headers that start no record (inflating to garbage, or to no WARC record) are passed over,
    and the scan ends at the end of the file: one row, never a loop."""
    members = _members(_records(3))
    fake = gzip.compress(b"not a WARC record", mtime=0)
    garbage = (b"\x1f\x8b\x08\x00" + random.Random(3).randbytes(60)) * 5_000 + fake * 100
    path = tmp_path / "garbage.warc.gz"
    path.write_bytes(members[0] + _flipped(members[1]) + garbage)
    good, errors = pages_and_errors(path)
    assert [p.id for p in good] == ["<urn:uuid:r0>"]
    assert len(errors) == 1 and "cannot read the records after byte" in (errors[0].error or "")
