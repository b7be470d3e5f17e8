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


def decoded_start(data: bytes, header: str | None, size: int) -> bytes:
    """The first bytes of `data` with the codings of `header` undone: at most `size` of each coding's
    output, what follows it not decoded (to tell what a body is, an untyped WARC record's, without paying
    for all of it). Raises `ContentCodingError` for an unknown coding or first bytes that do not decode,
    as `decode_content` says them; the rest of the stream is not looked at."""
    for coding in reversed(parse_codings(header)):
        if not data:
            break  # an empty body is empty under any coding
        try:
            data = _START_DECODERS[coding](data, size)
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


def _deflate_wbits(data: bytes) -> int:
    """HTTP's "deflate" is the zlib format, but servers have long sent raw deflate; browsers take both:
    the zlib format where its 2-byte header checks, else raw."""
    return 15 if len(data) >= 2 and (data[0] * 256 + data[1]) % 31 == 0 and data[0] & 0x0F == 8 else -15


def _deflate(data: bytes, limit: int) -> bytes:
    decompressor = zlib.decompressobj(_deflate_wbits(data))
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


def _zstd_start(data: bytes, size: int) -> bytes:
    reader = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(data), read_across_frames=True)
    with reader:
        return reader.read(size)


# `decoded_start`'s: each coding's first `size` bytes of output.
_START_DECODERS: dict[str, Callable[[bytes, int], bytes]] = {
    "gzip": lambda data, size: zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(data, size),
    "deflate": lambda data, size: zlib.decompressobj(_deflate_wbits(data)).decompress(data, size),
    "br": lambda data, size: brotli.Decompressor().process(data, output_buffer_limit=size),
    "zstd": _zstd_start,
}


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
# magic number, nor does raw deflate. Text can start as any of them does (`x^2+1` is a zlib header and a
# fixed-Huffman block that reads without error; `(µ/ý` is zstd's magic in latin-1), so a start counts only
# with more evidence from the data after it (`_zstd_evidence`, `_deflate_evidence`).
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
# Skippable frames (magic 0x184D2A50 to 0x184D2A5F, then a 4-byte length) hold metadata a zstd decoder
# passes over; pzstd starts its output with one. The first few are stepped over to the frame after them.
_ZSTD_SKIPPABLE, _ZSTD_SKIPPABLE_MASK = 0x184D2A50, 0xFFFFFFF0
_MAX_SKIPPABLE = 16
_ZSTD_BLOCK_HEAD = 3
_ZSTD_RLE, _ZSTD_COMPRESSED = 1, 2  # block types; 0 is raw, 3 reserved
_ZSTD_CHECKSUM_FLAG = 0x04  # the Frame_Header_Descriptor's Content_Checksum_flag
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
# Output per input byte that text read as deflate never reaches: a fixed-Huffman block, all that text
# reads as for long, makes at most 258 bytes of 13 bits (a length code 285 of 8, a distance code of 5:
# 158.8 times; the runs of 1 to 3 characters after `x^` that inflate most reach 86), while the deflate
# data of a page padded with 2 MB of spaces, `&nbsp;` or `<br>` inflates 185 to 226 times (levels 1 to
# 3) or 489 (4 to 9), and looks no more random than a run. Counted from `_MIN_RATIO_OUTPUT` inflated.
_MIN_RATIO = 160
_MIN_RATIO_OUTPUT = 64 * 1024
# Output inflated from the sample at most (704 KiB). The ratio is asked after each step and holds before
# this is reached, so a valid sample is inflated whole, and a stream that ends within it (a very
# compressible page whose deflate data is short) has its checksum verified; this only makes the bound plain.
_MAX_INFLATED = _MIN_RATIO * _INFLATE_SAMPLE + 64 * 1024
# Bits per byte of deflate data at the least: the first KiB of every corpus page compressed at any level
# has 7.2 or more (its first 4 KiB 7.8), while text has at most 6.5 (random printable ASCII 6.6), and a
# run that reads as deflate 3 or less.
_MIN_DEFLATE_ENTROPY = 7.0
# A first block that is stored (level 0): its BFINAL bit, BTYPE 00 and the padding to the byte's end,
# which every encoder writes as zeros, so the byte is 0 or 1. Text has no such byte (`x^ ` + `<p\xc3\x8f`
# had passed as a stored block: its LEN and NLEN happen to be one's complements).
_STORED_BLOCK_STARTS = (0x00, 0x01)


def undeclared_coding(body: bytes) -> str | None:
    """The content coding `body` starts with ("gzip", "deflate" or "zstd"), or None: no page or JSON
    starts so. A start counts only with the data after it as evidence (`_zstd_evidence`,
    `_deflate_evidence`): text that starts so (`x^2+1`, at any length) is read as the page it is."""
    if _zstd_evidence(body):
        return "zstd"
    if body.startswith(_GZIP_START):
        head = _gzip_head_length(body)
        return "gzip" if head is not None and _deflate_evidence(body, head, wbits=31) else None
    if body.startswith(_ZLIB_STARTS):
        return "deflate" if _deflate_evidence(body, 2, wbits=15) else None
    return None


def _zstd_evidence(body: bytes) -> bool:
    """Whether `body` is zstd data: skippable frames (at most `_MAX_SKIPPABLE`, each whole) then a frame
    that `_zstd_frame_evidence` confirms, or skippable frames that end with the body (a whole stream)."""
    position = 0
    for _ in range(_MAX_SKIPPABLE):
        magic = int.from_bytes(body[position : position + 4], "little")
        if magic & _ZSTD_SKIPPABLE_MASK != _ZSTD_SKIPPABLE or len(body) < position + 8:
            break
        position += 8 + int.from_bytes(body[position + 4 : position + 8], "little")
        if position >= len(body):
            return position == len(body)
    if not body.startswith(_ZSTD_MAGIC, position):
        return False
    return _zstd_frame_evidence(memoryview(body)[position:])


def _zstd_frame_evidence(frame: memoryview) -> bool:
    """Whether the zstd frame `frame` starts with is one: the magic alone is four bytes a latin-1 page can
    start with (`(µ/ý`).

    Its header must be valid (reserved bit clear, a window the decoder takes: what `decode_content` will
    decode), and its blocks, fed to the decoder one at a time (each makes at most 128 KiB), must decode
    without error up to a compressed block, a second block, or the frame's end (checksum and content size
    verified), with nothing or another frame after it. The block header after text is almost never
    valid (its size needs a byte under 0x10: a tab or line break at the one place), and a compressed
    block's tables from text fail. A body cut off inside its first compressed block is not told.
    """
    try:
        zstandard.get_frame_parameters(frame[:32])
        position = zstandard.frame_header_size(frame[:32])
        decompressor = zstandard.ZstdDecompressor().decompressobj()
        decompressor.decompress(frame[:position])
        for block in range(2):
            head = int.from_bytes(frame[position : position + _ZSTD_BLOCK_HEAD], "little")
            kind, size = (head >> 1) & 3, head >> 3
            end = position + _ZSTD_BLOCK_HEAD + (1 if kind == _ZSTD_RLE else size)
            if end > len(frame):
                return False  # cut off: no block decoded to go by
            decompressor.decompress(frame[position:end])
            position = end
            if kind == _ZSTD_COMPRESSED or block:
                return True
            if head & 1:  # the last block, raw or RLE: the frame must end as a whole one does
                if frame[4] & _ZSTD_CHECKSUM_FLAG:
                    decompressor.decompress(frame[position : position + 4])
                    position += 4
                after = bytes(frame[position : position + 4])
                return decompressor.eof and (
                    not after
                    or after == _ZSTD_MAGIC
                    or int.from_bytes(after, "little") & _ZSTD_SKIPPABLE_MASK == _ZSTD_SKIPPABLE
                )
    except zstandard.ZstdError:
        return False
    return False


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

    Its first `_INFLATE_SAMPLE` bytes are inflated (output counted, not kept), and they must inflate
    without error. Then either its stream ends within them with the checksum zlib verifies there
    (Adler-32, or gzip's CRC-32 and length): any complete small body, `gzip.compress(b"")` included, and
    a very compressible page however large, against odds of 2**-32 for text. Or they inflate `_MIN_RATIO`
    times or more, which no text read as deflate does (a page of repeated rows or of padding, compressed,
    whose deflate data is a run). Or at least `_MIN_UNENDED_SAMPLE` bytes of it (a longer body, or one
    cut off) inflate and either look random, as compressed data does and no text does
    (`_MIN_DEFLATE_ENTROPY`), or start a stored block (level 0) as encoders write one
    (`_STORED_BLOCK_STARTS`). The first few bytes inflating is no evidence: most text fails within a few
    dozen bytes, but a few bytes of text read as fixed-Huffman literals before the input runs out, and a
    run reads so for ever.
    """
    sample = body[: start + _INFLATE_SAMPLE]
    inflater = zlib.decompressobj(wbits)
    pending, inflated = sample, 0
    try:
        while pending and not inflater.eof and inflated < _MAX_INFLATED:
            inflated += len(inflater.decompress(pending, 64 * 1024))  # output dropped: it is only counted
            pending = inflater.unconsumed_tail
            consumed = len(sample) - len(pending) - start
            if inflated >= max(_MIN_RATIO * consumed, _MIN_RATIO_OUTPUT):
                return True  # asked as soon as it may hold: a bomb is not inflated to its end
    except zlib.error:
        return False
    if inflater.eof:
        return True
    deflated = sample[start : len(sample) - len(pending)]
    if len(deflated) < _MIN_UNENDED_SAMPLE:
        return False
    return deflated[0] in _STORED_BLOCK_STARTS or _entropy(deflated) >= _MIN_DEFLATE_ENTROPY


def _entropy(data: bytes) -> float:
    """Shannon entropy of `data`'s byte values, in bits per byte (8 for random bytes)."""
    counts = np.bincount(np.frombuffer(data, dtype=np.uint8), minlength=256)
    shares = counts[counts > 0] / len(data)
    return float(-(shares * np.log2(shares)).sum())
