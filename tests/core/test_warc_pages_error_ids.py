"""Row ids of WARC files are unique: an error row's id is never a page row's. A record without a
WARC-Record-ID is named `<file>@<byte>` by where it starts, and the row of what could not be read after
it had been named by that same byte (the byte of the last record FastWARC framed): two rows of one id,
which a resume matches by. And a WARC file in a directory is named by its path relative to it, as an
HTML file there is: two `crawl.warc.gz` in two subdirectories gave their pages one id each."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from service.core.pages import Page, iter_pages
from tests.factories.warc import HttpResponse, response


def _unnamed(record: bytes) -> bytes:
    head, sep, rest = record.partition(b"\r\n\r\n")
    lines = [line for line in head.split(b"\r\n") if not line.startswith(b"WARC-Record-ID:")]
    return b"\r\n".join(lines) + sep + rest


def _records(count: int) -> list[bytes]:
    return [_unnamed(response(f"r{i}", HttpResponse(f"<p>page {i}</p>".encode() * 10))) for i in range(count)]


def _rows(path: Path) -> list[Page]:
    return list(iter_pages(path, bad_rows="report"))


# What follows the last record, and the id of its row: FastWARC hands back an empty record for a cut
# one (no page: it is named by its own byte), and fails on one it cannot read after the last page (the
# first record not read, by its position among the file's records, which no page row has).
AFTER_THE_LAST: dict[str, tuple[bytes, str]] = {
    "a record header cut off": (b"WARC/1.1\r\nWARC-Type: resp", "crawl.warc@{end}"),
    "a record FastWARC cannot read": (b"x" + _records(1)[0], "crawl.warc#3"),
}


@pytest.mark.parametrize("after", AFTER_THE_LAST)
def test_the_row_after_a_record_without_an_id_has_an_id_of_its_own(tmp_path: Path, after: str) -> None:
    records = _records(3)
    path = tmp_path / "crawl.warc"
    tail, row_id = AFTER_THE_LAST[after]
    path.write_bytes(b"".join(records) + tail)
    rows = _rows(path)
    starts = [sum(map(len, records[:i])) for i in range(3)]
    assert [r.id for r in rows if r.error is None] == [f"crawl.warc@{s}" for s in starts]
    (error,) = [r for r in rows if r.error is not None]
    assert error.id == row_id.format(end=sum(map(len, records)))
    assert len({r.id for r in rows}) == len(rows) == 4


def test_a_cut_one_stream_file_after_its_first_record(tmp_path: Path) -> None:
    """One gzip stream whose first record (named `@0`) is the last page read: the error row is not `@0`
    (the stream's offsets are FastWARC's read buffer's, which the cut record shares)."""
    records = _records(2)
    data = gzip.compress(b"".join(records), mtime=0)
    path = tmp_path / "crawl.warc.gz"
    cut = gzip.compress(records[0] + records[1][:30], mtime=0)  # the stream ends inside a record header
    path.write_bytes(cut)
    rows = _rows(path)
    # The cut one is the empty record FastWARC hands back, its second: named by that position.
    assert [r.id for r in rows] == ["crawl.warc.gz@0", "crawl.warc.gz#1"]
    assert rows[1].error is not None and rows[0].error is None
    path.write_bytes(data)
    assert [r.id for r in _rows(path)] == ["crawl.warc.gz@0", "crawl.warc.gz#1"]


def test_warc_files_of_one_name_in_two_subdirectories_name_their_rows_apart(tmp_path: Path) -> None:
    records = _records(2)
    for sub in ("a", "b"):
        (tmp_path / sub).mkdir()
        (tmp_path / sub / "crawl.warc.gz").write_bytes(b"".join(gzip.compress(r, mtime=0) for r in records))
    (tmp_path / "a" / "cut.warc").write_bytes(records[0][:-40])
    rows = _rows(tmp_path)
    second = len(gzip.compress(records[0], mtime=0))
    assert [r.id for r in rows] == [
        "a/crawl.warc.gz@0",
        f"a/crawl.warc.gz@{second}",
        "a/cut.warc@0",
        "b/crawl.warc.gz@0",
        f"b/crawl.warc.gz@{second}",
    ]
    assert [r.meta["warc_file"] for r in rows] == ["a/crawl.warc.gz"] * 2 + ["a/cut.warc"] + [
        "b/crawl.warc.gz"
    ] * 2
    assert rows[2].error is not None
    # Read alone, a file is named by its name, as it was.
    assert [r.id for r in _rows(tmp_path / "b" / "crawl.warc.gz")] == [
        "crawl.warc.gz@0",
        f"crawl.warc.gz@{second}",
    ]
