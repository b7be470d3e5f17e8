"""Everyday damage to a gzip member of a .warc.gz (a trailer byte flipped, a zeroed sector across two
members, a member cut where a restarted crawler appended, a member holding two records) costs the records
of the damaged members alone: reading goes on at the next intact member (`warc_fence.past_damage`). The
fence kept for a record that holds a stored .warc.gz had taken every intact record after any damaged
member, up to the damaged record's declared size (0 of 75 after a 1.6 MB page whose size byte flipped),
and the row said those bytes were skipped."""

from __future__ import annotations

import gzip
import random
from pathlib import Path

import pytest

from tests.factories.warc import HttpResponse, pages_and_errors, response, warc_record

COUNT = 16
BIG = 2  # the record whose member is damaged: a page far bigger than its member


WORDS = ["alpha", "beta", "gamma", "delta", "<b>x</b>", "<a href='/p'>link</a>", "lorem", "ipsum"]


def _records() -> list[bytes]:
    """Small pages of words (members of some 800 bytes, more than a sector's overlap), and one page of
    300 KB that deflates to a few KB: every intact member after it lies within its declared size."""
    records = []
    for i in range(COUNT):
        words = random.Random(i)
        text = " ".join(words.choice(WORDS) for _ in range(400))
        if i == BIG:
            text = "".join(f"<p>line {n} of the long page</p>\n" for n in range(9_000))
        records.append(response(f"r{i}", HttpResponse(f"<p>{text}</p>".encode()), uri=f"https://e.org/{i}"))
    return records


def _ids(indices: list[int]) -> list[str]:
    return [f"<urn:uuid:r{i}>" for i in indices]


def _damaged(kind: str, members: list[bytes]) -> tuple[bytes, list[int], int, int]:
    """The file with `kind` of damage at member `BIG`, the records whose pages survive it, and the bytes
    the one error row should say were skipped (first, after the last)."""
    before, big, after = b"".join(members[:BIG]), members[BIG], members[BIG + 1 :]
    start = len(before)
    if kind == "size byte flipped":
        damaged = bytearray(big)
        damaged[-2] ^= 0x01  # ISIZE
        lost, resume = [BIG], start + len(big)
        data = before + bytes(damaged) + b"".join(after)
    elif kind.startswith("zeroed"):  # a bad sector, or a 4 KiB page, across the end of the member
        zeroed = 512 if kind == "zeroed sector across two members" else 4096
        rest = big + b"".join(after)
        cut = len(big) - 100
        data = before + rest[:cut] + bytes(zeroed) + rest[cut + zeroed :]
        starts = [start + len(big) + sum(map(len, after[:i])) for i in range(len(after))]
        first = next(i for i, at in enumerate(starts) if at >= start + cut + zeroed)
        assert first < len(after) - 2, "the zeros reach the last members: the test proves nothing"
        lost, resume = list(range(BIG, BIG + 1 + first)), starts[first]
    else:  # "member cut, records appended": a writer killed in the member, a restarted crawler
        half = big[: len(big) // 2]
        data = before + half + b"".join(after)
        lost, resume = [BIG], start + len(half)
    return data, [i for i in range(COUNT) if i not in lost], start, resume


@pytest.mark.parametrize(
    "kind",
    [
        "size byte flipped",
        "zeroed sector across two members",
        # Zeros inflate as deflate data, through the members after it, to a false end: the trailer there
        # fails both its checks, so it is not taken for the damaged member's end.
        "zeroed page across members",
        "member cut, records appended",
    ],
)
def test_the_intact_members_after_a_damaged_one_are_read(tmp_path: Path, kind: str) -> None:
    members = [gzip.compress(record, mtime=0) for record in _records()]
    data, kept, start, resume = _damaged(kind, members)
    path = tmp_path / "crawl.warc.gz"
    path.write_bytes(data)

    good, errors = pages_and_errors(path)
    assert [p.id for p in good] == _ids(kept)
    assert len(errors) == 1
    assert f"(bytes {start} to {resume - 1}; reading goes on at the record at byte {resume})" in (
        errors[0].error or ""
    )


def test_a_member_of_two_records_damaged_in_its_middle_costs_its_own_records(tmp_path: Path) -> None:
    """Its trailer's size is both records', never the first's: no fence by size lets the next one in."""
    records = _records()
    members = [gzip.compress(b"".join(records[i : i + 2]), mtime=0) for i in range(0, COUNT, 2)]
    damaged = bytearray(members[1])  # records 2 (the big page) and 3
    damaged[len(damaged) // 2] ^= 0x55
    members[1] = bytes(damaged)
    path = tmp_path / "pairs.warc.gz"
    path.write_bytes(b"".join(members))

    good, errors = pages_and_errors(path)
    assert [p.id for p in good] == _ids([0, 1, *range(4, COUNT)])
    start, resume = len(members[0]), len(members[0]) + len(members[1])
    assert len(errors) == 1
    assert f"(bytes {start} to {resume - 1}; reading goes on" in (errors[0].error or "")


def test_a_damaged_warcinfo_member_is_no_stored_warc_file(tmp_path: Path) -> None:
    """A warcinfo record's media type, application/warc-fields, says nothing of a stored WARC file: a
    sector zeroed across its member's end and the next one's start costs those two records alone."""
    fields = "".join(f"note{n}: a field of the crawl's description\r\n" for n in range(200)).encode()
    info = warc_record("info", fields, record_type="warcinfo", content_type="application/warc-fields")
    members = [gzip.compress(record, mtime=0) for record in [info, *_records()]]
    cut = len(members[0]) - 8
    data = b"".join(members)
    path = tmp_path / "crawl.warc.gz"
    path.write_bytes(data[:cut] + bytes(16) + data[cut + 16 :])

    good, errors = pages_and_errors(path)
    assert [p.id for p in good] == _ids(list(range(1, COUNT)))
    assert len(errors) == 1
    resume = len(members[0]) + len(members[1])
    assert f"(bytes 0 to {resume - 1}; reading goes on at the record at byte {resume})" in (
        errors[0].error or ""
    )
