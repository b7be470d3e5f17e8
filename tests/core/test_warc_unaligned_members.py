"""A corrupt member of a .warc.gz whose gzip members are cut where its records are not (bgzip's BGZF
blocks, pgzip's fixed-size pieces of one stream) costs the records it held parts of: one error row, and
the records after it are read (`warc_unaligned.resync`), where the first corrupt member had ended the
file with every record after it lost. No page is made of damaged bytes, and none is read twice."""

from __future__ import annotations

import gzip
import random
import struct
import zlib
from pathlib import Path

import pytest

from service.core.errors import ErrorCode
from tests.factories.warc import HttpResponse, pages_and_errors, response, warc_record

COUNT = 30
SIZE = 777  # bytes of the stream per member


def _records() -> list[bytes]:
    return [
        response(
            f"r{i}", HttpResponse(f"<p>page {i}</p>".encode() * (20 + i)), uri=f"https://example.com/{i}"
        )
        for i in range(COUNT)
    ]


def _bgzf(data: bytes) -> bytes:
    deflate = zlib.compressobj(6, zlib.DEFLATED, -15)
    raw = deflate.compress(data) + deflate.flush()
    header = (
        b"\x1f\x8b\x08\x04" + bytes(4) + b"\x00\xff" + struct.pack("<H2sHH", 6, b"BC", 2, 18 + len(raw) + 7)
    )
    return header + raw + struct.pack("<II", zlib.crc32(data), len(data))


def _members(stream: bytes, bgzf: bool) -> list[bytes]:
    pieces = [stream[at : at + SIZE] for at in range(0, len(stream), SIZE)]
    if bgzf:
        return [_bgzf(piece) for piece in [*pieces, b""]]
    return [gzip.compress(piece, mtime=0) for piece in pieces]


def _spans(records: list[bytes]) -> list[tuple[int, int]]:
    starts = [sum(map(len, records[:i])) for i in range(len(records))]
    return [(start, start + len(record)) for start, record in zip(starts, records, strict=True)]


@pytest.mark.parametrize("bgzf", [True, False], ids=["bgzip", "pgzip"])
@pytest.mark.parametrize("damaged", [1, 5, 9, 14, 20])
def test_the_records_after_a_corrupt_member_are_read(tmp_path: Path, bgzf: bool, damaged: int) -> None:
    records = _records()
    members = _members(b"".join(records), bgzf)
    bad = bytearray(members[damaged])
    for at in range(20, min(80, len(bad) - 8)):
        bad[at] ^= 0xFF
    members[damaged] = bytes(bad)
    path = tmp_path / "crawl.warc.gz"
    path.write_bytes(b"".join(members))

    good, errors = pages_and_errors(path)
    lost_from, lost_to = damaged * SIZE, (damaged + 1) * SIZE  # the damaged member's piece of the stream
    kept = [i for i, (start, end) in enumerate(_spans(records)) if end <= lost_from or start >= lost_to]
    assert [p.id for p in good] == [f"<urn:uuid:r{i}>" for i in kept]
    assert [p.html for p in good] == [f"<p>page {i}</p>".encode() * (20 + i) for i in kept]
    failed = sum(map(len, members[:damaged]))
    # Its id is the member's byte, but where a record was framed there: `#n`, an ordinal no record has.
    assert len(errors) == 1 and errors[0].id in (f"crawl.warc.gz@{failed}", "crawl.warc.gz#2")
    assert errors[0].error_code == ErrorCode.VALIDATION
    assert f"(bytes {failed} to {failed + len(bad) - 1};" in (errors[0].error or "")


def test_two_corrupt_members_far_apart_are_two_rows(tmp_path: Path) -> None:
    records = _records()
    members = _members(b"".join(records), True)
    for damaged in (4, 16):
        bad = bytearray(members[damaged])
        bad[30:60] = bytes(b ^ 0xFF for b in bad[30:60])
        members[damaged] = bytes(bad)
    path = tmp_path / "crawl.warc.gz"
    path.write_bytes(b"".join(members))

    good, errors = pages_and_errors(path)
    spans = _spans(records)
    lost = [(4 * SIZE, 5 * SIZE), (16 * SIZE, 17 * SIZE)]
    kept = [i for i, (s, e) in enumerate(spans) if all(e <= a or s >= b for a, b in lost)]
    assert [p.id for p in good] == [f"<urn:uuid:r{i}>" for i in kept]
    assert len(errors) == 2


def test_a_stored_warc_in_the_damaged_record_gives_no_page(tmp_path: Path) -> None:
    """Where the damage falls in a record whose payload is a WARC file (plain here, so its records are
    in the stream as they are), reading goes on past that record's end, never at one of its records."""
    noise = random.Random(3)
    inner = b"".join(
        response(f"inner{i}", HttpResponse(b"<p>" + noise.randbytes(500).hex().encode() + b"</p>"))
        for i in range(6)
    )
    download = warc_record(
        "download", HttpResponse(inner, content_type="application/warc").block(), uri="https://e/x.warc"
    )
    records = [*_records()[:3], download, *_records()[3:6]]
    stream = b"".join(records)
    members = _members(stream, True)
    start = stream.find(b"WARC/1.1", stream.find(b"inner0") - 200)
    damaged = start // SIZE - 1  # the member before the download's first inner record
    bad = bytearray(members[damaged])
    bad[30:60] = bytes(b ^ 0xFF for b in bad[30:60])
    members[damaged] = bytes(bad)
    path = tmp_path / "crawl.warc.gz"
    path.write_bytes(b"".join(members))

    good, errors = pages_and_errors(path)
    assert not [p for p in good + errors if "inner" in p.id]
    assert [p.id for p in good][-3:] == ["<urn:uuid:r3>", "<urn:uuid:r4>", "<urn:uuid:r5>"]
    assert len(errors) == 1


def test_a_file_written_a_member_per_record_is_not_read_inside_a_member(tmp_path: Path) -> None:
    """A one-stream .warc.gz still ends with one row where it is corrupt: it has no member after."""
    data = bytearray(gzip.compress(b"".join(_records()), mtime=0))
    middle = len(data) // 2
    data[middle : middle + 20] = bytes(b ^ 0xFF for b in data[middle : middle + 20])
    path = tmp_path / "crawl.warc.gz"
    path.write_bytes(bytes(data))
    good, errors = pages_and_errors(path)
    assert len(errors) == 1 and "cannot read the records after byte" in (errors[0].error or "")
    assert [p.id for p in good] == [f"<urn:uuid:r{i}>" for i in range(len(good))]
