"""The id of a WARC record without a WARC-Record-ID (`warc_reading.Reading.unnamed_id`): `<file>@<byte>`
where the record starts at that byte, else `<file>#<n>`, its position among the file's records. Inside a
file compressed as one stream FastWARC's offsets are positions of its read buffer, which many records
share: named by them, pages of one file had one id."""

from __future__ import annotations

import gzip
from collections.abc import Callable
from pathlib import Path

import pytest
import zstandard

from service.core.pages import iter_pages
from tests.factories.warc import HttpResponse, lz4_frame, response, warc_record

COUNT = 40


def _unnamed(record: bytes) -> bytes:
    """`record` without its WARC-Record-ID line (a SHOULD that some writers leave out)."""
    head, sep, rest = record.partition(b"\r\n\r\n")
    lines = [line for line in head.split(b"\r\n") if not line.startswith(b"WARC-Record-ID:")]
    return b"\r\n".join(lines) + sep + rest


def _records() -> list[bytes]:
    """Pages of growing size without ids, a request record (no page, but a record) after the first."""
    pages = [
        _unnamed(response(f"r{i}", HttpResponse(f"<p>page {i}</p>".encode() * (1 + 5 * i))))
        for i in range(COUNT)
    ]
    request = _unnamed(
        warc_record("q", b"GET / HTTP/1.1\r\n\r\n", record_type="request", content_type="application/http")
    )
    return [pages[0], request, *pages[1:]]


ONE_STREAM: dict[str, tuple[str, Callable[[bytes, Path], bytes]]] = {
    "gzip": (".warc.gz", lambda data, _: gzip.compress(data, mtime=0)),
    "zstd": (".warc.zst", lambda data, _: zstandard.ZstdCompressor().compress(data)),
    "lz4": (".warc.lz4", lz4_frame),
}


@pytest.mark.parametrize("compression", ONE_STREAM)
def test_records_without_an_id_in_one_compressed_stream_get_unique_stable_ids(
    tmp_path: Path, compression: str
) -> None:
    suffix, compress = ONE_STREAM[compression]
    path = tmp_path / f"crawl{suffix}"
    path.write_bytes(compress(b"".join(_records()), tmp_path / "stream"))
    pages = list(iter_pages(path, bad_rows="report"))
    assert [p.error for p in pages] == [None] * COUNT
    ids = [p.id for p in pages]
    assert len(set(ids)) == COUNT
    # The first record starts at byte 0; the rest are named by their position among the records (the
    # request record is the second), which no read buffer moves.
    assert ids == [f"crawl{suffix}@0"] + [f"crawl{suffix}#{n}" for n in range(2, COUNT + 1)]
    assert [p.id for p in iter_pages(path, bad_rows="report")] == ids  # the same every run: resumable


def test_records_at_their_own_offsets_keep_their_byte_as_their_id(tmp_path: Path) -> None:
    """A plain file and one gzip member per record: each record starts at its own byte, its id as it was.
    A member holding two records names the second by its position: FastWARC gives both one offset."""
    records = _records()
    plain = tmp_path / "plain.warc"
    plain.write_bytes(b"".join(records))
    starts = [sum(map(len, records[:i])) for i in range(len(records))]
    pages = list(iter_pages(plain, bad_rows="report"))
    assert [p.id for p in pages] == [f"plain.warc@{starts[i]}" for i in range(len(records)) if i != 1]

    members = [gzip.compress(r, mtime=0) for r in records]
    members[5:7] = [gzip.compress(records[5] + records[6], mtime=0)]  # records 5 and 6 in one member
    starts = [sum(map(len, members[:i])) for i in range(len(members))]
    per_record = tmp_path / "members.warc.gz"
    per_record.write_bytes(b"".join(members))
    ids = [p.id for p in iter_pages(per_record, bad_rows="report")]
    assert len(set(ids)) == COUNT
    expected = [f"members.warc.gz@{starts[i]}" for i in (0, 2, 3, 4, 5)]
    expected += ["members.warc.gz#6"] + [f"members.warc.gz@{starts[i]}" for i in range(6, len(members))]
    assert ids == expected
