"""Reading on after damage in a .warc.gz never reads fewer intact records than the reader before
`warc_unaligned` did, never makes a page of a record inside a stored download, and never costs more than
a bounded look at a record however long: the ways a review found the first version of it to fall short.
"""

from __future__ import annotations

import gzip
import random
import re
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import pytest

from service.core import warc_unaligned
from tests.factories.warc import HttpResponse, gzip_pieces, pages_and_errors, response, warc_gz, warc_record

PIECE = 777  # bytes of the stream per member of the bgzip/pgzip files


def _record(index: int) -> bytes:
    http = HttpResponse(f"<p>page {index}</p>".encode() * (20 + index))
    return response(f"r{index}", http, uri=f"https://example.com/{index}")


def _pieces(stream: bytes, piece: int, *, bgzf: bool) -> list[bytes]:
    """`stream` cut into gzip members of `piece` bytes of it each: BGZF blocks (each one's own empty
    end-of-file block dropped: one file, its end block written once, by the caller) or pgzip's."""
    members = [gzip_pieces(stream[at : at + piece], piece, bgzf=bgzf) for at in range(0, len(stream), piece)]
    return [member[:-28] for member in members] if bgzf else members


def _flipped(member: bytes) -> bytes:
    """`member` with 30 bytes of its deflate data inverted: it no longer inflates."""
    bad = bytearray(member)
    bad[30:60] = bytes(byte ^ 0xFF for byte in bad[30:60])
    return bytes(bad)


def _plain_download() -> bytes:
    """A response whose payload is a plain WARC file of six pages (its records in the stream as they are)."""
    noise = random.Random(3)
    inner = b"".join(
        response(f"inner{i}", HttpResponse(b"<p>" + noise.randbytes(500).hex().encode() + b"</p>"))
        for i in range(6)
    )
    http = HttpResponse(inner, content_type="application/warc")
    return warc_record("download", http.block(), uri="https://e/x.warc")


@pytest.mark.parametrize("bgzf", [True, False], ids=["bgzip", "pgzip"])
def test_a_download_whose_header_the_damage_took_gives_no_page(tmp_path: Path, bgzf: bool) -> None:
    """The member holding a stored WARC download's header is corrupt: nothing tells that the headers
    after the damage are the download's, and read on at the first of them, its records had become
    pages. The end of the download (its last record's CR LF CR LF and its own, together) tells: reading
    goes on at the crawl's record after it."""
    stream = b"".join([_record(0), _record(1), _record(2), _plain_download(), *map(_record, range(3, 6))])
    members = _pieces(stream, PIECE, bgzf=bgzf)
    damaged = stream.find(b"WARC-Record-ID: <urn:uuid:download>") // PIECE
    assert damaged == (stream.find(b"WARC-Record-ID: <urn:uuid:inner0>") - 200) // PIECE  # all of it lost
    members[damaged] = _flipped(members[damaged])
    path = tmp_path / "crawl.warc.gz"
    path.write_bytes(b"".join(members) + (gzip_pieces(b"", 1, bgzf=True) if bgzf else b""))

    good, errors = pages_and_errors(path)
    assert not [page for page in good + errors if "inner" in page.id]
    assert [page.id for page in good] == [f"<urn:uuid:r{i}>" for i in (0, 1, 3, 4, 5)]
    assert len(errors) == 1


def test_a_zeroed_run_across_a_download_members_trailer_costs_only_the_next_record(tmp_path: Path) -> None:
    """A file written a member per record, a stored .warc.gz download in one: a run of zeros from its
    trailer into the next member's header. The download's data inflate whole, to exactly its record:
    its member ends there, though no member follows, and the records after the zeroed one are read."""
    noise = random.Random(1)
    inner = warc_gz(
        [response(f"inner{j}", HttpResponse(noise.randbytes(3000).hex().encode())) for j in range(20)]
    )
    http = HttpResponse(inner, content_type="application/gzip")
    download = warc_record("download", http.block(), uri="https://e/x.warc.gz")

    def page(index: int) -> bytes:
        body = f"<p>{index}</p>".encode() * 40 + noise.randbytes(800).hex().encode()
        return response(f"r{index}", HttpResponse(body), uri=f"https://e/{index}")

    records = [page(i) for i in range(3)] + [download] + [page(i) for i in range(3, 13)]
    members = [gzip.compress(record, mtime=0) for record in records]
    blob = bytearray(b"".join(members))
    end = sum(map(len, members[:4]))
    blob[end - 6 : end + 58] = bytes(64)  # the CRC's last 2 bytes, the size, the next member's first bytes
    path = tmp_path / "crawl.warc.gz"
    path.write_bytes(bytes(blob))

    good, errors = pages_and_errors(path)
    assert not [page for page in good + errors if "inner" in page.id]
    assert [page.id for page in good] == [f"<urn:uuid:r{i}>" for i in (0, 1, 2, *range(4, 13))]
    assert len(errors) == 1


def _tracked(stream_of: type[warc_unaligned._Output], chunks: list[bytes]) -> tuple[object, list[int]]:
    """An output stream of `chunks`, and the bytes it held each time it took one more (its memory)."""
    held: list[int] = []
    stream = stream_of(iter(()))

    def feed() -> Iterator[bytes]:
        for chunk in chunks:
            held.append(len(stream._buffer))
            yield chunk

    stream._chunks = feed()
    return stream, held


@pytest.mark.parametrize("look", ["past_crlf", "find"])
def test_a_long_record_is_looked_through_in_bounded_memory(look: str) -> None:
    """The output of the members after a damaged one, looked at far on (the end of a long record the
    damage fell in, a header past a stored download's end): the bytes before are dropped as they come.
    Held on, a record's whole output was held, and grown a chunk at a time (copied whole each time),
    reading was quadratic in the record's size."""
    chunk = 1 << 10
    chunks = [b"x" * chunk] * 2000 + [b"\r\n\r\nWARC/1.1\r\n"]
    stream, held = _tracked(warc_unaligned._Output, chunks)
    far = 2000 * chunk
    if look == "past_crlf":
        assert stream.past_crlf(far) == far + 4
    else:
        assert stream.find(b"WARC/", far - 10) == far + 4
    assert max(held) <= 2 * chunk


def test_a_corrupt_one_stream_file_is_not_inflated_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A .warc.gz compressed as one stream has no member after its corrupt data to go on at: its bytes
    say so (no member after the first inflates whole), where inflating it all again had doubled the time
    a corrupt file took."""
    records = [_record(i) for i in range(30)]
    data = bytearray(gzip.compress(b"".join(records), mtime=0))
    middle = len(data) // 2
    data[middle : middle + 20] = bytes(byte ^ 0xFF for byte in data[middle : middle + 20])
    path = tmp_path / "crawl.warc.gz"
    path.write_bytes(bytes(data))
    inflated: list[int] = []  # where the members inflated start
    decode = warc_unaligned.GZIP.decode

    def counted(handle: BinaryIO, offset: int, ends: list[int]) -> Iterator[bytes]:
        inflated.append(offset)
        return decode(handle, offset, ends)

    monkeypatch.setattr(warc_unaligned, "GZIP", warc_unaligned.GZIP._replace(decode=counted))
    assert warc_unaligned.resync(path, 0, 0, unaligned=False) is None
    assert 0 not in inflated


def test_a_row_after_reading_went_on_names_a_byte_of_the_output(tmp_path: Path) -> None:
    """After a corrupt member of a bgzip file, FastWARC's offsets are bytes of the output of the members
    it reads: a row names such a byte as one, with the member that output starts at."""
    records = [_record(i) for i in range(30)]
    records[25] = records[25].replace(b"WARC-Type: response\r\n", b"WARC-Typo: response\r\n")
    stream = b"".join(records)
    blob = bytearray(gzip_pieces(stream, PIECE, bgzf=True))
    at = blob.find(b"\x1f\x8b\x08", 2000) + 40
    blob[at : at + 20] = bytes(byte ^ 0xFF for byte in blob[at : at + 20])
    path = tmp_path / "crawl.warc.gz"
    path.write_bytes(bytes(blob))

    _, errors = pages_and_errors(path)
    untyped = [page for page in errors if page.id == "<urn:uuid:r25>"]
    assert len(untyped) == 1
    said = re.search(
        r"at byte (\d+) of the output of the gzip members from byte (\d+) ", untyped[0].error or ""
    )
    assert said is not None
    byte, member = map(int, said.groups())
    output = gzip.decompress(bytes(blob[member:]))
    assert output[byte:].startswith(b"WARC/1.1\r\nWARC-Typo: response")


def test_a_stored_download_member_inside_a_damaged_bgzf_block_is_not_read_on_at(tmp_path: Path) -> None:
    """A bgzip file whose damaged block holds a stored .warc.gz download's member as it is (deflate
    stores random bytes so), its deflate data intact but its checksum not: the first gzip member after
    the damaged block's start that inflates is the download's, and read on at, its record had become a
    page. The damaged block's header says where it ends: reading goes on at the block after."""
    noise = random.Random(7)
    inner = [response("inner0", HttpResponse(b"<p>" + noise.randbytes(400) + b"</p>"))]
    payload = noise.randbytes(9000) + warc_gz(inner) + noise.randbytes(9000)
    http = HttpResponse(payload, content_type="application/gzip")
    download = warc_record("download", http.block(), uri="https://e/x.warc.gz")
    stream = b"".join([_record(0), _record(1), download, *map(_record, range(2, 12))])
    piece = 8000
    blob = bytearray(gzip_pieces(stream, piece, bgzf=True))
    members = []  # where each BGZF block starts
    at = 0
    while at < len(blob):
        members.append(at)
        at += int.from_bytes(blob[at + 16 : at + 18], "little") + 1
    damaged = stream.find(warc_gz(inner)) // piece
    assert blob.find(warc_gz(inner)) > members[damaged]  # stored as it is, in the block to be damaged
    blob[members[damaged + 1] - 8] ^= 0xFF  # its CRC
    path = tmp_path / "crawl.warc.gz"
    path.write_bytes(bytes(blob))

    good, errors = pages_and_errors(path)
    assert not [page for page in good + errors if "inner" in page.id]
    lost = range(damaged * piece, (damaged + 1) * piece)
    starts = [stream.find(f"<urn:uuid:r{i}>".encode()) for i in range(12)]
    kept = [i for i in range(12) if stream.find(b"WARC-Record-ID", starts[i] - 300) not in lost]
    assert [page.id for page in good][-3:] == [f"<urn:uuid:r{i}>" for i in kept][-3:]


def test_a_bgzf_block_cut_out_of_a_download_costs_no_record_after_it(tmp_path: Path) -> None:
    """Bytes cut out of a bgzip file inside a stored download: a block's trailer zeroed, the next block
    gone, the header of the one after zeroed. The trailers tell of two blocks' output, three were lost:
    reading goes on where the chain puts the download's end were one more block of the size of the
    blocks before lost, as the records from there on confirm. Searched for from the download's end were
    the damaged blocks' output nothing, the records within three blocks' output after it had been lost."""
    piece = 1000
    noise = random.Random(11)
    inner = [response(f"inner{i}", HttpResponse(noise.randbytes(3000).hex().encode())) for i in range(2)]
    http = HttpResponse(warc_gz(inner), content_type="application/gzip")
    download = warc_record("download", http.block(), uri="https://e/x.warc.gz")
    stream = b"".join([_record(0), _record(1), download, *map(_record, range(2, 14))])
    blocks = _pieces(stream, piece, bgzf=True)
    first = (stream.find(b"<urn:uuid:r2>") - 300) // piece - 3  # three blocks before the download's end
    assert stream.find(b"<urn:uuid:download>") < first * piece
    damaged = bytearray(blocks[first])
    damaged[-8:] = bytes(8)
    header = bytearray(blocks[first + 2])
    header[:18] = bytes(18)
    kept = [*blocks[:first], bytes(damaged), bytes(header), *blocks[first + 3 :]]
    path = tmp_path / "crawl.warc.gz"
    path.write_bytes(b"".join(kept) + gzip_pieces(b"", 1, bgzf=True))

    good, errors = pages_and_errors(path)
    assert not [page for page in good + errors if "inner" in page.id]
    assert [page.id for page in good] == [f"<urn:uuid:r{i}>" for i in range(14)]
    assert len(errors) == 1


def test_a_download_member_damaged_inside_and_across_its_trailer_costs_only_the_next_record(
    tmp_path: Path,
) -> None:
    """A file written a member per record, a stored .warc.gz download in one: random bytes inside the
    download's deflate data (which then inflate to an end, but not to the record's size) and across its
    trailer and the next member's header. The end its data inflate to is the member's end: fenced on to
    deflateBound past it instead, the intact records within it had been lost."""
    noise = random.Random(0)
    inner = [
        response(f"inner{j}", HttpResponse(noise.randbytes(3000).hex().encode()), uri=f"https://e/inner{j}")
        for j in range(6)
    ]
    http = HttpResponse(warc_gz(inner), content_type="application/gzip")
    download = warc_record("download", http.block(), uri="https://e/x.warc.gz")
    records = [
        response(f"r{i}", HttpResponse(f"<p>page {i}</p>".encode() * 30), uri=f"https://e/{i}")
        for i in range(12)
    ]
    members = [gzip.compress(record, mtime=0) for record in [*records[:2], download, *records[2:]]]
    blob = bytearray(b"".join(members))
    start = len(members[0]) + len(members[1])
    end = start + len(members[2])
    damage = random.Random(4)
    at = damage.randrange(start + 200, end - 500)
    blob[at : at + 100] = damage.randbytes(100)
    at = end - damage.randrange(1, 200)
    blob[at : at + 100] = damage.randbytes(100)
    path = tmp_path / "crawl.warc.gz"
    path.write_bytes(bytes(blob))

    good, errors = pages_and_errors(path)
    assert not [page for page in good + errors if "inner" in page.id]
    assert [page.id for page in good] == [f"<urn:uuid:r{i}>" for i in (0, 1, *range(3, 12))]


@pytest.mark.parametrize("bgzf", [True, False], ids=["bgzip", "pgzip"])
def test_a_cut_record_of_a_truncated_download_confirms_no_header(tmp_path: Path, bgzf: bool) -> None:
    """A stored plain WARC download written with WARC-Truncated: its last record declares 10 MB and holds
    1.5 KB, and the member holding the download's header is corrupt. Walked from the first of its records,
    the records run on to that one, which the output's end cuts: taken for a record the file was cut in,
    reading had gone on at the download's first record and made pages of its records."""
    piece = 3000

    def page(index: int) -> bytes:
        return response(
            f"r{index}", HttpResponse(f"<p>page {index}</p>".encode() * 30), uri=f"https://e/{index}"
        )

    inner = [
        response(f"inner{j}", HttpResponse(f"<p>inner {j}</p>".encode() * 30), uri=f"https://i/{j}")
        for j in range(5)
    ]
    cut = response("inner5", HttpResponse(b"<p>" + b"x" * (10 << 20)), uri="https://i/5")[:1500]
    http = HttpResponse(b"".join([*inner, cut]), content_type="application/warc")
    download = warc_record("download", http.block(), uri="https://e/x.warc")
    download = download.replace(
        b"WARC-Type: response\r\n", b"WARC-Type: response\r\nWARC-Truncated: length\r\n"
    )
    stream = b"".join([*map(page, range(6)), download, *map(page, range(6, 14))])
    members = _pieces(stream, piece, bgzf=bgzf)
    damaged = stream.find(b"<urn:uuid:download>") // piece
    assert stream.find(b"<urn:uuid:inner4>") // piece > damaged  # its header lost, records of it not
    members[damaged] = _flipped(members[damaged])
    path = tmp_path / "crawl.warc.gz"
    path.write_bytes(b"".join(members) + (gzip_pieces(b"", 1, bgzf=True) if bgzf else b""))

    good, errors = pages_and_errors(path)
    assert not [page for page in good + errors if "inner" in page.id]
    assert errors


def test_the_fence_after_a_download_ending_in_the_damaged_member_is_less_its_output(tmp_path: Path) -> None:
    """pgzip: a stored .warc.gz download whose end lies inside the damaged member, whose trailer tells its
    output. The records after the download start that much sooner in the output after it than the
    download's end were that member's output nothing: searched for from there, the records within it
    had been lost (and with them every one after, none found there to go on at)."""
    piece = 9000
    noise = random.Random(1)
    inner = [
        response(
            f"inner{i}", HttpResponse(b"<p>" + noise.randbytes(2000) + b"</p>"), uri=f"https://e/inner{i}"
        )
        for i in range(40)
    ]
    http = HttpResponse(warc_gz(inner), content_type="application/gzip")
    download = warc_record("download", http.block(), uri="https://e/x.warc.gz")
    stream = b"".join([*map(_record, range(10)), download, *map(_record, range(10, 30))])
    members = _pieces(stream, piece, bgzf=False)
    end = stream.find(b"<urn:uuid:r10>")
    damaged = end // piece
    assert stream.find(b"<urn:uuid:download>") // piece < damaged < len(members) - 2
    members[damaged] = _flipped(members[damaged])
    path = tmp_path / "crawl.warc.gz"
    path.write_bytes(b"".join(members))

    good, errors = pages_and_errors(path)
    assert not [page for page in good + errors if "inner" in page.id]
    starts = [stream.rfind(b"WARC/1.1", 0, stream.find(f"<urn:uuid:r{i}>".encode())) for i in range(30)]
    after = [f"<urn:uuid:r{i}>" for i in range(10, 30) if starts[i] >= (damaged + 1) * piece]
    ids = [page.id for page in good]
    assert ids[:10] == [f"<urn:uuid:r{i}>" for i in range(10)]
    assert ids[-len(after) :] == after


@pytest.mark.parametrize(
    "binary",
    [b"\x89PNG\r\n\x1a\n" + bytes(64 << 10), random.Random(2).randbytes(8 << 10)],
    ids=["decodes_past_the_cap", "coded_past_the_read_bound"],
)
def test_a_coded_untyped_binary_body_is_passed_over_by_its_decoded_start(
    tmp_path: Path, cap_1_kib: int, binary: bytes
) -> None:
    """An untyped gzip-coded body is a page by its decoded start: only that start is decoded. Decoded
    whole, a binary body decoding past the page cap had been a payload_too_large row, and one coded past
    the read bound a too-large row, where the reader before passed them over as no page; a coded page is
    still read."""
    coded = {"Content-Encoding": "gzip"}
    binary_record = response("bin", HttpResponse(gzip.compress(binary, mtime=0), None, headers=coded))
    page_record = response("page", HttpResponse(gzip.compress(b"<p>hi</p>", mtime=0), None, headers=coded))
    path = tmp_path / "crawl.warc.gz"
    path.write_bytes(warc_gz([binary_record, page_record]))

    good, errors = pages_and_errors(path)
    assert [page.id for page in good] == ["<urn:uuid:page>"]
    assert good[0].html == b"<p>hi</p>"
    assert errors == []


def test_a_per_record_file_damaged_in_its_first_member_is_still_read_a_member_per_record(
    tmp_path: Path,
) -> None:
    """With no record framed yet, the member reading fails at is the damaged one: that it inflates to no
    record's start is its damage, not a sign that the members are cut where records are not. Taken for
    one, the whole file was read on as bgzip's (the damaged member "skipped with what it held"), and a
    stored download damaged later in it lost the intact records after it (23 of 49 in a review's file)."""
    members = [gzip.compress(_record(i)) for i in range(6)]
    first = bytearray(members[0])
    first[20] ^= 0x55  # inside its deflate data
    members[0] = bytes(first)
    path = tmp_path / "crawl.warc.gz"
    path.write_bytes(b"".join(members))
    good, errors = pages_and_errors(path)
    assert [p.id for p in good] == [f"<urn:uuid:r{i}>" for i in range(1, 6)]
    assert len(errors) == 1 and "with what it held" not in (errors[0].error or ""), errors[0].error
    assert "the record at byte 0 could not be decompressed" in (errors[0].error or "")
