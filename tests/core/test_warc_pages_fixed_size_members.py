"""A .warc.gz whose gzip members are cut where its records are not (pgzip cuts one stream into members of
a fixed size, bgzip into BGZF blocks of at most 64 KiB): FastWARC's offsets in it are member starts inside
records, so the check of the file's end (`warc_tail.tail_problem`) and of padding after its last record
(`ends_in_padding`) walk its records from where the reading began, as in one gzip stream. Walked from
the last record's offset, every such file had ended in a false error row ("no version line")."""

from __future__ import annotations

from pathlib import Path

import pytest

from service.core.errors import ErrorCode
from tests.factories.warc import HttpResponse, gzip_pieces, pages_and_errors, response

COUNT = 30


def _records() -> list[bytes]:
    return [
        response(
            f"r{i}", HttpResponse(f"<p>page {i}</p>".encode() * (20 + i)), uri=f"https://example.com/{i}"
        )
        for i in range(COUNT)
    ]


def _ids(count: int = COUNT) -> list[str]:
    return [f"<urn:uuid:r{i}>" for i in range(count)]


@pytest.mark.parametrize(("size", "bgzf"), [(100, False), (777, False), (4096, False), (1000, True)])
def test_every_page_comes_out_with_no_error_row(tmp_path: Path, size: int, bgzf: bool) -> None:
    path = tmp_path / "crawl.warc.gz"
    path.write_bytes(gzip_pieces(b"".join(_records()), size, bgzf=bgzf))
    good, errors = pages_and_errors(path)
    assert errors == []
    assert [p.id for p in good] == _ids()
    assert all(f"page {i}".encode() in p.html for i, p in enumerate(good))


def test_padding_after_the_last_member_is_no_error_row(tmp_path: Path) -> None:
    path = tmp_path / "crawl.warc.gz"
    path.write_bytes(gzip_pieces(b"".join(_records()), 777) + b"\0" * 512)
    good, errors = pages_and_errors(path)
    assert errors == [] and [p.id for p in good] == _ids()


def test_a_corrupt_member_is_an_error_row_and_the_records_after_it_are_read(tmp_path: Path) -> None:
    """Such a file's members start inside records, so reading cannot go on at the next member as in a
    per-record file: it goes on at the first record that starts in the members after the corrupt one
    (`warc_unaligned`). The pages before it and after it are read, once each; the records the corrupt
    member held parts of are its one error row. (Reading had ended there, the rest of the file lost.)"""
    data = bytearray(gzip_pieces(b"".join(_records()), 777))
    middle = len(data) // 2
    data[middle : middle + 20] = bytes(b ^ 0xFF for b in data[middle : middle + 20])
    path = tmp_path / "crawl.warc.gz"
    path.write_bytes(bytes(data))
    good, errors = pages_and_errors(path)
    assert len(errors) == 1 and errors[0].error_code == ErrorCode.VALIDATION
    assert "could not be decompressed" in (errors[0].error or "")
    ids = [p.id for p in good]
    lost = [i for i in _ids() if i not in ids]
    assert ids == [i for i in _ids() if i not in lost] and 0 < len(lost) <= 3, lost  # in order, once each
    assert ids[-1] == _ids()[-1]  # read to the end
    assert all(f"page {p.id[11:-1]}".encode() in p.html for p in good)
