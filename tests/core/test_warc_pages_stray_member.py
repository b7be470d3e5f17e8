"""A member that decodes but holds no WARC record FastWARC reads, in a WARC file compressed per record
(`warc_skip.skip_member`, `walk_records`): it is the row, named by its own byte, and not the intact
record before it. The record walk had taken any block with a Content-Length for a record (`b"x"` before
`WARC/1.1`, `warc/1.1`, a bare HTTP response), so the intact member before it was blamed ("may hold
garbage") and the bad one never named; a `WARC/2.0` member gave two rows, that false one and its own.

And where a frame's data is corrupt but still decodes (LZ4 keeps no checksum), the page read from it is
its own row, an error saying so, not a success row followed by a warning row of another id (of the same
id, for a record without a WARC-Record-ID); a record that is no page is named in its row."""

from __future__ import annotations

import gzip
from collections.abc import Callable
from pathlib import Path

import pytest
import zstandard

from service.core.errors import ErrorCode
from service.core.pages import iter_pages
from tests.factories.warc import HttpResponse, lz4_frame, pages_and_errors, response, warc_record

_PAGE = HttpResponse(b"<p>stray</p>")


def _lz4(records: list[bytes], tmp: Path) -> list[bytes]:
    return [lz4_frame(record, tmp) for record in records]


PER_RECORD: dict[str, tuple[str, Callable[[list[bytes], Path], list[bytes]]]] = {
    "gzip": (".warc.gz", lambda records, _: [gzip.compress(r, mtime=0) for r in records]),
    "zstd": (".warc.zst", lambda records, _: [zstandard.ZstdCompressor().compress(r) for r in records]),
    "lz4": (".warc.lz4", _lz4),
}

STRAY: dict[str, bytes] = {
    "a byte before the version line": b"x" + response("m", _PAGE),
    "a lower-case version line": response("m", _PAGE).replace(b"WARC/1.1", b"warc/1.1", 1),
    "a version FastWARC does not read": response("m", _PAGE).replace(b"WARC/1.1", b"WARC/2.0", 1),
    "a bare HTTP response": _PAGE.block() + b"\r\n\r\n",
}


def _records(count: int = 4) -> list[bytes]:
    return [
        response(f"r{i}", HttpResponse(f"<p>page {i}</p>".encode() * 30), uri=f"https://example.com/{i}")
        for i in range(count)
    ]


def _offset(members: list[bytes], index: int) -> int:
    return sum(len(m) for m in members[:index])


@pytest.mark.parametrize("stray", STRAY)
@pytest.mark.parametrize("compression", PER_RECORD)
def test_a_stray_member_is_the_row_not_the_intact_record_before_it(
    tmp_path: Path, compression: str, stray: str
) -> None:
    suffix, compress = PER_RECORD[compression]
    records = _records()
    members = compress([*records[:2], STRAY[stray], *records[2:]], tmp_path / "frame")
    path = tmp_path / f"crawl{suffix}"
    path.write_bytes(b"".join(members))
    good, errors = pages_and_errors(path)
    assert [p.id for p in good] == [f"<urn:uuid:r{i}>" for i in range(4)]
    assert all(f"page {i}".encode() in p.html for i, p in enumerate(good))
    (row,) = errors
    start, resume = _offset(members, 2), _offset(members, 3)
    assert row.id == f"crawl{suffix}@{start}"
    assert row.error_code == ErrorCode.VALIDATION
    assert (
        f"the record at byte {start} holds no WARC record FastWARC reads and was skipped (bytes {start} "
        f"to {resume - 1}; reading goes on at the record at byte {resume})"
    ) in (row.error or "")
    assert "may hold garbage" not in (row.error or "")


def _unnamed(record: bytes) -> bytes:
    head, sep, rest = record.partition(b"\r\n\r\n")
    lines = [line for line in head.split(b"\r\n") if not line.startswith(b"WARC-Record-ID:")]
    return b"\r\n".join(lines) + sep + rest


def _misframed(frame: bytes, old: bytes, new: bytes) -> bytes:
    """`frame` with the literal bytes `old` (once in it) made `new`, of the same length: LZ4 without
    checksums decodes it, to a record FastWARC frames otherwise than its Content-Length walk does."""
    assert frame.count(old) == 1 and len(old) == len(new)
    return frame.replace(old, new)


@pytest.mark.parametrize("named", [True, False])
def test_a_page_read_from_a_frame_of_garbage_is_its_own_row(tmp_path: Path, named: bool) -> None:
    """The page's row says so (its id, url and meta, no page), and no row comes after it: there had been
    a success row with the garbage and a warning row after it, of the same id where the record had no
    WARC-Record-ID."""
    records = _records(5)
    if not named:
        records = [_unnamed(r) for r in records]
    frames = _lz4(records, tmp_path / "frame")
    size = len(HttpResponse(b"<p>page 2</p>" * 30).block())  # the WARC Content-Length, 3 digits
    frames[2] = _misframed(frames[2], b"Length: %d\r\n" % size, b"Length: %d\r\n" % (size - 50))
    path = tmp_path / "crawl.warc.lz4"
    path.write_bytes(b"".join(frames))
    pages = list(iter_pages(path, bad_rows="report"))
    ids = [p.id for p in pages]
    assert len(set(ids)) == len(ids) == 5
    start, resume = _offset(frames, 2), _offset(frames, 3)
    row = pages[2]
    assert row.id == ("<urn:uuid:r2>" if named else f"crawl.warc.lz4@{start}")
    assert [p.error is None for p in pages] == [True, True, False, True, True]
    assert (
        row.html == b"" and row.url == "https://example.com/2" and row.meta["warc_file"] == "crawl.warc.lz4"
    )
    assert (
        f"a response record at byte {start} was read, but its LZ4 frame decompresses to bytes that are no "
        "whole WARC records"
    ) in (row.error or "")
    assert f"(bytes {start} to {resume - 1}; reading goes on at the record at byte {resume})" in (
        row.error or ""
    )


def test_a_record_of_no_page_read_from_garbage_is_named_in_its_row(tmp_path: Path) -> None:
    """A request record has no page row to flag: its row says which record it was."""
    request = warc_record(
        "q", b"GET / HTTP/1.1\r\n\r\n", record_type="request", content_type="application/http"
    )
    records = _records(4)
    frames = _lz4([*records[:2], request, *records[2:]], tmp_path / "frame")
    frames[2] = _misframed(frames[2], b"Length: 18\r\n", b"Length: 10\r\n")
    path = tmp_path / "crawl.warc.lz4"
    path.write_bytes(b"".join(frames))
    good, errors = pages_and_errors(path)
    assert [p.id for p in good] == [f"<urn:uuid:r{i}>" for i in range(4)]
    (row,) = errors
    start = _offset(frames, 2)
    assert row.id == f"crawl.warc.lz4@{start}"
    assert f"the record <urn:uuid:q>, a request record at byte {start} was read" in (row.error or "")
