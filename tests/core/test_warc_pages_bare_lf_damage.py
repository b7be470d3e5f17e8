"""Damage and padding around a record whose WARC header lines end in bare LF, read alone in quirks mode
(`warc_pages`, `warc_bare_lf.bare_lf_record_end`), reading going on at its member's end: that end is a
member's start whatever its first bytes say (a damaged magic is one member skipped, as after a record with
CRLF lines, where it had ended the file), padding or nothing after it ends the file (it had been read as a
record that is none, a false error row), and a member of its own that does not decode is one row (the
failure's), not a row blaming its line ends before it."""

from __future__ import annotations

import gzip
import struct
from collections.abc import Callable
from pathlib import Path

import pytest
import zstandard

from tests.factories.warc import HttpResponse, lz4_frame, pages_and_errors, response

COUNT = 8
Write = Callable[[bytes, Path], bytes]
# A layout compressed per record: its suffix, and how it writes one record (`tmp`: the LZ4 writer's path).
PER_RECORD: dict[str, tuple[str, Write]] = {
    "gzip": (".warc.gz", lambda record, _: gzip.compress(record, mtime=0)),
    "zstd": (".warc.zst", lambda record, _: zstandard.ZstdCompressor(write_checksum=True).compress(record)),
    "lz4": (".warc.lz4", lambda record, tmp: lz4_frame(record, tmp)),
}
LAYOUTS: dict[str, tuple[str, Write]] = {"plain": (".warc", lambda record, _: record), **PER_RECORD}


def _bare_lf(record: bytes) -> bytes:
    header, _, rest = record.partition(b"\r\n\r\n")
    return header.replace(b"\r\n", b"\n") + b"\n\n" + rest


def _records() -> list[bytes]:
    """Pages, every one with bare-LF header lines."""
    return [
        _bare_lf(response(f"r{i}", HttpResponse(f"<p>page {i}</p>".encode() * 30), uri=f"https://e.org/{i}"))
        for i in range(COUNT)
    ]


def _ids(indices: range | list[int]) -> list[str]:
    return [f"<urn:uuid:r{i}>" for i in indices]


def _members(layout: str, tmp_path: Path) -> list[bytes]:
    _, write = LAYOUTS[layout]
    return [write(record, tmp_path / "frame") for record in _records()]


@pytest.mark.parametrize("layout", PER_RECORD)
def test_a_damaged_magic_after_a_bare_lf_record_is_one_member_skipped(tmp_path: Path, layout: str) -> None:
    members = _members(layout, tmp_path)
    damaged = bytearray(members[4])
    damaged[0] ^= 0x01
    members[4] = bytes(damaged)
    path = tmp_path / f"crawl{PER_RECORD[layout][0]}"
    path.write_bytes(b"".join(members))

    good, errors = pages_and_errors(path)
    assert [p.id for p in good] == _ids([i for i in range(COUNT) if i != 4])
    start = sum(map(len, members[:4]))
    resume = start + len(members[4])
    assert len(errors) == 1
    assert f"(bytes {start} to {resume - 1}; reading goes on at the record at byte {resume})" in (
        errors[0].error or ""
    )


_SKIPPABLE = struct.pack("<II", 0x184D2A50, 8) + b"metadata"


@pytest.mark.parametrize(
    ("layout", "padding"),
    [
        ("plain", bytes(512)),
        ("gzip", bytes(512)),
        ("zstd", bytes(512)),
        ("zstd", _SKIPPABLE),
        ("lz4", b"\r\n"),
        ("lz4", _SKIPPABLE),
    ],
)
def test_padding_after_a_last_bare_lf_record_ends_the_file(
    tmp_path: Path, layout: str, padding: bytes
) -> None:
    path = tmp_path / f"crawl{LAYOUTS[layout][0]}"
    path.write_bytes(b"".join(_members(layout, tmp_path)) + padding)
    good, errors = pages_and_errors(path)
    assert errors == []
    assert [p.id for p in good] == _ids(range(COUNT))


def test_a_dictionary_file_ending_in_a_bare_lf_record_ends_there(tmp_path: Path) -> None:
    """Reading went on at the file's end, handed the dictionary frame alone: a false "incomplete frame"."""
    records = _records()
    dictionary = zstandard.train_dictionary(2048, list(records * 4))
    content = dictionary.as_bytes()
    compressor = zstandard.ZstdCompressor(dict_data=dictionary, write_checksum=True)
    path = tmp_path / "crawl.warc.zst"
    path.write_bytes(
        struct.pack("<II", 0x184D2A5D, len(content)) + content + b"".join(map(compressor.compress, records))
    )
    good, errors = pages_and_errors(path)
    assert errors == []
    assert [p.id for p in good] == _ids(range(COUNT))


@pytest.mark.parametrize("damage", ["cut", "flipped"])
def test_a_bare_lf_record_whose_member_does_not_decode_is_one_row(tmp_path: Path, damage: str) -> None:
    members = _members("gzip", tmp_path)
    start = sum(map(len, members[:3]))
    if damage == "cut":
        data = b"".join(members[:3]) + members[3][: len(members[3]) // 2]
        kept = [0, 1, 2]
    else:
        flipped = bytearray(members[3])
        flipped[len(flipped) // 2] ^= 0x55
        data = b"".join([*members[:3], bytes(flipped), *members[4:]])
        kept = [i for i in range(COUNT) if i != 3]
    path = tmp_path / "crawl.warc.gz"
    path.write_bytes(data)

    good, errors = pages_and_errors(path)
    assert [p.id for p in good] == _ids(kept)
    assert len(errors) == 1
    assert "LF alone" not in (errors[0].error or "")  # its member's damage, not its line ends
    assert errors[0].id == f"crawl.warc.gz@{start}" and f"byte {start}" in (errors[0].error or "")
