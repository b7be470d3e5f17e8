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
"""

from __future__ import annotations

import io
import re
import zlib
from collections.abc import Callable
from typing import Protocol

import brotli
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
