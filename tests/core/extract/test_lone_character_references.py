"""resiliparse keeps a lone character between tags written as a character reference as it keeps the raw
character (`extractors._LONE_CHARACTER`): `<em>&bdquo;</em>`, `<span>&euro;</span>` lost their
character, on all-ASCII pages too, while the same page with the raw „ and € kept it."""

from __future__ import annotations

import pytest

from service.core.extract import InlineRunner, extract
from service.core.extract.extractors import keep_lone_characters, run_extractor
from tests.core.test_extract import article, page

INLINE = InlineRunner()


def cell_page(lone: str) -> str:
    """An English article (all ASCII) and a paragraph with `lone` alone in its own element."""
    return page(article(4) + f"<p>The title reads <em>{lone}</em>Harbour<em>{lone}</em> today.</p>")


def resiliparse_text(html: str) -> str:
    return run_extractor("resiliparse", html).text


@pytest.mark.parametrize(
    ("reference", "character"),
    [
        ("&bdquo;", "\u201e"),
        ("&ldquo;", "\u201c"),
        ("&euro;", "\u20ac"),
        ("&ndash;", "\u2013"),
        ("&hellip;", "\u2026"),
        ("&rarr;", "\u2192"),
        ("&bull;", "\u2022"),
        ("&#x89aa;", "\u89aa"),
        ("&#X89AA;", "\u89aa"),
        ("&#35242;", "\u89aa"),
        ("&#0008364;", "\u20ac"),
        ("&#x20ac", "\u20ac"),  # the ";" is optional after a number
        ("&#150;", "\u2013"),  # 0x80-0x9F are windows-1252 to an HTML parser: an en dash
        ("&#0;", "\ufffd"),  # U+FFFD to the parser, as a raw one it is kept
        ("&#" + "9" * 5000 + ";", "\ufffd"),  # past U+10FFFF; too long for `int`
    ],
)
def test_a_lone_character_written_as_a_reference_is_kept_as_the_raw_one_is(
    reference: str, character: str
) -> None:
    referenced, raw = cell_page(reference), cell_page(character)
    assert referenced.isascii()  # no non-ASCII character skipped the pass
    expected = resiliparse_text(raw)
    assert f"reads {character}Harbour{character} today." in expected
    assert resiliparse_text(referenced) == expected


def test_the_union_keeps_the_quotes_and_the_euro_sign_of_a_page_that_writes_them_as_references() -> None:
    tail = (
        "<p>The title reads <em>{0}</em>Harbour<em>{1}</em> and costs <span>20</span> <span>{2}</span>.</p>"
    )
    referenced = page(article(4) + tail.format("&bdquo;", "&ldquo;", "&euro;"))
    raw = page(article(4) + tail.format("\u201e", "\u201c", "\u20ac"))
    union = extract(referenced, runner=INLINE)
    assert union.extractor == "resiliparse"
    assert "reads \u201eHarbour\u201c and costs 20 \u20ac." in union.text
    assert union.text == extract(raw, runner=INLINE).text


@pytest.mark.parametrize(
    "lone",
    [
        "&amp;",
        "&lt;",
        "&gt;",
        "&nbsp;",
        "&copy;",
        "&copy",  # a Latin-1 name valid without ";": two UTF-8 bytes, never skipped
        "&amp;euro;",  # the text "&euro;", decoded once
        "&euro",  # no reference: "euro" is no name without ";"
        "&EURO;",  # no name: names are case-sensitive
        "&NotEqualTilde;",  # two characters, no lone one
        "&#x7ff;",  # two UTF-8 bytes
        "&#x10000;",  # four UTF-8 bytes
        "&#xe001;",  # private use: an icon, still skipped
        "&#32;",
        "&#129;",  # one of the five bytes windows-1252 leaves undefined: a C1 control
    ],
)
def test_references_resiliparse_does_not_skip_or_that_are_icons_are_left_as_they_are(lone: str) -> None:
    html = cell_page(lone)
    assert keep_lone_characters(html) == html


def test_a_reference_is_decoded_once_and_an_icon_reference_is_still_skipped() -> None:
    text = resiliparse_text(cell_page("&amp;euro;"))
    assert "reads &euro;Harbour&euro; today." in text and "\u20ac" not in text
    text = resiliparse_text(cell_page("&#xe001;"))
    assert "reads Harbour today." in text and "\ue001" not in text and "\u2060" not in text


def test_a_reference_not_alone_between_tags_is_left_as_it_is() -> None:
    """Only a node of the one character is skipped: a reference inside text, or beside another
    character, is extracted already."""
    for html in (
        page("<p>costs 20&euro; in <span>x&euro;</span> and <span>&euro;x</span></p>"),
        page("<p><span>&euro;&euro;</span> <a href='?a=1&amp;b=2'>&euro; x</a></p>"),
    ):
        assert keep_lone_characters(html) == html
