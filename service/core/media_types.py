"""Content-Type values as HTTP sends them and as browsers read them, for every reader of raw pages: the
service's raw-body routes (`service.api.documents`) and WARC records (`service.core.warc_record_page`).

A Content-Type is a singleton field, but a proxy that merges two of them writes one comma-separated list
(`text/html, text/html; charset=koi8-r`), and crawlers keep it as it came. The email parser reads such a
list as `text/plain` (a raw body's 415, a WARC record's page skipped); the Fetch standard's "extract a
MIME type" (`extract_media_type`) reads it as browsers do.

A body that comes with no Content-Type at all is a page where it looks like markup
(`looks_like_markup`): one rule for both readers, where the WARC reader's own had passed over in silence
an untyped page that starts with a byte order mark or is UTF-16, which the API reads as a page.
"""

from __future__ import annotations

import codecs
import re
from email.message import Message

from service.core.decoding import sniff_utf16

# A media type's essence as the Fetch standard's MIME type parser takes it: token "/" token, before any
# parameters, with HTTP white space around.
_TOKEN = r"[!#$%&'*+.^_`|~0-9A-Za-z-]+"
_ESSENCE = re.compile(rf"[\t\n\r ]*({_TOKEN}/{_TOKEN})[\t\n\r ]*(?:;|$)")


def parse_content_type(value: str) -> tuple[str, str | None]:
    """(lower-case media type, charset label or None) of one `Content-Type` value.

    The email parser does the RFC 2045 work (quoted parameters, case); one it cannot parse reads as
    `text/plain`, which callers that must quote the header back keep in mind.
    """
    message = Message()
    message["content-type"] = value
    charset = message.get_param("charset")
    return message.get_content_type(), charset if isinstance(charset, str) and charset else None


def split_values(value: str) -> list[str]:
    """`value` split at its commas outside quoted strings (Fetch's "getting, decoding, and splitting":
    a backslash escapes the next character in quotes, an unterminated quote runs to the end), each
    value stripped of spaces and tabs."""
    values: list[str] = []
    current: list[str] = []
    quoted = escaped = False
    for char in value:
        if escaped:
            escaped = False
        elif quoted and char == "\\":
            escaped = True
        elif char == '"':
            quoted = not quoted
        elif char == "," and not quoted:
            values.append("".join(current).strip(" \t"))
            current = []
            continue
        current.append(char)
    values.append("".join(current).strip(" \t"))
    return values


def essence(value: str) -> str | None:
    """One value's media type (lower case), None where Fetch's parser fails on it or it is `*/*`."""
    match = _ESSENCE.match(value)
    found = match.group(1).lower() if match else None
    return None if found == "*/*" else found


def essences(values: list[str]) -> list[str]:
    """The distinct valid media types of `values` (`split_values`), in order."""
    return list(dict.fromkeys(e for e in map(essence, values) if e is not None))


def extract_media_type(value: str) -> tuple[str, str | None]:
    """(media type, charset) of a Content-Type value as the Fetch standard's "extract a MIME type" reads
    it: the last valid value of the list (`*/*` and values that are no media type skipped); its charset,
    or where it has none, the one set by the first value of the run of that same media type it ends (a
    value of another type starts the run over). One value, or a list without a valid one, is read by
    `parse_content_type` (so a value it cannot parse still reads as `text/plain`)."""
    values = split_values(value)
    if len(values) == 1 or not essences(values):
        return parse_content_type(value)
    media_type, charset, run_charset, run_type = "", None, None, None
    for item in values:
        if essence(item) is None:
            continue
        media_type, charset = parse_content_type(item)
        if media_type != run_type:  # a new run: its charset is this value's own
            run_type, run_charset = media_type, charset
        elif charset is None:
            charset = run_charset
    return media_type, charset


# The WHATWG's "ASCII whitespace", which MIME sniffing skips before a tag: JSON's white space and the
# form feed, which no JSON may start with either. Matched rather than stripped: `bytes.lstrip` copies a
# page of megabytes to read its first byte.
_WHITESPACE = "\t\n\x0c\r "
_MARKUP_START = re.compile(rb"[\t\n\x0c\r ]*<")
# What a UTF-16 body is read for (`sniff_utf16` reads as much).
_UTF16_SAMPLE = 4096


def looks_like_markup(body: bytes) -> bool:
    """Whether a body sent or stored without a Content-Type is a page: it starts with `<` after white
    space or a byte order mark (UTF-8 or UTF-16), or with `<` in UTF-16 without one (`sniff_utf16`'s
    markup, which the decoder reads for a crawler that lost the header). A UTF-16 byte order mark
    alone had made a page of any body, UTF-16 JSON too (PowerShell's default), embedded as HTML.

    The API reads such a request body as one raw page (JSON cannot start so; UTF-16 JSON holding markup
    starts with `{` or `[`), and the WARC reader such a response's body, its Content-Encoding undone, as
    a page: its own test (`<` after white space) had passed over a page starting with a BOM, or in
    UTF-16, where the API embedded the same bytes."""
    for bom, codec in ((codecs.BOM_UTF16_LE, "utf-16-le"), (codecs.BOM_UTF16_BE, "utf-16-be")):
        if body.startswith(bom):  # (and UTF-32's little-endian one: its NULs start no tag)
            text = body[len(bom) : len(bom) + _UTF16_SAMPLE].decode(codec, errors="replace")
            return text.lstrip(_WHITESPACE).startswith("<")
    utf16 = sniff_utf16(body)
    if utf16 is not None:
        return body[:_UTF16_SAMPLE].decode(utf16, errors="replace").lstrip(_WHITESPACE).startswith("<")
    start = len(codecs.BOM_UTF8) if body.startswith(codecs.BOM_UTF8) else 0
    return _MARKUP_START.match(body, start) is not None


def charset_parameter(value: str) -> str | None:
    """The charset label `value` names as the `charset` parameter of a Content-Type header, read as
    that header is (`extract_media_type`): a quoted string unquoted (`"windows-1252"` is windows-1252),
    what a `;` or a `,` starts (another parameter, another value) read as the header's own; None where
    it names nothing (`""`, `;`). For a label given apart from its header (a JSONL row's `encoding`)
    that is documented as that header's charset: Python's codec lookup had taken `"windows-1252"` and
    `windows-1252;` for windows-1252, as a label browsers do not know and ignore, where the header
    `charset="windows-1252"` reads it."""
    return extract_media_type(f"text/html; charset={value}")[1]
