"""Raw page bytes to text: the one decoder the pruner, the extractors and the training stack share.

The order follows what a browser does (the WHATWG "encoding sniffing" steps), with a statistical
detector where a browser would guess from the user's locale:

1. a byte-order mark (UTF-8, UTF-16 LE/BE, UTF-32 LE/BE) wins over everything; then UTF-16 markup
   without one (`sniff_utf16`: a NUL in every other byte, which no ASCII-compatible page has);
2. the `encoding` argument, as an HTTP `Content-Type` charset would declare it;
3. a `<meta charset>` / `<meta http-equiv="Content-Type" content="...; charset=...">` in the first
   `PRESCAN_BYTES` bytes, found as the HTML Standard's prescan finds it (`sniff_meta_charset`:
   comments and other tags' attributes skipped; browsers stop at 1024 bytes, real pages put long
   scripts before the meta tag, so we look further);
4. bytes that are valid UTF-8 and not all ASCII are UTF-8 (cheap, exact, and what most of the web
   is), also when the last character is cut off, and when they are mostly UTF-8 (`_mostly_utf8`: a
   few stray bytes in a page of UTF-8 text);
5. an XML declaration (`<?xml ... encoding="..."?>`, `sniff_xml_encoding`): the HTML Standard reads
   it only where no `<meta>` decides, and as a hint it ranks below real UTF-8 (a UTF-8 page with a
   stale `iso-8859-1` declaration is UTF-8) but above the ASCII default and the detector (a
   declaration is better evidence than statistics, and ISO-2022-JP is all ASCII bytes);
6. bytes that are all ASCII are ISO-2022-JP where they hold its escape sequences and read as it without
   an error (`sniff_iso2022_jp`: browsers' detectors read them so, and as UTF-8 such a page was its
   escape sequences as text), else UTF-8 (every other codec that reads ASCII as ASCII gives the same
   text);
7. otherwise `charset_detection.detect_encoding`: charset-normalizer's guess among the web's
   encodings, with the Latin-script readings re-ranked and, on pages with only a few non-ASCII bytes
   (an English page with a Russian or Chinese name in it), the plausible readings compared;
8. nothing to go on: windows-1252, the web's legacy default.

Declared labels are read the way browsers read them, by the Encoding Standard's table alone
(`encoding_labels.whatwg_codec`: `iso-8859-1` and `ascii` mean windows-1252, `shift_jis` means
windows-31j, `gbk` and `gb2312` mean gb18030, ...); a label the standard does not know (`latin-1`,
`cp437`, `base64`) or names the replacement encoding with (`iso-2022-kr`, `hz-gb-2312`) is ignored.
Undecodable bytes become U+FFFD; decoding never raises.
"""

from __future__ import annotations

import codecs
import re
from dataclasses import dataclass

from service.core.charset_detection import detect_encoding
from service.core.encoding_labels import decode_bytes, strict_iso2022_jp, whatwg_codec

PRESCAN_BYTES = 16384  # how far into the page a <meta> charset declaration is looked for

_BOMS: tuple[tuple[bytes, str], ...] = (
    # UTF-32 LE before UTF-16 LE: its BOM starts with the UTF-16 LE one.
    (codecs.BOM_UTF8, "utf-8"),
    (codecs.BOM_UTF32_LE, "utf-32-le"),
    (codecs.BOM_UTF32_BE, "utf-32-be"),
    (codecs.BOM_UTF16_LE, "utf-16-le"),
    (codecs.BOM_UTF16_BE, "utf-16-be"),
)

# The HTML Standard's prescan, as patterns over the page's bytes (ASCII white space is HT LF FF CR SP).
# The markup it looks at, in its order of precedence at one `<`: a comment, a `<meta` followed by a
# space or slash, a start or end tag, and other markup (`<!DOCTYPE`, `<?php`, `</3`) skipped to its `>`.
_MARKUP = re.compile(rb"<(?:(?P<comment>!--)|(?P<meta>(?i:meta)[\t\n\f\r /])|(?P<tag>/?[A-Za-z])|[!/?])")
_TAG_NAME_END = re.compile(rb"[\t\n\f\r >]")
# "Get an attribute": white space and slashes skipped, then the tag's `>` (no attribute) or a name, an
# optional `=` and a value quoted, unquoted or empty; names and values are lower-cased by the caller.
# No match means the bytes ran out inside the attribute, which ends the prescan.
_ATTRIBUTE = re.compile(
    rb"[\t\n\f\r /]*+(?:>|(?P<name>[^\t\n\f\r />][^\t\n\f\r />=]*+)(?:"
    rb"[\t\n\f\r ]*+=[\t\n\f\r ]*+"
    rb"(?:\"(?P<dq>[^\"]*+)\"|'(?P<sq>[^']*+)'|(?P<uq>[^\t\n\f\r >\"'][^\t\n\f\r >]*+)(?=[\t\n\f\r >])|(?=>))"
    rb"|(?=[\t\n\f\r ]*+[^\t\n\f\r =])))"
)
# "Extracting a character encoding from a meta element" (a `content` value, lower-cased): the first
# `charset=`, then a quoted label or one up to white space or `;`; an unmatched quote gives nothing.
_CONTENT_CHARSET = re.compile(
    rb"charset[\t\n\f\r ]*=[\t\n\f\r ]*"
    rb"(?:\"(?P<dq>[^\"]*)\"|'(?P<sq>[^']*)'|(?P<uq>[^\t\n\f\r ;\"'][^\t\n\f\r ;]*))?"
)
# "Get an XML encoding", with leading white space allowed (see `sniff_xml_encoding`): the first
# `encoding` before the declaration's `>` (atomic: a later one does not count), `=`, a quoted label.
_XML_DECL = re.compile(
    rb"[\t\n\f\r ]*+<\?xml(?>[^>]*?encoding)[\x00- ]*=[\x00- ]*(?:\"([^\">]*)\"|'([^'>]*)')"
)
# BOM-less UTF-16 that starts with an XML declaration: the prescan's first step reads it as UTF-16.
_UTF16_XML: tuple[tuple[bytes, str], ...] = ((b"<\0?\0x\0", "utf-16-le"), (b"\0<\0?\0x", "utf-16-be"))


@dataclass(frozen=True)
class DecodedHtml:
    """Decoded page text and how the encoding was chosen."""

    text: str
    encoding: str  # Python codec name actually used ("utf-8" for str input)
    source: str  # "bom" | "declared" | "meta" | "detected" | "xml" | "default" | "str"


# BOM-less UTF-16 (`sniff_utf16`): how much of the page's start is read, and the shares of its code units
# that must be ASCII (a NUL high byte), and may hold a NUL low byte.
_UTF16_SAMPLE = 4096
_UTF16_ASCII_SHARE = 1 / 3
_UTF16_NUL_LOW_SHARE = 1 / 50


def sniff_utf16(data: bytes) -> str | None:
    """ "utf-16-le" or "utf-16-be" for bytes without a BOM that are UTF-16 markup, else None.

    Markup is mostly ASCII, which UTF-16 writes as a NUL byte beside each character: in the first
    `_UTF16_SAMPLE` bytes at least a third of the code units have a NUL high byte, almost none a NUL
    low byte, and a `<` is among the low bytes. No page in an ASCII-compatible encoding holds NUL bytes
    in every other position (binary junk holds them anywhere), so the reading beats any declaration but
    a BOM: read as windows-1252 or UTF-8 (ASCII-only UTF-16 is valid UTF-8), such a page became its
    markup escaped as text with a NUL between every two characters, and was embedded so.
    """
    if b"\0" not in data[:_UTF16_SAMPLE]:  # (every ordinary page: one scan of 4 KiB)
        return None
    for name in ("utf-16-le", "utf-16-be"):
        low, high = _utf16_code_units(data, name)
        if _mostly_ascii_units(low, high) and b"<" in low:
            return name
    return None


def _utf16_code_units(data: bytes, codec: str) -> tuple[bytes, bytes]:
    """(low bytes, high bytes) of the code units the first `_UTF16_SAMPLE` bytes of `data` make in the
    byte order of `codec` ("utf-16-le" or "utf-16-be"), an odd last byte left out."""
    sample = data[:_UTF16_SAMPLE]
    sample = sample[: len(sample) // 2 * 2]
    first, second = sample[0::2], sample[1::2]
    return (first, second) if codec == "utf-16-le" else (second, first)


def _mostly_ascii_units(low: bytes, high: bytes) -> bool:
    """Whether the code units (`_utf16_code_units`) are markup's: at least `_UTF16_ASCII_SHARE` of them
    with a NUL high byte (ASCII), at most `_UTF16_NUL_LOW_SHARE` with a NUL low byte."""
    units = len(low)
    return 0 < units * _UTF16_ASCII_SHARE <= high.count(0) and low.count(0) <= units * _UTF16_NUL_LOW_SHARE


def _utf16_markup(data: bytes, codec: str) -> bool:
    """Whether `data` can be UTF-16 markup in the byte order of `codec`, as a declaration says it is:
    its code units are mostly ASCII (`_mostly_ascii_units`), or the first `_UTF16_SAMPLE` bytes hold
    a tag's start as code units, a `<` and then a letter, `/`, `!` or `?` ("<\0p\0" in UTF-16LE).

    Weaker evidence than `sniff_utf16` asks for, which must beat a declaration: here the declaration
    says UTF-16 already, and the bytes need only not contradict it. A UTF-16 page of little markup (a
    Chinese article) has the start of its first tag; an ASCII-compatible page with a stray NUL byte
    has none (one NUL makes at most one ASCII code unit, "\0<" in UTF-16BE, and a tag takes two).
    """
    low, high = _utf16_code_units(data, codec)
    if _mostly_ascii_units(low, high):
        return True
    position = low.find(b"<")
    while 0 <= position < len(low) - 1:
        if high[position] == high[position + 1] == 0 and low[position + 1] in _TAG_START:
            return True
        position = low.find(b"<", position + 1)
    return False


_TAG_START = frozenset(b"!/?ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")


def sniff_meta_charset(data: bytes) -> str | None:
    """The codec the first `<meta>` that declares one names in the first `PRESCAN_BYTES` bytes, if any.

    This is the HTML Standard's "prescan a byte stream to determine its encoding": a `<meta>` inside a
    comment, inside another tag's attribute value (`<div data-x="<meta charset=gbk>">`), or with a
    `content` but no `http-equiv="content-type"` declares nothing, nor does an attribute that merely
    ends in "charset" (`data-charset`); a `<meta>` whose label names no codec a page can be in is
    passed over for the next one. Bytes running out inside a tag or comment end the scan. Labels are
    read by `_page_label`; BOM-less UTF-16 starting with `<?xml` is UTF-16.
    """
    for prefix, name in _UTF16_XML:
        if data.startswith(prefix):
            return name
    head = data[:PRESCAN_BYTES]
    position = 0
    while (markup := _MARKUP.search(head, position)) is not None:
        if markup["comment"]:
            # The dashes of "<!--" may end it too: "<!-->" is a whole comment.
            end = head.find(b"-->", markup.start() + 2)
            if end < 0:
                return None
            position = end + 3
        elif markup["meta"]:
            found = _meta_element_charset(head, markup.end() - 1)
            if found is None:
                return None
            charset, position = found
            if charset is not None:
                return charset
        elif markup["tag"]:
            # Another tag: its attributes are skipped whole, so markup in their values is not read.
            name_end = _TAG_NAME_END.search(head, markup.end())
            if name_end is None:
                return None
            position = name_end.start()
            while (attribute := _ATTRIBUTE.match(head, position)) is not None:
                position = attribute.end()
                if attribute["name"] is None:
                    break
            else:
                return None
        else:
            end = head.find(b">", markup.start() + 1)
            if end < 0:
                return None
            position = end + 1
    return None


def _meta_element_charset(head: bytes, position: int) -> tuple[str | None, int] | None:
    """(the codec the `<meta>` whose attributes start at `position` declares, or None; the position
    after its `>`), or None where the bytes run out inside it.

    `charset` declares; `content` declares only beside `http-equiv="content-type"` (the "need
    pragma" rule); of an attribute given twice the first counts; a `charset` naming no codec makes
    the element declare nothing, also when its `content` names one.
    """
    seen: set[bytes] = set()
    got_pragma = False
    need_pragma: bool | None = None  # None: neither `charset` nor a `content` with a charset seen
    charset: str | None = None
    while (attribute := _ATTRIBUTE.match(head, position)) is not None:
        position = attribute.end()
        name = attribute["name"]
        if name is None:
            break
        name = name.lower()
        if name in seen:
            continue
        seen.add(name)
        value = (_value(attribute) or b"").lower()
        if name == b"http-equiv":
            got_pragma = value == b"content-type"
        elif name == b"content" and need_pragma is None:
            label = _content_charset(value)
            if label is not None and (codec := _meta_label(label)) is not None:
                charset, need_pragma = codec, True
        elif name == b"charset":
            charset, need_pragma = _meta_label(value), False
    else:
        return None
    if need_pragma is None or (need_pragma and not got_pragma):
        return None, position
    return charset, position


def _content_charset(content: bytes) -> bytes | None:
    """The charset label in a `<meta>`'s lower-cased `content` value ("text/html; charset=gbk"), if any."""
    match = _CONTENT_CHARSET.search(content)
    return None if match is None else _value(match)


def _value(match: re.Match[bytes]) -> bytes | None:
    """The value (quoted, `dq` `sq`, or not, `uq`) a match of `_ATTRIBUTE` or `_CONTENT_CHARSET` holds."""
    return match["dq"] or match["sq"] or match["uq"]


def _meta_label(label: bytes) -> str | None:
    """The codec a `<meta>`'s label names (`_page_label`), `x-user-defined` being windows-1252 there."""
    if label.strip(b"\t\n\f\r ").lower() == b"x-user-defined":
        return "cp1252"  # the HTML Standard's rule: no browser decodes a page as x-user-defined
    return _page_label(label)


def _page_label(label: bytes) -> str | None:
    """The codec a label declared inside the page names (`whatwg_codec`), or None where it names none.

    A label the Encoding Standard does not know is no declaration, as in a browser: Python's names for
    codecs that read ASCII as something else (UTF-7, EBCDIC: "C++" came out "C\ufffd") among them, and
    the replacement encoding's labels (`iso-2022-kr`, `hz-gb-2312`: Python's 7-bit codecs made every
    non-ASCII byte U+FFFD, and HZ read `/~bob/` as `/\ufffdbob/`).
    """
    name = whatwg_codec(label.decode("ascii", "replace"))
    # A document that says "utf-16" in ASCII bytes cannot be UTF-16 (the spec reads it as UTF-8).
    if name is not None and name.startswith("utf-16"):
        return "utf-8"
    return name


def declared_codec(label: str | None) -> str | None:
    """The codec an encoding declared outside the page names (an HTTP charset, a WARC record's, a JSONL
    row's `encoding`), or None where a browser ignores the declaration and reads the page's own.

    The rule is `_page_label`'s (the Encoding Standard's labels only), but UTF-16 stays UTF-16 (bytes
    sent with a UTF-16 charset can be UTF-16). A label only Python knows is ignored: a server's
    `charset=utf-7` over a windows-1251 page made it noise, and `charset=latin-1` over a UTF-8 page
    mojibake, where the `<meta>` said it right. A JSONL row's `encoding` is documented as the charset
    the file was served with, so it is read as that HTTP header is, and the page reads the same from a
    JSONL row as from the WARC record it came in.
    """
    return whatwg_codec(label)


def _declared_reading(data: bytes, encoding: str | None) -> str | None:
    """The codec `encoding` declares for `data` (`declared_codec`), but none where it declares UTF-16 and
    `data` is no UTF-16 markup in that byte order (`_utf16_markup`): UTF-16 writes every ASCII
    character, markup's `<` first, with a NUL byte beside it. A server's default `charset=utf-16` over
    a UTF-8 page had made it CJK noise, and embedded the noise; so it still did where the page held a
    single NUL byte anywhere, which any NUL had been taken as enough evidence for."""
    declared = declared_codec(encoding)
    if declared is not None and declared.startswith("utf-16") and not _utf16_markup(data, declared):
        return None
    return declared


def sniff_xml_encoding(data: bytes) -> str | None:
    """The codec an XML declaration at the top of the page (`<?xml ... encoding="..."?>`) names, if any.

    As the HTML Standard's "get an XML encoding" reads it (case-sensitive, a quoted label without
    white space, before the declaration's first `>`), except that white space may precede it: a
    script's stray newline in front of the declaration does not make it less of one. `decode_html`
    takes it only where no `<meta>` declares and the bytes are not UTF-8 with non-ASCII characters
    (see the module's steps).
    """
    match = _XML_DECL.match(data, 0, PRESCAN_BYTES)
    if match is None:
        return None
    label = match[1] if match[1] is not None else match[2]
    if not label or min(label) <= 0x20:
        return None
    return _page_label(label)


# ISO-2022-JP's escape sequences: to ASCII (ESC ( B), to JIS X 0201 Roman (ESC ( J, where 0x5C is the yen
# sign), to JIS X 0208 (ESC $ @, ESC $ B) and to JIS X 0201 katakana (ESC ( I); the last four leave ASCII.
_ISO2022_JP_TO_ASCII = b"\x1b(B"
_ISO2022_JP_LEAVE_ASCII = (b"\x1b(J", b"\x1b$@", b"\x1b$B", b"\x1b(I")


def sniff_iso2022_jp(data: bytes) -> str | None:
    """All-ASCII `data` read as ISO-2022-JP, where it is ISO-2022-JP: it leaves ASCII by one of the
    encoding's escape sequences, every ESC byte starts one of them, it holds no SO or SI, and it reads as
    ISO-2022-JP without an error to the standard's decoder (`strict_iso2022_jp`: NEC's ① and ㈱, which
    Python's codec lacks, are none; a page with one had stayed UTF-8). None where it is not.

    ISO-2022-JP is all ASCII bytes, so without a declaration it was read as UTF-8: a Japanese page came
    out as its escape sequences and the ASCII letters and punctuation its kanji and kana are written
    with ("\x1b$BF|K\\8l\x1b(B" for "日本語"), and was embedded so. Browsers' detectors (Firefox's
    chardetng) read such bytes as ISO-2022-JP where its decoder finds no error, and in the Encoding
    Standard's decoder an ESC that starts no escape sequence (an ANSI colour code, "\x1b[31m", in a
    pasted log), SO and SI are errors, which Python's codec lets through: such a page stays UTF-8.

    The text comes back so that a page is decoded once (`decode_html`, `parser_input`). The checks are
    C-speed substring searches and counts: the escape sequences hold one ESC each, so they cannot
    overlap, and every ESC starts one exactly where their counts add up to the ESC bytes'. Listing the
    sequences with `re.findall` had made 16 MiB of "\x1b$B" 5.6 million bytes objects (0.6 s, 330 MiB);
    a regex search for an ESC that starts none stops at every ESC too (0.24 s); the counts take 0.09 s.
    """
    if b"\x1b" not in data or not any(escape in data for escape in _ISO2022_JP_LEAVE_ASCII):
        return None
    if b"\x0e" in data or b"\x0f" in data:
        return None
    escapes = data.count(_ISO2022_JP_TO_ASCII) + sum(data.count(e) for e in _ISO2022_JP_LEAVE_ASCII)
    if data.count(b"\x1b") != escapes:
        return None
    return strict_iso2022_jp(data)


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def without_lone_surrogates(text: str) -> str:
    """`text` with U+FFFD for every lone surrogate: what text decoded with `errors="surrogateescape"` (a
    crawler's undecodable bytes) or a JSON `\\udc80` escape carries, and an undecodable byte gives."""
    return text if text.isascii() else _LONE_SURROGATE.sub("\ufffd", text)


def decode_html(data: bytes | str, *, encoding: str | None = None) -> DecodedHtml:
    """Decode a page's raw bytes (BOM, declared, meta, UTF-8, XML, detected); never raises on bad bytes.

    Text is taken as decoded already, as bytes with a BOM would be: without a leading U+FEFF (a client's
    `raw.decode("utf-8")` keeps it, and the parser then reads it as body text, moving `<title>` into
    `<body>`) and with U+FFFD for lone surrogates (which the parser had dropped)."""
    if isinstance(data, str):
        text = data[1:] if data.startswith("\ufeff") else data
        return DecodedHtml(text=without_lone_surrogates(text), encoding="utf-8", source="str")
    for bom, name in _BOMS:
        if data.startswith(bom):
            return DecodedHtml(data[len(bom) :].decode(name, errors="replace"), name, "bom")
    utf16 = sniff_utf16(data)
    if utf16 is not None:
        return DecodedHtml(data.decode(utf16, errors="replace"), utf16, "detected")
    declared = _declared_reading(data, encoding)
    if declared is not None:
        return DecodedHtml(decode_bytes(data, declared), declared, "declared")
    meta = sniff_meta_charset(data)
    if meta is not None:
        return DecodedHtml(decode_bytes(data, meta), meta, "meta")
    utf8 = None if data.isascii() else _utf8_reading(data)
    if utf8 is not None:
        return DecodedHtml(utf8, "utf-8", "detected")
    xml = sniff_xml_encoding(data)
    if xml is not None:
        return DecodedHtml(decode_bytes(data, xml), xml, "xml")
    if data.isascii():
        japanese = sniff_iso2022_jp(data)
        if japanese is not None:
            return DecodedHtml(japanese, "iso2022_jp", "detected")
        return DecodedHtml(data.decode("ascii"), "utf-8", "detected" if data else "default")
    detected = detect_encoding(data)
    return DecodedHtml(decode_bytes(data, detected), detected, "detected")


def with_declared_encoding(data: bytes, encoding: str | None) -> bytes:
    """`data` as bytes `decode_html` reads, without being told, the way `encoding` says to read them.

    For page collections, where the declaration (an HTTP charset kept in a WARC record, a JSONL row's
    `encoding`, or "utf-8" for a row that carries text) would otherwise be lost between the reader and
    the many consumers that only take bytes. The bytes come back unchanged when the declaration changes
    nothing (no codec named, a BOM, a `<meta>` that agrees, UTF-8 declared for valid UTF-8 without a
    contrary `<meta>`, or any declaration `decode_html` reads the bytes the same way without);
    otherwise the declared reading comes back as UTF-8 behind a BOM, which wins over everything else
    in `decode_html`.
    """
    declared = _declared_reading(data, encoding)
    if declared is None or any(data.startswith(bom) for bom, _ in _BOMS):
        return data
    meta = sniff_meta_charset(data)
    if meta == declared:
        return data
    # Undeclared non-ASCII UTF-8 is read as UTF-8 before an XML declaration is looked at; ASCII bytes
    # are not (ISO-2022-JP), and take the comparison below.
    if meta is None and declared == "utf-8" and not data.isascii() and _utf8_reading(data) is not None:
        return data
    reading = decode_bytes(data, declared)
    if decode_html(data).text == reading:
        return data
    return codecs.BOM_UTF8 + reading.encode("utf-8")


# "Mostly UTF-8" (`_mostly_utf8`): at least this many valid multi-byte sequences per invalid one (a page
# gets there with one invalid sequence at least, so it holds 20 valid ones at least). Measured on the
# shared corpus: UTF-8 pages with stray bytes have 0.002 to 0.04 invalid per valid (1 in 499 to 4 in
# 101); every legacy page has 1.0 or more.
_MOSTLY_UTF8_VALID_PER_INVALID = 20
_MOSTLY_UTF8_CHUNK = 65536  # bytes decoded between two checks of the invalid sequences' bound
_NON_ASCII_BYTES = bytes(range(0x80, 0x100))


def _utf8_reading(data: bytes) -> str | None:
    """`data` read as UTF-8 (U+FFFD for invalid sequences) where it is UTF-8, else None.

    Valid UTF-8 is; so is a UTF-8 page cut off inside its last character (a crawler's byte cap,
    WARC-Truncated), which the detector read as GBK: the first error is then the cut, at the end, and a
    whole non-ASCII character precedes it (one Latin-1 "é" at the end of an ASCII page is no evidence);
    so is a page that is mostly UTF-8 (`_mostly_utf8`).
    """
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        if (
            exc.reason == "unexpected end of data"
            and exc.end == len(data)
            and not data[: exc.start].isascii()
        ):
            return data.decode("utf-8", errors="replace")
    return _mostly_utf8(data)


def _mostly_utf8(data: bytes) -> str | None:
    """`data` read as UTF-8 where it holds one invalid sequence at most per `_MOSTLY_UTF8_VALID_PER_INVALID`
    valid multi-byte sequences, else None.

    Real UTF-8 pages carry a few stray bytes (a windows-1252 "é" pasted into a template, a string cut
    inside a character), and the detector read one such Polish page as windows-1251 (none of its
    phrases survived). Legacy text is next to never valid UTF-8 by accident (a windows-1252 "é" before
    an ASCII letter is an invalid sequence), so it has about as many invalid sequences as valid ones or
    more. The page is decoded in chunks and given up once its invalid sequences are more than a page of
    its length could excuse (a valid sequence takes two bytes at least): a legacy or binary page costs a
    few chunks, not a decode of the whole page one error at a time (5 MB of random bytes: 150 ms, now 8).
    """
    most_invalid = len(data) // 2 // _MOSTLY_UTF8_VALID_PER_INVALID
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    written_replacements = b"\xef\xbf\xbd" in data  # U+FFFD in the page: a valid sequence
    characters = invalid = 0
    for start in range(0, len(data), _MOSTLY_UTF8_CHUNK):
        end = start + _MOSTLY_UTF8_CHUNK
        part = decoder.decode(data[start:end], final=end >= len(data))
        characters += len(part)
        invalid += part.count("\ufffd")
        if written_replacements:  # one cut by the chunk's end counts with the next, where it is decoded
            invalid -= data.count(b"\xef\xbf\xbd", max(start - 2, 0), end)
        if invalid > most_invalid:
            return None
    # A valid sequence is one character of two bytes or more, so there are at most as many as the
    # bytes outnumber the characters: a free check that turns down a legacy page of few non-ASCII bytes.
    if invalid * _MOSTLY_UTF8_VALID_PER_INVALID > len(data) - characters:
        return None
    # Every ASCII byte decodes to itself, never inside an invalid sequence: the other characters are
    # the multi-byte sequences, valid or U+FFFD.
    valid = characters - len(data.translate(None, _NON_ASCII_BYTES)) - invalid
    if invalid * _MOSTLY_UTF8_VALID_PER_INVALID > valid:
        return None
    return data.decode("utf-8", errors="replace")  # one piece: joining the chunks' text cost more


def utf8_payload(data: bytes, *, encoding: str | None = None) -> bytes | None:
    """The page's bytes as valid UTF-8, when `decode_html` reads them as UTF-8: a UTF-8 consumer (Lexbor)
    takes them and reads the same text `decode_html` gives.

    That is: a UTF-8 BOM (the rest of the page is returned), a UTF-8 declaration (the argument, a
    `<meta>` or, without one, an XML declaration: bytes that are not UTF-8 then take it as a hint), or
    pure ASCII that no declaration gives another codec and that is not undeclared ISO-2022-JP
    (`sniff_iso2022_jp`: its bytes are ASCII too). Valid UTF-8 (`_valid_utf8`) is returned as it is,
    skipping a decode and a re-encode; bytes that are not are repaired first, each invalid sequence
    U+FFFD's three bytes as `decode_html` reads it (`_utf8_or_repaired`). Everything else returns None:
    decode with `decode_html`, or take `parser_input`.

    Lexbor keeps an invalid byte in its text nodes as it is, and two of them either side of something
    the tree drops (a removed `<script>`, `<style>` or hidden element, a NUL byte, a stray end tag) met
    in one text node and read as one character the page never had (`\\xc3<script>x()</script>\\x8c`
    became "Ì" where `decode_html` reads "\\ufffd\\ufffd"). The check costs about 0.5 % of pruning a
    page (`_valid_utf8`).
    """
    payload = _payload(data, encoding)
    return payload if isinstance(payload, bytes) else None


def parser_input(data: bytes, *, encoding: str | None = None) -> bytes | str:
    """The page as a UTF-8 parser takes it: `utf8_payload` where that gives bytes, else the text of
    `decode_html`, with the page sniffed once.

    An undeclared ISO-2022-JP page is all ASCII, so `utf8_payload` has to read it as ISO-2022-JP to turn
    it down; asking it and then `decode_html` had sniffed and decoded such a page twice more (the pruner
    took 1.3 s and 360 MiB for 16 MiB of escape sequences, before the tag count that refuses it).
    """
    payload = _payload(data, encoding)
    return payload if payload is not None else decode_html(data, encoding=encoding).text


def _payload(data: bytes, encoding: str | None) -> bytes | str | None:
    """`utf8_payload`'s bytes; `decode_html`'s text where the sniff that turned the bytes down has read
    the page already (undeclared ISO-2022-JP); else None."""
    for bom, name in _BOMS:
        if data.startswith(bom):
            return _utf8_or_repaired(data[len(bom) :]) if name == "utf-8" else None
    if sniff_utf16(data) is not None:
        return None
    declared = _declared_reading(data, encoding) or sniff_meta_charset(data) or sniff_xml_encoding(data)
    if declared is not None:
        # (`decode_html` reads declared UTF-8 as UTF-8 too where the declaration is an XML one: bytes
        # that are not UTF-8 are read as mostly UTF-8 or by the declaration, U+FFFD for the same bytes.)
        return _utf8_or_repaired(data) if declared == "utf-8" else None
    if not data.isascii():
        return None
    japanese = sniff_iso2022_jp(data)  # (no declaration, ASCII: `decode_html` reads it so too)
    return data if japanese is None else japanese


def _utf8_or_repaired(data: bytes) -> bytes:
    """`data` where it is valid UTF-8 (`_valid_utf8`), else its text read as UTF-8, U+FFFD for each
    invalid sequence (what `decode_html` gives a page it reads as UTF-8), encoded back to UTF-8.

    Bytes, not the text: the pruner charges a page given as text the text's size besides its bytes and
    parses it slower, so a page that one invalid byte had sent down that path (a truncated download's
    cut last character) was refused where its valid twin was pruned (6 MB of Chinese: "pruning it would
    take about 402 MiB (the budget for 3767454 bytes ...)"), and a 16 MiB page took 5.5 s and 345 MiB
    where its twin takes 3.1 s and 296 MiB. Repaired, it costs what its twin does, and the decode the
    repair makes is gone before parsing starts.
    """
    return data if _valid_utf8(data) else data.decode("utf-8", errors="replace").encode("utf-8")


_UTF8_CHECK_CHUNK = 1024 * 1024  # bytes `_valid_utf8` decodes at a time


def _valid_utf8(data: bytes) -> bool:
    """Whether `data` is valid UTF-8, decoded a chunk at a time and the text thrown away.

    Python has no UTF-8 check that builds no text; the chunks bound it. Decoding 16 MiB whole made a
    string of up to 64 MiB (one emoji makes every character 4 bytes) and took 39 ms for German text with
    an emoji at the end; in chunks of 1 MiB it takes 7 ms (Chinese 11 ms, ASCII 0.8 ms, the `isascii`
    scan), and a corpus page of 100 KB about 30 us, against 5.6 ms to prune it.
    """
    if data.isascii():
        return True
    decoder = codecs.getincrementaldecoder("utf-8")()
    view = memoryview(data)
    try:
        for start in range(0, len(data), _UTF8_CHECK_CHUNK):
            end = start + _UTF8_CHECK_CHUNK
            decoder.decode(view[start:end], final=end >= len(data))
    except UnicodeDecodeError:
        return False
    return True
