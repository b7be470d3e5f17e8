"""service.core.warc_tail and warc_frames: the record walk, the streaming gunzip and the LZ4 frame check."""

from __future__ import annotations

import gzip
import io
import random
import time
import zlib
from pathlib import Path

import pytest
from fastwarc.warc import ArchiveIterator

from service.core import warc_frames, warc_gzip, warc_tail
from service.core.warc_tail import walk_records
from tests.factories.warc import HttpResponse, response

RECORDS = [
    response("a", HttpResponse(b"<p>a</p>")),
    response("b", HttpResponse(b"<p>" + b"b" * 3000 + b"</p>")),
]
DATA = b"".join(RECORDS)


def _chunked(data: bytes, rng: random.Random) -> list[bytes]:
    cuts = sorted(rng.sample(range(1, len(data)), 12))
    return [data[i:j] for i, j in zip([0, *cuts], [*cuts, len(data)], strict=True)]


@pytest.mark.parametrize("seed", range(5))
def test_the_walk_does_not_depend_on_chunk_boundaries(seed: int) -> None:
    rng = random.Random(seed)
    assert walk_records(_chunked(DATA, rng)) is None
    second = len(RECORDS[0])
    in_body = DATA[: second + 1000]
    assert walk_records([bytes([b]) for b in in_body]) == (
        "the file ends inside the record",
        second,
        ": it was cut off",
    )
    in_header = DATA[: second + 40]
    assert walk_records(_chunked(in_header, rng)) == ("the file ends inside the record header", second, "")


def test_the_walk_refuses_what_is_no_warc() -> None:
    assert walk_records([b"\n" * 10]) is None  # separators only
    problem = walk_records([b"WARC/1.1\r\nWARC-Type: response\r\n\r\nbody"])
    assert problem is not None and problem[0].startswith("the file ends inside")
    assert walk_records([b"x" * (2 << 20)]) == ("the file holds no WARC record header", 0, warc_tail._NO_END)


def test_gunzip_streams_members_in_bounded_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(warc_gzip, "CHUNK", 4096)
    payload = bytes(random.Random(0).randrange(256) for _ in range(50_000))
    members = gzip.compress(payload) + gzip.compress(payload) + b"\0" * 7  # padding after the last
    chunks = list(warc_gzip.gunzipped(io.BytesIO(members)))
    assert b"".join(chunks) == payload * 2 and max(map(len, chunks)) <= 4096
    with pytest.raises(warc_frames.Undecodable):
        list(warc_gzip.gunzipped(io.BytesIO(members[:-40])))  # the second member cut off
    with pytest.raises(warc_frames.Undecodable):
        list(warc_gzip.gunzipped(io.BytesIO(gzip.compress(payload) + b"not gzip")))


def test_many_tiny_chunks_and_members_take_linear_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """A header was looked for again in the whole buffer after each chunk, and each gzip member was
    handed the rest of the chunk read: a stream of one-byte pieces, or a file of one-byte gzip members
    (21 bytes each), was quadratic, minutes for 20 MB."""
    started = time.perf_counter()
    no_header = ("the file holds no WARC record header", 0, warc_tail._NO_END)  # over FastWARC's bound
    assert walk_records(iter([b"x"] * 300_000)) == no_header
    assert time.perf_counter() - started < 2

    fed = 0
    real = zlib.decompressobj

    class Counting:
        def __init__(self, wbits: int) -> None:
            self._inner = real(wbits)

        def __getattr__(self, name: str) -> object:
            return getattr(self._inner, name)

        def decompress(self, data: bytes, max_length: int) -> bytes:
            nonlocal fed
            fed += len(data)
            return self._inner.decompress(data, max_length)

    monkeypatch.setattr(zlib, "decompressobj", Counting)
    members = b"".join(map(gzip.compress, RECORDS)) + gzip.compress(b"x") * 20_000
    assert b"".join(warc_gzip.gunzipped(io.BytesIO(members))) == DATA + b"x" * 20_000
    assert fed < 4 * len(members)


def _lz4_frame(
    blocks: list[bytes], *, content_size: bool, block_checksum: bool, content_checksum: bool
) -> bytes:
    """An LZ4 frame of uncompressed blocks (the frame format's high bit), checksums as placeholders."""
    flags = 0x60 | 0x08 * content_size | 0x10 * block_checksum | 0x04 * content_checksum
    out = warc_frames.LZ4_MAGIC + bytes([flags, 0x40])
    out += (sum(map(len, blocks))).to_bytes(8, "little") if content_size else b""
    out += b"\x99"  # header checksum
    for block in blocks:
        out += (len(block) | 0x80000000).to_bytes(4, "little") + block + b"\0" * 4 * block_checksum
    return out + b"\0\0\0\0" + b"\0" * 4 * content_checksum


@pytest.mark.parametrize("flags", [(False, False, False), (True, True, True), (True, False, True)])
def test_the_lz4_frame_check_finds_every_cut(flags: tuple[bool, bool, bool]) -> None:
    content_size, block_checksum, content_checksum = flags
    frames = [
        _lz4_frame([b"x" * 100, b"y" * 50], content_size=content_size, block_checksum=block_checksum,
                   content_checksum=content_checksum),
        b"\x52\x2a\x4d\x18" + (5).to_bytes(4, "little") + b"skip!",  # a skippable frame
        _lz4_frame([b"z" * 30], content_size=content_size, block_checksum=block_checksum,
                   content_checksum=content_checksum),
    ]  # fmt: skip
    data = b"".join(frames)
    boundaries = {0, len(frames[0]), len(frames[0]) + len(frames[1]), len(data)}
    for end in range(1, len(data) + 1):
        problem = warc_frames.lz4_frames_problem(io.BytesIO(data[:end]))
        assert (problem is None) == (end in boundaries), (end, problem)
    assert "no LZ4 frame" in (warc_frames.lz4_frames_problem(io.BytesIO(data + b"junk")) or "")


@pytest.mark.parametrize("extra", [0, 1])
def test_the_walk_refuses_a_header_fastwarc_refuses(tmp_path: Path, extra: int) -> None:
    """A header of `MAX_HEADER_BYTES` (its CRLF CRLF included) is read by both, one byte more by neither:
    walked up to 1 MiB, a record FastWARC refused was taken for whole, and the page before it blamed."""
    record = response("a", HttpResponse(b"<p>a</p>"), uri="https://example.com/")
    header = record.index(b"\r\n\r\n") + 4
    uri = "https://example.com/" + "a" * (warc_tail.MAX_HEADER_BYTES - header + extra)
    data = RECORDS[0] + response("b", HttpResponse(b"<p>b</p>"), uri=uri)
    problem = walk_records([data])
    path = tmp_path / "crawl.warc"
    path.write_bytes(data)
    try:
        read = len(list(ArchiveIterator(str(path), parse_http=False)))  # FastWARC's own bound, by default
    except OSError:
        read = 1
    if extra:
        what, at, _ = problem or ("", 0, "")
        assert (what, at) == (
            "the file holds a WARC record header longer than FastWARC reads",
            len(RECORDS[0]),
        )
        assert read == 1
    else:
        assert problem is None and read == 2
