"""Padding that ends a WARC file (NULs, as a writer pads a file to a block; a blank line) is no member and
no error (`warc_tail.ends_in_padding`): FastWARC fails on it ("data error", "Unknown frame descriptor",
"Invalid WARC header"), and that failure had been an error row for a file whose every record was read.
Padding that follows a member cut off is still the cut's row."""

from __future__ import annotations

import gzip
from collections.abc import Callable
from pathlib import Path

import pytest
import zstandard

from service.core.pages import Page, iter_pages
from tests.factories.warc import HttpResponse, lz4_frame, response

COUNT = 5


def _gzip(data: bytes) -> bytes:
    return gzip.compress(data, mtime=0)


def _zstd(data: bytes) -> bytes:
    return zstandard.ZstdCompressor().compress(data)


# A layout: its suffix, and how it compresses records (per record, or the whole as one stream).
LAYOUTS: dict[str, tuple[str, Callable[[list[bytes], Path], bytes]]] = {
    "plain": (".warc", lambda records, _: b"".join(records)),
    "gzip per record": (".warc.gz", lambda records, _: b"".join(map(_gzip, records))),
    "zstd per record": (".warc.zst", lambda records, _: b"".join(map(_zstd, records))),
    "lz4 per record": (".warc.lz4", lambda records, tmp: b"".join(lz4_frame(r, tmp) for r in records)),
    "gzip stream": (".warc.gz", lambda records, _: _gzip(b"".join(records))),
    "zstd stream": (".warc.zst", lambda records, _: _zstd(b"".join(records))),
    "lz4 stream": (".warc.lz4", lambda records, tmp: lz4_frame(b"".join(records), tmp)),
}
PADDING = {"512 NULs": b"\0" * 512, "a CRLF": b"\r\n", "blanks": b" \n\t", "one NUL": b"\0"}


def _records() -> list[bytes]:
    return [response(f"r{i}", HttpResponse(f"<p>page {i}</p>".encode() * 20)) for i in range(COUNT)]


def _rows(path: Path) -> list[Page]:
    return list(iter_pages(path, bad_rows="report"))


@pytest.mark.parametrize("padding", PADDING)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_padding_after_the_last_record_is_no_error(tmp_path: Path, layout: str, padding: str) -> None:
    suffix, write = LAYOUTS[layout]
    path = tmp_path / f"crawl{suffix}"
    path.write_bytes(write(_records(), tmp_path / "frame") + PADDING[padding])
    rows = _rows(path)
    assert [(r.id, r.error) for r in rows] == [(f"<urn:uuid:r{i}>", None) for i in range(COUNT)]


@pytest.mark.parametrize("layout", [name for name in LAYOUTS if name != "plain"])
def test_padding_after_a_cut_member_is_the_cut_s_row(tmp_path: Path, layout: str) -> None:
    suffix, write = LAYOUTS[layout]
    records = _records()
    whole = write(records, tmp_path / "frame")
    last = write(records[-1:], tmp_path / "frame")
    path = tmp_path / f"crawl{suffix}"
    path.write_bytes(whole[: -len(last) // 2] + b"\0" * 512)
    rows = _rows(path)
    assert [r.error is None for r in rows].count(False) == 1
    assert rows[-1].error is not None
