"""A zstd WARC compressed with a dictionary (the IIPC zstd-WARC layout, as wget-at writes it: a skippable
frame of magic 0x184D2A5D holding the dictionary, zstd-compressed or not, before the frames): a corrupt
frame is one row and reading goes on at the next frame, as without one. The frames had been checked
without the dictionary (no candidate decoded, so the first corrupt frame ended the file), and FastWARC,
handed the file from a later frame on, reads no dictionary there ("Dictionary mismatch" for every frame
after: a row per record)."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
import zstandard

from tests.factories.warc import HttpResponse, pages_and_errors, response

COUNT = 24


def _unnamed(record: bytes) -> bytes:
    head, sep, rest = record.partition(b"\r\n\r\n")
    lines = [line for line in head.split(b"\r\n") if not line.startswith(b"WARC-Record-ID:")]
    return b"\r\n".join(lines) + sep + rest


def _records() -> list[bytes]:
    """Pages alike but for their words (what a dictionary is for); every third without an id."""
    records = []
    for i in range(COUNT):
        body = f"<html><head><title>Page {i}</title></head><body><p>words {i} and more</p></body></html>"
        record = response(f"r{i}", HttpResponse(body.encode() * (1 + i % 4)), uri=f"https://example.com/{i}")
        records.append(_unnamed(record) if i % 3 == 0 else record)
    return records


def _dictionary_file(records: list[bytes], *, compressed: bool) -> tuple[bytes, list[bytes]]:
    """The dictionary frame and a frame per record compressed with it."""
    samples: list[bytes | bytearray | memoryview] = list(records * 4)
    dictionary = zstandard.train_dictionary(2048, samples)
    content = dictionary.as_bytes()
    if compressed:
        content = zstandard.ZstdCompressor().compress(content)
    frame = struct.pack("<II", 0x184D2A5D, len(content)) + content
    compressor = zstandard.ZstdCompressor(dict_data=dictionary)
    return frame, [compressor.compress(r) for r in records]


def _flipped(frame: bytes) -> bytes:
    out = bytearray(frame)
    for at in range(len(out) // 2, min(len(out) // 2 + 20, len(out) - 4)):
        out[at] ^= 0xFF
    return bytes(out)


@pytest.mark.parametrize("compressed", [False, True])
def test_a_corrupt_frame_of_a_dictionary_file_is_skipped(tmp_path: Path, compressed: bool) -> None:
    records = _records()
    head, frames = _dictionary_file(records, compressed=compressed)
    assert zstandard.get_frame_parameters(frames[0]).dict_id  # the frames need the dictionary
    path = tmp_path / "crawl.warc.zst"
    path.write_bytes(head + b"".join(frames))
    good, errors = pages_and_errors(path)
    assert not errors and len(good) == COUNT  # FastWARC reads it whole
    named, pages = [p.id for p in good], [p.html for p in good]

    bad = 10
    frames[bad] = _flipped(frames[bad])
    path.write_bytes(head + b"".join(frames))
    good, errors = pages_and_errors(path)
    start = len(head) + sum(map(len, frames[:bad]))
    resume = start + len(frames[bad])
    assert [p.id for p in good] == named[:bad] + named[bad + 1 :]
    assert [p.html for p in good] == pages[:bad] + pages[bad + 1 :]
    # Records without an id after the corrupt frame keep the byte they start at (FastWARC's offsets
    # there are counted from the dictionary frame handed to it first).
    assert named[12] == f"crawl.warc.zst@{resume + len(frames[11])}"
    (row,) = errors
    assert row.id == f"crawl.warc.zst@{start}"
    assert f"(bytes {start} to {resume - 1}; reading goes on at the record at byte {resume})" in (
        row.error or ""
    )


def test_a_corrupt_first_frame_after_the_dictionary_is_named_by_its_own_byte(tmp_path: Path) -> None:
    """The first data frame, not the dictionary frame at byte 0, is the one that failed."""
    records = _records()
    head, frames = _dictionary_file(records, compressed=False)
    frames[0] = _flipped(frames[0])
    path = tmp_path / "crawl.warc.zst"
    path.write_bytes(head + b"".join(frames))
    good, errors = pages_and_errors(path)
    assert len(good) == COUNT - 1
    assert [p.id for p in errors] == [f"crawl.warc.zst@{len(head)}"]
