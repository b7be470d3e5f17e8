"""The fence kept where a damaged gzip member's record is a stored .warc.gz download
(`warc_fence.past_damage`): no member of the download is ever read on at, so none of its records becomes
a page row (nor an error row blaming its bytes), and the crawl's records after the damaged member are
read. Three ways around it that the fence had: a member holding a request record before the download
(the fence was sized by the request), damage in the member's first four bytes (no fence at all), and
damaged data inflated to a false end inside the download (the fence lowered to it)."""

from __future__ import annotations

import gzip
import random
from pathlib import Path

import pytest

from tests.factories.warc import HttpResponse, pages_and_errors, response, warc_record

OUTER = [f"<urn:uuid:o{i}>" for i in range(6)]


def _page(index: int) -> bytes:
    http = HttpResponse(f"<p>outer {index}</p>".encode() * 20)
    return response(f"o{index}", http, uri=f"https://example.com/o{index}")


def _download() -> tuple[bytes, list[bytes]]:
    """A response record whose payload is a .warc.gz of three pages amid random bytes (so deflate stores
    it as it is), and that file's members."""
    noise = random.Random(5)
    inner = [
        response(f"inner{i}", HttpResponse(b"<p>" + noise.randbytes(3000) + b"</p>"), uri=f"https://in/{i}")
        for i in range(3)
    ]
    members = [gzip.compress(record, mtime=0) for record in inner]
    payload = noise.randbytes(20_000) + b"".join(members) + noise.randbytes(20_000)
    http = HttpResponse(payload, content_type="application/warc")
    return response("download", http, uri="https://example.com/crawl.warc.gz"), members


def _request() -> bytes:
    block = b"GET /crawl.warc.gz HTTP/1.1\r\nHost: example.com\r\n\r\n"
    return warc_record("req", block, record_type="request", content_type="application/http; msgtype=request")


def _crawl(tmp_path: Path, damaged: bytes) -> Path:
    outer = [gzip.compress(_page(i), mtime=0) for i in range(6)]
    path = tmp_path / "crawl.warc.gz"
    path.write_bytes(b"".join([*outer[:3], damaged, *outer[3:]]))
    return path


def _no_inner_row(path: Path, kept: int = len(OUTER)) -> None:
    good, errors = pages_and_errors(path)
    assert [p.id for p in good] == OUTER[:kept]
    assert not [p for p in good + errors if "inner" in p.id or (p.url or "").startswith("https://in/")]
    assert errors


@pytest.mark.parametrize("damage", ["cut in its middle", "end zeroed"])
def test_a_request_before_the_download_in_its_member_keeps_the_fence(tmp_path: Path, damage: str) -> None:
    download, nested = _download()
    member = gzip.compress(_request() + download, mtime=0)
    assert min(member.find(inner) for inner in nested) > 0, "not stored as they are: the test proves nothing"
    damaged = member[:40_000] if damage == "cut in its middle" else member[:-30] + bytes(30)
    # A download cut in its middle tells no end: the records appended after it, within the size its
    # record declares, are lost with it (the fence's known cost), but none of the download's is read.
    _no_inner_row(_crawl(tmp_path, damaged), 3 if damage == "cut in its middle" else len(OUTER))


@pytest.mark.parametrize("byte", [0, 1, 2, 3])
def test_damage_in_the_first_four_bytes_keeps_the_fence(tmp_path: Path, byte: int) -> None:
    download, nested = _download()
    member = bytearray(gzip.compress(download, mtime=0))
    at = max(member.find(inner) for inner in nested) + len(nested[-1]) + 100
    member[at : at + 10] = bytes(b ^ 0xFF for b in member[at : at + 10])
    member[byte] ^= 0x55
    _no_inner_row(_crawl(tmp_path, bytes(member)))
    _, errors = pages_and_errors(tmp_path / "crawl.warc.gz")
    assert len(errors) == 1


def test_a_false_deflate_end_inside_the_download_keeps_the_fence(tmp_path: Path) -> None:
    """A byte set in the stored data before the download's members: what follows inflates as deflate
    data, to an end a few bytes on (found by search; the member's output there is far short of its
    record), where the fence had been lowered to."""
    download, _ = _download()
    member = bytearray(gzip.compress(download, mtime=0))
    member[3703] = 0xFF
    _no_inner_row(_crawl(tmp_path, bytes(member)))
    _, errors = pages_and_errors(tmp_path / "crawl.warc.gz")
    assert len(errors) == 1
