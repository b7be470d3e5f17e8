"""The scan for the next zstd frame that starts a record, over garbage full of frame headers
(`warc_frames._Zstd.starts_record`): bounded work per candidate. Each candidate had a decompressor of its
own and its first block decoded whole (128 KiB of output for a fake raw block): 2 MB of such garbage took
8.5 s. A candidate's first bytes are now read where they are stored as they are (a raw block, a block's
raw literals), with one decompressor for the file; the work is counted here, not timed."""

from __future__ import annotations

import io
import random
from pathlib import Path
from typing import Any

import pytest
import zstandard

from service.core import warc_frames, warc_skip
from service.core.pages import iter_pages
from tests.factories.warc import HttpResponse, response

_REAL = zstandard.ZstdDecompressor


class _Counted:
    """A real ZstdDecompressor that counts how many are made and how many decodes they start."""

    made = 0
    decodes = 0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        type(self).made += 1
        self._real = _REAL(*args, **kwargs)

    def decompressobj(self, *args: Any, **kwargs: Any) -> Any:
        type(self).decodes += 1
        return self._real.decompressobj(*args, **kwargs)

    def stream_reader(self, *args: Any, **kwargs: Any) -> Any:
        type(self).decodes += 1
        return self._real.stream_reader(*args, **kwargs)

    def decompress(self, *args: Any, **kwargs: Any) -> Any:
        type(self).decodes += 1
        return self._real.decompress(*args, **kwargs)


def _garbage(size: int) -> bytes:
    """Frame headers every few bytes: raw blocks claiming 128 KiB, and whole valid frames (each decoding
    to 128 KiB of NULs from 22 bytes) whose literals are stored raw."""
    rng = random.Random(5)
    raw = b"\x28\xb5\x2f\xfd\x00\x38" + ((131072 - 64) << 3 | 1).to_bytes(3, "little")
    bomb = zstandard.ZstdCompressor().compress(b"\0" * 131072)
    out = bytearray()
    while len(out) < size:
        out += raw + rng.randbytes(7) if rng.random() < 0.7 else bomb
    return bytes(out)


def test_garbage_full_of_frame_headers_costs_no_decoding(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    records = [response(f"r{i}", HttpResponse(f"<p>page {i}</p>".encode() * 30)) for i in range(6)]
    frames = [zstandard.ZstdCompressor().compress(r) for r in records]
    garbage = _garbage(1 << 20)
    candidates = garbage.count(b"\x28\xb5\x2f\xfd")
    assert candidates > 40_000
    path = tmp_path / "crawl.warc.zst"
    path.write_bytes(b"".join(frames[:3]) + garbage + b"".join(frames[3:]))
    monkeypatch.setattr(zstandard, "ZstdDecompressor", _Counted)
    pages = list(iter_pages(path, bad_rows="report"))
    assert [p.id for p in pages if p.error is None] == [f"<urn:uuid:r{i}>" for i in range(6)]
    start = sum(map(len, frames[:3]))
    assert [p.id for p in pages if p.error is not None] == [f"crawl.warc.zst@{start}"]
    # One decompressor for the scan (and one for each look at the file), a decode for each frame walked
    # to its end (the record's before the garbage, the garbage's first): none for the candidates.
    assert _Counted.made <= 3
    assert _Counted.decodes <= 4


def test_a_record_frame_is_found_whatever_its_first_block_holds() -> None:
    """Raw literals (a small record), Huffman-coded ones (words), a raw block (noise zstd leaves as it
    is): each frame that starts a record is found, and one that decodes to anything else is not."""
    rng = random.Random(2)
    words = b" ".join(rng.choice([b"alpha", b"beta", b"gamma", b"the", b"of"]) for _ in range(3000))
    scan = warc_frames._Zstd(None).framing(io.BytesIO(b""))
    for body in (b"<p>x</p>", b"<p>" + words + b"</p>", rng.randbytes(3000)):
        record = response("r", HttpResponse(body))
        for level in (3, -5):
            data = b"junk" + zstandard.ZstdCompressor(level=level).compress(record)
            assert warc_skip._next_record_member(io.BytesIO(data), 1, scan) == 4
    for other in (b"WARC-Type: response\r\n" + words, b"WARC/2.0\r\n" + words, rng.randbytes(3000)):
        assert (
            warc_skip._next_record_member(io.BytesIO(zstandard.ZstdCompressor().compress(other)), 0, scan)
            is None
        )
