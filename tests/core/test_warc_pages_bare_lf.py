"""WARC headers whose lines end in bare LF, as some tools write them (WARC requires CRLF): FastWARC reads
a header's lines by CRLF alone, so such a record was one of an unknown type, passed over with no row, and
what followed it was framed by whatever Content-Length came next. Where the file is plain or compressed
per record, each such record is read again alone, in FastWARC's quirks mode (`warc_pages`,
`warc_bare_lf.bare_lf_record_end`), and reading goes on after it; in a file compressed as one stream (no
byte to begin reading at), it is an error row that says why."""

from __future__ import annotations

import gzip
from collections.abc import Callable
from pathlib import Path

import pytest
import zstandard

from service.core.errors import ErrorCode
from tests.factories.warc import HttpResponse, lz4_frame, pages_and_errors, response, warc_record

# A layout: its suffix, and how it writes records (`tmp`: a scratch path for the LZ4 writer).
LAYOUTS: dict[str, tuple[str, Callable[[list[bytes], Path], bytes]]] = {
    "plain": (".warc", lambda records, _: b"".join(records)),
    "gzip per record": (".warc.gz", lambda records, _: b"".join(gzip.compress(r, mtime=0) for r in records)),
    "zstd per record": (
        ".warc.zst",
        lambda records, _: b"".join(zstandard.ZstdCompressor().compress(r) for r in records),
    ),
    "lz4 per record": (".warc.lz4", lambda records, tmp: b"".join(lz4_frame(r, tmp) for r in records)),
}


def _bare_lf(record: bytes) -> bytes:
    """`record` with its WARC header's lines ended in LF alone (its block, and the HTTP head, as they are)."""
    header, _, rest = record.partition(b"\r\n\r\n")
    return header.replace(b"\r\n", b"\n") + b"\n\n" + rest


def _records() -> list[bytes]:
    """A warcinfo record (whose fields end in LF, as its block has no CRLF CRLF FastWARC could stop at),
    a page, a chunked page (its HTTP head gives FastWARC no Content-Length to frame it by), a page."""
    info = warc_record(
        "info",
        b"software: a tool\nformat: WARC\n",
        record_type="warcinfo",
        uri=None,
        content_type="application/warc-fields",
    )
    pages = [
        response(
            f"r{i}", HttpResponse(f"<p>page {i}</p>".encode() * 5, chunked=i == 1), uri=f"https://e.org/{i}"
        )
        for i in range(3)
    ]
    return [info, *pages]


def _ids() -> list[str]:
    return [f"<urn:uuid:r{i}>" for i in range(3)]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_records_with_bare_lf_headers_are_read(tmp_path: Path, layout: str) -> None:
    suffix, write = LAYOUTS[layout]
    path = tmp_path / f"crawl{suffix}"
    path.write_bytes(write([_bare_lf(r) for r in _records()], tmp_path / "frame"))
    good, errors = pages_and_errors(path)
    assert errors == []
    assert [p.id for p in good] == _ids()
    assert [p.url for p in good] == [f"https://e.org/{i}" for i in range(3)]
    assert all(p.html == f"<p>page {i}</p>".encode() * 5 for i, p in enumerate(good))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_one_bare_lf_header_among_crlf_ones(tmp_path: Path, layout: str) -> None:
    suffix, write = LAYOUTS[layout]
    records = _records()
    records[2] = _bare_lf(records[2])  # the chunked page: FastWARC had lost the framing after it too
    path = tmp_path / f"crawl{suffix}"
    path.write_bytes(write(records, tmp_path / "frame"))
    good, errors = pages_and_errors(path)
    assert errors == [] and [p.id for p in good] == _ids()


def test_a_record_without_an_id_is_named_by_its_byte(tmp_path: Path) -> None:
    records = _records()
    records[1] = records[1].replace(b"WARC-Record-ID: <urn:uuid:r0>\r\n", b"")
    path = tmp_path / "crawl.warc"
    path.write_bytes(b"".join(map(_bare_lf, records)))
    good, errors = pages_and_errors(path)
    assert errors == []
    assert [p.id for p in good] == [f"crawl.warc@{len(_bare_lf(records[0]))}", *_ids()[1:]]


def test_in_one_gzip_stream_a_bare_lf_header_is_a_row_that_says_so(tmp_path: Path) -> None:
    records = _records()
    records[2] = _bare_lf(records[2])
    path = tmp_path / "crawl.warc.gz"
    path.write_bytes(gzip.compress(b"".join(records), mtime=0))
    good, errors = pages_and_errors(path)
    assert [p.id for p in good][:1] == ["<urn:uuid:r0>"]
    assert errors and errors[0].error_code == ErrorCode.VALIDATION
    assert "its WARC header's lines end in LF alone, where WARC requires CRLF" in (errors[0].error or "")
    ids = [p.id for p in good + errors]
    assert len(set(ids)) == len(ids)
