"""A corrupt member whose record is a crawled download of a compressed WARC file (a .warc.gz served as a
file): its payload holds members of its own, stored as they are (deflate's stored blocks, zstd's raw
blocks), each starting with a member's magic and decoding to a WARC record's start. Reading goes on after
the damaged member, never at one of those (`warc_fence.past_damage`): it had gone on inside the damaged
record, and the download's records came out as pages of the crawl."""

from __future__ import annotations

import gzip
import random
from collections.abc import Callable
from pathlib import Path

import pytest
import zstandard

from service.core.errors import ErrorCode
from tests.factories.warc import HttpResponse, pages_and_errors, response

Compress = Callable[[bytes], bytes]
# A compression, and a file suffix. zstd frames with a checksum: without one, corrupt raw blocks decode.
COMPRESSIONS: dict[str, tuple[Compress, str]] = {
    "gzip": (lambda data: gzip.compress(data, mtime=0), ".warc.gz"),
    "zstd": (lambda data: zstandard.ZstdCompressor(write_checksum=True).compress(data), ".warc.zst"),
}


def _page(record_id: str, text: str) -> bytes:
    return response(
        record_id, HttpResponse(f"<p>{text}</p>".encode() * 20), uri=f"https://example.com/{record_id}"
    )


def _download(compress: Compress) -> tuple[bytes, list[bytes]]:
    """A response record whose payload is a compressed WARC file of three pages amid random bytes (so the
    outer compression stores it as it is), and that file's members."""
    noise = random.Random(5)
    inner = [
        response(f"inner{i}", HttpResponse(b"<p>" + noise.randbytes(3000) + b"</p>"), uri=f"https://in/{i}")
        for i in range(3)
    ]
    members = [compress(record) for record in inner]
    payload = noise.randbytes(20_000) + b"".join(members) + noise.randbytes(20_000)
    http = HttpResponse(payload, content_type="application/warc")
    return response("download", http, uri="https://example.com/crawl.warc.gz"), members


@pytest.mark.parametrize("where", ["after the nested records", "before them"])
@pytest.mark.parametrize("compression", COMPRESSIONS)
def test_reading_never_goes_on_inside_the_damaged_record(
    tmp_path: Path, compression: str, where: str
) -> None:
    compress, suffix = COMPRESSIONS[compression]
    download, nested = _download(compress)
    before = [compress(_page(f"o{i}", f"outer {i}")) for i in range(3)]
    after = [compress(_page(f"o{i}", f"outer {i}")) for i in range(3, 6)]
    damaged = bytearray(compress(download))
    stored = [bytes(damaged).find(member) for member in nested]
    assert min(stored) > 0, "the nested members are not stored as they are: the test proves nothing"
    at = max(stored) + len(nested[-1]) + 100 if where == "after the nested records" else min(stored) - 100
    damaged[at : at + 10] = bytes(b ^ 0xFF for b in damaged[at : at + 10])
    path = tmp_path / f"crawl{suffix}"
    path.write_bytes(b"".join([*before, bytes(damaged), *after]))

    good, errors = pages_and_errors(path)
    assert [p.id for p in good] == [f"<urn:uuid:o{i}>" for i in range(6)]
    start = sum(map(len, before))
    resume = start + len(damaged)
    assert len(errors) == 1 and errors[0].error_code == ErrorCode.VALIDATION
    assert f"(bytes {start} to {resume - 1}; reading goes on at the record at byte {resume})" in (
        errors[0].error or ""
    )


def test_damage_before_the_download_is_known_costs_no_record_after_it(tmp_path: Path) -> None:
    """Damage in the download record's WARC header hides what its payload is: reading goes on at the next
    member that starts a record, which may be one of the download's (stored across deflate's stored
    blocks, each of those fails too). The fence by a record's size was taken from such a member's own
    header (40 KB), and the intact records after the download, within it, were lost with no row."""
    noise = random.Random(5)
    inner = [
        response(f"inner{i}", HttpResponse(b"<p>" + noise.randbytes(40_000) + b"</p>"), uri=f"https://in/{i}")
        for i in range(3)
    ]
    payload = b"".join(gzip.compress(record, mtime=0) for record in inner)
    download = response("download", HttpResponse(payload, content_type="application/warc"))
    damaged = bytearray(gzip.compress(download, mtime=0))
    damaged[35] ^= 0x55  # in the deflate data of the WARC header
    outer = [gzip.compress(_page(f"o{i}", f"outer {i}"), mtime=0) for i in range(6)]
    path = tmp_path / "crawl.warc.gz"
    path.write_bytes(b"".join([*outer[:3], bytes(damaged), *outer[3:]]))

    good, errors = pages_and_errors(path)
    assert [p.id for p in good if p.url and "example.com" in p.url] == [f"<urn:uuid:o{i}>" for i in range(6)]
    assert errors


def test_a_download_whose_trailer_is_zeroed_costs_no_record_after_it(tmp_path: Path) -> None:
    """Its data inflate to their end, where its trailer, all zeros, says nothing: the member ends there (a
    fence by the record's size, admitting only a member after a trailer of its size, had taken the
    intact records after it), and never at a member of the download's."""
    download, nested = _download(lambda data: gzip.compress(data, mtime=0))
    member = gzip.compress(download, mtime=0)
    assert min(member.find(inner) for inner in nested) > 0, "not stored as they are: the test proves nothing"
    outer = [gzip.compress(_page(f"o{i}", f"outer {i}"), mtime=0) for i in range(6)]
    path = tmp_path / "crawl.warc.gz"
    path.write_bytes(b"".join([*outer[:3], member[:-8] + bytes(8), *outer[3:]]))

    good, errors = pages_and_errors(path)
    assert [p.id for p in good] == [f"<urn:uuid:o{i}>" for i in range(6)]
    start = sum(map(len, outer[:3]))
    resume = start + len(member)
    assert len(errors) == 1
    assert f"(bytes {start} to {resume - 1}; reading goes on at the record at byte {resume})" in (
        errors[0].error or ""
    )
