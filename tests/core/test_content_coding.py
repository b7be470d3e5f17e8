"""Content codings: each one round-trips, corrupt and cut-off streams fail typed, bombs stop at the cap."""

from __future__ import annotations

import gzip
import time
import zlib
from collections.abc import Callable

import brotli
import pytest
import zstandard

from service.core.content_coding import (
    MAX_CODINGS,
    MAX_PARTS,
    ContentCodingError,
    decode_content,
    parse_codings,
)
from service.core.errors import ErrorCode

PAGE = ("<html><body>" + "<p>Příliš žluťoučký kůň úpěl ďábelské ódy.</p>" * 400 + "</body></html>").encode()


def _raw_deflate(data: bytes) -> bytes:
    compressor = zlib.compressobj(wbits=-15)
    return compressor.compress(data) + compressor.flush()


ENCODERS: dict[str, Callable[[bytes], bytes]] = {
    "gzip": gzip.compress,
    "x-gzip": gzip.compress,
    "deflate": zlib.compress,
    "br": brotli.compress,
    "zstd": lambda data: zstandard.ZstdCompressor().compress(data),
}


@pytest.mark.parametrize("coding", sorted(ENCODERS))
def test_round_trip(coding: str) -> None:
    encoded = ENCODERS[coding](PAGE)
    assert len(encoded) < len(PAGE) // 5
    assert decode_content(encoded, coding.upper(), limit=len(PAGE)) == PAGE


def test_raw_deflate_and_stacked_codings() -> None:
    assert decode_content(_raw_deflate(PAGE), "deflate", limit=len(PAGE)) == PAGE
    # Applied gzip first, then br: undone in reverse.
    stacked = brotli.compress(gzip.compress(PAGE))
    assert decode_content(stacked, "gzip, br", limit=len(PAGE)) == PAGE
    assert decode_content(PAGE, "identity", limit=len(PAGE)) == PAGE
    assert decode_content(b"", "br", limit=10) == b""


def test_concatenated_members_and_frames() -> None:
    halves = PAGE[:1000], PAGE[1000:]
    assert decode_content(b"".join(gzip.compress(h) for h in halves), "gzip", limit=len(PAGE)) == PAGE
    frames = b"".join(zstandard.ZstdCompressor().compress(h) for h in halves)
    assert decode_content(frames, "zstd", limit=len(PAGE)) == PAGE


def test_many_tiny_zstd_frames_take_linear_time() -> None:
    # Walking the frames once handed each one the whole rest of the body: 200,000 empty frames (1.8 MB,
    # well under any body cap) took 13 s, quadratic in their number. Up to the cap the walk is linear.
    compressor = zstandard.ZstdCompressor()
    body = compressor.compress(b"") * (MAX_PARTS - 1) + compressor.compress(PAGE)
    started = time.perf_counter()
    assert decode_content(body, "zstd", limit=len(PAGE)) == PAGE
    assert time.perf_counter() - started < 2
    with pytest.raises(ContentCodingError, match="cut off"):
        decode_content(body[:-3], "zstd", limit=len(PAGE))


@pytest.mark.parametrize("coding", ["gzip", "zstd"])
def test_more_members_than_the_cap_are_refused(coding: str) -> None:
    """16 MiB of 29-byte gzip members took 2.4 s of a thread holding the GIL (a Python step each)."""
    tiny = ENCODERS[coding](b"<p>hi</p>")
    at_cap = decode_content(tiny * MAX_PARTS, coding, limit=10**9)
    assert at_cap == b"<p>hi</p>" * MAX_PARTS
    with pytest.raises(ContentCodingError) as caught:
        decode_content(tiny * (16 * 1024 * 1024 // len(tiny)), coding, limit=10**9)
    assert caught.value.code is ErrorCode.VALIDATION
    assert f"more than {MAX_PARTS}" in caught.value.message


def test_gzip_members_may_be_padded_with_nul_bytes() -> None:
    """As gzip(1) and Python's GzipFile read them; any other byte after a member is corrupt."""
    halves = gzip.compress(PAGE[:1000]), gzip.compress(PAGE[1000:])
    padded = halves[0] + b"\0" * 10_000 + halves[1] + b"\0" * 3
    assert decode_content(padded, "gzip", limit=len(PAGE)) == PAGE
    assert gzip.decompress(padded) == PAGE
    for junk in (b"\x1f", b"\0\0x", b"\x1f\x8b\x08"):
        with pytest.raises(ContentCodingError, match="corrupt"):
            decode_content(halves[0] + junk, "gzip", limit=len(PAGE))
        with pytest.raises((OSError, EOFError)):
            gzip.decompress(halves[0] + junk)  # the library we replaced refuses the same


def test_gzip_with_header_fields_and_crc_checks() -> None:
    """FNAME, FCOMMENT, FEXTRA and FHCRC headers decode; a wrong CRC or length is corrupt."""
    import zlib

    raw = zlib.compressobj(6, zlib.DEFLATED, -15)
    deflated = raw.compress(PAGE) + raw.flush()
    extra = b"AB\x02\x00hi"
    header = b"\x1f\x8b\x08" + bytes([0x04 | 0x08 | 0x10]) + b"\0\0\0\0\0\xff"
    header += len(extra).to_bytes(2, "little") + extra + b"page.html\0" + b"a comment\0"
    trailer = zlib.crc32(PAGE).to_bytes(4, "little") + len(PAGE).to_bytes(4, "little")
    member = header + deflated + trailer
    assert gzip.decompress(member) == PAGE
    assert decode_content(member, "gzip", limit=len(PAGE)) == PAGE
    bad_crc = header + deflated + (zlib.crc32(PAGE) ^ 1).to_bytes(4, "little") + trailer[4:]
    with pytest.raises(ContentCodingError, match="corrupt"):
        decode_content(bad_crc, "gzip", limit=len(PAGE))


@pytest.mark.parametrize("coding", ["gzip", "deflate", "br", "zstd"])
@pytest.mark.parametrize("damage", ["cut", "junk", "trailing junk"])
def test_corrupt_streams_are_validation_errors(coding: str, damage: str) -> None:
    encoded = ENCODERS[coding](PAGE)
    broken = {
        "cut": encoded[: len(encoded) // 2],
        "junk": b"junk" + encoded,
        "trailing junk": encoded + b"junk",  # each coding refuses bytes after its stream's end
    }[damage]
    with pytest.raises(ContentCodingError) as caught:
        decode_content(broken, coding, limit=10 * len(PAGE))
    assert caught.value.code is ErrorCode.VALIDATION
    assert f"the {coding} body is corrupt" in caught.value.message


@pytest.mark.parametrize("coding", ["gzip", "deflate", "br", "zstd"])
def test_bombs_stop_at_the_limit(coding: str) -> None:
    bomb = ENCODERS[coding](b"\0" * 50_000_000)
    assert len(bomb) < 100_000
    with pytest.raises(ContentCodingError) as caught:
        decode_content(bomb, coding, limit=1_000_000, limit_name="HTMLLM_MAX_BODY_BYTES")
    assert caught.value.code is ErrorCode.PAYLOAD_TOO_LARGE
    assert "1000000 bytes (HTMLLM_MAX_BODY_BYTES)" in caught.value.message
    # Exactly at the limit still decodes.
    assert len(decode_content(ENCODERS[coding](b"\0" * 1000), coding, limit=1000)) == 1000


def test_unknown_codings_are_unsupported_media_type() -> None:
    assert parse_codings(" GZIP ,identity, br") == ["gzip", "br"]
    assert parse_codings(None) == [] and parse_codings("") == []
    for header in ("compress", "gzip, lzma", "exi"):
        with pytest.raises(ContentCodingError) as caught:
            decode_content(b"x", header, limit=10)
        assert caught.value.code is ErrorCode.UNSUPPORTED_MEDIA_TYPE
        assert "unsupported Content-Encoding" in caught.value.message


def test_more_codings_than_the_cap_are_unsupported() -> None:
    """Each layer was capped at the limit but their number was not: 49,770 bytes of gzip listed 2,002
    deep (stored layers around a 9 MiB page) took 8.6 s to decode. `identity` does not count."""
    stacked = PAGE
    for _ in range(MAX_CODINGS):
        stacked = gzip.compress(stacked)
    header = ", ".join(["gzip", "identity"] * MAX_CODINGS)
    assert decode_content(stacked, header, limit=len(PAGE)) == PAGE
    assert parse_codings(header) == ["gzip"] * MAX_CODINGS
    # One layer more is refused before any is undone, as an unknown coding is.
    for count in (MAX_CODINGS + 1, 2002):
        with pytest.raises(ContentCodingError) as caught:
            decode_content(gzip.compress(stacked), ", ".join(["gzip"] * count), limit=10**9)
        assert caught.value.code is ErrorCode.UNSUPPORTED_MEDIA_TYPE
        assert f"more than {MAX_CODINGS} codings" in caught.value.message
