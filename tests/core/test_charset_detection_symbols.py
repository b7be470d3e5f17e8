"""service.core.charset_detection: undeclared windows-1252 pages whose only non-ASCII bytes are symbols
("£££" price levels, "5µg"), and the Cyrillic, Central European and East Asian pages that must stay
as they were read."""

from __future__ import annotations

import pytest

from service.core import charset_detection
from service.core.charset_detection import FEW_FOREIGN_BYTES, detect_encoding
from service.core.decoding import decode_html
from service.core.prune import prune_html

ENGLISH = "<html><body>" + (
    "<p>We spent the week walking around the old town and the river banks, looking at churches.</p>" * 8
)
# A review's cases: each was read as another script or another Latin encoding ("ЈЈЈ" in windows-1251,
# "ŁŁ" in windows-1250, "ľg" in iso-8859-2, "ĄĄ" in windows-1250), one "£" or "€" correctly.
SYMBOLS = ["£££", "££", "££££", "¥¥", "¥¥¥", "µg", "5µg", "10 µm", "©©", "±±", "¼¼", "³³", "»»", "¿¿", "(££)"]


def _sentence(symbol: str) -> str:
    return f"<p>The Old Bell: price range {symbol}, open daily.</p>"


@pytest.mark.parametrize("symbol", SYMBOLS)
@pytest.mark.parametrize("head", ["", ENGLISH])
def test_symbols_between_english_words_are_windows_1252(head: str, symbol: str) -> None:
    """Alone or after a paragraph of English, with nothing else non-ASCII (no Welsh "Môn" to give the
    alphabets a Western letter)."""
    page = head + _sentence(symbol)
    decoded = decode_html(page.encode("cp1252"))
    assert (decoded.text, decoded.encoding) == (page, "cp1252")


def test_the_reviewers_page_prunes_with_its_pound_signs() -> None:
    """What `htmllm prune -` printed: "price range ЈЈЈ"."""
    pruned = prune_html(_sentence("£££").encode("cp1252"))
    assert "price range £££, open daily." in pruned


@pytest.mark.parametrize(("levels", "unit"), [(30, "£££"), (400, "£££"), (400, "¥¥"), (400, "5µg")])
def test_a_listing_of_many_price_levels_is_windows_1252(levels: int, unit: str) -> None:
    """Past `FEW_FOREIGN_BYTES` the detector's guess, re-ranked among the Latin readings, decides:
    windows-1250 ("ŁŁŁ") or iso-8859-2 ("5ľg") before."""
    rows = "".join(f"<li>Pub {i}: price range {unit}, open daily.</li>" for i in range(levels))
    page = ENGLISH + rows + "</body></html>"
    data = page.encode("cp1252")
    assert (len(data.translate(None, bytes(range(128)))) > FEW_FOREIGN_BYTES) == (levels == 400)
    assert decode_html(data).text == page


def test_a_reading_that_makes_a_repeated_byte_odd_still_pays_for_it() -> None:
    """iso-8859-15's "€€€€" is "¤¤¤¤" in windows-1252 (a German corpus page's price range): the run
    counts once, as a lone "¤", and that still rules windows-1252 out."""
    page = ENGLISH + "<p>Grüße aus Köln. Preis: <span>€€€€</span> und <span>€€</span>.</p>"
    decoded = decode_html(page.encode("iso8859_15"))
    assert (decoded.text, decoded.encoding) == (page, "iso8859-15")


def test_a_micro_sign_before_a_vowel_keeps_iso_8859_2_s_slovak_letter() -> None:
    """A Slovak word that starts with "ľ" has a vowel after it: 0xB5 there is no unit's prefix."""
    for text in ("ľudia", "ľahko", "veľký"):
        page = f"{ENGLISH}<p>See {text} here.</p>"
        assert decode_html(page.encode("iso8859_2")).text == page, text
    sample = f"{ENGLISH}<p>10 µg, 5µm, 20 µA</p>".encode("cp1252")
    assert charset_detection._best_latin_reading(sample, "iso8859-2")[0] == "cp1252"


@pytest.mark.parametrize(
    ("encoding", "word"),
    [
        ("cp1250", "Michał"), ("cp1250", "Łódź"), ("cp1250", "Dvořák"), ("cp1250", "że"),
        ("cp1250", "Wałęsa"), ("cp1250", "Żywiec"), ("cp1250", "Łza"), ("cp1250", "žluťoučký kůň"),
        ("iso8859_2", "Šimon"), ("iso8859_2", "Michał"), ("cp1251", "Москва"), ("cp1251", "Україна"),
        ("cp1251", "Привет мир"), ("cp1254", "Türkiye"), ("gb18030", "北京"), ("gb18030", "你好"),
    ],
)  # fmt: skip
def test_foreign_words_beside_repeated_bytes_keep_their_encoding(encoding: str, word: str) -> None:
    """A page with a word of another encoding, alone and beside the bytes of "££" (in a double-byte
    encoding "＃＃", in windows-1250 "ŁŁ"): the word decides, the run says nothing."""
    data = f"{ENGLISH}<p>See {word} here.</p>".encode(encoding)
    for page in (data, data + _sentence("££").encode("cp1252")):
        assert decode_html(page).text == page.decode(encoding), page[-60:]


RUSSIAN = (
    "<p>Москва - столица России, город федерального значения. Её называют сердцем страны, и ее улицы "
    "полны людей. Ж - буква алфавита, а ЖЖ - сокращение.</p>"
)
CZECH = "<p>Příliš žluťoučký kůň úpěl ďábelské ódy. Šťastný Šimon šel ke skále.</p>"
POLISH = "<p>Zażółć gęślą jaźń. Michał był w Łodzi, a Wałęsa w Gdańsku. Ąą Łł.</p>"


@pytest.mark.parametrize(
    ("encoding", "text"),
    [
        ("cp1251", RUSSIAN), ("koi8_r", RUSSIAN), ("cp1250", CZECH), ("iso8859_2", CZECH),
        ("cp1250", POLISH), ("iso8859_2", POLISH),
    ],
)  # fmt: skip
@pytest.mark.parametrize("repeat", [1, 8])
def test_undeclared_cyrillic_and_central_european_pages_stay_right(
    encoding: str, text: str, repeat: int
) -> None:
    """Whole paragraphs, short (the few-foreign-bytes contest) and long (the detector's guess), with
    rows of no-break spaces between them; the Russian one's "ее" and "ЖЖ" are repeated bytes too."""
    page = "<html><body>" + (text + "<p>\xa0\xa0\xa0</p>") * repeat + "</body></html>"
    decoded = decode_html(page.encode(encoding))
    assert decoded.text == page, decoded.encoding


@pytest.mark.parametrize(
    ("encoding", "text"),
    [
        ("euc_kr", "<p>서울은 대한민국의 수도이며 가장 큰 도시이다. 한강이 도시를 가로질러 흐른다.</p>"),
        ("gb18030", "<p>北京是中华人民共和国的首都，也是全国的政治和文化中心。</p>"),
        ("euc_jp", "<p>東京は日本の首都であり、最大の都市です。</p>"),
    ],
)
@pytest.mark.parametrize("repeat", [1, 10])
def test_double_byte_readings_see_a_repeated_byte_whole(encoding: str, text: str, repeat: int) -> None:
    """Two ideographic spaces between tags are 0xA1 four times in EUC-KR, GBK and EUC-JP: read as one
    byte, the run would be a lone lead byte, and the detector read such Korean pages as windows-874."""
    page = "<html><body>" + (text + "<p>\u3000\u3000</p>" * 3) * repeat + "</body></html>"
    data = page.encode(encoding)
    assert b"<p>\xa1\xa1\xa1\xa1</p>" in data
    assert decode_html(data).text == page


def test_a_repeated_byte_counts_once_only_where_it_stands_alone() -> None:
    """Between ASCII non-letters, with an ASCII byte below 0x40 after it (no second byte of a double-byte
    encoding); never inside a word ("jää", "Öö") or a longer run."""
    runs = [m.group() for m in charset_detection._REPEATED_BYTE.finditer(
        "a £££, (££) ¥¥<b> jää Öö xµµ ££Price ££".encode("cp1252")
    )]  # fmt: skip
    assert runs == [b"\xa3\xa3\xa3", b"\xa3\xa3", b"\xa5\xa5", b"\xa3\xa3"]
    assert detect_encoding(("jää " * 3 + "Öö").encode("iso8859_15")) in ("cp1252", "iso8859-15")


@pytest.mark.parametrize(
    "text",
    [
        'Our partner: ООО "Gazprom Neft", Moscow.',
        "© 2012 ООО «Intersoft Lab». All rights reserved.",
        "Format: ДД.ММ.ГГГГ",
        "ИП и ООО",
        "ООО, РФ",
        "Ну ммм... ааа!",
    ],
)
def test_a_russian_word_of_one_letter_repeated_keeps_windows_1251(text: str) -> None:
    """Russian writes words as one letter repeated: "ООО" (the LLC in every company name), "ГГГГ" in a
    date's placeholder. Collapsing every repeated byte made such a page's only Cyrillic run one letter,
    which counts for no alphabet, and windows-1252 won the tie: "ÎÎÎ", "ÃÃÃÃ" (an adversarial review).
    Only bytes that are symbols in windows-1252 ("£", "»") are collapsed."""
    page = f"<html><body><p>{text}</p></body></html>"
    assert decode_html(page.encode("cp1251")).text == page


@pytest.mark.parametrize("word", ["ľnený", "Materiál: ľnený"])
def test_a_slovak_word_with_l_caron_before_n_keeps_iso_8859_2(word: str) -> None:
    """No unit begins with "n": "µn" is Slovak "ľn" ("ľnený", linen), which the unit rule had read as a
    micro sign in windows-1252."""
    page = f"<html><body><p>{word}</p></body></html>"
    assert decode_html(page.encode("iso8859_2")).text == page
