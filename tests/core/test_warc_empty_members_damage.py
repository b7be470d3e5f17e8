"""Damage right where reading goes on past empty gzip members and LZ4 frames (`warc_tail.reading_end`):
what a second review of that change found it got wrong, each against the reading before the change
(which stopped at the first empty member, and skipped the damaged member after it with a row): never
fewer intact records, no row for an intact record.
"""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from service.core.pages import Page
from tests.factories.warc import gzip_pieces, lz4_frame, numbered_responses, pages_and_errors

EMPTY = gzip.compress(b"", mtime=0)  # an empty member as gzip writes one
# An LZ4 skippable frame of ten bytes, which FastWARC's reader fails on (a row of its own).
SKIPPABLE = (0x184D2A5A).to_bytes(4, "little") + (10).to_bytes(4, "little") + bytes(10)


def _damaged(member: bytes, how: str) -> bytes:
    bad = bytearray(member)
    if how == "method":
        bad[2] = 7  # a compression method gzip does not define
    elif how == "magic":
        bad[0] = 0
    elif how == "trailer":
        bad[-8:] = bytes(8)  # its CRC-32 and size zeroed
    else:  # its deflate data from their first bytes
        bad[20:50] = bytes(byte ^ 0xFF for byte in bad[20:50])
    return bytes(bad)


def _ids(pages: list[Page]) -> list[str]:
    return [page.id for page in pages]


@pytest.mark.parametrize("before", [0, 2])
@pytest.mark.parametrize("how", ["method", "magic"])
def test_a_member_damaged_in_its_header_right_after_an_empty_one_is_skipped_with_a_row(
    tmp_path: Path, how: str, before: int
) -> None:
    """Reading goes on at the member after an empty one, which is damaged where no decoder gets a byte
    out of it (its magic or method): FastWARC fails there at once, nothing framed, and its first bytes say
    no member starts there, so none after it was looked for: one row for the rest of the file, every
    intact record after it lost. The walk's mark is where a member starts, whatever its bytes say."""
    a, b = numbered_responses("a", before), numbered_responses("b", 3)
    members = [gzip.compress(record, mtime=0) for record in b]
    members[0] = _damaged(members[0], how)
    head = b"".join(gzip.compress(record, mtime=0) for record in a) + EMPTY
    path = tmp_path / "crawl.warc.gz"
    path.write_bytes(head + b"".join(members))
    good, errors = pages_and_errors(path)
    assert _ids(good) == [f"<urn:uuid:{r}>" for r in [f"a{i}" for i in range(before)] + ["b1", "b2"]]
    assert _ids(errors) == [f"crawl.warc.gz@{len(head)}"]


@pytest.mark.parametrize("how", ["method", "magic", "trailer", "flip"])
def test_a_pgzip_file_joined_after_an_empty_member_goes_on_after_its_damaged_first_member(
    tmp_path: Path, how: str
) -> None:
    """`cat a.warc.gz b.warc.gz`, a written as one gzip stream, b by pgzip (its members cut where its
    records are not) with its first member damaged. Reading goes on at b past the empty member and fails
    there with nothing framed; nothing read of a tells how b was cut, and b was taken for a file written
    a member per record: no member after the damaged one starts a record, and every record of b was
    lost (a zeroed trailer too). b's own members after the damaged one tell: reading goes on inside
    them at the first record that starts there."""
    a, b = numbered_responses("a", 2), numbered_responses("b", 3)
    members = gzip_pieces(b"".join(b), 300)
    first = len(gzip.compress(b"".join(b)[:300], mtime=0))
    head = gzip.compress(b"".join(a), mtime=0) + EMPTY
    path = tmp_path / "crawl.warc.gz"
    path.write_bytes(head + _damaged(members[:first], how) + members[first:])
    good, errors = pages_and_errors(path)
    assert _ids(good) == [f"<urn:uuid:{r}>" for r in ("a0", "a1", "b1", "b2")]
    assert _ids(errors) == [f"crawl.warc.gz@{len(head)}"]


def test_an_intact_lz4_record_before_empty_frames_is_a_page_where_reading_went_on_past_damage(
    tmp_path: Path,
) -> None:
    """Past a damaged first frame, FastWARC stops at the empty frames after r1 and r2's frame; after
    damage, reading goes on at the frame after them only where the rest of the file walks whole, and
    the walk gave the frames to FastWARC's reader, which fails on the skippable frame at the file's end
    (as FastWARC does when it gets there, with a row of its own): r2 was made an error row. The walk
    passes over skippable frames, which hold no record."""
    r = numbered_responses("r", 4)
    scratch = tmp_path / "frame.lz4"
    empty = lz4_frame(b"", scratch)
    damaged = bytearray(lz4_frame(r[0], scratch))
    damaged[0] ^= 0xFF  # its magic
    frames = [bytes(damaged), lz4_frame(r[1] + r[2], scratch), empty, empty, empty, SKIPPABLE]
    frames += [lz4_frame(r[3], scratch), SKIPPABLE]
    path = tmp_path / "crawl.warc.lz4"
    path.write_bytes(b"".join(frames))
    good, errors = pages_and_errors(path)
    assert _ids(good) == [f"<urn:uuid:r{i}>" for i in (1, 2, 3)]
    assert _ids(errors)[0] == "crawl.warc.lz4@0"
    assert len(errors) == 2  # the damaged frame's, and FastWARC's at the skippable frame after r3
