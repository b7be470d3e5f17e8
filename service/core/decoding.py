"""Raw page bytes to text: the one decoder the pruner, the extractors and the training stack share.

The order follows what a browser does (the WHATWG "encoding sniffing" steps), with a statistical
detector where a browser would guess from the user's locale:

1. a byte-order mark (UTF-8, UTF-16 LE/BE, UTF-32 LE/BE) wins over everything;
2. the `encoding` argument, as an HTTP `Content-Type` charset would declare it;
3. a `<meta charset>` / `<meta http-equiv="Content-Type" content="...; charset=...">` or an XML
   declaration in the first `PRESCAN_BYTES` bytes (browsers stop at 1024; real pages put long scripts
   before the meta tag, so we look further);
4. bytes that are valid UTF-8 are UTF-8 (cheap, exact, and what most of the web is), also when the
   last character is cut off;
5. otherwise `charset_detection.detect_encoding`: charset-normalizer's guess among the web's
   encodings, with the Latin-script readings re-ranked and, on pages with only a few non-ASCII bytes
   (an English page with a Russian or Chinese name in it), the plausible readings compared;
6. nothing to go on: windows-1252, the web's legacy default.

Encoding labels are mapped the way browsers map them (`iso-8859-1` and `ascii` mean windows-1252,
`shift_jis` means windows-31j, ...), and a declaration naming no text codec (`base64`, `rot13`, an
unknown label) is ignored. Undecodable bytes become U+FFFD; decoding never raises.
"""

from __future__ import annotations

import codecs
import functools
import re
from dataclasses import dataclass
from email.message import Message

from service.core.charset_detection import detect_encoding
from service.core.encoding_labels import normalize_encoding

PRESCAN_BYTES = 16384  # how far into the page a <meta> charset declaration is looked for

_BOMS: tuple[tuple[bytes, str], ...] = (
    # UTF-32 LE before UTF-16 LE: its BOM starts with the UTF-16 LE one.
    (codecs.BOM_UTF8, "utf-8"),
    (codecs.BOM_UTF32_LE, "utf-32-le"),
    (codecs.BOM_UTF32_BE, "utf-32-be"),
    (codecs.BOM_UTF16_LE, "utf-16-le"),
    (codecs.BOM_UTF16_BE, "utf-16-be"),
)

_META_CHARSET = re.compile(rb"<meta\b[^>]*?charset\s*=\s*[\"']?\s*([A-Za-z0-9_:.+-]+)", re.IGNORECASE)
_XML_DECL = re.compile(rb"^\s*<\?xml[^>]*?encoding\s*=\s*[\"']([A-Za-z0-9_:.+-]+)", re.IGNORECASE)


@dataclass(frozen=True)
class DecodedHtml:
    """Decoded page text and how the encoding was chosen."""

    text: str
    encoding: str  # Python codec name actually used ("utf-8" for str input)
    source: str  # "bom" | "declared" | "meta" | "detected" | "default" | "str"


def parse_content_type(value: str) -> tuple[str, str | None]:
    """(lower-case media type, charset label or None) of a `Content-Type` value, as HTTP sends it.

    The email parser does the RFC 2045 work (quoted parameters, case); one it cannot parse reads as
    `text/plain`, which callers that must quote the header back keep in mind.
    """
    message = Message()
    message["content-type"] = value
    charset = message.get_param("charset")
    return message.get_content_type(), charset if isinstance(charset, str) and charset else None


def sniff_meta_charset(data: bytes) -> str | None:
    """The codec a `<meta>` charset or XML declaration near the top of the page names, if any."""
    head = data[:PRESCAN_BYTES]
    for pattern in (_XML_DECL, _META_CHARSET):
        match = pattern.search(head)
        if match is None:
            continue
        name = normalize_encoding(match.group(1).decode("ascii", "replace"))
        if name is None:
            continue
        # A document that says "utf-16" in ASCII bytes cannot be UTF-16 (the spec reads it as UTF-8).
        if name.startswith(("utf-16", "utf-32")):
            return "utf-8"
        # Nor can it be in a codec that reads ASCII as something else (EBCDIC, UTF-7, HZ): no browser
        # knows those, and decoding the page with one turned it to noise ("C++" is "C\ufffd" in UTF-7).
        if not _reads_ascii(name):
            continue
        return name
    return None


_ASCII_TEXT = bytes([9, 10, 13, *range(0x20, 0x7F)]).translate(None, b"%\\~")


@functools.cache
def _reads_ascii(name: str) -> bool:
    """Whether `name` decodes printable ASCII as ASCII (bar `%`, `\\` and `~`, which a few Japanese and
    DOS code pages read as yen, overline or the Arabic percent sign)."""
    return _ASCII_TEXT.decode(name, errors="replace") == _ASCII_TEXT.decode("ascii")


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def without_lone_surrogates(text: str) -> str:
    """`text` with U+FFFD for every lone surrogate: what text decoded with `errors="surrogateescape"` (a
    crawler's undecodable bytes) or a JSON `\\udc80` escape carries, and an undecodable byte gives."""
    return text if text.isascii() else _LONE_SURROGATE.sub("\ufffd", text)


def decode_html(data: bytes | str, *, encoding: str | None = None) -> DecodedHtml:
    """Decode a page's raw bytes (BOM, declared, meta, detected, default); never raises on bad bytes.

    Text is taken as decoded already, as bytes with a BOM would be: without a leading U+FEFF (a client's
    `raw.decode("utf-8")` keeps it, and the parser then reads it as body text, moving `<title>` into
    `<body>`) and with U+FFFD for lone surrogates (which the parser had dropped)."""
    if isinstance(data, str):
        text = data[1:] if data.startswith("\ufeff") else data
        return DecodedHtml(text=without_lone_surrogates(text), encoding="utf-8", source="str")
    for bom, name in _BOMS:
        if data.startswith(bom):
            return DecodedHtml(data[len(bom) :].decode(name, errors="replace"), name, "bom")
    declared = normalize_encoding(encoding)
    if declared is not None:
        return DecodedHtml(data.decode(declared, errors="replace"), declared, "declared")
    meta = sniff_meta_charset(data)
    if meta is not None:
        return DecodedHtml(data.decode(meta, errors="replace"), meta, "meta")
    try:
        return DecodedHtml(data.decode("utf-8"), "utf-8", "detected" if data else "default")
    except UnicodeDecodeError as exc:
        # A UTF-8 page cut off inside its last character (a crawler's byte cap, WARC-Truncated) is
        # still UTF-8; the detector read such a page as GBK. The first error is then the cut, at the
        # end; the page must hold a whole non-ASCII character before it (one Latin-1 "é" at the end of
        # an ASCII page is no evidence).
        if (
            exc.reason == "unexpected end of data"
            and exc.end == len(data)
            and not data[: exc.start].isascii()
        ):
            return DecodedHtml(data.decode("utf-8", errors="replace"), "utf-8", "detected")
    detected = detect_encoding(data)
    return DecodedHtml(data.decode(detected, errors="replace"), detected, "detected")


def with_declared_encoding(data: bytes, encoding: str | None) -> bytes:
    """`data` as bytes `decode_html` reads, without being told, the way `encoding` says to read them.

    For page collections, where the declaration (an HTTP charset kept in a WARC record, a JSONL row's
    `encoding`, or "utf-8" for a row that carries text) would otherwise be lost between the reader and
    the many consumers that only take bytes. The bytes come back unchanged when the declaration changes
    nothing (no codec named, a BOM, a `<meta>` that agrees, UTF-8 declared for valid UTF-8 without a
    contrary `<meta>`); otherwise the declared reading comes back as UTF-8 behind a BOM, which wins
    over everything else in `decode_html`.
    """
    declared = normalize_encoding(encoding)
    if declared is None or any(data.startswith(bom) for bom, _ in _BOMS):
        return data
    meta = sniff_meta_charset(data)
    if meta == declared:
        return data
    if meta is None and declared == "utf-8" and _is_utf8(data):
        return data
    reading = data.decode(declared, errors="replace")
    if decode_html(data).text == reading:
        return data
    return codecs.BOM_UTF8 + reading.encode("utf-8")


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def utf8_payload(data: bytes, *, encoding: str | None = None) -> bytes | None:
    """The page's bytes as UTF-8, when `decode_html` would read them as UTF-8 without looking at them.

    That is: a UTF-8 BOM (the rest of the page is returned), a UTF-8 declaration (argument or meta),
    or pure ASCII. A UTF-8 consumer (Lexbor) can then take the bytes as they are and skip a decode and
    a re-encode; undecodable bytes become U+FFFD there exactly as in `decode_html` (both follow the
    WHATWG decoder). Everything else returns None: decode with `decode_html`.
    """
    for bom, name in _BOMS:
        if data.startswith(bom):
            return data[len(bom) :] if name == "utf-8" else None
    declared = normalize_encoding(encoding)
    if declared is None:
        declared = sniff_meta_charset(data)
    if declared is not None:
        return data if declared == "utf-8" else None
    return data if data.isascii() else None
