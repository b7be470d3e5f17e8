"""Files joined by `cat` after empty members (a bgzip file, then another bgzip or a pgzip one), damaged
inside the second file right after the record reading went on at: that file's layout is told by its own
members, from where reading went on after the empty ones (`Reading.joined`), not by the whole file's first
member (a plain empty one) nor by the member that record starts in (which starts a record in any layout).
Taken for a file written a member per record, the second file was read on at the next file's first member,
and the intact records between were lost with no row.
"""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from service.core.pages import Page
from tests.factories.warc import HttpResponse, gzip_pieces, pages_and_errors, response

EMPTY = gzip.compress(b"", mtime=0)  # an empty member as gzip writes one, no BGZF block
BGZF_EOF = gzip_pieces(b"", 1, bgzf=True)  # the empty BGZF block bgzip ends every file with


def _record(name: str, paragraphs: int) -> bytes:
    html = f"<html><p>{name}</p>".encode() + b"<p>t</p>" * paragraphs + b"</html>"
    return response(name, HttpResponse(html), uri=f"https://e/{name}")


def _blocks(data: bytes, size: int) -> list[bytes]:
    """`data` as bgzip cuts it, a BGZF block per `size` bytes, without the empty block that ends the file."""
    return [
        gzip_pieces(data[at : at + size], size, bgzf=True)[: -len(BGZF_EOF)]
        for at in range(0, len(data), size)
    ]


def _pieces(data: bytes, size: int = 200) -> list[bytes]:
    """`data` cut every `size` bytes, as pgzip cuts a file into members."""
    return [data[at : at + size] for at in range(0, len(data), size)]


def _damaged(member: bytes, how: str) -> bytes:
    bad = bytearray(member)
    if how == "method":
        bad[2] = 7  # a compression method gzip does not define
    else:
        bad[20:50] = bytes(byte ^ 0xFF for byte in bad[20:50])  # deflate data flipped
    return bytes(bad)


def _urls(pages: list[Page]) -> list[str]:
    return [(page.url or "").rsplit("/", 1)[-1] for page in pages]


@pytest.mark.parametrize("how", ["flip", "method"])
def test_a_bgzip_file_joined_after_another_is_read_on_past_its_damaged_block(
    tmp_path: Path, how: str
) -> None:
    # An empty gzip member, bgzip file A, bgzip file B, bgzip file C. B's first record b0 spans many
    # blocks, the second of them damaged; b1 after it is intact. The record framed where reading went on
    # after A's empty block starts B's first block, so that block says nothing of B's layout, and byte 0's
    # member is a plain empty one: read as a file a member per record, reading went on at C, and b1 was lost.
    a = b"".join(_blocks(_record("a0", 50) + _record("a1", 50), 200))
    b = _blocks(_record("b0", 400) + _record("b1", 50), 200)
    b[1] = _damaged(b[1], how)
    c = b"".join(_blocks(_record("c0", 50) + _record("c1", 50), 200))
    path = tmp_path / "joined.warc.gz"
    path.write_bytes(EMPTY + a + BGZF_EOF + b"".join(b) + BGZF_EOF + c + BGZF_EOF)

    pages, errors = pages_and_errors(path)

    assert _urls(pages) == ["a0", "a1", "b1", "c0", "c1"]
    assert len(errors) == 1, [e.error for e in errors]  # b0's, with the damaged block


@pytest.mark.parametrize("how", ["flip", "method"])
def test_a_pgzip_file_joined_after_a_bgzip_one_goes_on_after_its_damaged_second_member(
    tmp_path: Path, how: str
) -> None:
    # An empty gzip member, bgzip file A, empty members, pgzip file B, a file C a member per record. B's
    # first member starts its first record, as any file's does: that says nothing of its layout. The
    # members after the damaged one do (they start inside records): reading goes on inside them.
    a = b"".join(_blocks(_record("a0", 50), 200)) + BGZF_EOF
    members = [
        gzip.compress(piece, mtime=0) for piece in _pieces(b"".join(_record(f"b{i}", 50) for i in range(5)))
    ]
    members[1] = _damaged(members[1], how)  # b0's second member
    c = gzip.compress(_record("c0", 50), mtime=0)
    path = tmp_path / "joined.warc.gz"
    path.write_bytes(EMPTY + a + EMPTY + EMPTY + b"".join(members) + c)

    pages, errors = pages_and_errors(path)

    assert _urls(pages) == ["a0", "b1", "b2", "b3", "b4", "c0"]
    assert len(errors) == 1, [e.error for e in errors]  # b0's, with the damaged member
