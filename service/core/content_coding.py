"""HTTP content codings (`Content-Encoding: gzip`, `deflate`, `br`, `zstd`) undone under a size cap.

Two callers have the same problem: the API's request bodies (crawlers gzip their POSTs; HTML shrinks
five- to tenfold) and WARC response payloads, which a crawler stores exactly as the server sent them.
Both must stop decoding at a byte limit, not after it: a few KiB of gzip or brotli can expand to
gigabytes, so every decoder here is driven in bounded steps and refuses as soon as its output passes
`limit`.

Codings are undone in reverse order of the header (`Content-Encoding: gzip, br` was gzipped first).
An unknown coding is `unsupported_media_type` (RFC 9110 §8.4.1 answers it with 415), a corrupt stream
`validation_error`, too much output `payload_too_large`.

A header listing more than `MAX_CODINGS` codings (`identity` not counted) is `unsupported_media_type`
too: each layer is capped at `limit`, but their number was not, and 49,770 bytes of gzip stacked 2,002
deep (stored gzip layers around a 9 MiB page) took 8.6 s to decode. Compressing twice gains nothing;
no client or server stacks more than two.

A gzip or zstd stream may be several members (frames) one after the other, each walked in Python; a
body of more than `MAX_PARTS` is refused (`validation_error`): 16 MiB of 29-byte gzip members took 2.4 s
of a thread holding the GIL, and no client compresses a request or a response that way (a streaming
compressor that starts a member per 64 KiB would need 256 for a 16 MiB body).

And a body compressed with no Content-Encoding saying so (a crawler posting the body as the origin sent
it) is told by `undeclared_coding`, for the API to refuse rather than embed binary noise; the page readers
(`service.core.pages`) ask it too, of a page file once its own gzip is undone and of a WARC body once its
Content-Encoding is, so the bulk commands refuse the same bodies with the same code.
"""

from __future__ import annotations

import io
import re
import zlib
from collections.abc import Callable
from typing import Protocol

import brotli
import numpy as np
import zstandard

from service.core.errors import ErrorCode, HtmllmError

CODINGS = ("gzip", "deflate", "br", "zstd")
MAX_CODINGS = 4  # codings listed in one Content-Encoding, identity not counted
MAX_PARTS = 4096  # gzip members or zstd frames in one body
_NOT_NUL = re.compile(rb"[^\0]")
_ALIASES = {"x-gzip": "gzip"}
_STEP = 64 * 1024


class ContentCodingError(HtmllmError):
    """A body whose content coding is unknown, corrupt or decodes past the size limit."""

    code = ErrorCode.VALIDATION


def parse_codings(header: str | None) -> list[str]:
    """The codings a `Content-Encoding` value lists, in the order applied; `identity` dropped."""
    codings: list[str] = []
    for part in (header or "").split(","):
        name = part.strip().lower()
        name = _ALIASES.get(name, name)
        if not name or name == "identity":
            continue
        if name not in CODINGS:
            raise ContentCodingError(
                f"unsupported Content-Encoding {part.strip()[:40]!r}: use one of {', '.join(CODINGS)}",
                code=ErrorCode.UNSUPPORTED_MEDIA_TYPE,
            )
        if len(codings) == MAX_CODINGS:
            raise ContentCodingError(
                f"the Content-Encoding lists more than {MAX_CODINGS} codings; compress the body once",
                code=ErrorCode.UNSUPPORTED_MEDIA_TYPE,
            )
        codings.append(name)
    return codings


def decode_content(data: bytes, header: str | None, *, limit: int, limit_name: str = "") -> bytes:
    """`data` with the codings of `header` undone; raises `ContentCodingError` on any failure.

    `limit` caps every intermediate and the final output; `limit_name` (a setting's name) goes into
    the too-large message so the reader knows what to raise.
    """
    for coding in reversed(parse_codings(header)):
        if not data:
            break  # an empty body is empty under any coding
        try:
            data = _DECODERS[coding](data, limit)
        except _TooManyParts:
            part = "members" if coding == "gzip" else "frames"
            raise ContentCodingError(
                f"the {coding} body has more than {MAX_PARTS} {part} one after the other; compress it as one"
            ) from None
        except _TooLarge:
            hint = f" ({limit_name})" if limit_name else ""
            raise ContentCodingError(
                f"the {coding} body decodes to more than {limit} bytes; the limit is {limit} bytes{hint}",
                code=ErrorCode.PAYLOAD_TOO_LARGE,
            ) from None
        except (OSError, EOFError, zlib.error, brotli.error, zstandard.ZstdError) as exc:
            raise ContentCodingError(f"the {coding} body is corrupt: {exc}") from exc
    return data


class _TooLarge(Exception):
    pass


class _TooManyParts(Exception):
    pass


def _check(size: int, limit: int) -> None:
    if size > limit:
        raise _TooLarge


class _Readable(Protocol):
    def read(self, size: int = -1, /) -> bytes: ...


def _read_bounded(stream: _Readable, limit: int) -> bytes:
    out = bytearray()
    while chunk := stream.read(_STEP):
        out += chunk
        _check(len(out), limit)
    return bytes(out)


def _gzip(data: bytes, limit: int) -> bytes:
    """Concatenated members, as `gzip -c a b` writes them (zlib checks each one's header, CRC and
    length); NUL bytes after a member are padding, as gzip(1) and `GzipFile` allow; anything else after
    one, or a member cut off, is corrupt. Each member is fed in doubling slices of a view, so what it
    leaves over (`unused_data`, a copy) is at most about its own size."""
    view = memoryview(data)
    out = bytearray()
    position = members = 0
    while position < len(data):
        members += 1
        if members > MAX_PARTS:
            raise _TooManyParts
        decompressor = zlib.decompressobj(16 + zlib.MAX_WBITS)
        size = 64
        while not decompressor.eof:
            if position >= len(data):
                raise EOFError("the stream is cut off")
            pending: bytes | memoryview = view[position : position + size]
            position += len(pending)
            size = min(2 * size, _STEP)
            while pending and not decompressor.eof:
                out += decompressor.decompress(pending, _STEP)
                _check(len(out), limit)
                pending = decompressor.unconsumed_tail
        position -= len(decompressor.unused_data)
        if position < len(data) and data[position] == 0:
            after = _NOT_NUL.search(data, position)
            position = len(data) if after is None else after.start()
    return bytes(out)


def _deflate(data: bytes, limit: int) -> bytes:
    # HTTP's "deflate" is the zlib format, but servers have long sent raw deflate; browsers take both.
    wbits = 15 if len(data) >= 2 and (data[0] * 256 + data[1]) % 31 == 0 and data[0] & 0x0F == 8 else -15
    decompressor = zlib.decompressobj(wbits)
    out = bytearray()
    pending = data
    while pending:
        out += decompressor.decompress(pending, _STEP)
        _check(len(out), limit)
        pending = decompressor.unconsumed_tail
    out += decompressor.flush()
    _check(len(out), limit)
    if not decompressor.eof:
        raise zlib.error("the stream is cut off")
    if decompressor.unused_data:  # as gzip, brotli and zstd refuse them: a body glued to something else
        raise zlib.error(f"{len(decompressor.unused_data)} bytes follow the end of the stream")
    return bytes(out)


def _brotli(data: bytes, limit: int) -> bytes:
    decompressor = brotli.Decompressor()
    out = bytearray(decompressor.process(data, output_buffer_limit=_STEP))
    while not decompressor.is_finished():
        _check(len(out), limit)
        chunk = decompressor.process(b"", output_buffer_limit=_STEP)
        if not chunk and decompressor.can_accept_more_data():
            raise brotli.error("the stream is cut off")  # it wants input there is no more of
        out += chunk
    _check(len(out), limit)
    return bytes(out)


def _zstd(data: bytes, limit: int) -> bytes:
    reader = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(data), read_across_frames=True)
    with reader:
        out = _read_bounded(reader, limit)
    # The stream reader returns a cut-off frame's output without complaint. Its size is now known to be
    # under the limit, so walking the frames again to see each one end is bounded too.
    _check_frames_end(data)
    return out


def _check_frames_end(data: bytes) -> None:
    """Raise `ZstdError` unless `data` is whole zstd frames, in time linear in its size.

    Each frame is fed in doubling slices of a view, so what it leaves over (`unused_data`, a copy) is
    at most about its own size: handing each frame the whole rest of the body made a body of many
    tiny frames quadratic (200,000 empty frames, 1.8 MB, took 13 s).
    """
    view = memoryview(data)
    decompressor = zstandard.ZstdDecompressor()
    position = frames = 0
    while position < len(data):
        frames += 1
        if frames > MAX_PARTS:
            raise _TooManyParts
        frame = decompressor.decompressobj()
        size = 64
        while not frame.eof:
            if position >= len(data):
                raise zstandard.ZstdError("the stream is cut off")
            piece = view[position : position + size]
            frame.decompress(piece)
            position += len(piece)
            size *= 2
        position -= len(frame.unused_data)


_DECODERS: dict[str, Callable[[bytes, int], bytes]] = {
    "gzip": _gzip,
    "deflate": _deflate,
    "br": _brotli,
    "zstd": _zstd,
}


# A body compressed without Content-Encoding (a crawler stores the body as the origin sent it): zstd's
# frame magic, gzip's magic and method byte, and the zlib headers of deflate's four levels. Brotli has no
# magic number, nor does raw deflate. Text can start as gzip or zlib does (`x^2+1` is a zlib header and a
# fixed-Huffman block that reads without error), so those starts count only with more evidence from the
# deflate data after them (`_deflate_evidence`).
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_GZIP_START = b"\x1f\x8b\x08"
_ZLIB_STARTS = (b"\x78\x01", b"\x78\x5e", b"\x78\x9c", b"\x78\xda")
# gzip's header flags (RFC 1952 section 2.3.1), and the three bits it reserves, which must be 0.
_FHCRC, _FEXTRA, _FNAME, _FCOMMENT, _GZIP_RESERVED = 0x02, 0x04, 0x08, 0x10, 0xE0
_GZIP_FIXED_HEAD = 10
_MAX_GZIP_HEAD = 64 * 1024  # an extra field takes at most 65,535 bytes; a file name a few hundred
# Deflate data inflated to confirm a start, and the least of it that is evidence where its stream does
# not end within it (a longer body, or one cut off): no text was seen to read as deflate for more than
# 129 bytes, but for a run (`x^` then `****`...), which reads without error for ever.
_INFLATE_SAMPLE = 4096
_MIN_UNENDED_SAMPLE = 1024
_MAX_INFLATED = 256 * 1024  # output inflated from the sample at most (a bomb's 4 KiB make 4 MiB)
# Bits per byte of deflate data at the least: the first KiB of every corpus page compressed at any level
# has 7.2 or more (its first 4 KiB 7.8), while text has at most 6.5 (random printable ASCII 6.6), and a
# run that reads as deflate 3 or less.
_MIN_DEFLATE_ENTROPY = 7.0
_STORED_BLOCK = 0b000  # a first block's BFINAL and BTYPE bits, masked to the type (level 0's blocks)


def undeclared_coding(body: bytes) -> str | None:
    """The content coding `body` starts with ("gzip", "deflate" or "zstd"), or None: no page or JSON
    starts so. A gzip or zlib start counts only with the deflate data after it as evidence
    (`_deflate_evidence`): text that starts so (`x^2+1`, at any length) is read as the page it is."""
    if body.startswith(_ZSTD_MAGIC):
        return "zstd"
    if body.startswith(_GZIP_START):
        head = _gzip_head_length(body)
        return "gzip" if head is not None and _deflate_evidence(body, head, wbits=31) else None
    if body.startswith(_ZLIB_STARTS):
        return "deflate" if _deflate_evidence(body, 2, wbits=15) else None
    return None


def _gzip_head_length(body: bytes) -> int | None:
    """The bytes the gzip member header at the start of `body` takes, or None where it is none: reserved
    flags set, or an extra field, name or comment that does not end within the body (or 64 KiB)."""
    flags = body[3] if len(body) > 3 else 0
    if flags & _GZIP_RESERVED:
        return None
    end = _GZIP_FIXED_HEAD
    if flags & _FEXTRA:
        end += 2 + int.from_bytes(body[end : end + 2], "little")
    for field in (_FNAME, _FCOMMENT):
        if flags & field:
            zero = body.find(b"\0", end, _MAX_GZIP_HEAD)
            if zero < 0:
                return None
            end = zero + 1
    if flags & _FHCRC:
        end += 2
    return end if end <= min(len(body), _MAX_GZIP_HEAD) else None


def _deflate_evidence(body: bytes, start: int, *, wbits: int) -> bool:
    """Whether the deflate data at `body[start:]` (after a gzip or zlib header) shows it is compressed
    data rather than text that happens to start as a header does.

    Either its stream ends within `_INFLATE_SAMPLE` bytes with the checksum zlib verifies there (Adler-32,
    or gzip's CRC-32 and length): any complete small body, `gzip.compress(b"")` included, against odds
    of 2**-32 for text. Or at least `_MIN_UNENDED_SAMPLE` bytes of it (a longer body, or one cut off)
    inflate without error and either look random, as compressed data does and no text does
    (`_MIN_DEFLATE_ENTROPY`), or start a stored block (level 0, whose length zlib checked against its
    one's complement). The first few bytes inflating is no evidence: most text fails within a few dozen
    bytes, but a few bytes of text read as fixed-Huffman literals before the input runs out, and a run
    reads so for ever.
    """
    sample = body[: start + _INFLATE_SAMPLE]
    inflater = zlib.decompressobj(wbits)
    pending, inflated = sample, 0
    try:
        while pending and not inflater.eof and inflated < _MAX_INFLATED:
            inflated += len(inflater.decompress(pending, 64 * 1024))  # output dropped: it is only counted
            pending = inflater.unconsumed_tail
    except zlib.error:
        return False
    if inflater.eof:
        return True
    deflated = sample[start : len(sample) - len(pending)]
    if len(deflated) < _MIN_UNENDED_SAMPLE:
        return False
    return deflated[0] & 0b110 == _STORED_BLOCK or _entropy(deflated) >= _MIN_DEFLATE_ENTROPY


def _entropy(data: bytes) -> float:
    """Shannon entropy of `data`'s byte values, in bits per byte (8 for random bytes)."""
    counts = np.bincount(np.frombuffer(data, dtype=np.uint8), minlength=256)
    shares = counts[counts > 0] / len(data)
    return float(-(shares * np.log2(shares)).sum())
