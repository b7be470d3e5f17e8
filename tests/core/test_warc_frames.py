"""Where a gzip member that does not decode ends (`warc_gzip.inflate_damaged`): where its deflate data
inflate to their end and one of its trailer's two checks holds, so that the damage was in the other (or
in data stored as they are, which no inflater checks), it is whole; an end whose trailer fails both is
not. Zeros and other garbage inflate as deflate data, on through the members after it, to a false end:
taken for the member's, the intact members before it were lost."""

from __future__ import annotations

import gzip
import io
import random

import pytest

from service.core.warc_gzip import inflate_damaged

LOOK = 1 << 10


def _member(data: bytes) -> bytes:
    return gzip.compress(data, mtime=0)


def _text() -> bytes:
    return b"WARC/1.1\r\n" + b"".join(b"<p>line %d</p>\n" % n for n in range(2_000))


def _flipped(data: bytes, *at: int) -> bytes:
    out = bytearray(data)
    for position in at:
        out[position] ^= 0x01
    return bytes(out)


@pytest.mark.parametrize("check", ["size", "crc"])
def test_a_member_whose_trailer_fails_one_check_ends_after_it(check: str) -> None:
    member, after = _member(_text()), _member(b"WARC/1.1\r\n")
    damaged = _flipped(member, len(member) - (2 if check == "size" else 6))
    inflated = inflate_damaged(io.BytesIO(b"xx" + damaged + after), 2, LOOK)
    assert (inflated.end, inflated.whole) == (2 + len(member), True)
    assert inflated.head == _text()[:LOOK]


def test_a_flip_in_stored_data_ends_the_member_after_its_trailer() -> None:
    """Data that deflate stores as they are (a stored .warc.gz) inflate whatever is flipped in them."""
    member = _member(random.Random(3).randbytes(100_000))
    damaged = _flipped(member, len(member) // 2)
    assert inflate_damaged(io.BytesIO(damaged), 0, LOOK)[1:] == (len(member), True)


def test_a_trailer_that_fails_both_checks_ends_no_whole_member() -> None:
    member, after = _member(_text()), _member(b"WARC/1.1\r\n")
    damaged = member[:-8] + bytes(8)
    assert inflate_damaged(io.BytesIO(damaged + after), 0, LOOK)[1:] == (len(member), False)


def test_damaged_deflate_data_give_their_output_before_the_damage_and_no_end() -> None:
    text = _text()
    member = _member(text)
    damaged = member[:400] + bytes(200) + member[600:]
    inflated = inflate_damaged(io.BytesIO(damaged), 0, 64 << 10)
    assert inflated.end is None and not inflated.whole
    assert len(inflated.head) > 1_000 and text.startswith(inflated.head[:1_000])


def test_a_cut_member_or_no_member_has_no_end() -> None:
    member = _member(_text())
    assert inflate_damaged(io.BytesIO(member[: len(member) // 2]), 0, LOOK) == (_text()[:LOOK], None, False)
    assert inflate_damaged(io.BytesIO(b"not a gzip member"), 0, LOOK) == (b"", None, False)
