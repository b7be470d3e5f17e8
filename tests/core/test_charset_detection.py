"""service.core.charset_detection: pages with few non-ASCII bytes, and the tables the detector uses."""

from __future__ import annotations

import random
import tracemalloc

import pytest

from service.core import charset_detection
from service.core.charset_detection import DETECT_SAMPLE_BYTES, FEW_FOREIGN_BYTES, detect_encoding
from service.core.decoding import decode_html
from service.core.encoding_labels import decode_bytes, normalize_encoding

ENGLISH = "<html><body>" + (
    "<p>We spent the week walking around the old town and the river banks, looking at churches.</p>" * 8
)

CYRILLIC_WORDS = [
    "Москва", "Москву", "Россия", "привет", "Иван Петров", "ООО Ромашка", "Санкт-Петербург", "мир", "Киев",
    "книга", "Привет мир", "на русском языке", "Контакты", "Главная страница", "нет", "Добро пожаловать",
]  # fmt: skip
# Words whose other readings land in rare rows or show mojibake marks; see the ambiguous ones below.
EAST_ASIAN_WORDS = {
    "gb18030": ["中国", "你好", "上海市", "欢迎", "网站首页", "联系我们", "关于我们", "公司简介", "登录"],
    "big5hkscs": ["台灣", "台北", "你好", "繁體中文", "首頁", "聯絡我們"],
    "cp932": ["日本", "東京", "こんにちは", "ありがとう", "日本語", "お問い合わせ", "カタカナ", "ニュース"],
}  # fmt: skip
# Latin pages with one accented word: they stay Latin however few their non-ASCII bytes.
LATIN_WORDS = {
    "cp1252": [
        "café", "naïve", "résumé", "Müller", "Zürich", "España", "año", "Ça va", "Øresund", "Århus", "Þór",
        "São Paulo", "Köln", "Curaçao", "Señor Muñoz", "Noël", "Straße", "© 2024 Acme", "10 °C", "50 m²",
        "“quoted” — dash…", "Brand™ ®", "€ 20", "£5", "1º lugar",
    ],
    "cp1250": ["Dvořák", "Łódź", "žluťoučký kůň", "Kraków", "Székesfehérvár"],
    "cp1254": ["Türkiye"],
}  # fmt: skip


def _page(word: str) -> str:
    return f"{ENGLISH}<p>See {word} here.</p></body></html>"


@pytest.mark.parametrize("word", CYRILLIC_WORDS)
def test_a_few_cyrillic_words_in_an_english_page(word: str) -> None:
    """The detector alone said Big5 for "Москва", windows-1257 for "привет", windows-1252 for "книга"."""
    data = _page(word).encode("cp1251")
    assert len(data.translate(None, bytes(range(128)))) <= FEW_FOREIGN_BYTES
    decoded = decode_html(data)
    assert (decoded.text, decoded.encoding) == (_page(word), "cp1251")


@pytest.mark.parametrize(
    ("encoding", "word"), [(encoding, word) for encoding, words in EAST_ASIAN_WORDS.items() for word in words]
)
def test_a_few_east_asian_words_in_an_english_page(encoding: str, word: str) -> None:
    decoded = decode_html(_page(word).encode(encoding))
    assert decoded.text == _page(word), decoded.encoding


@pytest.mark.parametrize(
    ("encoding", "word"), [(encoding, word) for encoding, words in LATIN_WORDS.items() for word in words]
)
def test_a_few_latin_words_stay_latin(encoding: str, word: str) -> None:
    decoded = decode_html(_page(word).encode(encoding))
    assert decoded.text == _page(word), decoded.encoding


@pytest.mark.parametrize(
    ("encoding", "page"),
    [
        ("cp1257", "<p>Šī lapa tiek atjaunota.</p>"),
        ("cp1254", "<div>10:30 ÖÖ</div>"),
        ("cp1250", "<p>Čí je to auto?</p>"),
        ("iso8859_15", '<html lang="et"><title>Öö</title><p>P&auml;ike l&auml;ks looja.</p>'),
        ("cp1252", "<h3>Ää</h3><p>Index</p>"),
        ("cp1250", "<h3>Źź</h3><p>Index</p>"),
        ("cp1258", "<p>Đó là nhà.</p>".replace("à", "a")),
    ],
)
def test_a_western_word_of_two_letters_alone_is_never_read_as_east_asian(encoding: str, page: str) -> None:
    """A page whose one non-ASCII pair is a two-letter Western word (Latvian "Šī", Turkish "ÖÖ", Estonian
    "Öö", an index heading "Ää"): every such pair is a common character in some East Asian encoding, and
    a rule that read a lone pair as CJK (reverted) made these "蓄 lapa", "10:30 种", "<title>嘱</title>".
    Which Latin codec is a guess on one word; an East Asian one is a misreading."""
    text = decode_html(page.encode(encoding)).text
    assert not any("\u3000" <= ch <= "\u9fff" or "\uac00" <= ch <= "\ud7af" for ch in text), text


def test_ambiguous_east_asian_bytes_go_to_the_more_common_encoding() -> None:
    """In EUC-JP "日本" is two common hanzi in GBK ("泣塑"): with nothing else to go on, GBK, first in
    `_EAST_ASIAN`'s order, wins; a Japanese sentence with kana (rare rows in GBK) is EUC-JP."""
    assert detect_encoding(_page("日本").encode("euc_jp")) == "gb18030"
    sentence = "日本語のページです。お問い合わせはこちら。"
    assert decode_html(_page(sentence).encode("euc_jp")).text == _page(sentence)


@pytest.mark.parametrize(
    ("encoding", "text"),
    [
        ("gb18030", "的一是不了在人有我他这个们中来上大为和国地到以说时要就出会可也你对生能而子那得"),
        ("big5hkscs", "的一是不了在人有我他這個們中來上大為和國地到以說時要就出會可也你對生能而子那得"),
        ("cp932", "日一人年大十二本中長出三時行見月分後前生五間上東四今金あいうえおアイウエオー、。"),
        ("euc_jp", "日一人年大十二本中長出三時行見月分後前生五間上東四今金あいうえおアイウエオー、。"),
        ("cp949", "이다에의는로하을가고지서한은기으년대사시를리도인스일"),
    ],
)
def test_the_common_rows_hold_each_languages_common_characters(encoding: str, text: str) -> None:
    """The most frequent characters of each language (charset-normalizer's frequency tables) cost nothing."""
    assert [ch for i, ch in enumerate(text) if charset_detection._east_asian_cost(text, i, encoding)] == []


def test_the_re_ranked_codecs_are_ones_the_detector_can_name() -> None:
    detected = {normalize_encoding(name) for name in charset_detection._DETECTED_ENCODINGS}
    latin, non_latin = charset_detection._LATIN_SINGLE_BYTE, charset_detection._NON_LATIN_SINGLE_BYTE
    assert detected >= latin | non_latin
    assert not latin & non_latin
    assert set(charset_detection._LATIN_CANDIDATES) <= latin
    # The East Asian contenders are codec names as normalize_encoding gives them, and the detector's.
    east_asian = set(charset_detection._EAST_ASIAN)
    assert {normalize_encoding(name) for name in east_asian} == east_asian
    assert east_asian - {"big5hkscs"} <= detected and normalize_encoding("big5") == "big5hkscs"


def test_every_double_byte_code_of_every_contender_is_scored_without_raising() -> None:
    """Big5-HKSCS decodes some codes to two characters ("Ê̄"), whose halves do not encode alone."""
    pairs = [bytes([lead, trail]) for lead in range(0x80, 0x100) for trail in range(0x40, 0x100)]
    for name in charset_detection._EAST_ASIAN:
        for pair in pairs:
            charset_detection._reading_cost(pair, name)
    data = _page("x").encode() + b"\x88\x62\x88\x64"
    assert decode_html(data).text.startswith(ENGLISH)


@pytest.mark.parametrize(
    "codec",
    sorted(charset_detection._LATIN_SINGLE_BYTE | charset_detection._NON_LATIN_SINGLE_BYTE),
)
def test_single_byte_readings_score_as_their_text(codec: str) -> None:
    """The counted form scores a single-byte reading (numpy, per distinct context) as the text form
    does (character by character): random bytes, Latin and Cyrillic text, the page's first and last
    byte next to a letter, undefined bytes (U+FFFD)."""
    rng = random.Random(codec)
    samples = [
        b"",
        b"\xe4",
        b"a\xe4",
        b"\xc4b",
        bytes(range(256)),
        "Grüße aus Köln, Straße – “quoted” ©2024 Š".encode("cp1252"),
        "Москва, Санкт-Петербург: Главная страница".encode("cp1251"),
        *(rng.randbytes(rng.randrange(1, 400)) for _ in range(40)),
        *(bytes(rng.choice(b"ab Z\x81\x8d\xa4\xad\xc0\xdf\xe0\xff") for _ in range(300)) for _ in range(10)),
    ]
    for sample in samples:
        counted = charset_detection._score_single_byte(charset_detection._byte_contexts(sample), codec)
        assert counted == charset_detection._score(sample.decode(codec, errors="replace")), sample


def test_a_codec_that_is_not_single_byte_is_refused_by_the_counted_form() -> None:
    for codec in ("utf-8", "gb18030", "cp037"):
        with pytest.raises(ValueError, match="single-byte"):
            charset_detection._single_byte_characters(codec)


def test_a_gbk_euro_sign_costs_the_gb18030_reading_nothing() -> None:
    """0x80 is the euro sign in the web's GBK (code page 936), as decode_html reads it: scoring the
    gb18030 reading with Python's codec, which rejects 0x80, counted it as a broken byte."""
    sample = " 价格 €20 ".encode("gb18030").replace("€".encode("gb18030"), b"\x80")
    assert charset_detection._reading_cost(sample, "gb18030") == 0
    page = _page("价格 €20").encode("gb18030").replace(b"\xa2\xe3", b"\x80")
    assert decode_html(page).encoding == "gb18030"


# Text of each script for generated pages in its legacy encodings (`_markup_heavy_page`).
RUSSIAN = (
    "Москва является столицей России и крупнейшим городом страны. Сегодня в городе солнечно и тепло, "
    "а завтра обещают дождь. Новости культуры, спорта и экономики читайте на нашем сайте каждый день."
)
SIMPLIFIED_CHINESE = (
    "北京市今天天气晴朗，明天有雨。欢迎访问我们的网站，了解更多信息。"
    "我们的公司成立于二零零五年，主要从事软件开发和网络服务。联系我们获取产品价格和技术支持。"
)
TRADITIONAL_CHINESE = (
    "臺北市今天天氣晴朗，明天有雨。歡迎訪問我們的網站，瞭解更多資訊。"
    "我們的公司成立於二零零五年，主要從事軟體開發和網路服務。聯絡我們取得產品價格和技術支援。"
)
KOREAN = (
    "서울특별시의 오늘 날씨는 맑고 내일은 비가 오겠습니다. 웹사이트에 오신 것을 환영합니다. "
    "회사소개 뉴스 문의하기 로그인 "
)
JAPANESE = (
    "東京都渋谷区の天気予報です。今日は晴れ、明日は雨でしょう。ソフトウェア開発の会社概要とお問い合わせは"
    "こちらです。"
)


def _markup_heavy_page(text: str, padding: int) -> str:
    """A page whose text sits in long ASCII markup (links, a stylesheet, a script), its `<head>` opening
    with a comment of `padding` ASCII bytes, as a CMS's license banner or inline script pads it."""
    words = text.split(" ") if " " in text else [text[i : i + 12] for i in range(0, len(text), 12)]
    menu = "".join(
        f'<li><a href="/section/{i}/index.html?ref=nav&amp;lang=xx" class="menu-item">' for i in range(12)
    )
    body = "".join(
        f'<div class="post"><a href="https://example.com/articles/2024/{i}/story.html" title="">'
        f"{word}</a></div>\n"
        for i, word in enumerate(words)
    )
    return (
        f"<html><head><!--{'a' * padding}--><title>{text[:20]}</title>"
        '<link rel="stylesheet" href="/static/css/main.css"><script src="/static/js/app.js"></script></head>'
        f"<body><ul>{menu}</ul>{body}</body></html>"
    )


@pytest.mark.parametrize(
    ("codec", "text"),
    [
        (codec, text * repeat)
        for codec, text in (
            ("cp1251", RUSSIAN),
            ("koi8-r", RUSSIAN),
            ("gb18030", SIMPLIFIED_CHINESE),
            ("big5hkscs", TRADITIONAL_CHINESE),
            ("cp949", KOREAN),
            ("cp932", JAPANESE),
            ("euc_jp", JAPANESE),
        )
        for repeat in (1, 3)  # fewer non-ASCII bytes than FEW_FOREIGN_BYTES, and more
    ],
)
def test_the_reading_does_not_move_with_the_length_of_the_ascii_markup(codec: str, text: str) -> None:
    """charset-normalizer reads five chunks of 512 bytes spread over what it is given: on the page itself
    its guess moved with the length of the ASCII before the text (a review found GBK read as windows-1252
    and KOI8-R as windows-1251 for 8 to 30 of 30 lengths of a comment in the `<head>`). Given the non-ASCII
    bytes in their context only, it reads every length of the page alike, and right."""
    wrong = {}
    for padding in range(0, 6000, 500):
        data = _markup_heavy_page(text, padding).encode(codec)
        decoded = decode_html(data)
        if decoded.text != decode_bytes(data, codec):
            wrong[padding] = decoded.encoding
    assert wrong == {}


def test_neighbourhoods_keep_each_non_ascii_run_with_its_context_and_merge_where_they_touch() -> None:
    """What the detector and the contest are given: each run of non-ASCII bytes with `_CONTEXT` bytes
    either side, runs that close together in one piece, a page of CJK text whole."""
    context, filler = charset_detection._CONTEXT, b"x" * 20
    sample = filler + b"\xe4" + filler + b"\xf6yyy\xfc" + filler
    edge = b"x" * context
    assert (
        charset_detection._neighbourhoods(sample)
        == edge + b"\xe4" + edge + b" " + edge + b"\xf6yyy\xfc" + edge
    )
    assert charset_detection._neighbourhoods(b"plain ASCII") == b""
    assert charset_detection._neighbourhoods(b"\xe4ab") == b"\xe4ab"
    text = ("北京欢迎你 abc " * 1000).encode("gb18030")
    assert charset_detection._neighbourhoods(text) == text


# A paragraph of each East Asian double-byte encoding, in Python's codec and the one the page reads as.
DOUBLE_BYTE_PARAGRAPHS = [
    ("gbk", "gb18030", "<p>你好，世界！这是一个中文测试页面。</p>\n"),
    ("big5", "big5hkscs", "<p>你好，世界！這是一個中文測試頁面，用於檢測編碼。</p>\n"),
    ("shift_jis", "cp932", "<p>こんにちは、世界！これは日本語のテストページです。</p>\n"),
]


@pytest.mark.parametrize(("codec", "reading", "paragraph"), DOUBLE_BYTE_PARAGRAPHS)
def test_a_double_byte_page_over_the_detectors_limit_reads_right_at_odd_and_even_lengths(
    codec: str, reading: str, paragraph: str
) -> None:
    """The detector sees `DETECT_SAMPLE_BYTES` of the page's neighbourhoods. Cut there by bytes, a page of
    more holds half a character at the end whenever its markup before the text is of the other parity:
    a lone lead byte that no East Asian codec reads, so every one of them lost (a review's GBK page of
    780 KB read as windows-874 for 2 and 4 spaces after `<html>`, as GB18030 for 1 and 3)."""
    text = paragraph.encode(codec) * (DETECT_SAMPLE_BYTES // len(paragraph.encode(codec)) + 500)
    readings = {n: detect_encoding(b"<html>" + b" " * n + text) for n in range(4)}
    assert readings == dict.fromkeys(range(4), reading)


def test_legacy_text_after_a_long_ascii_head_is_seen() -> None:
    """The detector used to be given the page's first `DETECT_SAMPLE_BYTES` only: after 600 KiB of
    ASCII (an inline script), a Russian page had no non-ASCII byte there and read as windows-1252."""
    russian = "<p>Привет, мир! Это тестовая страница на русском языке.</p>" * 40
    head = b"<html><head><script>" + b"var a=1;" * (600 * 128) + b"</script></head><body>"
    data = head + russian.encode("cp1251") + b"</body></html>"
    assert len(head) > DETECT_SAMPLE_BYTES
    assert detect_encoding(data) == "cp1251"
    assert decode_html(data).text.endswith(russian + "</body></html>")


@pytest.mark.parametrize(
    ("codec", "text"),
    [
        ("gb18030", "<p>北京欢迎你，今天天气晴朗。</p>\n"),  # ASCII between the runs: cut at the run's start
        ("gb18030", "北京欢迎你，今天天气晴朗。"),  # one run: an even number of bytes into it
        ("cp932", "東京都の天気予報です。"),
        ("big5hkscs", "<b>台灣</b>繁體中文，首頁"),
        ("cp1251", "Привет, мир!"),
    ],
)
def test_neighbourhoods_are_capped_where_a_character_ends(codec: str, text: str) -> None:
    """The cap cuts the last piece where a character ends, whatever byte the limit falls on: the
    neighbourhoods decode strictly, and hold no more than the limit."""
    data = b"<html> " + text.encode(codec) * 200
    for limit in range(1, 400):
        neighbourhoods = charset_detection._neighbourhoods(data, limit)
        assert len(neighbourhoods) <= limit
        assert len(neighbourhoods) >= limit // 2 - 2 * charset_detection._CONTEXT, limit
        neighbourhoods.decode(codec)  # raises where a character is cut


def test_neighbourhoods_read_no_more_of_a_page_than_they_keep() -> None:
    """A page of 16 MiB whose non-ASCII bytes sit apart: the pieces stop at the limit, so what the scan
    holds (its spans, a hundred bytes or so a piece of 18) is bounded by the limit too, not by the page
    (8 MB here; the whole page's spans take over 100 MB)."""
    data = (b"a" * 20 + b"\xe9") * (16 * 1024 * 1024 // 21)
    tracemalloc.start()
    try:
        neighbourhoods = charset_detection._neighbourhoods(data)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(neighbourhoods) <= DETECT_SAMPLE_BYTES
    assert neighbourhoods.startswith(b"a" * charset_detection._CONTEXT + b"\xe9")
    assert peak < 64 * DETECT_SAMPLE_BYTES


@pytest.mark.parametrize("levels", [1, 3])
def test_windows_1252_competes_where_the_alphabets_chose_another_latin_reading(levels: int) -> None:
    """A page's few non-ASCII bytes can be "£££" price levels: windows-1250 reads them "ŁŁŁ", Polish
    letters the alphabet fit counts for it (on the page's bytes as they are), and windows-1251 then beat
    that reading in the contest (a corpus page of 563 KB read so once its tail was seen). windows-1252
    competes too, last: a page goes to it only where every other reading costs more. (The single-byte
    readings now judge each run as one "£", which the alphabets count for none of them: see
    test_charset_detection_symbols.py for pages without the Welsh word.)"""
    prices = '<script>{"levels":[{"v":"££££"},{"v":"£££"},{"v":"££"},{"v":"£"}]}</script>' * levels
    page = ENGLISH + prices + "<p>Ynys Môn – a walk.</p></body></html>"
    data = page.encode("cp1252")
    assert charset_detection._best_latin_reading(data, "cp1252")[0] == "cp1250"  # the alphabets' choice
    assert detect_encoding(data) == "cp1252"
    assert decode_html(data).text == page


def _with_one(text: str, codec: str, extra: bytes, shown: str) -> tuple[bytes, str]:
    """A page of `text` in `codec` with the bytes `extra` (one character Python's strict codec lacks)
    before its last sentence, and the text a browser reads from it (`extra` as `shown`)."""
    page = _page(text * 3 + "XX" + text)
    return page.encode(codec).replace(b"XX", extra), page.replace("XX", shown)


@pytest.mark.parametrize(
    ("codec", "text", "extra", "shown"),
    [
        ("gb18030", SIMPLIFIED_CHINESE, b"\x80", "€"),  # GBK's euro sign (code page 936)
        ("big5hkscs", TRADITIONAL_CHINESE, b"\xa3\xe1", "€"),  # Big5's euro sign (code page 950)
        ("big5hkscs", TRADITIONAL_CHINESE, "啱".encode("big5hkscs"), "啱"),  # HKSCS: not in strict big5
        ("big5hkscs", TRADITIONAL_CHINESE, "嘅".encode("big5hkscs"), "嘅"),
        ("euc_jp", JAPANESE, b"\xad\xea", "㈱"),  # NEC's row 13 (CP51932)
        ("euc_jp", JAPANESE, b"\xad\xa1", "①"),
        ("euc_jp", JAPANESE, b"\xad\xb6", "Ⅱ"),
        ("euc_jp", JAPANESE, b"\xfc\xe2", "髙"),  # NEC's selection of IBM's kanji
    ],
)
def test_one_character_only_a_browser_reads_does_not_rule_out_the_page_s_encoding(
    codec: str, text: str, extra: bytes, shown: str
) -> None:
    """charset-normalizer decodes with Python's strict codecs, so one such character ruled the right
    encoding out: GBK and Big5 pages came out windows-1252 or iso-8859-15 mojibake, EUC-JP ones GBK
    nonsense (`charset_detection._second_look`)."""
    data, expected = _with_one(text, codec, extra, shown)
    assert len(data.translate(None, bytes(range(128)))) > FEW_FOREIGN_BYTES
    decoded = decode_html(data)
    assert (decoded.text, decoded.encoding) == (expected, codec)


def test_the_second_look_keeps_the_first_answer_unless_its_reading_is_the_more_plausible(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A Latin page's bytes can read as Big5 but for HKSCS characters (ASCII letters are Big5 second
    bytes): blanked out, they leave a Big5 reading the detector may name, which must then also read as
    more plausible text than the first answer. The detector is made to name Big5 here."""
    import charset_normalizer

    german = "Grüße aus München: für Käse und Brötchen öffnet der Bäcker früh. " * 12
    data = german.encode("cp1252")
    found = charset_detection._browser_only_spans(data, "big5")
    assert found is not None and found.spans  # HKSCS pairs, nothing Big5 rejects
    first = charset_normalizer.from_bytes(data, cp_isolation=charset_detection._DETECTED_ENCODINGS)
    monkeypatch.setattr(charset_normalizer, "from_bytes", lambda *args, **kwargs: _Named("big5"))
    assert charset_detection._second_look(data, first) is first
    # A GBK page the first look read as windows-1252 (its euro sign ruled GBK out) takes the second.
    chinese, _ = _with_one(SIMPLIFIED_CHINESE, "gb18030", b"\x80", "€")
    monkeypatch.undo()
    sample = charset_detection._neighbourhoods(chinese)
    first = charset_normalizer.from_bytes(sample, cp_isolation=charset_detection._DETECTED_ENCODINGS)
    second = _Named("gb18030")
    monkeypatch.setattr(charset_normalizer, "from_bytes", lambda *args, **kwargs: second)
    assert charset_detection._second_look(sample, first) is second


class _Named:
    """A stand-in for the detector's matches whose best match names `encoding`."""

    def __init__(self, encoding: str) -> None:
        self.encoding = encoding

    def best(self) -> _Named:
        return self


def test_browser_only_spans_need_every_other_character_to_be_the_encoding_s() -> None:
    """A reading that errs where the standard's decoder errs too, more than once per
    `_BYTES_PER_ERROR` bytes (once at least: a stray byte), is no reading of the page: None. The few
    errors it may make are blanked out with the characters only a browser reads."""
    gbk = "中文 €5 中文".encode("gb18030").replace(b"\xa2\xe3", b"\x80")
    assert charset_detection._browser_only_spans(gbk, "gb18030") == ([(5, 6)], 12)
    assert charset_detection._browser_only_spans(gbk + b"\xff", "gb18030") == ([(5, 6), (12, 13)], 13)
    assert charset_detection._browser_only_spans(gbk + b"\xff\xff", "gb18030") is None
    assert charset_detection._browser_only_spans("中文".encode("gb18030"), "gb18030") == ([], 4)
    # A lead byte before an ASCII byte is one error, and the ASCII byte is read again.
    assert charset_detection._browser_only_spans(b"\xd6<p>", "gb18030") == ([(0, 1)], 4)
    long = "中文".encode("gb18030") * charset_detection._BYTES_PER_ERROR
    assert charset_detection._browser_only_spans(long + b"\xff" * 4, "gb18030") is not None
    assert charset_detection._browser_only_spans(long + b"\xff" * 5, "gb18030") is None


def test_browser_only_spans_stop_at_the_cap_after_the_last_one_collected() -> None:
    """Past `_MOST_BROWSER_ONLY` characters the reading ends after the last one collected, and nothing
    after it is read: a page of them costs no more than that many (each takes the error handler)."""
    most = charset_detection._MOST_BROWSER_ONLY
    many = b"\x80 " * (most + 1)
    found = charset_detection._browser_only_spans(many, "gb18030")
    assert found is not None
    assert found.spans == [(2 * i, 2 * i + 1) for i in range(most)]
    assert found.end == 2 * most - 1
    # Past the cap, errors are not counted either: the reading stands on what it was read to.
    assert charset_detection._browser_only_spans(many + b"\xff" * 99, "gb18030") == found
    assert charset_detection._browser_only_spans(many[:20], "gb18030") == (
        [(i, i + 1) for i in range(0, 20, 2)],
        20,
    )


# Cantonese written in Big5-HKSCS: 9 of its 59 characters (哋, 咗, 嘅, 喺, ...) are HKSCS codes.
CANTONESE = (
    "我哋今日去咗旺角食嘢，啲嘢好好食，佢話下次再嚟。你喺邊度？我冇時間，唔該你快啲啦。"
    "呢間餐廳嘅服務真係幾好，價錢都唔貴。"
)


def test_a_page_of_more_hkscs_characters_than_are_collected_is_big5_hkscs() -> None:
    """An undeclared Cantonese page with more HKSCS characters than `_browser_only_spans` collects was
    iso-8859-15 mojibake (1,000 paragraphs; no Big5 reading was left to look at again): the second look
    reads the sample up to the last one collected."""
    paragraphs = 4 * charset_detection._MOST_BROWSER_ONLY // 9 + 1
    page = "<html><body>" + "".join(f"<p>{CANTONESE}</p>\n" for _ in range(paragraphs)) + "</body></html>"
    data = page.encode("big5hkscs")
    assert data.decode("big5", errors="replace").count("\ufffd") > 4 * charset_detection._MOST_BROWSER_ONLY
    decoded = decode_html(data)
    assert (decoded.text, decoded.encoding) == (page, "big5hkscs")


def _cut_inside_last_character(page: str, codec: str) -> tuple[bytes, str]:
    """`page` in `codec` cut after the first byte of its last non-ASCII character (a crawler's byte cap),
    and the text a browser reads from that."""
    last = max(i for i, ch in enumerate(page) if not ch.isascii())
    return page[:last].encode(codec) + page[last].encode(codec)[:1], page[:last] + "\ufffd"


CJK_PAGES = [
    ("gb18030", SIMPLIFIED_CHINESE),
    ("big5hkscs", TRADITIONAL_CHINESE),
    ("euc_jp", JAPANESE),
    ("cp932", JAPANESE),
    ("cp949", KOREAN),
]


@pytest.mark.parametrize(("codec", "text"), CJK_PAGES)
def test_a_page_cut_inside_its_last_character_keeps_its_encoding(codec: str, text: str) -> None:
    """The detector's strict codecs rule an encoding out for a character the page's end cut off: GBK,
    Big5 and EUC-JP pages so cut were windows-1252, iso-8859-2 or iso-8859-15 mojibake, EUC-KR ones
    iso-8859-5. The detector's sample leaves that character out (`_complete_end`)."""
    data, expected = _cut_inside_last_character(_page(text * 4), codec)
    decoded = decode_html(data)
    assert (decoded.text, decoded.encoding) == (expected, codec)


@pytest.mark.parametrize(("codec", "text"), CJK_PAGES)
def test_one_stray_byte_does_not_rule_out_the_page_s_encoding(codec: str, text: str) -> None:
    """One 0xFF in the text (no character of any of these encodings) ruled the page's encoding out for
    the detector; the second look blanks it out, as it does a character only a browser reads."""
    page = _page(text * 4)
    data = page.encode(codec).replace(b"See ", b"See \xff", 1)
    decoded = decode_html(data)
    assert (decoded.text, decoded.encoding) == (page.replace("See ", "See \ufffd", 1), codec)


@pytest.mark.parametrize(
    ("data", "sample"),
    [
        (b"<p>\xb1\xb1\xbe", b"<p>\xb1\xb1"),  # a lead byte without its second byte
        (b"<p>\xb1\xb1", b"<p>\xb1\xb1"),
        (b"<p>\x81\x30\x81", b"<p>\x81\x30"),  # (GB18030's four-byte form cut after three bytes)
        (b"<p>\x81\x30\x81\x30", b"<p>\x81\x30\x81\x30"),
        (b"<p>\xb1\xb15", b"<p>\xb1\xb15"),  # a character, then a digit
        (b"<p>\xe9</p>" + b"x" * 20, b"<p>\xe9</p>xxxx"),  # (only the page's end is cut)
    ],
)
def test_the_sample_leaves_out_a_character_the_page_s_end_cut_off(data: bytes, sample: bytes) -> None:
    assert charset_detection._neighbourhoods(data) == sample


def test_blanked_spans_of_several_readings_may_overlap() -> None:
    assert charset_detection._blanked(b"abcdefgh", [(1, 3), (2, 4), (6, 7)]) == b"a ef h"
    assert charset_detection._blanked(b"abc", []) == b"abc"
