"""Pin each extractor's behaviour on generated pages, the union's fall-through, and the time limit."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import justext
import pytest

from service.cli import main
from service.core.decoding import decode_html
from service.core.errors import ErrorCode
from service.core.extract import (
    EXTRACTORS,
    LIMITS,
    Extraction,
    ExtractionError,
    ExtractionOptionsError,
    ExtractionTimeoutError,
    ExtractorLimits,
    ExtractorPool,
    InlineRunner,
    count_words,
    detect_language,
    extract,
    extract_all,
    extractors,
    resolve_order,
    stoplist_name,
    unreadable_chars,
)
from service.core.extract.extractors import JUSTEXT_STOPLISTS, mostly_cjk
from service.core.extract.normalize import drop_ruby_annotations, normalize_text
from service.core.extract.word_count import CJK_RANGES
from tests.core.test_extract_word_count import SCRIPT_WORDS, unspaced_text
from tests.memory import vm_data_mib

# ---------------------------------------------------------------------------------------------------
# Generated pages

SENTENCES = [
    "The harbour town was rebuilt after the storm of 1953, and most of its houses still face the sea.",
    "Fishermen there have sold their catch on the same stone quay for more than three hundred years.",
    "In the early morning the market is busy with buyers from the restaurants of the nearby city.",
    "A small museum near the church tells the story of the families who lived from the water.",
    "Visitors who walk along the dunes in the evening can often watch seals resting on the sandbanks.",
    "The local council has protected the old lighthouse, which was switched off in the nineteen sixties.",
    "Children from the village school learn to sail in the sheltered bay during the summer months.",
    "When the tide is low, it is possible to walk across the mudflats to the island with a guide.",
    "The bakery on the main street is known for a dark rye bread that is made with sea salt.",
    "Most of the visitors come in July and August, but the town is at its most beautiful in autumn.",
    "An old ferry still connects the harbour with the islands twice a day, even in the winter.",
    "The writer who lived in the house by the canal described the light of the coast in her letters.",
]
GERMAN = [
    "Die kleine Stadt am Fluss wurde nach dem großen Hochwasser vollständig wieder aufgebaut.",
    "Viele Häuser in der Altstadt sind älter als dreihundert Jahre und stehen heute unter Denkmalschutz.",
    "Auf dem Marktplatz verkaufen die Bauern aus der Umgebung jeden Samstag ihr Obst und Gemüse.",
    "Im Sommer fahren die Schiffe zweimal täglich flussabwärts bis zur nächsten größeren Stadt.",
    "Das Museum neben der Kirche erzählt die Geschichte der Familien, die vom Fluss gelebt haben.",
    "Für Besucher gibt es außerdem einen schönen Wanderweg durch die Weinberge oberhalb der Stadt.",
]
RUSSIAN = [
    "Маленький город на берегу реки был полностью восстановлен после большого наводнения.",
    "Многие дома в старом городе построены более трёхсот лет назад и сегодня охраняются государством.",
    "По субботам на рыночной площади крестьяне из окрестных деревень продают овощи и фрукты.",
    "Летом корабли два раза в день ходят вниз по реке до следующего большого города.",
]
CHINESE = [
    "这座海边小镇在一九五三年的大风暴之后重建，镇上大多数房屋至今仍然面向大海。",
    "三百多年来，渔民们一直在同一个石头码头上出售他们每天捕到的新鲜鱼虾。",
    "清晨的市场非常热闹，附近城市的餐馆老板们早早就来这里挑选最好的海产。",
    "教堂旁边的一座小博物馆讲述了世世代代靠海为生的家庭的故事和他们的生活。",
    "傍晚沿着沙丘散步的游客常常可以看到海豹躺在沙洲上休息，晒着最后的阳光。",
    "当地政府保护了那座古老的灯塔，它在上世纪六十年代就已经停止使用了。",
]
JAPANESE = [
    "この港町は一九五三年の大きな嵐の後に再建され、ほとんどの家は今も海に面している。",
    "漁師たちは三百年以上も前から、同じ石の岸壁で毎朝その日の魚を売ってきた。",
    "早朝の市場は近くの町のレストランから来た買い手たちでとてもにぎわっている。",
    "教会の近くにある小さな博物館では、海とともに暮らしてきた家族の歴史を紹介している。",
    "夕方に砂丘を歩くと、砂州の上で休んでいるアザラシを見ることができる。",
    "地元の人々は、一九六〇年代に役目を終えた古い灯台を大切に守り続けている。",
]
TABLE_ROWS = [("Lindholm", "1432", "ferry"), ("Oster Bay", "877", "bridge"), ("Skarvik", "2210", "ferry")]
CODE_LINE = "return 1.8 * math.sin(hour / 12.42 * 2 * math.pi)"
NAV = ["Home", "News", "Travel", "Weather", "Sports", "Culture", "Shop", "Contact", "Login", "Newsletter"]


def article(n: int, start: int = 0, sentences: list[str] = SENTENCES) -> str:
    """n distinct paragraphs of three sentences each (trafilatura drops repeated paragraphs)."""
    paragraphs = []
    for i in range(n):
        k = start + 3 * i
        paragraphs.append(" ".join(sentences[(k + j) % len(sentences)] for j in range(3)))
    return "".join(f"<p>{p}</p>" for p in paragraphs)


def page(body: str, title: str = "The harbour town") -> str:
    return (
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{title}</title></head>'
        f"<body>{body}</body></html>"
    )


def table_page() -> str:
    rows = "".join(f"<tr><td>{a}</td><td>{b}</td><td>{c}</td></tr>" for a, b, c in TABLE_ROWS)
    table = (
        "<table><thead><tr><th>Island</th><th>Inhabitants</th><th>Access</th></tr></thead>"
        f"<tbody>{rows}</tbody></table>"
    )
    return page(
        f"<main><article><h1>Islands of the coast</h1>{article(3)}{table}{article(2, 5)}</article></main>"
    )


def code_page() -> str:
    code = f"def tide_height(hour):\n    {CODE_LINE}\n"
    return page(
        f"<main><article><h1>Computing the tide</h1>{article(3)}<pre><code>{code}</code></pre>"
        f"{article(2, 4)}</article></main>"
    )


def boilerplate_page() -> str:
    nav = "<nav><ul>" + "".join(f'<li><a href="/{w.lower()}">{w}</a></li>' for w in NAV) + "</ul></nav>"
    links = "".join(f'<li><a href="/s{i}">Story number {i} you might also like</a></li>' for i in range(15))
    side = f'<aside class="sidebar"><h3>Related stories</h3><ul>{links}</ul></aside>'
    foot = (
        "<footer><p>Copyright 2024 Coastal Media Group. All rights reserved.</p>"
        "<p>We use cookies to improve your experience. By continuing to browse you accept our cookie "
        'policy.</p><a href="/imprint">Imprint</a> <a href="/privacy">Privacy</a></footer>'
    )
    return page(
        f'<header><div class="logo">Coastal News</div>{nav}</header>'
        f'<div class="content"><article><h1>The harbour town</h1>{article(5)}</article>{side}</div>{foot}'
    )


def german_cp1252_page() -> bytes:
    """A windows-1252 page that says so only in its <meta http-equiv>."""
    html = (
        '<html><head><meta http-equiv="Content-Type" content="text/html; charset=windows-1252">'
        "<title>Die Stadt am Fluss</title></head><body><article><h1>Die Stadt am Fluss</h1>"
        f"{article(5, sentences=GERMAN)}</article></body></html>"
    )
    return html.encode("cp1252")


def russian_cp1251_page() -> bytes:
    """A windows-1251 page with no declaration in the page: the charset comes from HTTP."""
    html = f"<html><body><article><h1>Город</h1>{article(4, sentences=RUSSIAN)}</article></body></html>"
    return html.encode("cp1251")


def unspaced_page(sentences: list[str], charset: str, paragraphs: int = 4) -> bytes:
    """A Chinese or Japanese article (no spaces between words) in a legacy charset its <meta> names;
    each paragraph is every sentence once, long enough for jusText to call it good."""
    body = "".join(
        "<p>" + "".join(sentences[(i + j) % len(sentences)] for j in range(len(sentences))) + "</p>"
        for i in range(paragraphs)
    )
    html = (
        f'<html><head><meta charset="{charset}"><title>{sentences[0][:6]}</title></head>'
        f"<body><article><h1>{sentences[0][:8]}</h1>{body}</article></body></html>"
    )
    return html.encode(charset)


def pathological_page(paragraphs: int = 45_000) -> str:
    """About the most work the structural limits (`service.core.extract.limits`) let through: 45,000
    tiny paragraphs inside 40 `<div>`s, under jusText's and trafilatura's 50,000 tags and 2,000,000
    depth x tags, take jusText about 1.7 s and trafilatura 2.6 s. (jusText's classification of such
    paragraphs used to be quadratic: 5,000 took 6.7 s.)"""
    return "<html><body>" + "<div>" * 40 + "<p>alpha beta\n" * paragraphs + "</body></html>"


def deep_page(depth: int = 20_000) -> str:
    """20,000 nested `<div>x`: resiliparse's main-content pass takes over 10 s on it (its work grows with
    depth x elements), so every extractor refuses the page unless a test lifts the limits (`unlimited`)."""
    return "<html><body>" + "<div>x" * depth + "</body></html>"


INLINE = InlineRunner()


@pytest.fixture
def unlimited(monkeypatch: pytest.MonkeyPatch) -> None:
    """No structural limits, for the tests that need an extraction to really run long in a worker."""
    for name in EXTRACTORS:
        monkeypatch.setitem(LIMITS, name, ExtractorLimits(max_tags=10**12, max_nesting_work=10**18))


@pytest.fixture(scope="module")
def pool() -> Iterator[ExtractorPool]:
    with ExtractorPool(2) as shared:
        yield shared


def outputs(html: str | bytes, **kwargs: object) -> dict[str, Extraction]:
    results = extract_all(html, runner=INLINE, **kwargs)  # type: ignore[arg-type]
    assert all(isinstance(r, Extraction) for r in results.values()), results
    return {name: r for name, r in results.items() if isinstance(r, Extraction)}


def squash(text: str) -> str:
    return " ".join(text.split())


# ---------------------------------------------------------------------------------------------------
# Each extractor on each page


def test_table_page_every_extractor_keeps_the_cells_each_in_its_own_layout() -> None:
    out = outputs(table_page())
    for name in EXTRACTORS:
        assert "Islands of the coast" in out[name].text
        assert all(cell in out[name].text for row in TABLE_ROWS for cell in row), name
    # resiliparse: one line per row, cells tab-separated.
    assert any(line.split() == ["Lindholm", "1432", "ferry"] for line in out["resiliparse"].text.splitlines())
    assert "\t" in out["resiliparse"].text
    # trafilatura: tables kept as markdown rows.
    assert "| Lindholm | 1432 | ferry |" in out["trafilatura"].text
    # jusText: every cell becomes a paragraph of its own; the row structure is lost. These short cells
    # are kept because the table sits between kept prose (next test).
    lines = out["justext"].text.splitlines()
    assert "Lindholm" in lines and "1432" in lines and "ferry" in lines


def test_justext_drops_the_short_cells_of_a_table_that_ends_the_article() -> None:
    """jusText classifies each cell as a paragraph: a short one (under 70 characters) is kept only
    between kept paragraphs, so a table after the last of them is lost. The others keep every cell."""
    rows = "".join(f"<tr><td>Row {i} alpha beta</td><td>{i * 3}</td></tr>" for i in range(5))
    out = outputs(page(f"<main><article><h1>Rows</h1>{article(3)}<table>{rows}</table></article></main>"))
    assert SENTENCES[0] in out["justext"].text and "Row 2 alpha beta" not in out["justext"].text
    for name in ("resiliparse", "trafilatura"):
        assert "Row 2 alpha beta" in out[name].text and "12" in out[name].text, name


def test_code_page_justext_drops_the_code_the_others_keep_it_indented() -> None:
    out = outputs(code_page())
    for name in ("resiliparse", "trafilatura"):
        assert f"    {CODE_LINE}" in out[name].text, name
        assert "def tide_height(hour):" in out[name].text
    # Over 70 characters with no stopword: jusText calls the block boilerplate.
    assert "tide_height" not in out["justext"].text
    assert "Computing the tide" in out["justext"].text
    assert out["justext"].words < out["resiliparse"].words


def test_justext_keeps_a_short_code_block_between_prose_with_its_whitespace_collapsed() -> None:
    """jusText classifies a `<pre>` like any paragraph: a short one between kept paragraphs is kept, its
    lines kept but their indentation, runs of spaces and blank lines collapsed."""
    code = "def f(x):\n    return x   # keep   spaces\n\n\n    y = 1"
    out = outputs(
        page(f"<main><article>{article(3)}<pre><code>{code}</code></pre>{article(2, 4)}</article></main>")
    )
    assert "def f(x):\nreturn x # keep spaces\ny = 1" in out["justext"].text
    for name in ("resiliparse", "trafilatura"):
        assert "def f(x):\n    return x   # keep   spaces" in out[name].text, name


def test_boilerplate_page_every_extractor_keeps_the_article_and_drops_the_chrome() -> None:
    out = outputs(boilerplate_page())
    for name in EXTRACTORS:
        text = out[name].text
        assert SENTENCES[0] in text and SENTENCES[11] in text, name
        for chrome in ("Newsletter", "Story number", "Copyright 2024", "cookie policy", "Coastal News"):
            assert chrome not in text, (name, chrome)
        assert out[name].passed


@pytest.mark.parametrize(
    "empty",
    [
        "",
        "   \n ",
        "<html><body></body></html>",
        b"",
        b"<html></html>",
        "<!-- nothing here -->",  # lxml calls these "Document is empty": jusText raised on them
        '<?xml version="1.0" encoding="utf-8"?>',
    ],
)
def test_empty_page_yields_empty_text_not_an_error(empty: str | bytes) -> None:
    out = outputs(empty)
    for name in EXTRACTORS:
        assert out[name].text == "" and out[name].words == 0 and not out[name].passed
    union = extract(empty, runner=INLINE)
    # Nothing passes, every output is equally empty: the first in the order is returned, unpassed.
    assert union.extractor == "resiliparse" and not union.passed and union.text == ""
    assert [a.extractor for a in union.attempts] == list(EXTRACTORS)


def test_non_utf8_page_is_decoded_by_its_meta_charset_and_justext_uses_german() -> None:
    data = german_cp1252_page()
    out = outputs(data)
    assert decode_html(data).encoding == "cp1252"
    for name in EXTRACTORS:
        assert out[name].encoding == "windows-1252"  # as browsers name it, not Python's codec
        assert "Häuser in der Altstadt sind älter" in out[name].text, name
        assert "\ufffd" not in out[name].text
    assert out["justext"].language == "de"
    assert out["resiliparse"].language is None


def test_http_declared_charset_is_used_and_justext_picks_the_russian_stoplist() -> None:
    data = russian_cp1251_page()
    out = outputs(data, encoding="windows-1251")
    for name in EXTRACTORS:
        assert out[name].encoding == "windows-1251"
        assert "Маленький город на берегу реки" in out[name].text, name
    assert out["justext"].language == "ru"
    assert out["justext"].passed


def test_language_detection_and_stoplist_choice() -> None:
    assert detect_language(" ".join(GERMAN)) == "de"
    assert detect_language(" ".join(SENTENCES)) == "en"
    assert detect_language("   ") is None
    assert stoplist_name("de") == "German"
    assert stoplist_name(None) is None  # unknown: jusText's language-independent mode
    assert stoplist_name("ja") is None  # no Japanese stoplist: jusText's language-independent mode
    assert stoplist_name("xx") is None
    shipped = set(justext.get_stoplists())
    assert set(JUSTEXT_STOPLISTS.values()) <= shipped


def test_words_count_each_chinese_and_japanese_character() -> None:
    assert count_words("the harbour town") == 3
    assert count_words("Grüße an alle") == 3
    assert count_words("東京は2020年に") == 6  # 東 京 は 年 に, and 2020
    assert count_words("「東京」、 x。") == 3  # their punctuation separates, and is no word
    assert count_words("서울은 대한민국의 수도") == 3  # Korean puts spaces between words
    assert count_words(CHINESE[0]) == len(CHINESE[0]) - 2  # every character but "，" and "。"


@pytest.mark.parametrize(
    ("sentences", "charset", "language"), [(CHINESE, "gb18030", "zh"), (JAPANESE, "shift_jis", "ja")]
)
def test_chinese_and_japanese_pages_pass_the_filter_and_justext_keeps_them(
    sentences: list[str], charset: str, language: str
) -> None:
    """Counted by whitespace, four paragraphs of Chinese were 4 "words": every Chinese and Japanese
    page failed the 50-word filter. And jusText, given the English stoplist, kept nothing of them."""
    data = unspaced_page(sentences, charset)
    union = extract(data, runner=INLINE)
    assert union.extractor == "resiliparse" and union.passed and union.words > 200
    assert sentences[1] in union.text and "\ufffd" not in union.text
    out = outputs(data)
    assert out["justext"].language == language
    assert sentences[1] in out["justext"].text and out["justext"].passed
    for name in EXTRACTORS:
        assert out[name].passed, name


def test_lone_surrogates_in_str_input_become_replacement_characters() -> None:
    """Text decoded with errors="surrogateescape" (a crawler's undecodable byte): resiliparse and jusText
    raised on it and trafilatura returned nothing."""
    html = page("<article>" + article(4) + "</article>").replace("Fishermen", "Fisher\udce9men")
    out = outputs(html)
    for name in EXTRACTORS:
        assert out[name].passed and "Fisher\ufffdmen" in out[name].text, name
    assert extract(html, runner=INLINE).extractor == "resiliparse"


def test_language_hint_overrides_detection() -> None:
    out = outputs(german_cp1252_page(), language="en")
    # An English stoplist on German text: jusText sees too few stopwords and keeps less.
    assert out["justext"].language == "en"
    assert out["justext"].words < outputs(german_cp1252_page())["justext"].words


@pytest.mark.parametrize("given", ["EN", " en ", "en-US", "en_GB"])
def test_a_language_hint_is_normalised_to_its_code(given: str) -> None:
    """ "EN" was used and reported as given; a stoplist was found only by luck of `.lower()`."""
    out = outputs(german_cp1252_page(), language=given)
    assert out["justext"].language == "en"
    assert out["justext"].text == outputs(german_cp1252_page(), language="en")["justext"].text


def test_justext_on_an_undetected_chinese_page_runs_language_independent() -> None:
    """One sentence repeated: the detector says "unknown", and the English stoplist (reported as None)
    kept 0 words of 250 the other extractors found."""
    sentence = "北京是中华人民共和国的首都，也是全国的政治和文化中心。"
    data = f'<html><head><meta charset="gb18030"></head><body><article><p>{sentence * 10}</p></article>'
    assert detect_language(sentence * 10) is None
    out = outputs(data.encode("gb18030"))
    assert out["justext"].words == out["resiliparse"].words == 250 and out["justext"].passed
    assert out["justext"].language is None  # no language known, no stoplist used


def test_justext_reports_no_language_where_none_is_detected() -> None:
    """It reported "en" for the English stoplist that stood in for an unknown language."""
    data = page("<p>" + "qx zv " * 60 + "</p>")
    assert detect_language("qx zv " * 60) is None
    assert outputs(data)["justext"].language is None


def _cjk_by_loop(text: str) -> bool:
    """`mostly_cjk` as it was written first (named `mostly_unspaced`), one comparison per character."""
    sample = text[:4000]
    unspaced = sum(1 for c in sample if any(low <= ord(c) <= high for low, high in CJK_RANGES))
    return unspaced * 2 > count_words(sample)


CJK_EDGES = [chr(c) for low, high in CJK_RANGES for c in (low - 1, low, high, high + 1)]


@pytest.mark.parametrize("char", CJK_EDGES, ids=lambda c: f"U+{ord(c):04X}")
def test_mostly_cjk_counts_each_range_to_its_bounds(char: str) -> None:
    inside = any(low <= ord(char) <= high for low, high in CJK_RANGES)
    for text in (char, char * 3 + " ab cd", f"x {char}{char} y"):
        assert mostly_cjk(text) == _cjk_by_loop(text), text
    assert mostly_cjk(char * 5) is inside


def test_mostly_cjk_reads_only_the_sample_and_needs_a_majority() -> None:
    assert not mostly_cjk("") and not mostly_cjk("   ")
    assert not mostly_cjk("東京 a b")  # 2 of 4 words: no majority
    assert mostly_cjk("東京 a") and mostly_cjk("東京」、 a")  # punctuation is no word
    assert mostly_cjk("\U00020000\U0003134f x")  # the supplementary-plane ideographs too
    assert not mostly_cjk("word " * 800 + "東" * 4000)  # past the 4000-character sample
    assert mostly_cjk("東" * 4000 + "word " * 4000)
    mixed = "".join(CJK_EDGES) + " the 東京 harbour、town " * 50
    assert mostly_cjk(mixed) == _cjk_by_loop(mixed)


@pytest.mark.parametrize("script", list(SCRIPT_WORDS))
def test_thai_lao_khmer_and_myanmar_are_not_read_as_chinese_or_japanese(script: str) -> None:
    """Their words are several letters long: jusText's length thresholds stay as they are for them."""
    assert not mostly_cjk(unspaced_text(script, 100))


def test_justext_on_an_undetected_khmer_page_runs_language_independent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A short Khmer text is "unknown" to the detector; the English fallback's stoplist then found no
    stopword in it and kept nothing."""
    assert detect_language("ព្រះរាជាណាចក្រកម្ពុជា ជាប្រទេសមួយនៅអាស៊ីអាគ្នេយ៍") is None
    monkeypatch.setattr(extractors, "detect_language", lambda text: None)
    body = "".join(f"<p>{unspaced_text('Khmer', 60, seed=i)}</p>" for i in range(3))
    out = extractors.run_justext(page(f"<article>{body}</article>"))
    assert out.language is None and count_words(out.text) > 100


@pytest.mark.parametrize("script", list(SCRIPT_WORDS))
def test_thai_lao_khmer_and_myanmar_pages_pass_the_filter(script: str) -> None:
    """Split on whitespace, 4 paragraphs of 60 words in phrases of 8, and a heading, were 33 "words": the
    page failed the 50-word filter whatever an extractor kept."""
    body = "".join(f"<p>{unspaced_text(script, 60, seed=i)}</p>" for i in range(4))
    data = page(f"<article><h1>{unspaced_text(script, 4)}</h1>{body}</article>")
    union = extract(data, runner=INLINE)
    assert union.extractor == "resiliparse" and union.passed and union.words > 150
    out = outputs(data)
    for name in EXTRACTORS:
        assert out[name].passed and unspaced_text(script, 60, seed=2) in out[name].text, name


def _three_sentences(sentences: list[str]) -> list[str]:
    """Paragraphs of three sentences each: 100-120 characters."""
    return ["".join(sentences[(i + j) % len(sentences)] for j in range(3)) for i in range(len(sentences))]


def _cjk_article(sentences: list[str], charset: str) -> bytes:
    """Navigation links, an article of paragraphs of three sentences and a footer."""
    nav = "".join(f'<li><a href="/{i}">{s[:4]}</a></li>' for i, s in enumerate(sentences))
    body = "".join(f"<p>{paragraph}</p>" for paragraph in _three_sentences(sentences))
    html = (
        f'<html><head><meta charset="{charset}"></head><body><nav><ul>{nav}</ul></nav>'
        f"<article>{body}</article><footer><p>&copy; 2024 {sentences[0][:6]}</p></footer></body></html>"
    )
    return html.encode(charset)


@pytest.mark.parametrize(("sentences", "charset"), [(CHINESE, "gb18030"), (JAPANESE, "shift_jis")])
def test_justext_keeps_chinese_and_japanese_paragraphs_of_three_sentences(
    sentences: list[str], charset: str
) -> None:
    """jusText's language-independent mode calls a paragraph good from 200 characters, about 35 English
    words but over 100 Chinese ones: NHK Easy's article (corpus p0751: paragraphs of 60-140 characters
    once its ruby readings are dropped) came out empty, and so did these paragraphs."""
    assert all(100 <= len(paragraph) < 120 for paragraph in _three_sentences(sentences))
    out = outputs(_cjk_article(sentences, charset))["justext"]
    # The article, and neither the navigation (all links) nor the footer (a copyright sign).
    assert out.passed and out.text.splitlines() == _three_sentences(sentences)


# ---------------------------------------------------------------------------------------------------
# One form of the text: what every extractor's input and output go through

# Soft hyphens, a zero-width space, a word joiner, a BOM and bidi marks, all invisible on the page.
HIDDEN = "Mit\xadtel\xadal\xadter Zu\u200bsam\u2060men\ufeffhang \u200eStra\u00dfe\u202a Kaf\u200ffee"
SHOWN = "Mittelalter Zusammenhang Straße Kaffee"
RUBY = (
    "<ruby>子<rt>こ</rt></ruby>どもへの<ruby>体罰<rp>(</rp><rt>たいばつ</rt><rp>)</rp></ruby>を"
    "<ruby>禁止<rt>きんし</rt></ruby>する<ruby>法律<RT>ほうりつ</ruby>ができる。"
)
RUBY_BASE = "子どもへの体罰を禁止する法律ができる。"


def test_every_extractor_drops_invisible_format_characters_and_gives_nfc() -> None:
    """resiliparse and jusText kept them inside words ("Mit\xadtel\xadal\xadter"): the same page's text
    differed per extractor, and a snippet search for "Mittelalter" missed it."""
    paragraphs = "".join(
        f"<p>{GERMAN[i]} {HIDDEN}\u2028Cafe\u0301 {GERMAN[i + 1]} {GERMAN[(i + 2) % 6]}</p>"
        for i in range(0, 6, 2)
    )
    out = outputs(page(f"<main><article><h1>Die Stadt</h1>{paragraphs}</article></main>", "Die Stadt"))
    for name in EXTRACTORS:
        text = out[name].text
        assert SHOWN in text and "Café " in text, name  # "e" + U+0301 composed
        assert unreadable_chars(text) == 0 and "\u2028" not in text and "Cafe\u0301" not in text, name
    # resiliparse kept U+2028, LINE SEPARATOR (the others made it a space): a newline now.
    assert f"{SHOWN}\nCafé" in out["resiliparse"].text


def test_normalize_text_keeps_the_joiners_and_empties_invisible_text() -> None:
    assert normalize_text("\u200b \ufeff\n\u00ad") == ""
    assert normalize_text("\u0645\u06cc\u200c\u062e\u0648\u0627\u0645 \U0001f468\u200d\U0001f469") == (
        "\u0645\u06cc\u200c\u062e\u0648\u0627\u0645 \U0001f468\u200d\U0001f469"  # Persian ZWNJ, an emoji ZWJ
    )
    assert normalize_text("a\u2029b") == "a\nb"


def test_ruby_readings_are_dropped_and_the_base_text_kept_by_every_extractor() -> None:
    """resiliparse (main content) and jusText put the readings into the text ("子こどもへの体罰たいばつ"),
    and resiliparse dropped the base characters 子 and を."""
    paragraphs = "".join(f"<p>{''.join(JAPANESE[i:] + JAPANESE[:i])}{RUBY}</p>" for i in range(4))
    data = f'<html><head><meta charset="utf-8"></head><body><article>{paragraphs}</article></body></html>'
    out = outputs(data)
    for name in EXTRACTORS:
        text = out[name].text
        assert text.count(RUBY_BASE) >= 1 and JAPANESE[2] in text, name
        for reading in ("こども", "たいばつ", "きんし", "ほうりつ", "("):
            assert reading not in text, (name, reading)


def test_resiliparse_keeps_a_lone_chinese_or_japanese_character_between_tags() -> None:
    """resiliparse's icon-font test (a lone private-use character) compares the character's UTF-8 bytes
    in the wrong byte order and skipped nearly every lone three-byte character: 親 in a dictionary link,
    を between two (NHK Easy lost one at every link); an icon is still skipped."""
    linked = (
        '<a href="/d/1" class="dicWin"><span class="under">親</span></a>が子どもを<a href="/d/2">教育</a>'
        'するために<a href="/d/3"><span>体罰</span></a>を<a href="/d/4"><span>禁止</span></a>します。'
        '<i class="icon">\ue001</i>'
    )
    paragraphs = "".join(f"<p>{''.join(JAPANESE[i:] + JAPANESE[:i])}{linked}</p>" for i in range(4))
    out = outputs(
        f'<html><head><meta charset="utf-8"></head><body><article>{paragraphs}</article></body></html>'
    )
    for name in EXTRACTORS:
        assert "親が子どもを教育するために体罰を禁止します。" in out[name].text, name
    assert "\ue001" not in out["resiliparse"].text and "\u2060" not in out["resiliparse"].text


@pytest.mark.parametrize(
    ("html", "expected"),
    [
        (f"<p>{RUBY}</p>", f"<p>{RUBY_BASE}</p>"),
        ("<p><ruby><rb>東</rb><rtc><rt>とう</rt></rtc></ruby>京</p>", "<p>東京</p>"),
        # An annotation ends at its end tag or at the next tag: the reading in a span stays, and no
        # base text after it is ever removed.
        ("<ruby>a<rt>b<span>c</span></rt></ruby>d", "a<span>c</span></rt>d"),
        ("<p>a<rt>b</p><p>kept</p>", "<p>a</p><p>kept</p>"),
        # Inside a comment or a script "<rt>" is no tag: removing from it would eat their ends.
        (
            "<!-- <rt>x --><p>kept</p><script>s='<rt>'</script>",
            "<!-- <rt>x --><p>kept</p><script>s='<rt>'</script>",
        ),
        ("<!-- unclosed <rt>x", "<!-- unclosed <rt>x"),
        ("<p>no ruby <rtx> <rubyx> <rt-x></p>", "<p>no ruby <rtx> <rubyx> <rt-x></p>"),
    ],
)
def test_drop_ruby_annotations(html: str, expected: str) -> None:
    assert drop_ruby_annotations(html) == expected


def test_a_text_node_over_10_mb_is_extracted_by_trafilatura_and_justext() -> None:
    """libxml2 drops a text node over 10,000,000 bytes unless parsed with huge_tree: both gave empty
    text and no error for a page the server accepts (up to 16 MiB). Four-byte characters make it
    10.3 MB in 2.7 million characters, which keeps the extraction short."""
    text = "\U00020000\U00020001\U00020002\U00020003\u3002" * 540_000
    assert len(text.encode()) > 10_000_000
    out = outputs(
        f'<html><head><meta charset="utf-8"></head><body><article><p>{text}</p></article></body></html>'
    )
    for name in EXTRACTORS:
        assert out[name].words == 4 * 540_000, name


def test_an_article_300_elements_deep_is_extracted_by_trafilatura_and_justext() -> None:
    """Without huge_tree libxml2 stops parsing 255 elements deep, and both gave empty text."""
    html = page("<div>" * 300 + article(4) + "</div>" * 300)
    out = outputs(html)
    for name in EXTRACTORS:
        assert SENTENCES[0] in out[name].text and out[name].passed, name


# ---------------------------------------------------------------------------------------------------
# Text that is no text: binary input, a page read with the wrong codec


def test_random_bytes_fail_the_filter_with_a_reason() -> None:
    """200 KB of random bytes, read as cp1252, gave 6,566 "words" of control-character soup that passed."""
    import random

    data = random.Random(0).randbytes(200_000)
    results = extract_all(data, runner=INLINE)
    # trafilatura finds no text, jusText refuses control characters outright: resiliparse's soup is it.
    assert not any(isinstance(r, Extraction) and r.passed for r in results.values())
    soup = results["resiliparse"]
    assert isinstance(soup, Extraction) and soup.words > 1000
    reason = soup.attempts[0].reason
    assert reason is not None and "U+FFFD, control or invisible format characters (over 5%)" in reason
    union = extract(data, runner=INLINE)
    assert not union.passed and union.extractor == "resiliparse"


def test_a_page_whose_meta_charset_is_wrong_fails_the_filter() -> None:
    """A windows-1251 page that says UTF-8: U+FFFD soup with 300 words passed. U+FFFD is no letter, so
    the soup has no words now, and over 5% of it is unreadable."""
    text = " ".join(RUSSIAN * 8)
    data = f'<html><head><meta charset="utf-8"></head><body><p>{text}</p></body></html>'.encode("cp1251")
    union = extract(data, runner=INLINE)
    assert union.encoding == "utf-8" and "\ufffd" in union.text and union.words == 0
    assert unreadable_chars(union.text) > 0.5 * len(union.text)
    assert not union.passed
    assert all(a.reason is not None and not a.passed for a in union.attempts)


def test_a_few_replacement_characters_do_not_fail_the_filter() -> None:
    html = page("<article>" + article(4) + "</article>").replace("Fishermen", "Fisher\ufffdmen")
    result = extract(html, runner=INLINE)
    assert result.passed and "\ufffd" in result.text and result.attempts[0].reason is None


# ---------------------------------------------------------------------------------------------------
# The union


def test_union_takes_resiliparse_first_when_it_passes() -> None:
    result = extract(table_page(), runner=INLINE)
    assert result.extractor == "resiliparse" and result.passed
    assert [a.extractor for a in result.attempts] == ["resiliparse"]
    assert result.text == outputs(table_page())["resiliparse"].text


def test_union_falls_through_a_short_output_in_the_given_order() -> None:
    html = code_page()
    out = outputs(html)
    min_words = out["justext"].words + 1  # jusText dropped the code, so it falls just short
    assert out["trafilatura"].words >= min_words
    result = extract(
        html, order=["justext", "trafilatura", "resiliparse"], min_words=min_words, runner=INLINE
    )
    assert result.extractor == "trafilatura" and result.passed
    assert [(a.extractor, a.passed) for a in result.attempts] == [("justext", False), ("trafilatura", True)]
    assert result.attempts[0].words == out["justext"].words


def test_union_quality_scorer_hook_decides_what_passes() -> None:
    def no_code(text: str) -> float:
        return 0.0 if "tide_height" in text else 1.0

    result = extract(code_page(), scorer=no_code, min_score=0.5, runner=INLINE)
    assert result.extractor == "justext" and result.passed and result.score == 1.0
    assert [(a.extractor, a.score) for a in result.attempts] == [
        ("resiliparse", 0.0),
        ("trafilatura", 0.0),
        ("justext", 1.0),
    ]


def test_union_when_nothing_passes_returns_the_longest_output_unpassed() -> None:
    html = table_page()
    out = outputs(html)
    longest = max(EXTRACTORS, key=lambda n: out[n].words)
    result = extract(html, min_words=10**6, runner=INLINE)
    assert not result.passed and result.extractor == longest
    assert result.words == out[longest].words
    assert len(result.attempts) == len(EXTRACTORS)


def noscript_page() -> str:
    """An article only inside `<noscript>`: resiliparse (noscript off, as DCLM ran it) finds no text."""
    return page(f"<noscript><article><h1>The harbour town</h1>{article(4)}</article></noscript>")


def test_union_with_min_words_0_never_takes_an_output_without_words() -> None:
    """With min_words=0 an empty output passed (0 >= 0): the union stopped at resiliparse's nothing."""
    html = noscript_page()
    assert outputs(html)["resiliparse"].text == ""
    result = extract(html, min_words=0, runner=INLINE)
    assert result.extractor == "trafilatura" and result.passed and SENTENCES[0] in result.text
    assert result.attempts[0].extractor == "resiliparse" and result.attempts[0].reason == "no words"
    # Text without a letter or digit is no word either: nothing passes, whatever min_words says.
    junk = extract(page("<article><p>" + "· | — " * 40 + "</p></article>"), min_words=0, runner=INLINE)
    assert not junk.passed and all(a.reason == "no words" for a in junk.attempts)


@pytest.mark.parametrize("score", [float("nan"), float("inf"), float("-inf")])
def test_a_non_finite_score_fails_the_filter(score: float) -> None:
    """NaN compared False with the minimum, so it passed."""
    result = extract(table_page(), scorer=lambda text: score, min_score=0.5, runner=INLINE)
    assert not result.passed and len(result.attempts) == len(EXTRACTORS)
    assert all(a.reason is not None and "not a finite number" in a.reason for a in result.attempts)


def test_a_scorer_that_raises_fails_that_attempt_typed_and_the_union_goes_on() -> None:
    """It escaped as a bare exception and ended the whole union."""

    def scorer(text: str) -> float:
        if "\t" in text:  # resiliparse's table rows
            raise RuntimeError("model crashed")
        return 1.0

    result = extract(table_page(), scorer=scorer, runner=INLINE)
    assert result.extractor == "trafilatura" and result.passed and result.score == 1.0
    failed = result.attempts[0]
    assert failed.extractor == "resiliparse" and not failed.passed and not failed.timed_out
    assert failed.error is not None and "quality scorer failed on resiliparse's output" in failed.error
    assert "RuntimeError: model crashed" in failed.error
    with pytest.raises(ExtractionError, match="quality scorer failed") as info:
        extract(table_page(), "resiliparse", scorer=scorer, runner=INLINE)
    assert info.value.code == ErrorCode.EXTRACTION_FAILED
    assert isinstance(extract_all(table_page(), scorer=scorer, runner=INLINE)["resiliparse"], ExtractionError)


def test_random_order_is_a_seeded_permutation_per_page() -> None:
    html = boilerplate_page()
    orders = {resolve_order("random", seed=seed, text=html) for seed in range(30)}
    assert all(sorted(o) == sorted(EXTRACTORS) for o in orders)
    assert len(orders) >= 3
    assert resolve_order("random", seed=7, text=html) == resolve_order("random", seed=7, text=html)
    for seed in range(6):
        result = extract(html, order="random", seed=seed, min_words=0, runner=INLINE)
        assert result.extractor == resolve_order("random", seed=seed, text=html)[0]
        assert len(result.attempts) == 1


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: extract("<p>x</p>", "boilerpipe", runner=INLINE), "unknown extractor"),
        (lambda: extract("<p>x</p>", "all", runner=INLINE), "extract_all"),
        (lambda: extract("<p>x</p>", order=["resiliparse", "resiliparse"], runner=INLINE), "repeats"),
        (lambda: extract("<p>x</p>", order=[], runner=INLINE), "no extractor"),
        (lambda: extract("<p>x</p>", order="alphabetical", runner=INLINE), "random"),
        (lambda: extract("<p>x</p>", timeout_s=0, runner=INLINE), "positive"),
        (lambda: extract("<p>x</p>", timeout_s={"tika": 1.0}, runner=INLINE), "unknown extractor"),
        (lambda: extract("<p>x</p>", min_words=-1, runner=INLINE), "min_words"),
        # These raised TypeError, or were taken: a NaN min_words passed everything.
        (lambda: extract("<p>x</p>", timeout_s={"justext": "1"}, runner=INLINE), "positive number"),  # type: ignore[dict-item]
        (lambda: extract("<p>x</p>", timeout_s="5", runner=INLINE), "positive number"),  # type: ignore[arg-type]
        (lambda: extract("<p>x</p>", timeout_s=float("nan"), runner=INLINE), "positive number"),
        (lambda: extract("<p>x</p>", min_words=float("nan"), runner=INLINE), "min_words"),  # type: ignore[arg-type]
        (lambda: extract("<p>x</p>", min_words=float("inf"), runner=INLINE), "min_words"),  # type: ignore[arg-type]
        (lambda: extract("<p>x</p>", min_score=float("nan"), runner=INLINE), "min_score"),
        (lambda: extract("<p>x</p>", language="", runner=INLINE), "language"),
        (lambda: extract("<p>x</p>", language="English!", runner=INLINE), "language"),
        (lambda: extract_all("<p>x</p>", language=7, runner=INLINE), "language"),  # type: ignore[arg-type]
        (lambda: extract(12345, runner=INLINE), "str or bytes"),  # type: ignore[arg-type]
        (lambda: extract_all("<p>x</p>", extractors=["justext", "tika"], runner=INLINE), "unknown"),
    ],
)
def test_bad_options_are_validation_errors(call: object, message: str) -> None:
    with pytest.raises(ExtractionOptionsError, match=message) as info:
        call()  # type: ignore[operator]
    assert info.value.code == ErrorCode.VALIDATION
    assert isinstance(info.value, ExtractionError)


# ---------------------------------------------------------------------------------------------------
# Isolation and time limits (real worker processes)


def test_isolated_workers_give_the_inline_results(pool: ExtractorPool) -> None:
    for html in (table_page(), german_cp1252_page()):
        isolated = extract_all(html, runner=pool)
        inline = outputs(html)
        for name in EXTRACTORS:
            got = isolated[name]
            assert isinstance(got, Extraction)
            assert (got.text, got.language, got.words) == (
                inline[name].text,
                inline[name].language,
                inline[name].words,
            )


def test_time_limit_kills_a_pathological_extraction_and_the_pool_recovers(
    pool: ExtractorPool, unlimited: None
) -> None:
    html = deep_page()
    with pytest.raises(ExtractionTimeoutError) as info:
        extract(html, "resiliparse", timeout_s=0.5, runner=pool)
    # Unbounded, this page takes resiliparse many seconds; the limit's own figure, not a wall-clock bound
    # (a cold pool's start counted in it: 2.3 s of 3 on a loaded machine).
    assert "ran past its 0.5 s limit" in str(info.value), info.value
    assert info.value.code == ErrorCode.EXTRACTION_FAILED
    assert extract(table_page(), "resiliparse", runner=pool).passed


def test_union_falls_through_a_timed_out_extractor(pool: ExtractorPool, unlimited: None) -> None:
    # libxml2 gives up 2,048 elements deep, so jusText keeps the article before the nesting. 10,000
    # levels keep resiliparse well past its 0.5 s (2-5 s) while jusText takes 2-5 s, not 20-30 s.
    html = "<html><body><article>" + article(4) + "</article>" + deep_page(10_000)
    limits = {"resiliparse": 0.5, "justext": 120.0}
    result = extract(html, order=["resiliparse", "justext"], timeout_s=limits, runner=pool)
    assert "ran past its 0.5 s limit" in str(result.attempts[0].error), result.attempts[0]
    assert result.extractor == "justext" and result.passed
    assert result.attempts[0].extractor == "resiliparse" and result.attempts[0].timed_out
    assert result.attempts[0].error is not None and "limit" in result.attempts[0].error
    with pytest.raises(ExtractionTimeoutError, match="every extractor timed out"):
        extract(html, order=["resiliparse"], timeout_s=0.5, runner=pool)


def _pathological_extraction_in_a_thread(pool: ExtractorPool) -> tuple[threading.Thread, list[BaseException]]:
    """A started thread keeping one of `pool`'s workers busy (resiliparse on a deep page, a 60 s limit;
    the caller lifts the limits), and the list that receives what its extraction raises."""
    caught: list[BaseException] = []

    def job() -> None:
        try:
            extract(deep_page(), "resiliparse", timeout_s=60, runner=pool)
        except BaseException as exc:
            caught.append(exc)

    thread = threading.Thread(target=job)
    thread.start()
    return thread, caught


def test_a_crashed_worker_is_an_extraction_error_not_a_timeout(unlimited: None) -> None:
    before = set(multiprocessing.active_children())
    with ExtractorPool(1) as solo:
        assert extract(table_page(), "resiliparse", runner=solo).passed  # starts the one worker
        (worker,) = [p for p in multiprocessing.active_children() if p not in before]
        thread, caught = _pathological_extraction_in_a_thread(solo)
        time.sleep(0.5)
        assert worker.pid is not None
        # A segfault in the extractor (SIGKILL is the OOM killer's: retried, `test_extract_lost_worker.py`)
        os.kill(worker.pid, signal.SIGSEGV)
        thread.join(30)
        assert len(caught) == 1
        assert isinstance(caught[0], ExtractionError)
        assert not isinstance(caught[0], ExtractionTimeoutError)
        assert "crashed" in str(caught[0])
        assert extract(table_page(), "justext", runner=solo).passed  # replaced by a fresh worker
        assert solo.live_workers == 1


def test_a_worker_killed_while_idle_is_replaced_not_blamed_on_the_next_page() -> None:
    with ExtractorPool(1) as solo:
        assert extract(table_page(), "resiliparse", runner=solo).passed
        (worker,) = solo._idle
        assert worker.process.pid is not None
        os.kill(worker.process.pid, signal.SIGKILL)  # the OOM killer picks an idle worker
        worker.process.join(10)
        result = extract(table_page(), "resiliparse", runner=solo)  # was "extractor worker died"
        assert result.passed and solo.live_workers == 1


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_DATA bounds mmap on Linux")
def test_an_extraction_past_the_memory_limit_fails_typed_and_the_worker_goes_on() -> None:
    """What the extraction limits misjudge cannot take the pod's memory: held to a little more than an
    idle worker has, an extractor on a 3 MB page fails as extraction_failed, and the worker serves on."""
    page = "<html><body>" + "<p>lorem ipsum dolor sit amet consectetur</p>\n" * 60_000 + "</body></html>"
    with ExtractorPool(1) as probe:
        probe.prestart()
        (idle,) = probe._idle
        assert idle.process.pid is not None
        idle_mib = vm_data_mib(idle.process.pid)
    with ExtractorPool(1, memory_limit_bytes=(idle_mib + 4) * 2**20) as limited:
        limited.prestart()
        worker = limited._idle[0].process.pid
        with pytest.raises(ExtractionError) as failed:
            extract(page, "resiliparse", runner=limited, min_words=0, timeout_s=120)
        assert failed.value.code is ErrorCode.EXTRACTION_FAILED
        # Wherever the limit strikes, in the extractor or while the worker takes the 3 MB page in, the
        # worker reports it and serves on (taking the page in, it used to die: "worker died").
        assert failed.value.message.startswith("resiliparse failed: MemoryError"), failed.value.message
        assert "likely the extractor processes' memory limit" in failed.value.message  # it said nothing
        assert extract(table_page(), "resiliparse", runner=limited).passed
        assert [kept.process.pid for kept in limited._idle] == [worker]  # the same process


def test_a_limit_too_long_to_wait_for_means_no_limit(pool: ExtractorPool) -> None:
    for limit in (float("inf"), 1e12):  # raised OverflowError (untyped) and killed the worker
        assert extract(table_page(), "resiliparse", timeout_s=limit, runner=pool).passed


def test_importing_starts_no_worker() -> None:
    code = (
        "import multiprocessing, service.core.extract as e, service.core.extract.pool as p\n"
        "assert p._default_pool is None and not multiprocessing.active_children()\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


# ---------------------------------------------------------------------------------------------------
# htmllm extract


def write_jsonl(path: Path) -> Path:
    rows = [
        {"id": "table", "html": table_page(), "url": "https://example.org/t"},
        {"id": "empty", "html": ""},
        {"id": "code", "html": code_page()},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_cli_extract_union_writes_one_row_per_page_in_order(tmp_path: Path) -> None:
    source = write_jsonl(tmp_path / "pages.jsonl")
    out = tmp_path / "out.jsonl"
    args = ["extract", "--input", str(source), "--output", str(out), "--workers", "1", "--no-progress"]
    assert main(args) == 0
    rows = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert [r["id"] for r in rows] == ["table", "empty", "code"]
    assert rows[0]["extractor"] == "resiliparse" and rows[0]["passed"] and rows[0]["url"].endswith("/t")
    assert rows[1]["words"] == 0 and not rows[1]["passed"]
    assert rows[2]["attempts"][0]["extractor"] == "resiliparse"


def test_cli_extract_all_and_order(tmp_path: Path) -> None:
    source = write_jsonl(tmp_path / "pages.jsonl")
    out = tmp_path / "all.jsonl"
    common = ["--input", str(source), "--workers", "1", "--no-progress"]
    assert main(["extract", "--extractor", "all", "--output", str(out), *common]) == 0
    rows = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert set(rows[0]["extractions"]) == set(EXTRACTORS)
    assert "tide_height" not in rows[2]["extractions"]["justext"]["text"]
    assert "tide_height" in rows[2]["extractions"]["trafilatura"]["text"]
    ordered = tmp_path / "ordered.jsonl"
    order = ["--order", "justext,trafilatura", "--min-words", "100000"]
    assert main(["extract", "--output", str(ordered), *order, *common]) == 0
    first = json.loads(ordered.read_text(encoding="utf-8").splitlines()[0])
    assert [a["extractor"] for a in first["attempts"]] == ["justext", "trafilatura"]


def test_cli_extract_reports_an_unreadable_row_and_goes_on(tmp_path: Path) -> None:
    source = tmp_path / "pages.jsonl"
    rows = [
        json.dumps({"id": "table", "html": table_page()}),
        "{broken",
        json.dumps({"id": "code", "html": code_page()}),
    ]
    source.write_text("\n".join(rows) + "\n", encoding="utf-8")
    out = tmp_path / "out.jsonl"
    args = ["extract", "--input", str(source), "--output", str(out), "--workers", "1", "--no-progress"]
    assert main(args) == 0
    result = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert [r["id"] for r in result] == ["table", "1", "code"]
    assert "error" not in result[0] and "error" not in result[2] and result[2]["text"]
    assert result[1]["error"]["code"] == "validation_error"
    assert "line 2 is not JSON" in result[1]["error"]["message"]


def test_cli_extract_rejects_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = str(tmp_path / "o.jsonl")
    assert main(["extract", "--input", str(tmp_path / "missing"), "--output", out, "--no-progress"]) == 1
    assert "does not exist" in capsys.readouterr().err
    source = str(write_jsonl(tmp_path / "p.jsonl"))
    assert main(["extract", "--input", source, "--output", out, "--order", "resiliparse,tika"]) == 2
    assert "unknown extractor" in capsys.readouterr().err


@pytest.mark.parametrize("option", [["--timeout-s", "0"], ["--timeout-s", "nan"], ["--min-words", "-1"]])
def test_cli_extract_refuses_bad_limits_before_touching_the_output(
    tmp_path: Path, option: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """These were an error row for every page, exit code 0, and the previous output replaced."""
    out = tmp_path / "o.jsonl"
    out.write_text("previous\n")
    source = str(write_jsonl(tmp_path / "p.jsonl"))
    assert main(["extract", "--input", source, "--output", str(out), "--no-progress", *option]) == 2
    assert "--timeout-s must be > 0" in capsys.readouterr().err
    assert out.read_text() == "previous\n"


def test_closing_the_pool_stops_busy_workers_too(unlimited: None) -> None:
    """A server's shutdown closes the pool while a pathological page keeps a worker busy: the worker
    is killed and its job fails typed, instead of the process running on past its parent."""
    pool = ExtractorPool(1)
    thread, failures = _pathological_extraction_in_a_thread(pool)
    deadline = time.monotonic() + 60
    while not pool._busy and time.monotonic() < deadline:
        time.sleep(0.01)
    (worker,) = pool._busy
    started = time.perf_counter()
    pool.close()
    thread.join(30)
    assert not thread.is_alive() and time.perf_counter() - started < 10
    assert not worker.process.is_alive()
    assert len(failures) == 1 and isinstance(failures[0], ExtractionError)
    assert failures[0].code == ErrorCode.EXTRACTION_FAILED
