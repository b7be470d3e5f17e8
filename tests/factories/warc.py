"""WARC files written byte by byte (not with the reader's library), so the reader is checked against
the format rather than against itself; LZ4 frames alone come from FastWARC's writer (no other LZ4 writer
is installed)."""

from __future__ import annotations

import gzip
import struct
import zlib
from dataclasses import dataclass, field
from pathlib import Path

from fastwarc.stream_io import Lz4Writer

from service.core.pages import Page, iter_pages


@dataclass(frozen=True)
class HttpResponse:
    body: bytes
    content_type: str | None = "text/html"
    status: str = "200 OK"
    headers: dict[str, str] = field(default_factory=dict)
    chunked: bool = False
    # The head's line ends: one for every line, or one per line with the blank line's last, as crawled
    # heads mix CRLF and bare LF.
    eol: str | tuple[str, ...] = "\r\n"

    def block(self) -> bytes:
        lines = [f"HTTP/1.1 {self.status}"]
        if self.content_type is not None:
            lines.append(f"Content-Type: {self.content_type}")
        lines += [f"{k}: {v}" for k, v in self.headers.items()]
        body = self.body
        if self.chunked:
            lines.append("Transfer-Encoding: chunked")
            body = b"".join(f"{len(c):x}\r\n".encode() + c + b"\r\n" for c in _chunks(body, 7)) + b"0\r\n\r\n"
        else:
            lines.append(f"Content-Length: {len(body)}")
        ends = (self.eol,) * (len(lines) + 1) if isinstance(self.eol, str) else self.eol
        assert len(ends) == len(lines) + 1, f"{len(ends)} line ends for a head of {len(lines) + 1} lines"
        head = "".join(line + end for line, end in zip(lines, ends, strict=False)) + ends[-1]
        return head.encode("latin-1") + body


def _chunks(data: bytes, size: int) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]


def warc_record(
    record_id: str,
    block: bytes,
    *,
    record_type: str = "response",
    uri: str | None = "https://example.com/",
    content_type: str = "application/http; msgtype=response",
    extra: dict[str, str] | None = None,
) -> bytes:
    """One WARC/1.1 record: header, block, and the CRLF CRLF that ends it."""
    lines = ["WARC/1.1", f"WARC-Type: {record_type}", f"WARC-Record-ID: <urn:uuid:{record_id}>"]
    lines.append("WARC-Date: 2026-11-30T12:00:00Z")
    if uri is not None:
        lines.append(f"WARC-Target-URI: {uri}")
    lines += [f"{k}: {v}" for k, v in (extra or {}).items()]
    lines += [f"Content-Type: {content_type}", f"Content-Length: {len(block)}"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + block + b"\r\n\r\n"


def response(record_id: str, http: HttpResponse, uri: str = "https://example.com/") -> bytes:
    return warc_record(record_id, http.block(), uri=uri)


def numbered_responses(prefix: str, count: int) -> list[bytes]:
    """`count` HTML response records `<prefix>0`, `<prefix>1`, ... (their ids and their pages' text), each
    a page of about 700 bytes at https://example.com/<id>: records that span a few deflate blocks and that
    a test tells apart by id."""
    return [
        response(
            f"{prefix}{i}",
            HttpResponse(f"<p>{prefix} page {i}</p>".encode() * 30),
            uri=f"https://example.com/{prefix}{i}",
        )
        for i in range(count)
    ]


def warc_gz(records: list[bytes]) -> bytes:
    """A .warc.gz as crawlers write it: one gzip member per record."""
    return b"".join(gzip.compress(r, mtime=0) for r in records)


def gzip_pieces(data: bytes, size: int, *, bgzf: bool = False) -> bytes:
    """`data` as one gzip member per `size` bytes of it, cut where its records are not, as pgzip writes a
    file; `bgzf`: as bgzip does (each member's header holds the BGZF extra field with the member's size,
    and an empty member ends the file)."""
    pieces = [data[at : at + size] for at in range(0, len(data), size)]
    if not bgzf:
        return b"".join(gzip.compress(piece, mtime=0) for piece in pieces)
    return b"".join(_bgzf_block(piece) for piece in [*pieces, b""])


def _bgzf_block(data: bytes) -> bytes:
    deflate = zlib.compressobj(6, zlib.DEFLATED, -15)
    raw = deflate.compress(data) + deflate.flush()
    size = 18 + len(raw) + 8  # header with its extra field, deflate data, CRC and size
    header = b"\x1f\x8b\x08\x04" + bytes(4) + b"\x00\xff" + struct.pack("<H2sHH", 6, b"BC", 2, size - 1)
    return header + raw + struct.pack("<II", zlib.crc32(data), len(data))


def lz4_frame(data: bytes, scratch: Path) -> bytes:
    """`data` as one LZ4 frame, as FastWARC writes a record (written through `scratch`, a file path)."""
    writer = Lz4Writer(str(scratch))
    writer.write(data)
    writer.close()
    return scratch.read_bytes()


def pages_and_errors(path: Path) -> tuple[list[Page], list[Page]]:
    """The pages read from `path` (bad rows reported, not raised), split into sound ones and error rows."""
    pages = list(iter_pages(path, bad_rows="report"))
    return [p for p in pages if p.error is None], [p for p in pages if p.error is not None]


def lz4_checked_frame(data: bytes) -> bytes:
    """`data` as one LZ4 frame of blocks stored as they are, with a content checksum (as the lz4 tool
    writes one; FastWARC's writer keeps none), so that a byte flipped in them decodes, and only the
    checksum at the frame's end says so."""
    descriptor = bytes([0x64, 0x70])  # version 01, independent blocks, content checksum; 4 MiB blocks
    frame = b"\x04\x22\x4d\x18" + descriptor + bytes([(_xxh32(descriptor) >> 8) & 0xFF])
    for at in range(0, len(data), 1 << 22):
        block = data[at : at + (1 << 22)]
        frame += struct.pack("<I", len(block) | 0x80000000) + block
    return frame + struct.pack("<II", 0, _xxh32(data))


_P1, _P2, _P3, _P4, _P5 = 2654435761, 2246822519, 3266489917, 668265263, 374761393
_MASK = 0xFFFFFFFF


def _rotl(value: int, bits: int) -> int:
    return ((value << bits) | (value >> (32 - bits))) & _MASK


def _xxh32(data: bytes, seed: int = 0) -> int:
    """XXH32, the checksum of the LZ4 frame format (no xxhash module is installed)."""
    size, at = len(data), 0
    if size >= 16:
        lanes = [(seed + _P1 + _P2) & _MASK, (seed + _P2) & _MASK, seed, (seed - _P1) & _MASK]
        while at + 16 <= size:
            for lane in range(4):
                word = int.from_bytes(data[at : at + 4], "little")
                lanes[lane] = _rotl((lanes[lane] + word * _P2) & _MASK, 13) * _P1 & _MASK
                at += 4
        value = (_rotl(lanes[0], 1) + _rotl(lanes[1], 7) + _rotl(lanes[2], 12) + _rotl(lanes[3], 18)) & _MASK
    else:
        value = (seed + _P5) & _MASK
    value = (value + size) & _MASK
    while at + 4 <= size:
        value = _rotl((value + int.from_bytes(data[at : at + 4], "little") * _P3) & _MASK, 17) * _P4 & _MASK
        at += 4
    while at < size:
        value = _rotl((value + data[at] * _P5) & _MASK, 11) * _P1 & _MASK
        at += 1
    value = (value ^ (value >> 15)) * _P2 & _MASK
    value = (value ^ (value >> 13)) * _P3 & _MASK
    return value ^ (value >> 16)
