"""A record whose WARC header is longer than FastWARC reads (`warc_tail.MAX_HEADER_BYTES`, 32 KiB: wget
writes a 40,000-character URL into WARC-Target-URI as it is) in a WARC file compressed per record: it is
its own row, saying so, and the intact page before it is kept. The record walk took headers up to 1 MiB,
so the member before it was blamed ("corrupt data its compression cannot tell", its page not kept)."""

from __future__ import annotations

import gzip
from collections.abc import Callable
from pathlib import Path

import pytest
import zstandard

from service.core.warc_tail import MAX_HEADER_BYTES
from tests.factories.warc import HttpResponse, lz4_frame, pages_and_errors, response

PER_RECORD: dict[str, tuple[str, Callable[[bytes, Path], bytes]]] = {
    "gzip": (".warc.gz", lambda record, _: gzip.compress(record, mtime=0)),
    "zstd": (".warc.zst", lambda record, _: zstandard.ZstdCompressor().compress(record)),
    "lz4": (".warc.lz4", lz4_frame),
}
_LONG_URI = "https://example.com/search?q=" + "a" * 40_000


def _page(name: str, uri: str = "https://example.com/") -> bytes:
    return response(name, HttpResponse(f"<p>page {name}</p>".encode() * 20), uri=uri)


@pytest.mark.parametrize("long_records", [1, 2])  # wget writes the request and the response so
@pytest.mark.parametrize("compression", PER_RECORD)
def test_a_header_over_fastwarc_s_bound_is_its_own_row(
    tmp_path: Path, compression: str, long_records: int
) -> None:
    suffix, compress = PER_RECORD[compression]
    records = [_page("r0"), _page("r1"), *[_page(f"long{i}", _LONG_URI) for i in range(long_records)]]
    records += [_page("r2"), _page("r3")]
    members = [compress(record, tmp_path / "frame") for record in records]
    path = tmp_path / f"crawl{suffix}"
    path.write_bytes(b"".join(members))
    good, errors = pages_and_errors(path)
    assert [p.id for p in good] == [f"<urn:uuid:r{i}>" for i in range(4)]
    starts = [sum(map(len, members[:i])) for i in range(2, 2 + long_records)]
    assert [row.id for row in errors] == [f"crawl{suffix}@{start}" for start in starts]
    for row, start in zip(errors, starts, strict=True):
        assert f"the record at byte {start} holds no WARC record FastWARC reads" in (row.error or "")
        assert f"over the {MAX_HEADER_BYTES} FastWARC reads" in (row.error or "")


def test_a_header_at_fastwarc_s_bound_is_read(tmp_path: Path) -> None:
    """The bound is FastWARC's own, to the byte: a header of exactly that many bytes is a page."""
    short = _page("long", "https://example.com/")
    header = short.index(b"\r\n\r\n") + 4
    uri = "https://example.com/" + "a" * (MAX_HEADER_BYTES - header)
    members = [gzip.compress(r, mtime=0) for r in (_page("r0"), _page("long", uri), _page("r1"))]
    path = tmp_path / "crawl.warc.gz"
    path.write_bytes(b"".join(members))
    good, errors = pages_and_errors(path)
    assert [p.id for p in good] == ["<urn:uuid:r0>", "<urn:uuid:long>", "<urn:uuid:r1>"] and not errors
