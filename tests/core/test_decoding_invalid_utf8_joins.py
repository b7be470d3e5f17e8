"""A page declared UTF-8 whose bytes are not valid UTF-8 prunes as its decoded text does.

Such bytes had gone to Lexbor as they were (`utf8_payload`), which keeps an invalid byte in a text node
as it is: two of them either side of something the tree drops (a removed `<script>`, `<style>`,
`<noscript>`, `<template>` or hidden element, a NUL byte, a stray end tag, a comment in a table whose
text is fostered out of it) met in one text node and read as one character the page never had
(`\\xc3<script>x()</script>\\x8c` came out "Ì", where `decode_html` reads "\\ufffd\\ufffd"). Only valid
UTF-8 goes as it is now; the rest is repaired first, each invalid sequence U+FFFD as `decode_html` reads
it, and still goes as bytes (as text the pruner charged it more and refused pages its valid twin passes).
"""

from __future__ import annotations

import codecs
import random

import pytest

from service.core import decoding, prune
from service.core.decoding import decode_html, parser_input, utf8_payload
from service.core.prune import InputTooLargeError, prune_html, prune_text

# Each way a page declares UTF-8: (bytes in front of the page, the `encoding` argument).
DECLARATIONS: dict[str, tuple[bytes, str | None]] = {
    "meta": (b'<meta charset="utf-8">', None),
    "argument": (b"", "utf-8"),
    "bom": (codecs.BOM_UTF8, None),
    "xml": (b'<?xml version="1.0" encoding="utf-8"?>', None),
}

# What the tree drops between two invalid bytes: (markup before the left byte, between them, after the
# right byte). A comment in a table stays in the table while the text around it is fostered out of it,
# where its two pieces meet.
REMOVED: dict[str, tuple[bytes, bytes, bytes]] = {
    "script": (b"", b"<script>x()</script>", b""),
    "style": (b"", b"<style>p { color: red }</style>", b""),
    "comment": (b"<table>", b"<!-- a comment -->", b"</table>"),
    "nul": (b"", b"\x00", b""),
    "noscript": (b"", b"<noscript>enable scripts</noscript>", b""),
    "template": (b"", b"<template>row</template>", b""),
    "hidden": (b"", b"<span hidden>hidden</span>", b""),
    "stray-end-tag": (b"", b"</span>", b""),
}

# Pieces of a valid sequence, split where a removed element may sit: "Ì", "€", "😀" joined.
SPLIT_SEQUENCES = ((b"\xc3", b"\x8c"), (b"\xe2\x82", b"\xac"), (b"\xf0\x9f", b"\x98\x80"))


def _page(declaration: str, removed: str) -> tuple[bytes, str | None]:
    """A page declared UTF-8 the way `declaration` names, with each of `SPLIT_SEQUENCES` split around
    the `removed` markup, and its `encoding` argument."""
    front, encoding = DECLARATIONS[declaration]
    before, middle, after = REMOVED[removed]
    body = b"".join(
        b"<p>word " + before + left + middle + right + after + b" word</p>" for left, right in SPLIT_SEQUENCES
    )
    return front + b"<title>Titel</title>" + body, encoding


def _prunes_as_decoded(data: bytes, encoding: str | None) -> None:
    """`data` prunes as its `decode_html` text does, with no non-ASCII character that text lacks (the
    output's ASCII holds tags the page need not have written, `<html>`, `<body>`)."""
    text = decode_html(data, encoding=encoding).text
    pruned = prune_html(data, encoding=encoding)
    assert pruned == prune_text(text)
    assert {c for c in pruned if not c.isascii()} <= set(text)


@pytest.mark.parametrize("removed", list(REMOVED))
@pytest.mark.parametrize("declaration", list(DECLARATIONS))
def test_invalid_bytes_around_a_removed_element_prune_as_the_decoded_text(
    declaration: str, removed: str
) -> None:
    data, encoding = _page(declaration, removed)
    repaired = decode_html(data, encoding=encoding).text.encode("utf-8")
    assert utf8_payload(data, encoding=encoding) == repaired
    assert parser_input(data, encoding=encoding) == repaired
    _prunes_as_decoded(data, encoding)
    pruned = prune_html(data, encoding=encoding)
    assert not {"Ì", "€", "😀"} & set(pruned)
    assert pruned.count("\ufffd") == 2 * len(SPLIT_SEQUENCES) + 1  # "\xf0\x9f" is one invalid sequence


# A valid page, as each declaration writes it, and its pruned output (unchanged by the validity check).
VALID_BODY = (
    "<p>Grüße <script>x()</script>aus Köln</p>"
    "<p>北京<style>p {}</style>欢迎你</p>"
    "<table>😀<!-- c -->€</table>"
)
VALID_PRUNED = "<html><title>Titel</title><body><p>Grüße aus Köln</p><p>北京欢迎你</p>😀€</body></html>"


@pytest.mark.parametrize("declaration", list(DECLARATIONS))
def test_valid_utf8_still_goes_to_the_parser_as_bytes(declaration: str) -> None:
    front, encoding = DECLARATIONS[declaration]
    data = front + ("<title>Titel</title>" + VALID_BODY).encode()
    payload = utf8_payload(data, encoding=encoding)
    expected = data[len(codecs.BOM_UTF8) :] if declaration == "bom" else data
    assert isinstance(payload, bytes) and payload == expected
    assert parser_input(data, encoding=encoding) == expected
    assert prune_html(data, encoding=encoding) == VALID_PRUNED
    assert prune_text(decode_html(data, encoding=encoding).text) == VALID_PRUNED


def test_the_check_reads_characters_cut_by_its_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check decodes a chunk at a time: a character cut by a chunk's end is valid, and an invalid
    byte in any chunk, or a character cut by the page's end, is found."""
    monkeypatch.setattr(decoding, "_UTF8_CHECK_CHUNK", 5)
    valid = '<meta charset="utf-8"><p>Grüße, 北京欢迎你, 😀😀😀</p>'.encode()
    for start in range(6):  # every offset of the characters against the chunks' ends
        data = b" " * start + valid
        assert utf8_payload(data) == data
    for bad in (valid + b"\xff", valid + b"\xe2\x82", valid.replace(b"\x9f\x98\x80", b"\x9f\x98", 1)):
        assert utf8_payload(bad) == parser_input(bad) == decode_html(bad).text.encode("utf-8") != bad


def _pruned_or_refused(data: bytes) -> str:
    """The outcome, "pruned" or "refused" (`prune_html` finds the page over its memory budget)."""
    try:
        prune_html(data)
    except InputTooLargeError:
        return "refused"
    return "pruned"


def test_a_page_cut_inside_its_last_character_is_charged_as_its_valid_twin(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A truncated download's cut last character had sent a whole page to the pruner as text, which it
    charges the text's size besides (`_prune_document`): 6 MB of Chinese it had pruned were refused
    ("the budget for 3767454 bytes"), over the API too. Repaired, the page goes as bytes and its budget
    and estimate are its valid twin's. Without the headroom a test-sized page meets the budget: some
    of these pages are refused, some pruned, and each cut page as its twin."""
    monkeypatch.setattr(prune, "_MEMORY_HEADROOM", 0)
    seen = set()
    for length in range(20, 34, 2):
        valid = ('<meta charset="utf-8">' + ("<p>" + "中" * length + "</p>") * 2000).encode()
        cut = valid + "中".encode()[:2]
        assert _pruned_or_refused(cut) == _pruned_or_refused(valid), length
        seen.add(_pruned_or_refused(valid))
    assert seen == {"pruned", "refused"}


# The sweep's pieces: ASCII and valid non-ASCII text, invalid sequences (stray continuation bytes, lone
# and cut lead bytes, overlong forms, surrogates, bytes UTF-8 never uses), and markup the tree drops.
TEXT = (
    b"word",
    b" ",
    b"a b",
    b"Gr\xc3\xbc\xc3\x9fe",
    b"\xe5\x8c\x97\xe4\xba\xac",
    b"\xf0\x9f\x98\x80",
    b"&amp;",
)
INVALID = (
    b"\x80",
    b"\x8c",
    b"\xbf",
    b"\xc3",
    b"\xe2\x82",
    b"\xf0\x9f",
    b"\xf0\x9f\x98",
    b"\xc0\xaf",
    b"\xe0\x80\xaf",
    b"\xed\xa0\x80",
    b"\xf5",
    b"\xff",
)
MARKUP = (
    b"<p>",
    b"</p>",
    b"<b>",
    b"</b>",
    b"<div>",
    b"</div>",
    b"<table>",
    b"</table>",
    b"<br>",
    b"\x00",
    b"</span>",
    *(middle for _, middle, _ in REMOVED.values()),
)


def random_page(rng: random.Random) -> tuple[bytes, str | None]:
    """A page declared UTF-8 one of `DECLARATIONS`' ways, of random text, invalid bytes and markup."""
    front, encoding = DECLARATIONS[rng.choice(list(DECLARATIONS))]
    pieces = [rng.choice(rng.choice((TEXT, INVALID, MARKUP))) for _ in range(rng.randint(1, 40))]
    return front + b"".join(pieces), encoding


def test_random_pages_declared_utf8_prune_as_their_decoded_text() -> None:
    """A small fixed-seed sweep (/tmp/s43/F4's script runs 2,000 pages of the same generator)."""
    rng = random.Random(20261207)
    for _ in range(150):
        data, encoding = random_page(rng)
        assert prune_html(data, encoding=encoding) == prune_text(decode_html(data, encoding=encoding).text), (
            data,
            encoding,
        )
