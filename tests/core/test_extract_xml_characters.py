"""trafilatura and jusText parse with lxml, which refuses characters XML cannot hold: a page holding one
such character reference had trafilatura return nothing, and binary input had jusText raise, where the
documented outcome is text that fails the filter. They see such characters as a space or U+FFFD."""

from __future__ import annotations

import random

import pytest

from service.core.extract import EXTRACTORS, ExtractionError, InlineRunner, extract, extract_all
from service.core.extract.normalize import xml_compatible
from tests.core.test_extract import SENTENCES, article, page

INLINE = InlineRunner()


def _article_with(inserted: str) -> str:
    return page(f"<article><p>Before{inserted}after, the harbour.</p>{article(6)}</article>")


@pytest.mark.parametrize("reference", ["&#11;", "&#1;", "&#x1a;", "&#X1F", "&#0012;", "&#xFFFE;", "&#65535;"])
def test_a_reference_to_a_character_xml_cannot_hold_leaves_trafilatura_its_text(reference: str) -> None:
    """0 words, no error: trafilatura's lxml tree could not hold the character."""
    words = extract(_article_with(""), "trafilatura", runner=INLINE).words
    result = extract(_article_with(reference), "trafilatura", runner=INLINE)
    assert result.passed and result.words >= words > 200
    assert SENTENCES[1] in result.text


@pytest.mark.parametrize("raw", ["\x01", "\x0b", "\x1f", "\ufffe", "\uffff"])
def test_a_raw_character_xml_cannot_hold_beside_a_dropped_element_leaves_justext_its_text(raw: str) -> None:
    """lxml_html_clean joins the text around a dropped <script>: "All strings must be XML compatible"."""
    html = _article_with(f"{raw}<script>var x = 1;</script>{raw}")
    for name, result in extract_all(html, runner=INLINE).items():
        assert not isinstance(result, ExtractionError), (name, result)
        assert result.passed and SENTENCES[1] in result.text, name


def test_binary_input_fails_the_filter_with_every_extractor_and_raises_in_none() -> None:
    """200 KB of random bytes: jusText raised (extraction_failed) where resiliparse's and trafilatura's
    outputs failed the filter, as docs/extraction.md says binary input does."""
    data = random.Random(7).randbytes(200_000)
    results = extract_all(data, runner=INLINE)
    for name in EXTRACTORS:
        result = results[name]
        assert not isinstance(result, ExtractionError), (name, result)
        assert not result.passed, name
    union = extract(data, runner=INLINE)
    assert not union.passed and all(a.error is None for a in union.attempts)


@pytest.mark.parametrize(
    ("html", "expected"),
    [
        ("a&#11;b&#12;c&#x0b;d&#x000C;e", "a b c d e"),  # vertical tab and form feed: whitespace
        ("a&#1;b&#x11;c&#31d&#x1A;e", "a\ufffdb\ufffdc\ufffdd\ufffde"),
        ("a\x00b\x08c\x0bd\x0ce\x1ff\ufffeg\uffffh", "a\ufffdb\ufffdc d e\ufffdf\ufffdg\ufffdh"),
        ("&#xFFFE;&#65535;&#xfffd;", "\ufffd\ufffd&#xfffd;"),
        # Kept: XML characters, other code points whose digits start alike, and what libxml2 maps.
        ("&#9;&#10;&#13;&#32;&#110;&#x10b;&#x1fffe;&#655350;&#0;&#150;&#x9f;&#xD800;", None),
        ("tab\tnewline\nreturn\r del\x7f nel\x85", None),
    ],
)
def test_xml_compatible_replaces_only_what_xml_cannot_hold(html: str, expected: str | None) -> None:
    assert xml_compatible(html) == (html if expected is None else expected)
