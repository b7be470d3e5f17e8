"""A WARC body still compressed once its chunking and Content-Encoding are undone (gzip, zlib or zstd with
no Content-Encoding, gzip twice under one `Content-Encoding: gzip`) is an `unsupported_media_type` row, by
the API's rule (`content_coding.undeclared_coding`): it had been read as a page of binary noise."""

from __future__ import annotations

import gzip
import zlib
from pathlib import Path

import brotli
import zstandard

from service.core.errors import ErrorCode
from service.core.pages import iter_pages
from tests.factories.warc import HttpResponse, response, warc_gz, warc_record

PAGE = b"<html><head><title>t</title></head><body><p>" + b"a page of words " * 40 + b"</p></body></html>"
ZSTD = zstandard.ZstdCompressor().compress
UNSAID = "but its Content-Encoding does not say so"


def _record(record_id: str, body: bytes, coding: str | None = None, *, chunked: bool = False) -> bytes:
    headers = {"Content-Encoding": coding} if coding else {}
    return response(record_id, HttpResponse(body, "text/html", headers=headers, chunked=chunked))


def test_a_warc_body_still_compressed_is_an_unsupported_media_type_row(tmp_path: Path) -> None:
    records = [
        _record("plain", PAGE),
        _record("declared", gzip.compress(PAGE), "gzip", chunked=True),
        _record("twice-declared", gzip.compress(gzip.compress(PAGE)), "gzip, gzip"),
        _record("gzip", gzip.compress(PAGE)),
        _record("zlib", zlib.compress(PAGE), chunked=True),
        _record("zstd", ZSTD(PAGE), "identity"),
        _record("twice", gzip.compress(gzip.compress(PAGE)), "gzip"),
        _record("zstd-in-br", brotli.compress(ZSTD(PAGE)), "br"),
        warc_record("resource", gzip.compress(PAGE), record_type="resource", content_type="text/html"),
    ]
    source = tmp_path / "crawl.warc.gz"
    source.write_bytes(warc_gz(records))
    rows = {
        page.id.removeprefix("<urn:uuid:").removesuffix(">"): page
        for page in iter_pages(source, bad_rows="report")
    }
    for name in ("plain", "declared", "twice-declared"):
        assert rows[name].error is None and rows[name].html == PAGE, name
    found = {
        "gzip": f"the HTTP body is gzip-compressed {UNSAID} (it starts 1f 8b 08",
        "zlib": f"the HTTP body is deflate-compressed {UNSAID} (it starts 78 9c",
        "zstd": f"the HTTP body is zstd-compressed {UNSAID}",
        "twice": "the HTTP body is still gzip-compressed (it starts 1f 8b 08 00) once its Content-Encoding "
        "('gzip') is undone: it was compressed once more than that header says",
        "zstd-in-br": "the HTTP body is still zstd-compressed",
        "resource": "the record's content is gzip-compressed",
    }
    for name, said in found.items():
        row = rows[name]
        assert row.error_code == ErrorCode.UNSUPPORTED_MEDIA_TYPE, name
        assert row.error is not None and said in row.error, row.error
        assert row.html == b"" and f"record <urn:uuid:{name}>" in row.error
    # The row keeps what the record said of itself, as any error row of a response does.
    assert rows["gzip"].meta["http_status"] == 200 and rows["gzip"].meta["content_type"] == "text/html"
