"""The page a WARC record holds, or none: which records are pages (an HTML payload, or an HTTP response
with no body that says it is anything else), their HTTP head read as browsers read it, and their codings
undone within the page cap. The cap is read as `pages.MAX_PAGE_BYTES` at call time, never imported by
value, so that a test that lowers it there lowers it here too. Apart from reading the file: a record's
bytes in, a `Page` or a `PageSourceError` out.

A body still compressed once its chunking and Content-Encoding are undone (gzip, zlib or zstd that no
Content-Encoding declares, as a crawler stores a body the origin sent mislabelled, or one compressed once
more than the header says) is an `unsupported_media_type` row (`PageCompressedError`), by the API's rule
(`content_coding.undeclared_coding`): read on, it was binary noise embedded as a page.

A response record's HTTP head is parsed here (`_http_head`), not with FastWARC's `HeaderMap.parse`: that
one knows only CRLF line ends, and a head written with bare LF (as warcio and browsers read it) was taken
whole for headers, its body lost with its Content-Type: the page was skipped, or over 32 KiB an error row.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, NamedTuple

from service.core import pages
from service.core.content_coding import (
    ContentCodingError,
    decode_content,
    decoded_start,
    parse_codings,
    undeclared_coding,
)
from service.core.media_types import extract_media_type, looks_like_markup
from service.core.pages import (
    READ_FACTOR,
    Page,
    PageCompressedError,
    PageSourceError,
    PageTooLargeError,
    declared_page,
)

if TYPE_CHECKING:
    from fastwarc.warc import WarcRecord

_HTML_MEDIA_TYPES = frozenset({"text/html", "application/xhtml+xml"})
# The most an HTTP response head may take, its blank line included: the bound FastWARC's parser kept, so
# a block with no blank line within it is no response (an error row), never a page made of a head.
MAX_HTTP_HEAD_BYTES = 32 * 1024
# Line ends as browsers (and warcio) read them: CRLF or a bare LF, mixed in one head.
_HEAD_END = re.compile(rb"\r?\n\r?\n")
_LINE_END = re.compile(rb"\r?\n")
_STATUS_LINE = re.compile(rb"[ \t]*HTTP/[0-9.]+[ \t]+([0-9]{3})(?:[ \t\r]|\Z)")
_BLANKS = " \t\r"


def target_uri(value: str | None) -> str | None:
    """A WARC-Target-URI without the angle brackets WARC 1.0 wrote around it (`<http://example.org/a>`,
    as wget writes every one; WARC 1.1 dropped them, and warcio strips them): kept, every page of a wget
    crawl had its `url` in brackets, matching no URL list or CDX index."""
    if value is not None and len(value) >= 2 and value.startswith("<") and value.endswith(">"):
        return value[1:-1].strip()
    return value


def warc_page(
    record: WarcRecord,
    block: bytes,
    page_id: str,
    url: str | None,
    meta: dict[str, Any],
    where: str,
    *,
    too_large: bool,
) -> Page | None:
    """The page a record holds, None for a record that holds no HTML page. `too_large`: `block` is only
    the start of a record over the read bound, enough to tell whether it holds a page (then refused)."""
    from fastwarc.warc import WarcRecordType

    content_type = record.headers.get("Content-Type") or ""
    coding: str | None = None
    status: int | None = None  # an HTTP response's
    if record.record_type == WarcRecordType.response:
        # The WARC Content-Type is a SHOULD: a response without one whose block starts as an HTTP
        # response is one (it had been passed over in silence); one typed otherwise is not (a DNS one).
        untyped_http = not content_type and block.startswith(b"HTTP/")
        if not (content_type.lower().startswith("application/http") or untyped_http):
            return None  # e.g. a DNS response
        http = _http_head(block, where)
        body = block[http.size :]
        content_type = http.headers.get("content-type") or ""
        coding = http.headers.get("content-encoding")
        status = meta["http_status"] = http.status
        if "chunked" in (http.headers.get("transfer-encoding") or "").lower():
            body = _dechunk(body)
    else:
        body = block
    media_type, charset = extract_media_type(content_type) if content_type else (None, None)
    if media_type is not None and media_type not in _HTML_MEDIA_TYPES:
        return None
    meta["content_type"] = content_type or None
    if media_type is None:
        # An untyped body is a page by its start (`_untyped_page`), which a Content-Encoding hides: the
        # start is undone first (`_decoded_start`), as the API undoes a request's body before it reads
        # it. Read while still coded, every gzip-coded untyped page had been passed over with no row.
        # Only the start: decoded whole, every coded body (an image, an archive) had cost its decoding,
        # and one over the page cap had been a payload_too_large row where it is no page at all. A
        # coding that cannot be started (unknown, garbage at its first bytes) is the record's error row:
        # whether it held a page cannot be told, and it had vanished.
        start = _decoded_start(body, coding, where) if _hides_start(coding) else body
        if not _untyped_page(start, status):
            return None
    if too_large:
        raise PageTooLargeError(
            f"{where} has {record.content_length} bytes, over the {READ_FACTOR * pages.MAX_PAGE_BYTES} read "
            f"for one page of at most {pages.MAX_PAGE_BYTES}"
        )
    body = _decoded(body, coding, where)
    left = undeclared_coding(body)
    if left is not None:
        response = record.record_type == WarcRecordType.response
        raise PageCompressedError(f"{where}: {_still_compressed(left, body, coding, response=response)}")
    html, encoding = declared_page(body, charset, where)
    return Page(id=page_id, html=html, url=url, meta=meta, encoding=encoding)


def _still_compressed(coding: str, body: bytes, declared: str | None, *, response: bool) -> str:
    """Why a body that is still `coding`-compressed once `declared` (its Content-Encoding) is undone is
    no page: the API's 415 message (`check_not_compressed`), said of a record rather than a request."""
    start = body[:4].hex(" ")
    if not response:  # a resource record: its block is the page itself, with no header to declare a coding
        return f"the record's content is {coding}-compressed (it starts {start}), not an HTML page"
    if declared is not None and parse_codings(declared):
        return (
            f"the HTTP body is still {coding}-compressed (it starts {start}) once its Content-Encoding "
            f"({declared[:100]!r}) is undone: it was compressed once more than that header says"
        )
    return (
        f"the HTTP body is {coding}-compressed but its Content-Encoding does not say so (it starts {start})"
    )


def _decoded(body: bytes, coding: str | None, where: str) -> bytes:
    """`body` with its Content-Encoding `coding` undone within the page cap; a coding that cannot be
    undone is `PageSourceError` with the code the API answers it with."""
    try:
        return decode_content(body, coding, limit=pages.MAX_PAGE_BYTES)
    except ContentCodingError as exc:
        raise PageSourceError(f"{where}: {exc.message}", code=exc.code) from exc


# Bytes of a coded untyped body's output decoded to tell whether it is a page (`_decoded_start`): its
# markup's start, after any white space and a UTF-16 sample (`looks_like_markup` reads 4 KiB).
_SNIFF_BYTES = 8 << 10


def _decoded_start(body: bytes, coding: str | None, where: str) -> bytes:
    """The first bytes (up to `_SNIFF_BYTES` of each coding's output) of `body` with its Content-Encoding
    `coding` undone (`content_coding.decoded_start`); what follows them is not looked at (`_decoded` reads
    it all, for a page). A coding that is unknown, or whose first bytes do not decode, is
    `PageSourceError`, as `_decoded` says it."""
    try:
        return decoded_start(body, coding, _SNIFF_BYTES)
    except ContentCodingError as exc:
        raise PageSourceError(f"{where}: {exc.message}", code=exc.code) from exc


def _hides_start(coding: str | None) -> bool:
    """Whether a Content-Encoding leaves a body's first bytes other than the page's: it lists a coding
    (`identity` is none), or one that cannot be read (unknown, too many), which undoing it will say."""
    try:
        return bool(parse_codings(coding))
    except ContentCodingError:
        return True


def _untyped_page(body: bytes, status: int | None) -> bool:
    """Whether a record with no media type holds a page: markup by its start, as the API reads an
    untyped request body (`looks_like_markup`: `<` after white space or a byte order mark, or UTF-16
    markup; the reader's own test, `<` after white space, had passed over a page that starts with a BOM
    or is UTF-16, with no row), or an HTTP response (`status`: its status line's) with no body (a
    redirect, a 204 or 304, stored without a Content-Type). Such a response is a page with nothing in
    it, as one typed text/html is: its row carries its `http_status`, by which the docs promise empty
    redirects can be filtered out, where it had been dropped unseen. A block with no status line is none:
    a resource record, or the empty record FastWARC hands back for a file cut inside a record's header
    (`warc_tail` says that one)."""
    return looks_like_markup(body) or (status is not None and not body.strip())


class _HttpHead(NamedTuple):
    status: int | None  # None for a status line that is no HTTP one, which crawl data has
    headers: dict[str, str]  # by lower-case name; a repeated header's values joined with ", "
    size: int  # bytes of the block the head takes, its blank line included: the body starts there


def _http_head(block: bytes, where: str) -> _HttpHead:
    """The HTTP response head that starts `block`, read as leniently as browsers read it: lines end in
    CRLF or a bare LF, a line folded onto the next (obs-fold) is joined with one space, a line with no
    colon is passed over, and a header's repeated lines are one comma-separated list. A block with no
    blank line is all head (a redirect stored without its last CRLF) unless it is longer than
    `MAX_HTTP_HEAD_BYTES`, which is `PageSourceError`."""
    end = _HEAD_END.search(block, 0, MAX_HTTP_HEAD_BYTES)
    if end is not None:
        head, size = block[: end.start()], end.end()
    elif len(block) <= MAX_HTTP_HEAD_BYTES:
        head, size = block, len(block)
    else:
        raise PageSourceError(
            f"{where}: the HTTP response head is malformed: no blank line ends it within its first "
            f"{MAX_HTTP_HEAD_BYTES} bytes"
        )
    status_line, *lines = _LINE_END.split(head)
    status = _STATUS_LINE.match(status_line)
    fields: list[list[str]] = []
    for line in lines:
        text = line.decode("utf-8", "replace")
        if text[:1] in (" ", "\t"):
            if fields:  # obs-fold: the previous field's value goes on
                fields[-1][1] += " " + text.strip(_BLANKS)
            continue
        name, colon, value = text.partition(":")
        name = name.strip(_BLANKS).lower()
        if colon and name:
            fields.append([name, value.strip(_BLANKS)])
    # A repeated header is one list of its lines' values, in order (RFC 9110 section 5.3), as Fetch
    # combines them before reading a Content-Type ("extract a MIME type": `text/html` then `text/html;
    # charset=iso-8859-5` is iso-8859-5) or a Content-Encoding (two lines of gzip are gzip twice). The
    # first line's value alone had read that page with the charset the decoder guessed.
    headers: dict[str, str] = {}
    for name, value in fields:
        value = value.strip(_BLANKS)
        headers[name] = f"{headers[name]}, {value}" if name in headers else value
    return _HttpHead(int(status.group(1)) if status else None, headers, size)


def _dechunk(body: bytes) -> bytes:
    """A chunked HTTP body's data. Lenient as crawl data needs: a body that only claims to be chunked
    (its first line is no chunk size) is returned as it is, one that breaks off keeps what came."""
    out = bytearray()
    position = 0
    while True:
        end = body.find(b"\n", position)
        try:
            size = int(body[position:end].split(b";", 1)[0].strip(), 16) if end >= 0 else -1
        except ValueError:
            size = -1
        if size < 0:
            return body if position == 0 else bytes(out)
        if size == 0:
            return bytes(out)
        start = end + 1
        out += body[start : start + size]
        if start + size > len(body):
            return bytes(out)
        position = start + size
        if body[position : position + 2] == b"\r\n":
            position += 2
        elif body[position : position + 1] == b"\n":
            position += 1
