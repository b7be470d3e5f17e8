"""A page file whose bytes are still compressed once the reader has undone the file's one gzip (zlib or
zstd in an `.html` file, gzip inside gzip) is an `unsupported_media_type` row, by the API's rule
(`content_coding.undeclared_coding`): it had been read as a page of binary noise, embedded with no error."""

from __future__ import annotations

import gzip
import json
import zlib
from pathlib import Path

import pytest
import zstandard

from service.core.errors import ErrorCode
from service.core.pages import PageCompressedError, iter_pages, read_page_bytes

PAGE = b"<html><head><title>t</title></head><body><p>" + b"a page of words " * 40 + b"</p></body></html>"


def _files(directory: Path) -> dict[str, bytes]:
    """A directory of page files, each with what it holds; returns name -> bytes written."""
    files = {
        "a-plain.html": PAGE,
        "b-zlib.html": zlib.compress(PAGE),
        "c-zstd.html": zstandard.ZstdCompressor().compress(PAGE),
        "d-gzip.html.gz": gzip.compress(PAGE),  # the file's own gzip: undone, a page
        "e-twice.html.gz": gzip.compress(gzip.compress(PAGE)),
        "f-zstd-in-gzip.html.gz": gzip.compress(zstandard.ZstdCompressor().compress(PAGE)),
        # Text that starts as a zlib header does: the check wants the deflate data after it as evidence.
        "g-text.html": b"x^2+1 is a polynomial <p>" + b"text " * 300 + b"</p>",
    }
    directory.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (directory / name).write_bytes(data)
    return files


def test_a_directory_page_still_compressed_is_an_unsupported_media_type_row(tmp_path: Path) -> None:
    files = _files(tmp_path / "pages")
    rows = {page.id: page for page in iter_pages(tmp_path / "pages", bad_rows="report")}
    assert list(rows) == sorted(files)
    for name in ("a-plain.html", "d-gzip.html.gz"):
        assert rows[name].error is None and rows[name].html == PAGE
    assert rows["g-text.html"].error is None and rows["g-text.html"].html == files["g-text.html"]
    found = {
        "b-zlib.html": "the file holds zlib-compressed bytes (they start 78 9c",
        "c-zstd.html": "the file holds zstd-compressed bytes (they start 28 b5 2f fd)",
        "e-twice.html.gz": "the file holds gzip-compressed bytes once gunzipped (they start 1f 8b 08",
        "f-zstd-in-gzip.html.gz": "the file holds zstd-compressed bytes once gunzipped",
    }
    for name, said in found.items():
        row = rows[name]
        assert row.error_code == ErrorCode.UNSUPPORTED_MEDIA_TYPE, name
        assert row.html == b"" and row.error is not None
        assert said in row.error and str(tmp_path / "pages" / name) in row.error, row.error


def test_a_jsonl_file_row_naming_a_compressed_file_is_an_error_row(tmp_path: Path) -> None:
    _files(tmp_path / "pages")
    rows = [
        {"id": "plain", "file": "pages/a-plain.html"},
        {"id": "zstd", "file": "pages/c-zstd.html", "encoding": "utf-8"},
        {"id": "twice", "file": "pages/e-twice.html.gz"},
        {"id": "inline", "html": "<p>a row's html is text, never sniffed</p>"},
    ]
    source = tmp_path / "rows.jsonl"
    source.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    pages = list(iter_pages(source, bad_rows="report"))
    assert [page.error_code if page.error else None for page in pages] == [
        None,
        ErrorCode.UNSUPPORTED_MEDIA_TYPE,
        ErrorCode.UNSUPPORTED_MEDIA_TYPE,
        None,
    ]
    assert pages[1].error is not None and f"{source}: line 2: " in pages[1].error
    # By default a bad row raises, with its code kept.
    with pytest.raises(PageCompressedError, match="zstd-compressed") as raised:
        list(iter_pages(source))
    assert raised.value.code == ErrorCode.UNSUPPORTED_MEDIA_TYPE


def test_a_single_compressed_file_raises_with_its_code(tmp_path: Path) -> None:
    _files(tmp_path)
    with pytest.raises(PageCompressedError, match="zlib-compressed"):
        read_page_bytes(tmp_path / "b-zlib.html")
    (page,) = iter_pages(tmp_path / "e-twice.html.gz", bad_rows="report")
    assert page.error_code == ErrorCode.UNSUPPORTED_MEDIA_TYPE and page.html == b""
    assert read_page_bytes(tmp_path / "d-gzip.html.gz") == PAGE
