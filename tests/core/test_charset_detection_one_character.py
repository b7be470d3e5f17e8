"""service.core.charset_detection: undeclared pages whose only non-ASCII bytes are one pair
(`_one_double_byte_character`): a CJK character alone reads as CJK, Western pages stay Western."""

from __future__ import annotations

import pytest

from service.core import charset_detection
from service.core.charset_detection import detect_encoding
from service.core.decoding import decode_html


def _title_page(title: str) -> str:
    """A page that is ASCII markup but for its title, as a short legacy CJK page (or a stub) is."""
    return (
        f"<html><head><title>{title}</title></head>"
        '<body><div id="main"><p>Welcome. <a href="/index.html">Home</a> | '
        '<a href="/about.html">About</a></p></div></body></html>'
    )


# One character of each encoding's common rows whose windows-1252 reading is two non-ASCII letters or a
# symbol and a letter standing alone ("ÖÐ", "Œ©", "¥é", "ªÅ"), and that no encoding earlier in the
# contest's order reads as a common character. Each read as windows-1252 (or another Latin reading)
# before the rule.
ONE_CHARACTER = [
    ("gb18030", "中"),  # "ÖÐ"
    ("gb18030", "我"),  # "ÎÒ"
    ("gb18030", "关"),  # "¹Ø"
    ("cp932", "見"),  # "Œ©"
    ("cp932", "時"),  # "Žž"
    ("euc_jp", "ラ"),  # "¥é"
    ("euc_jp", "テ"),  # "¥Æ"
    ("big5hkscs", "光"),  # "¥ú"
    ("big5hkscs", "空"),  # "ªÅ"
    ("big5hkscs", "旅"),  # "®È"
]


@pytest.mark.parametrize(("codec", "character"), ONE_CHARACTER)
def test_a_page_whose_text_is_one_cjk_character_reads_as_cjk(codec: str, character: str) -> None:
    page = _title_page(character)
    data = page.encode(codec)
    assert len(data.translate(None, bytes(range(128)))) == 2
    decoded = decode_html(data)
    assert (decoded.text, decoded.encoding, decoded.source) == (page, codec, "detected")


@pytest.mark.parametrize(("codec", "character"), ONE_CHARACTER)
def test_one_cjk_character_beside_ascii_punctuation_reads_as_cjk(codec: str, character: str) -> None:
    """A title of a number and the character ("2024年"), or the character and a site name after a dash."""
    for title in (f"2024{character}", f"{character} - Example", f"[{character}]"):
        page = _title_page(title)
        assert decode_html(page.encode(codec)).text == page, title


def test_a_cjk_page_cut_after_its_first_character_reads_as_cjk() -> None:
    """A crawler's byte cap inside the second character: the first is all the detector has."""
    data = "<html><head><title>中国人民</title>".encode("gb18030")[:22]  # "中" and the lead byte of "国"
    assert detect_encoding(data) == "gb18030"
    assert decode_html(data).text == "<html><head><title>中\ufffd"


def test_one_korean_syllable_reads_as_the_more_common_cjk_encoding() -> None:
    """Every EUC-KR syllable is a common GB2312 hanzi too ("한" is "茄"): one alone cannot tell the two
    apart, so it reads as GBK, first in the order, as "日" in EUC-JP does ("泣"); not as windows-1252's
    "ÇÑ" and "Æü"."""
    assert detect_encoding(_title_page("한").encode("cp949")) == "gb18030"
    assert detect_encoding(_title_page("日").encode("euc_jp")) == "gb18030"


# Western pages whose only non-ASCII bytes are two adjacent ones (one pair, the last two apart), as real
# pages write them: beside or inside ASCII words, punctuation, white space, symbols; each stays windows-1252.
WESTERN_PAIRS = [
    "GRÖßE 42",  # two letters inside an ASCII word ("Öß" is GBK's "诌", a common-row character)
    "Nestlé® products",  # a letter after ASCII, a symbol after it
    "Home »\xa0News",  # breadcrumbs: a guillemet and a no-break space
    "1990–\xa0today",
    '“È vero" she said',  # an Italian opening quote and a capital: Shift_JIS's level-1 "栃"
    "Rendez-vous à\xa0Paris",
    "¿Ó no?",
    "Þú ert",  # Icelandic: two letters alone, but rare-row characters in every CJK encoding
    "20 m²·h",
    "© 2024 – Acme",  # two single bytes
]


@pytest.mark.parametrize("text", WESTERN_PAIRS)
def test_a_western_page_with_two_adjacent_non_ascii_bytes_stays_western(text: str) -> None:
    page = _title_page(text)
    decoded = decode_html(page.encode("cp1252"))
    assert (decoded.text, decoded.encoding) == (page, "cp1252")


@pytest.mark.parametrize(
    ("text", "implausible"),
    [
        ("ÖÐ", True),
        ("°ê", True),  # a symbol and a letter
        ("ªº", False),  # ordinal indicators ("1º"), no letters here: Big5's "的" stays Latin
        ("º¹", False),  # a real page's (a script's)
        ("xÖÐ", False),  # an ASCII letter before
        ("ÖÐy", False),
        ("“ú", False),  # punctuation
        ("é\xa0", False),  # white space
        ("é’", False),  # an apostrophe
        ("©®", False),  # no letter
    ],
)
def test_the_pair_is_implausible_as_latin_only_alone_and_with_a_letter(text: str, implausible: bool) -> None:
    sample = f" {text} ".encode("cp1252")
    start = next(i for i, b in enumerate(sample) if b >= 0x80)
    assert charset_detection._implausible_latin_pair(sample, start, "cp1252") is implausible


def test_mis_declared_or_undeclared_utf8_pairs_are_not_this_rule_s() -> None:
    """UTF-8's "é" is "Ã©" in windows-1252: undeclared, the bytes are valid UTF-8 (read before the
    detector); declared windows-1252, they are read as declared."""
    page = _title_page("é")
    assert decode_html(page.encode("utf-8")).text == page
    declared = decode_html(page.encode("utf-8"), encoding="iso-8859-1")
    assert (declared.text, declared.source) == (_title_page("Ã©"), "declared")
