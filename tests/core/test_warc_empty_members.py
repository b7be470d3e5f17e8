"""An empty gzip member (one whose payload is 0 bytes: valid, RFC 1952) anywhere in a .warc.gz, or an
empty LZ4 frame in a .warc.lz4, is read as if it were not there (`warc_tail.reading_end`): FastWARC took
it for the file's end, and every record after it was lost without a row. bgzip ends every file with one
(its 28-byte end-of-file block), so `cat a.warc.gz b.warc.gz` of two bgzip files, which WARC allows (a
WARC file is a concatenation of records), had lost all of b. Each file here is read against the same file
without its empty members: the same rows in the same order, positions shifted by the empty members' bytes.
"""

from __future__ import annotations

import gzip
import random
import re
import zlib
from collections.abc import Callable
from pathlib import Path

import pytest
import zstandard

from service.core.pages import iter_pages
from tests.factories.warc import HttpResponse, gzip_pieces, lz4_frame, pages_and_errors, response

SIZE = 300  # bytes of the stream per member of a bgzip or pgzip file: its records are cut across members
EMPTY = gzip.compress(b"", mtime=0)  # an empty member as gzip writes one
BGZF_EOF = bytes.fromhex("1f8b08040000000000ff0600424302001b0003000000000000000000")  # bgzip's last block


def _records(prefix: str, count: int = 5) -> list[bytes]:
    return [
        response(
            f"{prefix}{i}",
            HttpResponse(f"<p>{prefix} page {i}</p>".encode() * (15 + 4 * i)),
            uri=f"https://example.com/{prefix}{i}",
        )
        for i in range(count)
    ]


def _unnamed(record: bytes) -> bytes:
    """`record` without its WARC-Record-ID line: its rows are named by the byte it starts at."""
    head, sep, rest = record.partition(b"\r\n\r\n")
    lines = [line for line in head.split(b"\r\n") if not line.startswith(b"WARC-Record-ID:")]
    return b"\r\n".join(lines) + sep + rest


def per_record(records: list[bytes]) -> list[bytes]:
    return [gzip.compress(record, mtime=0) for record in records]


def one_stream(records: list[bytes]) -> list[bytes]:
    return [gzip.compress(b"".join(records), mtime=0)]


def bgzip(records: list[bytes]) -> list[bytes]:
    """A bgzip file: its BGZF blocks, then the empty block bgzip ends every file with."""
    data = gzip_pieces(b"".join(records), SIZE, bgzf=True)
    assert data.endswith(BGZF_EOF)
    return [data[: -len(BGZF_EOF)], BGZF_EOF]


def pgzip(records: list[bytes]) -> list[bytes]:
    return [gzip_pieces(b"".join(records), SIZE)]


Layout = Callable[[list[bytes], list[bytes]], list[bytes]]
# Files of two crawls' records, `a` and `b`, as lists of parts: the parts that are empty members
# (`EMPTY`, `BGZF_EOF`) are left out of the same file without them.
LAYOUTS: dict[str, Layout] = {
    "empty member first, per-record": lambda a, b: [EMPTY, *per_record(a + b)],
    "two empty members first, per-record": lambda a, b: [EMPTY, EMPTY, *per_record(a + b)],
    "empty member after the first record": lambda a, b: [*per_record(a[:1]), EMPTY, *per_record(a[1:] + b)],
    "empty member between two per-record files": lambda a, b: [*per_record(a), EMPTY, *per_record(b)],
    "empty members between all records": lambda a, b: [m for r in per_record(a + b) for m in (r, EMPTY)],
    "several empty members ending the file": lambda a, b: [*per_record(a + b), EMPTY, EMPTY, BGZF_EOF],
    "empty member first, one stream": lambda a, b: [EMPTY, *one_stream(a + b)],
    "two one-stream files": lambda a, b: [*one_stream(a), *one_stream(b)],
    "two one-stream files, an empty member between": lambda a, b: [*one_stream(a), EMPTY, *one_stream(b)],
    "two bgzip files": lambda a, b: [*bgzip(a), *bgzip(b)],
    "three bgzip files": lambda a, b: [*bgzip(a), *bgzip(b[:2]), *bgzip(b[2:])],
    "pgzip, an empty member, pgzip": lambda a, b: [*pgzip(a), EMPTY, *pgzip(b)],
    "per-record then bgzip": lambda a, b: [*per_record(a), *bgzip(b)],
    "bgzip then per-record": lambda a, b: [*bgzip(a), *per_record(b)],
    "bgzip then one stream": lambda a, b: [*bgzip(a), *one_stream(b)],
    "one stream then per-record": lambda a, b: [*one_stream(a), *per_record(b)],
}
_EMPTIES = (EMPTY, BGZF_EOF)


def _rows(path: Path) -> list[tuple[object, ...]]:
    return [(p.id, p.url, p.html, p.error, p.error_code, p.meta) for p in iter_pages(path, bad_rows="report")]


def _write(directory: Path, parts: list[bytes], *, keep_empty: bool, name: str = "crawl.warc.gz") -> Path:
    directory.mkdir()
    path = directory / name
    path.write_bytes(b"".join(part for part in parts if keep_empty or part not in _EMPTIES))
    return path


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_file_with_empty_members_reads_as_the_same_file_without_them(tmp_path: Path, layout: str) -> None:
    a, b = _records("a"), _records("b")
    parts = LAYOUTS[layout](a, b)
    with_empty = _rows(_write(tmp_path / "with", parts, keep_empty=True))
    assert with_empty == _rows(_write(tmp_path / "without", parts, keep_empty=False))
    assert [row[0] for row in with_empty] == [
        f"<urn:uuid:{r}>" for r in [*(f"a{i}" for i in range(5)), *(f"b{i}" for i in range(5))]
    ]
    assert all(row[3] is None for row in with_empty)  # no error row


# Inside a file compressed as one stream FastWARC's offsets are positions of its read buffer, which the
# bytes before them move (`warc_reading.Reading.unnamed_id`): its records are named apart from those.
_AT_BYTES = [layout for layout in LAYOUTS if "one stream" not in layout and "one-stream" not in layout]


@pytest.mark.parametrize("layout", _AT_BYTES)
def test_records_after_empty_members_are_named_by_their_bytes(tmp_path: Path, layout: str) -> None:
    """Records without a WARC-Record-ID are named `<file>@<byte>`: after an empty member, by the byte
    they are at, which is the byte they are at without it moved on by the empty members' bytes before it."""
    a = [_unnamed(record) for record in _records("a")]
    b = [_unnamed(record) for record in _records("b")]
    parts = LAYOUTS[layout](a, b)
    with_empty = _rows(_write(tmp_path / "with", parts, keep_empty=True))
    without = _rows(_write(tmp_path / "without", parts, keep_empty=False))
    empties: list[tuple[int, int]] = []  # (byte in the file without them, bytes) of each empty member
    position = 0
    for part in parts:
        if part in _EMPTIES:
            empties.append((position, len(part)))
        else:
            position += len(part)

    def moved(page_id: object) -> object:
        found = re.fullmatch(r"crawl\.warc\.gz@(\d+)", str(page_id))
        if found is None:
            return page_id
        at = int(found.group(1))
        return f"crawl.warc.gz@{at + sum(size for where, size in empties if where <= at)}"

    assert len(with_empty) == 10
    assert [row[0] for row in with_empty] == [moved(row[0]) for row in without]
    assert [row[1:] for row in with_empty] == [row[1:] for row in without]


def test_a_file_of_empty_members_only_has_no_row(tmp_path: Path) -> None:
    path = tmp_path / "crawl.warc.gz"
    path.write_bytes(EMPTY * 3 + BGZF_EOF)
    assert list(iter_pages(path, bad_rows="report")) == []


# Guards, not fixes (read so before empty frames were read past too): one empty frame after a record's,
# which FastWARC passes over, and empty frames that end the file.
_LZ4_GUARDS = ("one after the first record (a guard)", "last (a guard)", "only (a guard)")


@pytest.mark.parametrize("where", ["first", "three after the first record", *_LZ4_GUARDS])
@pytest.mark.parametrize("compression", ["lz4", "zstd"])
def test_empty_lz4_and_zstd_frames_are_read_past(tmp_path: Path, compression: str, where: str) -> None:
    """FastWARC took an empty LZ4 frame that starts the file or follows another for the file's end (its
    zstd reader passes empty frames over: checked all the same, as guards)."""
    a = _records("a", 3)
    scratch = tmp_path / "frame.lz4"

    def frame(records: list[bytes]) -> bytes:
        if compression == "lz4":
            return lz4_frame(b"".join(records), scratch)
        return zstandard.ZstdCompressor(write_checksum=True).compress(b"".join(records))

    empty = frame([])
    frames = {
        "first": [empty, frame(a[:1]), frame(a[1:2]), frame(a[2:])],
        "three after the first record": [frame(a[:1]), empty, empty, empty, frame(a[1:2]), frame(a[2:])],
        "one after the first record (a guard)": [frame(a[:1]), empty, frame(a[1:])],
        "last (a guard)": [frame(a[:1]), frame(a[1:]), empty],
        "only (a guard)": [empty, empty],
    }[where]
    suffix = ".warc.lz4" if compression == "lz4" else ".warc.zst"
    good, errors = pages_and_errors(_write(tmp_path / "with", frames, keep_empty=True, name="crawl" + suffix))
    assert not errors
    expected = [] if where.startswith("only") else [f"<urn:uuid:a{i}>" for i in range(3)]
    assert [p.id for p in good] == expected


def _damaged(member: bytes) -> bytes:
    bad = bytearray(member)
    bad[30:60] = bytes(byte ^ 0xFF for byte in bad[30:60])
    return bytes(bad)


def test_a_corrupt_member_before_an_empty_one_is_one_row_and_the_rest_is_read(tmp_path: Path) -> None:
    a, b = _records("a"), _records("b")
    members = per_record(a)
    members[2] = _damaged(members[2])
    path = _write(tmp_path / "crawl", [*members, EMPTY, *per_record(b)], keep_empty=True)
    good, errors = pages_and_errors(path)
    assert [p.id for p in good] == [
        f"<urn:uuid:{r}>" for r in ("a0", "a1", "a3", "a4", *(f"b{i}" for i in range(5)))
    ]
    assert len(errors) == 1


@pytest.mark.parametrize("damaged", ["a's second block", "a's last data block", "b's second block"])
def test_a_corrupt_block_in_two_bgzip_files_joined_costs_only_its_records(
    tmp_path: Path, damaged: str
) -> None:
    """Damage in the first file is read past inside the members after it (`warc_unaligned.resync`), on
    through its empty last block into the second file; damage in the second, after the reading went on
    past that block, the same way from there. Guards, not fixes: all three were read so before empty
    members were read past (`resync` inflates on through them)."""
    a, b = _records("a", 8), _records("b", 8)
    blocks_a = _blocks(bgzip(a)[0])
    blocks_b = _blocks(bgzip(b)[0])
    if damaged == "b's second block":
        blocks_b[1] = _damaged(blocks_b[1])
    else:
        index = 1 if damaged == "a's second block" else len(blocks_a) - 1
        blocks_a[index] = _damaged(blocks_a[index])
    path = _write(tmp_path / "crawl", [*blocks_a, BGZF_EOF, *blocks_b, BGZF_EOF], keep_empty=True)
    good, errors = pages_and_errors(path)
    ids = [p.id for p in good]
    assert len(errors) == 1
    assert len(ids) == len(set(ids))  # none read twice
    intact = "b" if damaged.startswith("a") else "a"
    assert [f"<urn:uuid:{intact}{i}>" for i in range(8)] == [
        i for i in ids if i.startswith(f"<urn:uuid:{intact}")
    ]
    damaged_file = [i for i in ids if not i.startswith(f"<urn:uuid:{intact}")]
    assert 4 <= len(damaged_file) < 8  # a block of 300 bytes holds parts of one or two of its records
    # The first file's records, then the second's, in order.
    assert ids == sorted(ids, key=lambda page_id: (page_id[10], int(page_id[11:-1])))


def _blocks(data: bytes) -> list[bytes]:
    """The BGZF blocks `data` is made of, by each one's BSIZE."""
    blocks = []
    while data:
        size = int.from_bytes(data[16:18], "little") + 1
        blocks.append(data[:size])
        data = data[size:]
    return blocks


def _download() -> tuple[bytes, list[bytes]]:
    """A response record whose payload is a bgzip .warc.gz of three pages amid random bytes (so deflate
    stores it as it is: its empty end-of-file block too), and that file's data blocks."""
    noise = random.Random(5)
    inner = [
        response(f"inner{i}", HttpResponse(b"<p>" + noise.randbytes(3000) + b"</p>"), uri=f"https://in/{i}")
        for i in range(3)
    ]
    stored = gzip_pieces(b"".join(inner), 4000, bgzf=True)
    payload = noise.randbytes(20_000) + stored + noise.randbytes(20_000)
    http = HttpResponse(payload, content_type="application/warc")
    return response("download", http, uri="https://example.com/crawl.warc.gz"), _blocks(stored)


@pytest.mark.parametrize("damage", [False, True], ids=["intact", "damaged (a guard)"])
def test_a_stored_bgzip_download_and_an_empty_member_after_it(tmp_path: Path, damage: bool) -> None:
    """A stored bgzip .warc.gz download holds empty blocks of its own, as bytes of its record: none is
    taken for one of the file's members, and an empty member of the file after it is read past; where the
    download's member is damaged, none of its records becomes a row (`warc_fence.past_damage`): that case
    is a guard, not a fix (so before empty members were read past, too)."""
    a, b = _records("a", 3), _records("b", 3)
    download, stored = _download()
    member = gzip.compress(download, compresslevel=0, mtime=0)  # deflate's stored blocks, as for noise
    assert member.find(BGZF_EOF) > 0 and all(block in member for block in stored), "not stored as it is"
    if damage:
        member = member[:-30] + bytes(30)
    path = _write(tmp_path / "crawl", [*per_record(a), member, EMPTY, *per_record(b)], keep_empty=True)
    good, errors = pages_and_errors(path)
    outer = [f"<urn:uuid:{r}>" for r in ("a0", "a1", "a2", "b0", "b1", "b2")]
    assert [p.id for p in good] == outer  # the download is no page (application/warc)
    assert not [p for p in good + errors if "inner" in p.id or (p.url or "").startswith("https://in/")]
    assert len(errors) == int(damage)


def test_zlib_deflate_of_nothing_in_a_member_is_an_empty_member(tmp_path: Path) -> None:
    """An empty member whose deflate data is a stored block of no bytes (as some writers flush one), not
    the fixed-Huffman end that gzip writes: the same."""
    deflate = zlib.compressobj(0, zlib.DEFLATED, -15)
    stored = b"\x1f\x8b\x08\x00" + bytes(4) + b"\x00\xff" + deflate.compress(b"") + deflate.flush() + bytes(8)
    assert zlib.decompress(stored, 31) == b""
    a = _records("a", 3)
    path = _write(tmp_path / "crawl", [*per_record(a[:1]), stored, *per_record(a[1:])], keep_empty=True)
    good, errors = pages_and_errors(path)
    assert not errors and [p.id for p in good] == [f"<urn:uuid:a{i}>" for i in range(3)]


def test_a_bgzf_file_whose_bc_subfield_is_not_the_first_is_bgzip(tmp_path: Path) -> None:
    """`warc_unaligned.is_bgzf` tells a file's first block by the same walk of its extra field's subfields
    as every other block (`is_bgzf_block`), not by bytes 12 to 14 alone."""
    from service.core.warc_unaligned import is_bgzf, is_bgzf_block

    deflate = zlib.compressobj(6, zlib.DEFLATED, -15)
    data = b"WARC/1.1\r\n"
    raw = deflate.compress(data) + deflate.flush()
    extra = b"XY\x02\x00\x00\x00" + b"BC\x02\x00" + (12 + 12 + len(raw) + 8 - 1).to_bytes(2, "little")
    block = b"\x1f\x8b\x08\x04" + bytes(4) + b"\x00\xff" + len(extra).to_bytes(2, "little") + extra + raw
    block += zlib.crc32(data).to_bytes(4, "little") + len(data).to_bytes(4, "little")
    assert zlib.decompress(block, 31) == data
    path = tmp_path / "crawl.warc.gz"
    path.write_bytes(block + BGZF_EOF)
    with path.open("rb") as handle:
        assert is_bgzf_block(handle, 0) and is_bgzf_block(handle, len(block))
    assert is_bgzf(path)
    path.write_bytes(gzip.compress(data, mtime=0))  # a member without the BC subfield: no BGZF block
    assert not is_bgzf(path)
