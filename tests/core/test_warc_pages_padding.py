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
from tests.factories.warc import HttpResponse, gzip_pieces, lz4_frame, response

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
    "gzip fixed-size members": (".warc.gz", lambda records, _: gzip_pieces(b"".join(records), 100)),
    "zstd stream": (".warc.zst", lambda records, _: _zstd(b"".join(records))),
    "lz4 stream": (".warc.lz4", lambda records, tmp: lz4_frame(b"".join(records), tmp)),
}
PADDING = {
    "512 NULs": b"\0" * 512,
    "a CRLF": b"\r\n",
    "blanks": b" \n\t",
    "one NUL": b"\0",
    "NULs over a header's bound": b"\0" * (64 << 10),  # the walk's bound on a header is no bound on them
}


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


def _raw_zstd(data: bytes) -> bytes:
    """`data` as one zstd frame of one raw block and no checksum, as a writer may store a record: its
    bytes are the record's, so one can be corrupted where the format cannot tell (RFC 8878: no content
    size, a 2 MiB window, then a last raw block of `data`)."""
    assert len(data) < 128 << 10
    return b"\x28\xb5\x2f\xfd\x00\x58" + (1 | len(data) << 3).to_bytes(3, "little") + data


# Frames whose data is checked by nothing, so a corrupt byte still decodes; a one-bit change to the last
# record's bytes there; and whether FastWARC still frames that record. LZ4: the version line's LF turned
# to a VT, which the writer's literals copy on into the header's other line ends, so FastWARC finds no
# header (a CR turned to a TAB had left lines ended in bare LF, which `warc_pages` now reads). zstd: the
# CR before the Content-Length line turned to a TAB, so that line is no line of its own for FastWARC,
# which frames the record otherwise than its Content-Length.
UNCHECKED: dict[str, tuple[str, Callable[[bytes, Path], bytes], bytes, tuple[bytes, bytes], bool]] = {
    "lz4": (".warc.lz4", lz4_frame, b"WARC/1.1\r\n", (b"\n", b"\x0b"), False),
    "zstd without checksum": (
        ".warc.zst",
        lambda record, _: _raw_zstd(record),
        b"\r\nContent-Length",
        (b"\r", b"\t"),
        True,
    ),
}


@pytest.mark.parametrize("layout", UNCHECKED)
def test_the_last_record_corrupt_where_its_compression_cannot_tell_has_a_row(
    tmp_path: Path, layout: str
) -> None:
    """The file's own last bytes (an LZ4 frame's four-NUL end mark, the CRLF CRLF that ends a record in
    a zstd frame without checksum) had been taken for padding: FastWARC's failure after the last record,
    corrupt by one bit, passed for the padding that ends the file, and the record was lost without a
    row. Padding is only what follows the last frame's end."""
    suffix, frame, line, change, framed = UNCHECKED[layout]
    frames = [frame(record, tmp_path / "frame") for record in _records()]
    assert line in frames[-1]  # first in the WARC header, before the HTTP head's
    frames[-1] = frames[-1].replace(line, line.replace(*change, 1), 1)
    path = tmp_path / f"crawl{suffix}"
    path.write_bytes(b"".join(frames))
    rows = _rows(path)
    assert [(r.id, r.error) for r in rows[:-1]] == [(f"<urn:uuid:r{i}>", None) for i in range(COUNT - 1)]
    start = sum(map(len, frames[:-1]))
    # Framed, the record is the row (named by its byte); else the row is the file's, after the records read.
    assert rows[-1].error is not None
    assert rows[-1].id == (f"crawl{suffix}@{start}" if framed else f"crawl{suffix}#{COUNT - 1}")
