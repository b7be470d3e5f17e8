"""`undeclared_coding`: compressed bodies with no Content-Encoding are told however compressible the page,
zstd after skippable frames too; text that starts as a stored deflate block or as zstd's magic is not."""

from __future__ import annotations

import gzip
import random
import struct
import zlib
from collections.abc import Callable
from pathlib import Path

import pytest
import zstandard

from service.core.content_coding import undeclared_coding
from service.core.errors import ErrorCode
from service.core.pages import iter_pages

ROWS = b"<html><body><table>" + b"<tr><td>x</td><td>y</td></tr>" * 13_000 + b"</table></body></html>"


def _varied_text(size: int, seed: int = 11) -> str:
    """Words that compress about threefold: their deflate data looks random."""
    rng = random.Random(seed)
    words = [
        "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9)))
        for _ in range(3000)
    ]
    parts, length = [], 0
    while length < size:
        parts.append(f'<p class="c{rng.randint(0, 99)}">{" ".join(rng.choices(words, k=12))}</p>\n')
        length += len(parts[-1])
    return "".join(parts)


PADDED = b"<html>" + b" " * 2_000_000 + b"<body>" + _varied_text(100_000).encode() + b"</body></html>"
ZSTD = zstandard.ZstdCompressor().compress


def _gzip(data: bytes, level: int) -> bytes:
    return gzip.compress(data, level, mtime=0)


@pytest.mark.parametrize("level", [1, 6, 9])
@pytest.mark.parametrize("compress", [_gzip, zlib.compress], ids=["gzip", "zlib"])
@pytest.mark.parametrize("page", [ROWS, PADDED], ids=["rows", "padded"])
def test_a_very_compressible_page_compressed_is_told(
    page: bytes, compress: Callable[[bytes, int], bytes], level: int
) -> None:
    """380 KB of repeated rows deflate 400 to 1,000 times: the sample had stopped at 256 KiB inflated from
    a few hundred bytes, short of the stream's checksum and of a KiB to judge, and the body (a page file
    gzipped twice) was embedded as noise. 2 MB of padding leave a stream longer than the sample, whose
    deflate data is a run (185 to 489 times its size inflated): past 159, the most text read as a
    fixed-Huffman block makes."""
    expected = "gzip" if compress is _gzip else "deflate"
    compressed = compress(page, level)
    assert undeclared_coding(compressed) == expected
    assert undeclared_coding(compressed[:1500]) == expected  # cut off, as a stored body may be


@pytest.mark.parametrize("run", [b"c8", b"\xfaQ\xc6"])
def test_text_runs_that_inflate_most_are_still_text(run: bytes) -> None:
    """The runs of two and three characters that inflate most after `x^` (57 and 86 times, in a
    fixed-Huffman block) stay under the ratio that counts as evidence."""
    body = b"x^" + run * (20_000 // len(run))
    inflater = zlib.decompressobj()
    assert len(inflater.decompress(body[:4098])) > 50 * 4096  # no error: they read as deflate
    assert undeclared_coding(body) is None


def _skippable(payload: bytes, magic: int = 0x184D2A50) -> bytes:
    return struct.pack("<II", magic, len(payload)) + payload


def test_zstd_after_skippable_frames_is_told() -> None:
    """pzstd starts each frame with a skippable one (its size): only the frame magic had been looked for."""
    frame = ZSTD(ROWS)
    assert undeclared_coding(_skippable(struct.pack("<I", len(frame))) + frame) == "zstd"
    two = (
        _skippable(b"", 0x184D2A5F) + _skippable(b"meta" * 100, 0x184D2A53) + frame + _skippable(b"x") + frame
    )
    assert undeclared_coding(two) == "zstd"
    assert undeclared_coding(_skippable(b"only metadata")) == "zstd"  # a whole stream of no content
    assert undeclared_coding(_skippable(b"abcd")[:-1] + frame) is None  # its length is past the body
    assert undeclared_coding(_skippable(b"abcd") + b"<html>" + frame) is None
    assert undeclared_coding(_skippable(b"") * 17 + frame) is None  # more than compressors write


@pytest.mark.parametrize(
    "body",
    [
        b"x^ <p\xc3\x8f" + _varied_text(4000, seed=3).encode(),  # UTF-8 `x^ <pÏ`
        b"x^ ab\x9e\x9d" + "日本語のテキストです。".encode("shift_jis") * 300,
        b"x\x9c <p\xc3\x8f" + b"<p>a paragraph</p>" * 300,
        b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x03 <p\xc3\x8f" + b"<p>a paragraph</p>" * 300,
    ],
    ids=["utf-8", "shift_jis", "x9c", "gzip-header"],
)
def test_text_that_reads_as_a_stored_block_is_text(body: bytes) -> None:
    """After `x^`, the byte ` ` starts a stored block, and `<p` / `\\xc3\\x8f` read as its LEN and NLEN,
    one's complements: zlib copies the text out without error, which had been taken for level 0. An
    encoder pads the block's first byte with zeros (0 or 1); text has no such byte."""
    inflater = zlib.decompressobj(31 if body[0] == 0x1F else 15)
    assert len(inflater.decompress(body[:4096])) > 1024  # inflates without error
    assert undeclared_coding(body) is None


@pytest.mark.parametrize("level", [0, 1])
def test_level_0_streams_are_still_told(level: int) -> None:
    page = _varied_text(200_000).encode()
    for cut in (None, 1100, 4096, 70_000):
        assert undeclared_coding(zlib.compress(page, level)[:cut]) == "deflate"
        assert undeclared_coding(_gzip(page, level)[:cut]) == "gzip"


LATIN = "Une page en français, écrite à la main, où l'on lit ceci et cela.\n" * 1500


@pytest.mark.parametrize(
    "start",
    [
        "(\u00b5/\u00fd) ",  # a reserved bit set in the frame header
        "(\u00b5/\u00fd",  # the magic alone
        # A valid header (`€`: a 4-byte content size, `x`: a 32 MiB window), then a first block that
        # decodes (`0 \n`: raw, 82,950 bytes; `2 \n`: RLE), and after it text, which is no block.
        "(\u00b5/\u00fd\u20acxabcd0 \n",
        "(\u00b5/\u00fd\u20acxabcd2 \n",
    ],
)
def test_cp1252_text_starting_as_zstd_is_text(start: str) -> None:
    """`(µ/ý` is zstd's magic in latin-1 or windows-1252, and had been refused on those four bytes alone.
    A block header needs a byte under 0x10 (a tab or line break, in text) in one place: text crafted to
    have one gets through one block, and the header after it is text."""
    body = (start + LATIN).encode("cp1252")
    assert undeclared_coding(body) is None


@pytest.mark.parametrize("data", [b"", b"a", b"<p>hi</p>", ROWS, _varied_text(400_000).encode()])
@pytest.mark.parametrize(
    "compressor",
    [
        zstandard.ZstdCompressor(),
        zstandard.ZstdCompressor(level=19, write_checksum=True),
        zstandard.ZstdCompressor(level=-5, write_content_size=False),
    ],
    ids=["default", "checksum", "no-size"],
)
def test_zstd_frames_are_told(data: bytes, compressor: zstandard.ZstdCompressor) -> None:
    """A whole frame (a raw, RLE or compressed block, to its end), or the start of a long one."""
    frame = compressor.compress(data)
    assert undeclared_coding(frame) == "zstd"
    assert undeclared_coding(frame + frame) == "zstd"
    if len(data) > 300_000:
        assert undeclared_coding(frame[: len(frame) * 2 // 3]) == "zstd"  # cut off after a block or two


def test_a_page_file_of_rows_gzipped_twice_is_an_unsupported_media_type_row(tmp_path: Path) -> None:
    """The reviewer's case end to end: the page reader undoes the file's gzip, and what is left is gzip."""
    (tmp_path / "rows.html.gz").write_bytes(gzip.compress(_gzip(ROWS, 9)))
    (tmp_path / "pzstd.html").write_bytes(_skippable(b"\0\0\0\0") + ZSTD(ROWS))
    rows = list(iter_pages(tmp_path, bad_rows="report"))
    assert [(row.id, row.error_code) for row in rows] == [
        ("pzstd.html", ErrorCode.UNSUPPORTED_MEDIA_TYPE),
        ("rows.html.gz", ErrorCode.UNSUPPORTED_MEDIA_TYPE),
    ]
