"""Reading past empty gzip members and LZ4 frames (`warc_tail.reading_end`) where it meets the recovery
from damage, skippable frames and many stops: what a review of that change found it got wrong, each
against the reading before the change (which stopped at the first empty member): it must never read
fewer intact records, nor make pages of a stored download's records, nor blame an intact record.
"""

from __future__ import annotations

import gzip
import random
from pathlib import Path

import pytest

from service.core import warc_frames
from tests.factories.warc import (
    HttpResponse,
    gzip_pieces,
    lz4_frame,
    numbered_responses,
    pages_and_errors,
    response,
    warc_record,
)

EMPTY = gzip.compress(b"", mtime=0)  # an empty member as gzip writes one
# An LZ4 skippable frame of no bytes (magic 0x184D2A50, its size 0).
SKIPPABLE = (0x184D2A50).to_bytes(4, "little") + bytes(4)


def _flipped(data: bytes, start: int, end: int) -> bytes:
    bad = bytearray(data)
    bad[start:end] = bytes(byte ^ 0xFF for byte in bad[start:end])
    return bytes(bad)


@pytest.mark.parametrize("piece", [1000, 2000])
def test_no_page_of_a_stored_download_after_the_damage_hid_the_record_that_holds_it(
    tmp_path: Path, piece: int
) -> None:
    """A pgzip file whose first member is damaged, and a later record that stores a .warc.gz download
    whose members are each followed by an empty member. Past the damage, reading goes on at the first
    member that starts a record, which is the download's first (the damage hid the record that holds
    it). Its empty members had been read past as the file's: each of its records became a page.
    Reading that went on past damage reads past empty members only where the rest of the file walks to
    its end as whole records, which a download's members, followed by the rest of their record, never do."""
    noise = random.Random(4)
    inner = [
        response(
            f"inner{i}",
            HttpResponse(b"<p>" + noise.randbytes(noise.choice([100, 3000])) + b"</p>"),
            uri=f"https://in/{i}",
        )
        for i in range(3)
    ]
    stored = b"".join(gzip.compress(record, mtime=0) + EMPTY for record in inner)
    payload = noise.randbytes(noise.randrange(3000)) + stored + noise.randbytes(noise.randrange(3000))
    download = warc_record(
        "download", HttpResponse(payload, content_type="application/warc").block(), uri="https://e/x.warc.gz"
    )
    pages = [
        response(f"{p}{i}", HttpResponse(f"<p>{p} page {i}</p>".encode() * 40), uri=f"https://e/{p}{i}")
        for p in "ab"
        for i in range(3)
    ]
    outer = [*pages[:3], download, *pages[3:]]
    data = b"".join(outer)
    members = b"".join(
        gzip.compress(data[at : at + piece], compresslevel=0, mtime=0) for at in range(0, len(data), piece)
    )
    assert members.count(EMPTY) == len(inner), "the download's members not stored as they are"
    path = tmp_path / "crawl.warc.gz"
    path.write_bytes(_flipped(members, 30, 60))  # the first member's deflate data
    good, errors = pages_and_errors(path)
    assert not [page.id for page in good if (page.url or "").startswith("https://in/")]
    assert errors


def test_records_after_empty_lz4_frames_and_a_skippable_one_are_read(tmp_path: Path) -> None:
    """FastWARC stops at two empty frames and never reads the skippable frame after them: reading goes
    on at the frame after it. It had gone on at the skippable frame, which FastWARC fails on ("Invalid
    WARC header"), and every record after it was lost (the first read as an error row)."""
    records = numbered_responses("r", 4)
    scratch = tmp_path / "frame.lz4"
    empty = lz4_frame(b"", scratch)
    frames = [lz4_frame(records[0], scratch), empty, empty, SKIPPABLE]
    frames += [lz4_frame(record, scratch) for record in records[1:]]
    path = tmp_path / "crawl.warc.lz4"
    path.write_bytes(b"".join(frames))
    good, errors = pages_and_errors(path)
    assert not errors
    assert [page.id for page in good] == [f"<urn:uuid:r{i}>" for i in range(4)]


def test_a_file_that_starts_with_an_empty_lz4_frame_then_a_skippable_one_is_read(tmp_path: Path) -> None:
    records = numbered_responses("r", 3)
    scratch = tmp_path / "frame.lz4"
    frames = [lz4_frame(b"", scratch), SKIPPABLE, *(lz4_frame(record, scratch) for record in records)]
    path = tmp_path / "crawl.warc.lz4"
    path.write_bytes(b"".join(frames))
    good, errors = pages_and_errors(path)
    assert not errors
    assert [page.id for page in good] == [f"<urn:uuid:r{i}>" for i in range(3)]


def _frame_headers_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, records: int) -> int:
    """The LZ4 frame headers read to read a file of `records` records, each followed by two empty frames
    (where FastWARC stops every time), all of whose records are read."""
    scratch = tmp_path / "frame.lz4"
    empty = lz4_frame(b"", scratch)
    record = numbered_responses("r", 1)[0]
    frame = lz4_frame(record, scratch)
    path = tmp_path / f"crawl{records}.warc.lz4"
    path.write_bytes((frame + empty + empty) * records)
    calls = 0
    size_of = warc_frames._lz4_frame_size

    def counted(*args: object, **kwargs: object) -> object:
        nonlocal calls
        calls += 1
        return size_of(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(warc_frames, "_lz4_frame_size", counted)
    good, errors = pages_and_errors(path)
    assert len(good) == records and not errors
    return calls


def test_reading_past_empty_lz4_frames_reads_each_frame_header_a_bounded_number_of_times(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At each stop the frames were checked from where the reading began to the file's end, though the
    first that follows empty ones is where reading goes on: quadratic (2,000 records, 16 s). Now read up
    to there: each frame's header a few times at most, whatever the file's length."""
    for records in (50, 200):
        frames = 3 * records
        assert _frame_headers_read(tmp_path, monkeypatch, records) <= 3 * frames
        monkeypatch.undo()


def test_a_per_record_file_joined_to_a_bgzip_one_is_told_by_its_own_first_member(tmp_path: Path) -> None:
    """`cat a.warc.gz b.warc.gz`, a bgzip file then one written a member per record whose first member is
    cut: reading goes on at b past a's empty last block and fails at once, and whether b is bgzip's was
    told by the file's first byte (a's block): read as bgzip's, none of b's intact records was read."""
    a, b = numbered_responses("a", 3), numbered_responses("b", 4)
    members = [gzip.compress(record, mtime=0) for record in b]
    members[0] = members[0][: len(members[0]) // 2]
    path = tmp_path / "crawl.warc.gz"
    path.write_bytes(gzip_pieces(b"".join(a), 300, bgzf=True) + b"".join(members))
    good, errors = pages_and_errors(path)
    assert [page.id for page in good] == [f"<urn:uuid:{r}>" for r in ("a0", "a1", "a2", "b1", "b2", "b3")]
    assert len(errors) == 1


def test_a_member_damaged_right_after_an_empty_one_is_blamed_not_the_record_before(tmp_path: Path) -> None:
    """A member that fails before its first byte of output, right after an empty member: the walk of the
    file's end met the failure with no mark before it, and the intact record before the empty member was
    made an error row (its page lost) in place of the damaged member's own row."""
    records = numbered_responses("r", 4)
    members = [gzip.compress(record, mtime=0) for record in records]
    members[2] = _flipped(members[2], 12, 40)  # its deflate data from their first byte
    path = tmp_path / "crawl.warc.gz"
    path.write_bytes(members[0] + members[1] + EMPTY + members[2] + members[3])
    good, errors = pages_and_errors(path)
    assert [page.id for page in good] == [f"<urn:uuid:{r}>" for r in ("r0", "r1", "r3")]
    damaged = len(members[0]) + len(members[1]) + len(EMPTY)
    assert [page.id for page in errors] == [f"crawl.warc.gz@{damaged}"]


def test_a_bgzf_block_of_a_stored_download_past_damage_is_not_taken_for_the_files(tmp_path: Path) -> None:
    """A guard for the last: a pgzip file whose first member is damaged, reading going on at a member of
    a stored bgzip download (the damage hid the record that holds it), which fails at once. Told by that
    member's BGZF mark, the file was read as bgzip's and the intact records after the download were lost;
    only where reading began after empty members does the member there tell how its file was cut."""
    noise = random.Random(3)
    inner = [
        response(f"inner{i}", HttpResponse(b"<p>" + noise.randbytes(3000) + b"</p>"), uri=f"https://in/{i}")
        for i in range(3)
    ]
    stored = gzip_pieces(b"".join(inner), 4000, bgzf=True)
    payload = noise.randbytes(2000) + stored + noise.randbytes(2000)
    download = warc_record(
        "download", HttpResponse(payload, content_type="application/warc").block(), uri="https://e/x.warc.gz"
    )
    # Records that fill the damaged member: it shows no sign of the download (`warc_fence.past_damage`).
    a = [response(f"a{i}", HttpResponse(b"<p>a page</p>" * 400), uri=f"https://e/a{i}") for i in range(3)]
    b = numbered_responses("b", 3)
    data = b"".join([*a, download])
    members = [
        gzip.compress(data[at : at + 5000], compresslevel=0, mtime=0) for at in range(0, len(data), 5000)
    ]
    members[0] = _flipped(members[0], 30, 60)
    path = tmp_path / "crawl.warc.gz"
    path.write_bytes(b"".join(members) + EMPTY + gzip_pieces(b"".join(b), 5000))
    good, _ = pages_and_errors(path)
    assert [page.id for page in good if page.id.startswith("<urn:uuid:b")] == [
        f"<urn:uuid:b{i}>" for i in range(3)
    ]
    assert not [page.id for page in good if (page.url or "").startswith("https://in/")]
