"""A corrupt zstd or LZ4 frame in a WARC file written with one frame per record (`warc_pages.iter_warc`,
`warc_skip.skip_member`): it is one error row and the records after it are read, as for a corrupt gzip
member (`test_warc_pages_corrupt_member`), where the first corrupt frame had ended the file with one row
(every record after it lost). A file compressed as one stream still ends with one row: it has no next
frame to go on at."""

from __future__ import annotations

import gzip
import io
import random
from collections.abc import Callable
from pathlib import Path

import pytest
import zstandard

from service.core import warc_frames
from service.core.errors import ErrorCode
from service.core.pages import iter_pages
from tests.factories.warc import HttpResponse, lz4_frame, pages_and_errors, response, warc_record
from tests.memory import traced_peak

COUNT = 30


def _records(count: int = COUNT) -> list[bytes]:
    return [
        response(f"r{i}", HttpResponse(f"<p>page {i}</p>".encode() * 20), uri=f"https://example.com/{i}")
        for i in range(count)
    ]


def _zstd_frames(records: list[bytes]) -> list[bytes]:
    return [zstandard.ZstdCompressor().compress(r) for r in records]


def _zstd_checked_frames(records: list[bytes]) -> list[bytes]:
    """Frames with a content checksum and without the content size: the frame end's other paths."""
    compressor = zstandard.ZstdCompressor(write_checksum=True, write_content_size=False)
    return [compressor.compress(r) for r in records]


def _lz4_frames(records: list[bytes], tmp: Path) -> list[bytes]:
    return [lz4_frame(record, tmp) for record in records]


FRAMINGS: dict[str, tuple[str, Callable[[list[bytes], Path], list[bytes]]]] = {
    "zstd": (".warc.zst", lambda records, _: _zstd_frames(records)),
    "zstd with checksums": (".warc.zst", lambda records, _: _zstd_checked_frames(records)),
    "lz4": (".warc.lz4", _lz4_frames),
}


def _flipped(frame: bytes, start: int = 20, count: int = 30) -> bytes:
    """`frame` with `count` bytes from `start` on inverted (its header and end mark kept): it no longer
    decodes."""
    out = bytearray(frame)
    for at in range(start, min(start + count, len(out) - 4)):
        out[at] ^= 0xFF
    return bytes(out)


def _offset(frames: list[bytes], index: int) -> int:
    return sum(len(f) for f in frames[:index])


@pytest.mark.parametrize("framing", FRAMINGS)
def test_a_corrupt_frame_is_skipped_and_the_records_after_it_are_read(tmp_path: Path, framing: str) -> None:
    suffix, write = FRAMINGS[framing]
    frames = write(_records(), tmp_path / "frame")
    bad = {COUNT // 2, COUNT - 5}
    for index in bad:
        frames[index] = _flipped(frames[index])
    path = tmp_path / f"crawl{suffix}"
    path.write_bytes(b"".join(frames))
    good, errors = pages_and_errors(path)
    kept = [i for i in range(COUNT) if i not in bad]
    assert [p.id for p in good] == [f"<urn:uuid:r{i}>" for i in kept]
    assert all(f"page {i}".encode() in p.html for i, p in zip(kept, good, strict=True))
    # One row per corrupt frame, named by its own offset (the frame before it decoded to its end), and
    # none at the end: the file is checked from where reading went on, not again from its start.
    assert [p.id for p in errors] == [f"crawl{suffix}@{_offset(frames, i)}" for i in sorted(bad)]
    for index, row in zip(sorted(bad), errors, strict=True):
        start, resume = _offset(frames, index), _offset(frames, index + 1)
        assert row.error_code == ErrorCode.VALIDATION
        assert (
            f"the record at byte {start} could not be decompressed and was skipped (bytes {start} to "
            f"{resume - 1}; reading goes on at the record at byte {resume})"
        ) in (row.error or "")
    order = [p.id for p in iter_pages(path, bad_rows="report")]
    assert order.index(f"crawl{suffix}@{_offset(frames, COUNT // 2)}") == COUNT // 2


@pytest.mark.parametrize("framing", FRAMINGS)
def test_a_corrupt_first_frame_or_one_inside_a_record_body(tmp_path: Path, framing: str) -> None:
    """The first frame (no record framed yet) and a frame whose record FastWARC framed but could not read
    to its end (the corruption deep in a long body, past the first block) are each the row of their own
    offset, not of the record before, and the record after them is read. The body is words, which both
    formats compress (LZ4 stores incompressible data as it is)."""
    suffix, write = FRAMINGS[framing]
    rng = random.Random(7)
    words = [bytes(rng.choices(b"abcdefghijklmnopqrstuvwxyz", k=rng.randint(2, 9))) for _ in range(300)]
    body = b" ".join(rng.choices(words, k=80_000))
    records = _records(6)
    records[3] = warc_record("big", HttpResponse(b"<p>" + body + b"</p>").block())
    frames = write(records, tmp_path / "frame")
    frames[0] = _flipped(frames[0])
    frames[3] = _flipped(frames[3], start=len(frames[3]) - 5_000, count=200)
    path = tmp_path / f"crawl{suffix}"
    path.write_bytes(b"".join(frames))
    good, errors = pages_and_errors(path)
    # LZ4 data has no checksum here (FastWARC writes none): flipped bytes may decode, to garbage of
    # another length. Its record is then read, and FastWARC loses the framing after it: the next member
    # decodes whole to a record, this one to none, so this one is the row, and says so: the page's own
    # row (its id, no page), not a success row with a warning row after it.
    garbage = framing == "lz4"
    assert [p.id for p in good] == ["<urn:uuid:r1>", "<urn:uuid:r2>", "<urn:uuid:r4>", "<urn:uuid:r5>"]
    big = "<urn:uuid:big>" if garbage else f"crawl{suffix}@{_offset(frames, 3)}"
    assert [p.id for p in errors] == [f"crawl{suffix}@0", big]
    at = _offset(frames, 3)
    said = (
        f"record <urn:uuid:big>, a response record at byte {at} was read, but its LZ4 frame decompresses to "
        "bytes that are no whole WARC records as FastWARC frames them"
        if garbage
        else "could not be decompressed"
    )
    assert said in (errors[1].error or "")
    assert errors[1].html == b"" and errors[1].url == ("https://example.com/" if garbage else None)


@pytest.mark.parametrize("framing", FRAMINGS)
def test_a_corrupt_last_frame_or_one_stream_ends_the_file_with_one_row(tmp_path: Path, framing: str) -> None:
    """Nothing to go on reading at: no frame follows, or the file is one stream, whose offsets FastWARC
    gives are no frame starts."""
    suffix, write = FRAMINGS[framing]
    frames = write(_records(6), tmp_path / "frame")
    frames[-1] = _flipped(frames[-1])
    path = tmp_path / f"last{suffix}"
    path.write_bytes(b"".join(frames))
    good, errors = pages_and_errors(path)
    assert [p.id for p in good] == [f"<urn:uuid:r{i}>" for i in range(5)]
    assert len(errors) == 1 and "cannot read the records after byte" in (errors[0].error or "")

    (stream,) = write([b"".join(_records())], tmp_path / "frame")
    middle = len(stream) // 2
    path = tmp_path / f"stream{suffix}"
    path.write_bytes(_flipped(stream, middle, 60))
    good, errors = pages_and_errors(path)
    assert len(errors) == 1 and "cannot read the records after byte" in (errors[0].error or "")
    assert len(good) < COUNT


@pytest.mark.parametrize("framing", FRAMINGS)
def test_frame_magic_that_starts_no_record_ends_the_scan(tmp_path: Path, framing: str) -> None:
    """A frame's magic followed by garbage, and whole frames that hold no WARC record, are passed over,
    and the scan ends at the end of the file: one row, never a loop."""
    suffix, write = FRAMINGS[framing]
    frames = write(_records(3), tmp_path / "frame")
    magic = frames[0][:4]
    (fake,) = write([b"not a WARC record"], tmp_path / "frame")
    garbage = (magic + random.Random(3).randbytes(60)) * 3_000 + fake * 100
    path = tmp_path / f"garbage{suffix}"
    path.write_bytes(frames[0] + _flipped(frames[1]) + garbage)
    good, errors = pages_and_errors(path)
    assert [p.id for p in good] == ["<urn:uuid:r0>"]
    assert len(errors) == 1 and "cannot read the records after byte" in (errors[0].error or "")


def test_a_zstd_frame_is_walked_to_its_end_in_bounded_memory() -> None:
    """The frame a record was read from is decoded to its end, to tell whether the next one failed: its
    output comes a block at a time, so a frame that inflates to 64 MiB (a few KB of RLE blocks) never
    takes more than a block's worth."""
    frame = zstandard.ZstdCompressor().compress(b"\0" * (64 << 20))
    data = frame + b"after"

    zstd = warc_frames._Zstd(None)

    def walk() -> tuple[int, list[int]]:
        ends: list[int] = []
        return sum(len(out) for out in zstd.frame(io.BytesIO(data), 0, ends)), ends

    (size, ends), peak = traced_peak(walk)
    assert (size, ends) == (64 << 20, [len(frame)])
    assert peak < 4 << 20
    with pytest.raises(warc_frames.Undecodable):  # cut off
        list(zstd.frame(io.BytesIO(frame[:-3]), 0, []))


def test_an_lz4_frame_that_decodes_to_other_records_loses_no_record_after_it(tmp_path: Path) -> None:
    """LZ4 (without checksums, as FastWARC writes it) stores literals as they are, so a changed byte may
    decode: here the blank line that ends a record's WARC header, so that FastWARC frames the record
    otherwise than its Content-Length walk does and fails after it. The next frame decodes whole to a
    record: that one is where reading goes on, the changed frame is the row, and no record is lost (the
    next one had been taken for the corrupt one and skipped)."""
    frames = _lz4_frames(_records(6), tmp_path / "frame")
    end = b"Length: 325\r\n\r\nHTTP"
    assert frames[2].count(end) == 1  # a literal run of the compressed frame
    frames[2] = frames[2].replace(end, b"Length: 325\r\xe7\r\x99HTTP")
    path = tmp_path / "crawl.warc.lz4"
    path.write_bytes(b"".join(frames))
    good, errors = pages_and_errors(path)
    assert "<urn:uuid:r3>" in [p.id for p in good]
    assert [p.id for p in good if p.id != "<urn:uuid:r2>"] == [f"<urn:uuid:r{i}>" for i in (0, 1, 3, 4, 5)]
    assert [p.id for p in errors] == [f"crawl.warc.lz4@{_offset(frames, 2)}"]
    assert "was read, but its LZ4 frame decompresses to bytes that are no whole WARC records" in (
        errors[0].error or ""
    )
    assert "LZ4 frames without a checksum decode corrupt data" in (errors[0].error or "")


@pytest.mark.parametrize("framing", [*FRAMINGS, "gzip"])
def test_a_first_member_with_a_corrupt_magic_is_skipped_too(tmp_path: Path, framing: str) -> None:
    """The file's compression is told by its name where its first bytes no longer tell it (FastWARC
    picks its decoder by the name): the first member is one row, the records after it are read."""
    suffix, write = FRAMINGS.get(framing, (".warc.gz", lambda rs, _: [gzip.compress(r) for r in rs]))
    frames = write(_records(5), tmp_path / "frame")
    frames[0] = b"\0\0\0\0" + frames[0][4:]
    path = tmp_path / f"crawl{suffix}"
    path.write_bytes(b"".join(frames))
    good, errors = pages_and_errors(path)
    assert [p.id for p in good] == [f"<urn:uuid:r{i}>" for i in range(1, 5)]
    assert [p.id for p in errors] == [f"crawl{suffix}@0"]


def test_a_member_fastwarc_stops_at_quietly_is_skipped_too(tmp_path: Path) -> None:
    """A gzip member whose header flags claim an extra field it does not hold: FastWARC ends the file
    there without an error, and the end-of-file check found the rest undecodable: one row, the records
    after it lost. It is passed over as a member FastWARC fails on is."""
    members = [gzip.compress(r, mtime=0) for r in _records(8)]
    members[2] = members[2][:3] + b"\x04" + members[2][4:]  # FLG.FEXTRA
    path = tmp_path / "crawl.warc.gz"
    path.write_bytes(b"".join(members))
    good, errors = pages_and_errors(path)
    assert [p.id for p in good] == [f"<urn:uuid:r{i}>" for i in range(8) if i != 2]
    assert [p.id for p in errors] == [f"crawl.warc.gz@{_offset(members, 2)}"]
    assert "could not be decompressed and was skipped" in (errors[0].error or "")
