"""What every extractor's input and output go through, in one place (`extractors.run_extractor`).

- **Input: ruby annotations are dropped.** Japanese (and some Chinese) pages print readings over their
  characters with `<ruby>漢<rt>かん</rt></ruby>` (furigana). resiliparse (main content) and jusText put
  the readings into the text ("子こどもへの体罰たいばつ", where a reader sees "子どもへの体罰");
  trafilatura left them out. So `<rt>` and `<rp>` (the fallback parentheses) go, with their text, before
  any extractor sees the page, and the `<ruby>`, `<rb>` and `<rtc>` tags around the base text go too
  (their text stays), so the base text joins the text node of its sentence: resiliparse's main-content
  mode drops a lone character between tags ("<ruby>子</ruby>どもへの<ruby>体罰</ruby>を" came out
  "どもへの体罰"; `extractors.run_resiliparse` keeps such characters everywhere else).
- **Output: one form of the same text.** resiliparse and jusText keep the invisible format characters
  of the page inside words ("Mit\\xadtel\\xadal\\xadter": soft hyphens, in 28 union outputs of the corpus;
  BOMs, zero-width spaces, bidi marks), trafilatura strips them: the same page's text differed per
  extractor, defeating exact deduplication and snippet matching. Every output is cleared of them
  (`INVISIBLE_FORMAT`), gets U+2028/U+2029 as newlines, and is put in NFC.
- **Input of the lxml-based extractors: only characters XML can hold** (`xml_compatible`). An HTML
  parser keeps a C0 control character, raw or written as a reference (`&#11;`, `&#x1a;`), and U+FFFE
  and U+FFFF; libxml2 keeps them too, but lxml refuses them in any string set on a tree. trafilatura
  returned empty text, and no error, for a page holding one such reference (0 words where it found 293
  without it), and jusText raised "All strings must be XML compatible" on binary input (random bytes,
  a PNG body) where the other two extractors' output fails the filter. So, for trafilatura and
  jusText, vertical tab and form feed (whitespace to Python) become a space and the others U+FFFD:
  unreadable characters (`word_count`) as the controls are in resiliparse's text, so binary input still
  fails the filter as unreadable.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable
from typing import Final

# Format characters (category Cf) that are part of how text is written, so they are neither dropped
# from extracted text nor unreadable: the joiners (ZWNJ is spelling in Persian and the Indic scripts,
# ZWJ in Indic conjuncts and emoji sequences) and the prepended concatenation marks, visible signs
# that enclose the digits after them (Arabic number signs, the end-of-ayah mark, Kaithi and Syriac ones).
KEPT_FORMAT: Final = frozenset(
    {0x200C, 0x200D, *range(0x0600, 0x0606), 0x06DD, 0x070F, 0x0890, 0x0891, 0x08E2, 0x110BD, 0x110CD}
)
# Every assigned code point is below this or in plane 14 (tags, variation selectors): the planes in
# between hold private-use and unassigned code points only, no letter, space or format character (a
# test checks it for the running Python).
ASSIGNED_BOUND: Final = 0x40000
PLANE_14: Final = range(0xE0000, 0xF0000)


def is_invisible_format(code_point: int) -> bool:
    """Whether a code point is an invisible format character: category Cf but not `KEPT_FORMAT` (soft
    hyphen, zero-width space, word joiner, BOM, bidi marks, embeddings and isolates, tags, ...)."""
    return code_point not in KEPT_FORMAT and unicodedata.category(chr(code_point)) == "Cf"


def code_point_ranges(code_points: Iterable[int]) -> tuple[tuple[int, int], ...]:
    """Ascending code points as (first, last) ranges."""
    ranges: list[tuple[int, int]] = []
    for code_point in code_points:
        if ranges and ranges[-1][1] == code_point - 1:
            ranges[-1] = (ranges[-1][0], code_point)
        else:
            ranges.append((code_point, code_point))
    return tuple(ranges)


def character_class(ranges: Iterable[tuple[int, int]]) -> str:
    """A regular expression's character class of these (first, last) ranges."""
    return "[" + "".join(f"{re.escape(chr(low))}-{re.escape(chr(high))}" for low, high in ranges) + "]"


# Built once at import (80 ms), so the forkserver that starts the extractor workers holds it already.
INVISIBLE_FORMAT: Final = code_point_ranges(
    c for c in (*range(ASSIGNED_BOUND), *PLANE_14) if is_invisible_format(c)
)
_INVISIBLE: Final = re.compile(character_class(INVISIBLE_FORMAT))

# A tag name ends at HTML whitespace, "/" or ">" (as in `limits`).
_NAME_END = r"(?=[\t\n\f\r />])"
_RUBY: Final = re.compile(rf"<r(?:[tpb]|tc|uby){_NAME_END}", re.IGNORECASE)
# Comments, scripts and styles are matched first and kept as they are, so an "<rt>" inside one cannot
# remove the "-->" or "</script>" that ends it (an unclosed one runs to the end, as it does in a
# browser: one scan, not one per start). Then an annotation: its start tag, its text up to the next
# tag, and its own end tag when that is the next tag. An end tag is optional (`<rt>かん</ruby>`); where
# the next tag is another, the annotation ends there, so no base text after it is ever removed
# (`<rt><span>かん</span></rt>` keeps the reading in the span). Last, a `<ruby>`, `<rb>` or `<rtc>` tag,
# start or end, without its content.
_RUBY_MARKUP: Final = re.compile(
    rf"(<!--(?:.*?-->|.*)|<(script|style){_NAME_END}(?:.*?</\2\s*>|.*))"
    rf"|<(r[tp]){_NAME_END}[^>]*>?[^<]*(?:</\3\s*>)?"
    rf"|</?(?:ruby|rb|rtc){_NAME_END}[^>]*>?",
    re.IGNORECASE | re.DOTALL,
)


def drop_ruby_annotations(html: str) -> str:
    """`html` without ruby annotations (`<rt>`, `<rp>`, with their text) and ruby tags (`<ruby>`, `<rb>`,
    `<rtc>`, their text kept); the page itself when it has none."""
    if _RUBY.search(html) is None:
        return html
    return _RUBY_MARKUP.sub(r"\1", html)  # an unmatched group is "": the markup goes


# Characters XML 1.0 cannot hold, raw or as a numeric character reference (decimal or hexadecimal, with or
# without the ";", leading zeros allowed, ending where its digits end, as HTML parsers read one): C0
# controls other than tab, line feed and carriage return, and U+FFFE and U+FFFF. (`&#0;`, surrogates and
# code points past U+10FFFF are U+FFFD to libxml2 already; C1 references are windows-1252 to it, as HTML
# says.) A page is looked through for each character alone (`in`: 0.14 ms a corpus page) and for the
# references (a pattern that starts with "&#": 0.07 ms) before anything is replaced: one class of the
# characters took 0.5 ms, an alternation of both 1.2 ms.
_XML_UNSAFE_CHARACTER = "[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]"
_XML_UNSAFE_RAW: Final = (*(chr(c) for c in range(0x20) if c not in (0x09, 0x0A, 0x0D)), "\ufffe", "\uffff")
_XML_UNSAFE_REFERENCE = (
    r"&#(?:0*(?:[1-8]|1[124-9]|2[0-9]|3[01]|6553[45])(?![0-9])"
    r"|[xX]0*(?:[1-8bBcCeEfF]|1[0-9a-fA-F]|[fF]{3}[eEfF])(?![0-9a-fA-F]));?"
)
_XML_UNSAFE_REFERENCES: Final = re.compile(_XML_UNSAFE_REFERENCE)
_XML_UNSAFE: Final = re.compile(f"{_XML_UNSAFE_CHARACTER}|{_XML_UNSAFE_REFERENCE}")
# Vertical tab and form feed are whitespace to `str.split`, and a space where they stood; the rest are
# unreadable, as U+FFFD is.
_AS_SPACE: Final = frozenset({0x0B, 0x0C})


def _xml_replacement(match: re.Match[str]) -> str:
    found = match.group()
    if len(found) == 1:
        code_point = ord(found)
    else:
        digits = found[2:].rstrip(";")
        code_point = int(digits[1:], 16) if digits[0] in "xX" else int(digits)
    return " " if code_point in _AS_SPACE else "\ufffd"


def xml_compatible(html: str) -> str:
    """`html` with every character XML cannot hold, raw or as a reference, a space (vertical tab, form
    feed) or U+FFFD (the rest); the page itself when it has none."""
    if not any(c in html for c in _XML_UNSAFE_RAW) and _XML_UNSAFE_REFERENCES.search(html) is None:
        return html
    return _XML_UNSAFE.sub(_xml_replacement, html)


def normalize_text(text: str) -> str:
    """Extracted text without invisible format characters, with U+2028/U+2029 as newlines, in NFC."""
    if text.isascii():
        return text
    text = _INVISIBLE.sub("", text)
    if "\u2028" in text or "\u2029" in text:
        text = text.replace("\u2028", "\n").replace("\u2029", "\n")
    # A text made only of invisible characters is empty now, not whitespace.
    return unicodedata.normalize("NFC", text).strip()
