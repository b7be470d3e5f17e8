"""service.core.decoding: BOM, declared, meta, detected, default — and Central European pages."""

from __future__ import annotations

import codecs
import random
import tracemalloc

import pytest

from service.core import decoding
from service.core.decoding import (
    decode_html,
    parser_input,
    sniff_iso2022_jp,
    sniff_meta_charset,
    sniff_xml_encoding,
    utf8_payload,
    with_declared_encoding,
)
from service.core.encoding_labels import normalize_encoding
from service.core.prune import prune_html

CZECH_WORDS = [
    "příliš",
    "žluťoučký",
    "kůň",
    "úpěl",
    "ďábelské",
    "ódy",
    "šťastný",
    "čech",
    "šel",
    "přes",
    "řeku",
    "kde",
    "žil",
    "ježek",
    "všechny",
    "děti",
    "se",
    "učí",
    "ve",
    "škole",
    "číst",
    "psát",
    "ťukání",
    "na",
    "dveře",
    "žádost",
    "o",
    "změnu",
    "Šárka",
    "Žofie",
    "Ťapka",
    "náměstí",
    "město",
    "obec",
    "stát",
    "vláda",
    "zpráva",
    "počasí",
    "sport",
    "kultura",
    "ekonomika",
    "Česká",
    "republika",
    "Brno",
    "Ostrava",
    "Plzeň",
    "úřad",
]
SLOVAK_WORDS = [
    "ľudia",
    "sú",
    "slobodní",
    "a",
    "rovní",
    "v",
    "dôstojnosti",
    "aj",
    "právach",
    "ďaleko",
    "kôň",
    "päť",
    "šťastie",
    "žiť",
]
POLISH_WORDS = [
    "zażółć",
    "gęślą",
    "jaźń",
    "łódź",
    "świat",
    "książka",
    "pięć",
    "mąż",
    "wieś",
    "żona",
    "miłość",
    "dzień",
    "ręka",
]


def _czech_page(rng: random.Random, words: int, *, meta: str | None = None) -> str:
    text = " ".join(rng.choice(CZECH_WORDS) for _ in range(words))
    head = f'<meta charset="{meta}">' if meta else ""
    return f"<html><head>{head}<title>Zprávy</title></head><body><p>{text}</p></body></html>"


@pytest.mark.parametrize("encoding", ["windows-1250", "iso-8859-2"])
@pytest.mark.parametrize("seed", range(12))
def test_czech_without_meta(encoding: str, seed: int) -> None:
    rng = random.Random(seed)
    page = _czech_page(rng, 8 + seed * 5)
    decoded = decode_html(page.encode(encoding))
    assert decoded.text == page
    assert decoded.source == "detected"
    assert decoded.encoding == codecs.lookup(encoding).name


@pytest.mark.parametrize("encoding", ["windows-1250", "iso-8859-2"])
def test_czech_with_meta_charset(encoding: str) -> None:
    page = _czech_page(random.Random(1), 20, meta=encoding)
    decoded = decode_html(page.encode(encoding))
    assert (decoded.text, decoded.source) == (page, "meta")


@pytest.mark.parametrize("encoding", ["windows-1250", "iso-8859-2"])
def test_czech_with_http_equiv(encoding: str) -> None:
    text = " ".join(CZECH_WORDS[:12])
    page = (
        f'<html><head><meta http-equiv="Content-Type" content="text/html; charset={encoding}">'
        f"</head><body>{text}</body></html>"
    )
    decoded = decode_html(page.encode(encoding))
    assert (decoded.text, decoded.source) == (page, "meta")


@pytest.mark.parametrize(("words", "encoding"), [(SLOVAK_WORDS, "iso-8859-2"), (POLISH_WORDS, "cp1250")])
def test_other_central_european_languages(words: list[str], encoding: str) -> None:
    page = "<p>" + " ".join(words * 2) + "</p>"
    assert decode_html(page.encode(encoding)).text == page


GERMAN_WORDS = [
    "Grüße",
    "aus",
    "München",
    "für",
    "Straße",
    "Änderung",
    "Öffnungszeiten",
    "Übersicht",
    "schön",
]
WEST_ENCODED_PAGES = {
    # German with soft hyphens inside its words (on real pages the detector alone said cp775 or hp-roman8).
    "soft hyphens": " ".join(["Kinder\xadsitz\xadtest", "Sicher\xadheit", *GERMAN_WORDS] * 6),
    # English whose only non-ASCII characters are curly quotes: mac-roman would make "don’t" "donít".
    "curly quotes": "It\u2019s \u201cthe\u201d best \u2013 don\u2019t miss it. " * 5,
    # German with one Danish name: windows-1250 reads the "ø" as "ř" and fits German no worse.
    "stray letter": " ".join([*GERMAN_WORDS * 4, "Søren", "Kierkegaard"]),
    # An English page's only non-ASCII character, alone between spaces: "©", never iso-8859-2's "Š".
    "lone symbol": "Copyright \xa9 2023 KTRK-TV. All rights reserved. " * 3,
}


@pytest.mark.parametrize("text", WEST_ENCODED_PAGES.values(), ids=WEST_ENCODED_PAGES.keys())
def test_western_pages_without_meta(text: str) -> None:
    page = f"<html><body><p>{text}</p></body></html>"
    decoded = decode_html(page.encode("windows-1252"))
    assert decoded.text == page, decoded.encoding
    assert decoded.source == "detected"


def test_iso_8859_15_euro_is_not_the_currency_sign() -> None:
    page = "<p>" + " ".join(["Preis", "12,50 €", *GERMAN_WORDS] * 4) + "</p>"
    decoded = decode_html(page.encode("iso-8859-15"))
    assert decoded.text == page and "¤" not in decoded.text


@pytest.mark.parametrize(
    "data", [b"\xed\xa0\x80 lone", b"<p>caf\xe9</p>", b"ab\x80cd", b"<p>Hello w\xf6rld, and more text</p>"]
)
def test_short_pages_get_a_web_encoding(data: bytes) -> None:
    """No browser decodes cp1006, hp-roman8 or BOM-less UTF-16 from bytes like these; neither do we."""
    decoded = decode_html(data)
    assert decoded.encoding in {"cp1252", "iso8859-15", "cp1250", "iso8859-2"}, decoded.encoding
    assert decode_html(b"<p>caf\xe9</p>").text == "<p>café</p>"
    assert decode_html(b"<p>Hello w\xf6rld, and more text</p>").text == "<p>Hello wörld, and more text</p>"


OTHER_SCRIPTS = {
    "cp1251": "Привет, как дела? Это тест новой системы. Ещё один абзац о погоде в Москве, iPhone-версия.",
    "koi8-r": "Съешь же ещё этих мягких французских булок, да выпей чаю. Москва - столица России.",
    "cp1253": "Η Ελλάδα είναι χώρα της νοτιοανατολικής Ευρώπης. Η Αθήνα είναι η πρωτεύουσα.",
    "cp1255": "שלום עולם, זהו מבחן של מערכת חדשה לקידוד טקסט בעברית.",
    "cp1256": "مرحبا بالعالم، هذا اختبار لنظام جديد لترميز النصوص العربية.",
    "cp874": "สวัสดีชาวโลก นี่คือการทดสอบระบบใหม่สำหรับการเข้ารหัสข้อความภาษาไทย",
    "cp1254": "Türkiye Cumhuriyeti'nin başkenti Ankara'dır. İstanbul en kalabalık şehridir. Güzel ağaçlar.",
    "cp1257": "Lietuvos Respublika yra valstybė Baltijos jūros rytinėje pakrantėje. Ąžuolas, šaltinis.",
}


@pytest.mark.parametrize("encoding", OTHER_SCRIPTS)
@pytest.mark.parametrize("repeat", [1, 5, 30])
def test_other_scripts_without_meta(encoding: str, repeat: int) -> None:
    page = "<html><body><p>" + " ".join([OTHER_SCRIPTS[encoding]] * repeat) + "</p></body></html>"
    decoded = decode_html(page.encode(encoding))
    assert (decoded.text, decoded.encoding) == (page, codecs.lookup(encoding).name)


class _Guess:
    def __init__(self, encoding: str) -> None:
        self.encoding = encoding


class _Matches:
    def __init__(self, encoding: str) -> None:
        self._guess = _Guess(encoding)

    def best(self) -> _Guess:
        return self._guess


def test_a_cyrillic_guess_for_a_latin_page_is_overruled(monkeypatch: pytest.MonkeyPatch) -> None:
    """On real German pages full of soft hyphens charset-normalizer said KOI8-R ("fДhrt", "Sicher╜heit");
    the Latin reading wins when it has well under half the misfits. A Russian page keeps its guess."""
    import charset_normalizer

    monkeypatch.setattr(charset_normalizer, "from_bytes", lambda *_a, **_k: _Matches("koi8_r"))
    german = "<p>" + " ".join(["Sicher\xadheit", "fährt", "Größe", "Übersicht", "schön"] * 20) + "</p>"
    decoded = decode_html(german.encode("cp1252"))
    assert (decoded.text, decoded.encoding) == (german, "cp1252")
    russian = "<p>" + OTHER_SCRIPTS["koi8-r"] + "</p>"
    assert decode_html(russian.encode("koi8-r")).text == russian


def test_bom_wins_over_everything() -> None:
    page = '<meta charset="iso-8859-2"><p>Žluťoučký</p>'
    for codec, bom in (
        ("utf-8", codecs.BOM_UTF8),
        ("utf-16-le", codecs.BOM_UTF16_LE),
        ("utf-16-be", codecs.BOM_UTF16_BE),
        ("utf-32-le", codecs.BOM_UTF32_LE),
    ):
        decoded = decode_html(bom + page.encode(codec), encoding="windows-1252")
        assert (decoded.text, decoded.source, decoded.encoding) == (page, "bom", codec)


def test_declared_encoding_wins_over_meta() -> None:
    page = '<meta charset="utf-8"><p>Škoda</p>'
    decoded = decode_html(page.encode("cp1250"), encoding="windows-1250")
    assert (decoded.text, decoded.source, decoded.encoding) == (page, "declared", "cp1250")


def test_unknown_and_non_text_labels_are_ignored() -> None:
    page = b"<p>plain</p>"
    assert decode_html(page, encoding="no-such-charset").source == "detected"
    assert decode_html(page, encoding="base64").source == "detected"
    assert normalize_encoding("rot13") is None
    assert sniff_meta_charset(b'<meta charset="base64">') is None


@pytest.mark.parametrize("label", ["undefined", "idna", "punycode"])
def test_labels_of_codecs_that_raise_on_bytes_are_ignored(label: str) -> None:
    """Python text codecs that no browser knows and that raise even with errors="replace": a page that
    names one (`<meta charset="undefined">` comes out of real CMS templates) reads as undeclared."""
    page = "<p>café 北京</p>".encode()
    assert normalize_encoding(label) is None
    for declared in (
        decode_html(page, encoding=label),
        decode_html(f'<meta charset="{label}">'.encode() + page),
    ):
        assert declared.text.endswith("<p>café 北京</p>") and declared.encoding == "utf-8"
    assert with_declared_encoding(page, label) == page


def test_browser_label_aliases() -> None:
    # Browsers read iso-8859-1 and ascii as windows-1252: 0x80 is the euro sign.
    assert decode_html(b'<meta charset="iso-8859-1"><p>\x80</p>').text.endswith("€</p>")
    assert normalize_encoding("US-ASCII") == "cp1252"
    assert normalize_encoding("shift_jis") == "cp932"
    # A page that says utf-16 in ASCII bytes is not UTF-16.
    assert sniff_meta_charset(b'<meta charset="utf-16">') == "utf-8"


@pytest.mark.parametrize(
    ("label", "text", "codec"),
    [
        ("windows-874", "สวัสดีครับ", "cp874"),  # Thai pages' usual label, unknown to Python
        ("iso-8859-8-i", "שלום עולם", "iso8859-8"),  # Hebrew, logical order
        ("x-mac-roman", "Café Ørsted", "mac-roman"),
        ("x-cp1250", "Žluťoučký kůň", "cp1250"),
        ("ksc5601", "똠방각하", "cp949"),  # Python's euc_kr lacks the UHC syllables
        ("x-euc-jp", "日本語のテキスト", "euc_jp"),
        ("iso88592", "Żółć", "iso8859-2"),
        ("csisolatin1", "\u20ac 5", "cp1252"),
    ],
)
def test_every_whatwg_label_is_read_as_browsers_read_it(label: str, text: str, codec: str) -> None:
    """Labels of the WHATWG Encoding Standard that Python knows under another codec, or not at all,
    were ignored (the page went to the detector) or read with a subset (U+FFFD for what it lacks)."""
    page = f'<meta charset="{label}"><p>{text}</p>'
    data = page.encode("cp1252" if codec == "cp1252" else codec).replace(b"\\u20ac", b"\x80")
    assert normalize_encoding(label) == codec
    decoded = decode_html(data)
    assert (decoded.text, decoded.source) == (page.replace("\\u20ac", "\u20ac"), "meta")
    assert decode_html(data.split(b">", 1)[1], encoding=label.upper()).text == f"<p>{text}</p>".replace(
        "\\u20ac", "\u20ac"
    )


@pytest.mark.parametrize("label", ["utf-7", "cp037", "cp500"])
def test_meta_labels_of_codecs_that_misread_ascii_are_ignored(label: str) -> None:
    """A `<meta>` read in ASCII bytes cannot declare a codec that reads ASCII as something else
    (EBCDIC, UTF-7): the page was noise ("C++" came out "C\ufffd")."""
    page = f'<meta charset="{label}"><p>C++ & a+b=c, café</p>'
    assert sniff_meta_charset(page.encode()) is None
    assert decode_html(page.encode()).text == page
    assert utf8_payload(page.encode()) is None or decode_html(page.encode()).encoding == "utf-8"


@pytest.mark.parametrize("label", ["utf-7", "UTF-32", "utf-32le", "cp037", "ibm500", "unicode_escape"])
def test_declared_charsets_a_browser_ignores_are_ignored(label: str) -> None:
    """An HTTP charset (or a WARC record's, a JSONL row's) that no browser knows and that reads ASCII as
    something else was honoured: a windows-1251 page sent with `charset=utf-7` came out as noise where its
    `<meta>` said it right. Now the page's own declaration decides, on every path."""
    page = '<meta charset="windows-1251"><title>Привет, мир</title><p>C++ и a+b=c</p>'
    data = page.encode("cp1251")
    assert decode_html(data, encoding=label).text == page
    assert with_declared_encoding(data, label) == data
    assert prune_html(data, encoding=label) == prune_html(data)
    assert utf8_payload(b"<p>C++ a+b</p>", encoding=label) == b"<p>C++ a+b</p>"


def test_a_declared_utf16_charset_is_kept_and_escape_codecs_are_no_labels() -> None:
    """UTF-16 is a web encoding: bytes sent with a UTF-16 charset and no BOM are UTF-16. Python's escape
    codecs are text codecs to `codecs` but no page's encoding: a `<meta>` naming one is passed over."""
    text = "<p>Grüße, Здравствуйте</p>"
    for label, codec in (("utf-16le", "utf-16-le"), ("UTF-16BE", "utf-16-be")):
        assert decode_html(text.encode(codec), encoding=label).text == text
    # Bytes without a NUL are no UTF-16 markup: a server's default charset over a UTF-8 page (it was
    # read as CJK noise). The page's own <meta>, UTF-8 or the detector decide, as undeclared.
    utf8 = ('<html><meta charset="utf-8"><p>' + text + "</p>").encode()
    for label in ("utf-16", "UTF-16LE", "utf-16be", "ucs-2", "unicode"):
        decoded = decode_html(utf8, encoding=label)
        assert decoded.text == utf8.decode() and decoded.source == "meta", label
        assert decode_html(b"<p>plain ASCII</p>", encoding=label).text == "<p>plain ASCII</p>"
        assert with_declared_encoding(utf8, label) == utf8
        assert utf8_payload(utf8, encoding=label) == utf8
        assert prune_html(utf8, encoding=label) == prune_html(utf8)
    page = '<meta charset="unicode_escape"><p>a\\nb</p>'
    assert normalize_encoding("unicode_escape") is None and normalize_encoding("raw_unicode_escape") is None
    assert decode_html(page.encode()).text == page


UTF16_LABELS = ("utf-16", "UTF-16LE", "utf-16be", "ucs-2", "unicode")


@pytest.mark.parametrize("meta", ['<meta charset="utf-8">', ""])
def test_a_declared_utf16_charset_over_a_page_with_a_stray_nul_is_ignored(meta: str) -> None:
    """One NUL byte anywhere in a UTF-8 page had been enough to keep a declared UTF-16 charset, which made
    the page CJK noise: a NUL beside ASCII text is no UTF-16 markup, whose `<` and every other ASCII
    character come with a NUL high byte. The page reads as it does undeclared, on every path."""
    page = f"<html>{meta}<title>Grüße</title><p>Здравствуйте, 北京. A plain English sentence.</p></html>"
    data = page.encode()
    english = data.index(b"A plain")
    for at in (0, 1, 6, 7, english, english + 1, len(data) - 1, len(data)):  # even and odd, in ASCII
        with_nul = data[:at] + b"\0" + data[at:]
        expected = decode_html(with_nul)
        assert expected.text == with_nul.decode()
        for label in UTF16_LABELS:
            decoded = decode_html(with_nul, encoding=label)
            assert (decoded.text, decoded.encoding, decoded.source) == (
                expected.text,
                expected.encoding,
                expected.source,
            ), (at, label)
            assert with_declared_encoding(with_nul, label) == with_nul
            assert utf8_payload(with_nul, encoding=label) == utf8_payload(with_nul)
    with_nul = data[:6] + b"\0" + data[6:]  # after "<html>": a NUL after a ">", not after a "<"
    assert prune_html(with_nul, encoding="utf-16") == prune_html(with_nul)


def test_a_declared_utf16_charset_is_kept_for_utf16_with_little_markup() -> None:
    """A UTF-16 page that is mostly Chinese text has too few ASCII code units for `sniff_utf16` to read
    it undeclared; declared, the `<` of its tags is enough, in the declared byte order only."""
    page = "<p>" + "北京欢迎你。今天天气晴朗，明天有雨。" * 40 + "</p>"
    for label, codec in (("utf-16", "utf-16-le"), ("utf-16le", "utf-16-le"), ("utf-16be", "utf-16-be")):
        data = page.encode(codec)
        assert decode_html(data).encoding != codec  # not UTF-16 undeclared
        decoded = decode_html(data, encoding=label)
        assert (decoded.text, decoded.encoding, decoded.source) == (page, codec, "declared")


def test_undeclared_iso2022_jp_is_read_as_iso2022_jp() -> None:
    """ISO-2022-JP is all ASCII bytes: read as UTF-8 (every other ASCII reading), a Japanese page was its
    escape sequences and the ASCII its kanji and kana are written with. Browsers' detectors read it as
    ISO-2022-JP where it switches out of ASCII by the encoding's escapes and decodes without an error."""
    page = "<html><head><title>日本語のページ</title></head><body><p>東京都の天気予報です。</p></body></html>"
    data = page.encode("iso2022_jp")
    assert data.isascii() and b"\x1b$B" in data
    decoded = decode_html(data)
    assert (decoded.text, decoded.encoding, decoded.source) == (page, "iso2022_jp", "detected")
    assert utf8_payload(data) is None
    assert prune_html(data) == prune_html(page)
    assert with_declared_encoding(data, "iso-2022-jp") == data
    # ESC $ @ (JIS C 6226) and ESC ( J (JIS X 0201 Roman, where 0x5C is the yen sign) too.
    assert decode_html(b"<p>\x1b$@F|K\\\x1b(B</p>").text == "<p>日本</p>"
    assert decode_html(b"<p>\x1b(J\\100\x1b(B</p>").text == "<p>\xa5100</p>"
    # A declaration still decides: ASCII declared UTF-8 is UTF-8.
    assert decode_html(data, encoding="utf-8").text == data.decode("ascii")
    # Escapes that are not ISO-2022-JP's (an ANSI colour code), SO/SI, a bad double byte, or only the
    # escape back to ASCII: UTF-8, as before.
    for ascii_page in (
        b"<pre>\x1b[31mred\x1b[0m</pre>",
        b"<p>\x1b$BF|K\\\x1b(B \x1b[0m</p>",
        b"<p>\x1b$B\x0eF|\x1b(B</p>",
        b"<p>\x1b$BF|K\x1b(B</p>",
        b"<p>\x1b(Bplain</p>",
        b"<p>plain</p>",
    ):
        decoded = decode_html(ascii_page)
        assert (decoded.text, decoded.encoding) == (ascii_page.decode("ascii"), "utf-8"), ascii_page
        assert utf8_payload(ascii_page) == ascii_page


def test_utf8_cut_inside_its_last_character_is_utf8() -> None:
    """A crawler's byte cap cuts pages anywhere: an undeclared UTF-8 page that ends inside a character
    is UTF-8 with one U+FFFD, not GBK or windows-1252 mojibake."""
    chinese, czech = "<p>" + "北京欢迎你。" * 20, "<p>Příliš žluťoučký kůň úpěl ďábelské ódy. " * 5 + "ž"
    for text, cut in ((chinese, 1), (chinese, 2), (czech, 1)):
        decoded = decode_html(text.encode()[:-cut])
        assert (decoded.text, decoded.encoding) == (text[:-1] + "\ufffd", "utf-8")
    # One non-ASCII byte at the end of an ASCII page is no sign of UTF-8: the detector decides.
    assert decode_html(b"<p>Caf\xe9").text == "<p>Café"


def test_utf8_without_declaration_and_empty_input() -> None:
    page = "<p>Grüße, Здравствуйте, 你好</p>"
    assert decode_html(page.encode()).text == page
    assert decode_html(page.encode()).source == "detected"
    empty = decode_html(b"")
    assert (empty.text, empty.source) == ("", "default")


def test_undecodable_bytes_are_replaced_never_raised() -> None:
    decoded = decode_html(b'<meta charset="utf-8"><p>a\xff\xfeb</p>')
    assert "\ufffd" in decoded.text and decoded.text.endswith("b</p>")
    garbage = bytes(random.Random(3).getrandbits(8) for _ in range(5000))
    assert isinstance(decode_html(garbage).text, str)


def test_str_input_passes_through() -> None:
    decoded = decode_html("<p>já</p>")
    assert (decoded.text, decoded.source) == ("<p>já</p>", "str")


@pytest.mark.parametrize(
    "data",
    [
        b"<p>ascii only</p>",
        codecs.BOM_UTF8 + "<p>č</p>".encode(),
        b'<meta charset="utf-8"><p>\xc4\x8d and a bad byte \xff</p>',
        "<p>č</p>".encode("cp1250"),
        b'<meta charset="koi8-r"><p>\xf0\xd2\xc9</p>',
        b'<?xml version="1.0" encoding="utf-8"?><p>caf\xe9, caf\xc3\xa9</p>',
        b'<?xml version="1.0" encoding="iso-2022-jp"?><p>\x1b$B$3$s\x1b(B</p>',
    ],
)
def test_utf8_payload_agrees_with_decode_html(data: bytes) -> None:
    payload = utf8_payload(data)
    decoded = decode_html(data)
    if payload is not None:
        assert payload.decode("utf-8") == decoded.text  # valid UTF-8 only: invalid bytes are repaired
        assert parser_input(data) == payload
    else:
        assert decoded.encoding != "utf-8" or decoded.source == "detected"
        assert parser_input(data) == decoded.text


def test_with_declared_encoding_changes_bytes_only_when_the_reading_changes() -> None:
    text = "<html><body><p>Příliš žluťoučký kůň</p></body></html>"
    cp1250 = text.encode("cp1250")
    meta = '<html><head><meta charset="windows-1250"></head><body><p>Příliš žluťoučký kůň</p></body></html>'
    # Nothing to change: no codec named, a BOM, a <meta> that agrees, UTF-8 declared for UTF-8.
    assert with_declared_encoding(cp1250, None) is cp1250
    assert with_declared_encoding(cp1250, "no-such-charset") is cp1250
    bom = codecs.BOM_UTF8 + text.encode()
    assert with_declared_encoding(bom, "windows-1250") is bom
    assert with_declared_encoding(meta.encode("cp1250"), "cp1250") == meta.encode("cp1250")
    assert with_declared_encoding(text.encode(), "utf-8") == text.encode()
    # A declaration the bytes alone would not give: the declared reading, as UTF-8 behind a BOM.
    latin2 = text.encode("iso-8859-2")
    fixed = with_declared_encoding(meta.encode(), "utf-8")  # UTF-8 text whose <meta> says windows-1250
    assert fixed.startswith(codecs.BOM_UTF8) and decode_html(fixed).text == meta
    assert decode_html(with_declared_encoding(latin2, "iso-8859-2")).text == text


def test_text_is_taken_as_bytes_with_a_bom_would_be() -> None:
    """A client's `raw.decode("utf-8")` of a BOM page keeps U+FEFF, which the parser read as body text
    (the title moved into the body: other tokens than the bytes gave); lone surrogates (text decoded
    with surrogateescape) were dropped by the parser where an undecodable byte gives U+FFFD."""
    page = "<html><head><title>Café</title></head><body><p>Grüße</p></body></html>"
    raw = "\ufeff".encode() + page.encode()
    assert decode_html(raw.decode("utf-8")).text == decode_html(raw).text == page
    assert prune_html(raw.decode("utf-8")) == prune_html(raw)
    escaped = b"<p>caf\xe9 ok</p>".decode("utf-8", "surrogateescape")
    assert decode_html(escaped).text == "<p>caf\ufffd ok</p>"
    assert prune_html(escaped) == prune_html(b"<p>caf\xe9 ok</p>".decode("utf-8", "replace"))


KOI8_PAGE = "<p>Съешь же ещё этих мягких французских булок, да выпей чаю.</p>"
NOT_DECLARATIONS = {
    "in a comment": b'<!-- <meta charset="gbk"> -->',
    "in another tag's attribute": b'<div data-x="<meta charset=gbk>"></div>',
    "an attribute ending in charset": b'<meta data-charset="gbk">',
    "content without http-equiv": b'<meta name="x" content="text/html; charset=gbk">',
    "content beside another http-equiv": b'<meta http-equiv="refresh" content="0; charset=gbk">',
    "inside a processing instruction": b'<?php echo "<meta charset=gbk>" ?>',
}


@pytest.mark.parametrize("markup", NOT_DECLARATIONS.values(), ids=NOT_DECLARATIONS.keys())
def test_the_prescan_reads_only_what_browsers_read_as_a_declaration(markup: bytes) -> None:
    """The HTML Standard's prescan skips comments and other tags' attributes, and takes `content` only
    beside `http-equiv="content-type"`: the page's real `<meta>` after such markup decides."""
    data = b"<html><head>" + markup + b'<meta charset="koi8-r"></head><body>' + KOI8_PAGE.encode("koi8-r")
    assert sniff_meta_charset(markup + b"<p>plain</p>") is None
    assert sniff_meta_charset(data) == "koi8-r"
    decoded = decode_html(data)
    assert (decoded.encoding, decoded.source) == ("koi8-r", "meta")
    assert decoded.text.endswith(KOI8_PAGE)


@pytest.mark.parametrize(
    ("head", "codec"),
    [
        # A <meta> naming no codec a page can be in is passed over for the next one.
        (b'<meta charset="no-such-charset"><meta charset="koi8-r">', "koi8-r"),
        (b'<meta charset="utf-7"><meta charset="koi8-r">', "koi8-r"),
        # `charset` outranks `content` in one element, whichever comes first; a `charset` naming no
        # codec makes the element declare nothing, whatever its `content` says.
        (b'<meta http-equiv="Content-Type" content="text/html; charset=gbk" charset="koi8-r">', "koi8-r"),
        (
            b'<meta charset="bogus" http-equiv="content-type" content="text/html; charset=gbk">'
            b'<meta charset="koi8-r">',
            "koi8-r",
        ),
        # The first of an attribute given twice counts.
        (b'<meta charset="utf-7" charset="gbk"><meta charset="koi8-r">', "koi8-r"),
        # The spec's special cases: x-user-defined is windows-1252, BOM-less UTF-16 XML is UTF-16.
        (b'<meta charset="x-user-defined">', "cp1252"),
        ("<?xml".encode("utf-16-le"), "utf-16-le"),
        ("<?xml".encode("utf-16-be"), "utf-16-be"),
    ],
)
def test_the_prescan_follows_the_html_standard(head: bytes, codec: str | None) -> None:
    assert sniff_meta_charset(head + b"<p>plain</p>") == codec


def test_the_prescan_knows_no_script_as_browsers_do_not() -> None:
    """Browsers' prescan reads a script's text as markup: a `<meta>` in it declares, and a `<!--` in a
    string opens a comment that hides the real `<meta>` after it (the page then goes undeclared)."""
    assert sniff_meta_charset(b"<script>document.write('<meta charset=\"koi8-r\">')</script>") == "koi8-r"
    assert sniff_meta_charset(b"<script>var open = '<!--';</script><meta charset=\"koi8-r\">") is None


def test_a_meta_outranks_the_xml_declaration() -> None:
    """Browsers ignore an XML declaration in text/html where a `<meta>` declares: it used to win."""
    data = b'<?xml version="1.0" encoding="iso-8859-1"?><html><head><meta charset="koi8-r"></head>'
    decoded = decode_html(data + KOI8_PAGE.encode("koi8-r"))
    assert (decoded.text, decoded.source) == (data.decode("ascii") + KOI8_PAGE, "meta")


def test_utf8_outranks_the_xml_declaration() -> None:
    """A UTF-8 page with a stale `iso-8859-1` XML declaration is UTF-8, not "GrÃ¼ÃŸe" mojibake."""
    page = '<?xml version="1.0" encoding="iso-8859-1"?>\n<html><body><p>Grüße, Здравствуйте, 你好</p></body>'
    data = page.encode()
    decoded = decode_html(data)
    assert (decoded.text, decoded.encoding, decoded.source) == (page, "utf-8", "detected")
    assert with_declared_encoding(data, "utf-8") == data
    # Read as declared, windows-1252's undefined 0x81 (in "с", D1 81) is the C1 control a browser gives.
    as_declared = data.decode("cp1252", "replace").replace("\ufffd", "\x81")
    assert decode_html(with_declared_encoding(data, "iso-8859-1")).text == as_declared


def test_the_xml_declaration_decides_where_nothing_else_does() -> None:
    """Without a `<meta>`, for bytes that are not UTF-8 (or are all ASCII: ISO-2022-JP), the
    declaration beats the detector's guess: two Russian words alone are too little to go on."""
    page = '<?xml version="1.0" encoding="windows-1251"?><html><body><p>Привет мир</p></body></html>'
    decoded = decode_html(page.encode("cp1251"))
    assert (decoded.text, decoded.encoding, decoded.source) == (page, "cp1251", "xml")
    japanese = "<?xml version='1.0' encoding='iso-2022-jp'?><p>こんにちは、世界</p>"
    data = japanese.encode("iso2022_jp")
    assert data.isascii()
    decoded = decode_html(data)
    assert (decoded.text, decoded.source) == (japanese, "xml")
    assert utf8_payload(data) is None
    assert decode_html(with_declared_encoding(data, "utf-8")).text == data.decode("ascii")
    # Where it names UTF-8, or nothing, ASCII bytes stay a UTF-8 payload.
    assert utf8_payload(b'<?xml version="1.0" encoding="utf-8"?><p>x</p>') is not None


GB18030_TEXT = "中文网页 ⺁ 𠮷 ㄅ"  # ⺁ and 𠮷 are GB18030's 0xFE50 and a four-byte code: not in Python's GBK


@pytest.mark.parametrize(
    "label", ["gbk", "GB2312", "x-gbk", "chinese", "csgb2312", "iso-ir-58", "GB_2312-80"]
)
def test_gbk_labels_decode_as_gb18030(label: str) -> None:
    """The Encoding Standard decodes GBK and GB2312 with its gb18030 decoder, and 0x80 is the euro sign;
    Python's gbk codec turned both into U+FFFD."""
    body = GB18030_TEXT.encode("gb18030") + b" \x80 5"
    expected = f"{GB18030_TEXT} \u20ac 5"
    assert normalize_encoding(label) == "gb18030"
    meta = decode_html(f'<meta charset="{label}">'.encode() + body)
    assert (meta.text, meta.encoding) == (f'<meta charset="{label}">{expected}', "gb18030")
    assert decode_html(body, encoding=label).text == expected


def test_gb18030_reads_0x80_as_the_euro_only_where_a_character_starts() -> None:
    """As a second byte 0x80 is part of a two-byte character ("亐" is 0x8180); elsewhere undecodable
    bytes are still U+FFFD."""
    data = b'<meta charset="gb18030"><p>\x80\x81\x80\xff</p>'
    assert decode_html(data).text == '<meta charset="gb18030"><p>\u20ac亐\ufffd</p>'


def test_a_page_of_0x80_bytes_in_gb18030_is_not_read_one_error_at_a_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The standard's reading of undecodable bytes (the euro sign among them) runs in Python once per
    such byte (16 MiB of 0x80 took 5 s of a worker): past `_MOST_BROWSER_ERRORS` of them they are U+FFFD
    like any undecodable byte, and the handler never runs."""
    from service.core import encoding_labels

    monkeypatch.setattr(encoding_labels, "_MOST_BROWSER_ERRORS", 8)
    calls: list[int] = []
    real = encoding_labels._browser_error

    def counted(error: UnicodeError) -> tuple[str, int]:
        calls.append(1)
        return real(error)

    monkeypatch.setattr(encoding_labels, "_browser_error", counted)
    encoding_labels._browser_errors.cache_clear()
    try:
        assert decode_html(b"<p>\x80" * 4, encoding="gbk").text == "<p>\u20ac" * 4
        assert calls
        calls.clear()
        assert decode_html(b"<p>\x80" * 9, encoding="gbk").text == "<p>\ufffd" * 9
        assert not calls
    finally:
        encoding_labels._browser_errors.cache_clear()


def test_utf16_markup_without_a_bom_is_utf16_whatever_is_declared() -> None:
    """A crawler that kept a UTF-16 page's bytes and lost its header: read as windows-1252 (or UTF-8, when
    all ASCII) its markup came out escaped as text with a NUL between every two characters. A NUL in
    every other byte is no ASCII-compatible page, so UTF-16 wins over a declaration too; binary junk
    (NULs anywhere) and ordinary pages are not UTF-16."""
    text = "<html><title>Zdravím</title><p>Příliš žluťoučký kůň úpěl ďábelské ódy.</p></html>"
    for codec in ("utf-16-le", "utf-16-be"):
        for source in (text, "<p>only ASCII</p>", text + "<p>cut"):
            data = source.encode(codec)
            for declared in (None, "iso-8859-1", "utf-8", "utf-16"):
                decoded = decode_html(data, encoding=declared)
                assert (decoded.text, decoded.encoding) == (source, codec), (codec, source, declared)
            assert utf8_payload(data) is None
            assert prune_html(data) == prune_html(source)
        cut = text.encode(codec)[:-1]  # an odd length: the last half character is one U+FFFD
        assert decode_html(cut).text == text[:-1] + "\ufffd"
    junk = bytes(range(256)) * 16
    assert (
        decode_html(junk).encoding != "utf-16-le"
        and decode_html(b"\0" * 100 + b"<p>x</p>").text[-8:] == "<p>x</p>"
    )
    assert decode_html(b"<p>a\0b</p>").text == "<p>a\0b</p>"


POLISH_PAGE = "<html><body><p>" + " ".join(POLISH_WORDS * 3) + "</p>"  # 108 two-byte letters


def test_utf8_with_a_few_stray_bytes_is_utf8() -> None:
    """A UTF-8 page with a windows-1252 "é" pasted into it is UTF-8 with a U+FFFD there: the detector read
    such a Polish page as windows-1251 (not one of its phrases survived), others as windows-1250."""
    data = POLISH_PAGE.encode() + b"<p>Caf\xe9 cr\xe8me</p>"
    decoded = decode_html(data)
    expected = POLISH_PAGE + "<p>Caf\ufffd cr\ufffdme</p>"
    assert (decoded.text, decoded.encoding, decoded.source) == (expected, "utf-8", "detected")
    # A declared UTF-8 changes nothing, so the bytes stay as they are.
    assert with_declared_encoding(data, "utf-8") is data
    assert prune_html(data) == prune_html(expected)


@pytest.mark.parametrize(
    ("letters", "stray", "utf8"), [(40, 2, True), (39, 2, False), (20, 1, True), (19, 1, False)]
)
def test_mostly_utf8_is_twenty_valid_sequences_per_invalid_one(letters: int, stray: int, utf8: bool) -> None:
    """Legacy text is next to never valid UTF-8 by accident: every legacy corpus page has as many invalid
    sequences as valid ones or more, UTF-8 pages with stray bytes 1 in 25 at most."""
    data = b"<p>" + "\u017c".encode() * letters + b" caf\xe9" * stray + b"</p>"
    assert (decode_html(data).encoding == "utf-8") is utf8


def test_mostly_utf8_counts_a_written_u_fffd_as_valid_whatever_the_chunks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """U+FFFD written in the page (EF BF BD) is a valid sequence, also where a chunk's end cuts it."""
    from service.core import decoding

    written = ("\u017c" * 30 + "\ufffd" * 30).encode()  # 60 valid sequences: 3 invalid ones at most
    for chunk in (decoding._MOSTLY_UTF8_CHUNK, 5, 7):
        monkeypatch.setattr(decoding, "_MOSTLY_UTF8_CHUNK", chunk)
        assert decoding._mostly_utf8(written + b"\xe9" * 3) == written.decode() + "\ufffd" * 3, chunk
        assert decoding._mostly_utf8(written + b"\xe9" * 4) is None, chunk


def test_a_legacy_page_is_given_up_after_a_chunk(monkeypatch: pytest.MonkeyPatch) -> None:
    """Counting invalid sequences stops once they are more than the page's length could excuse: a legacy
    or binary page was decoded whole, one error at a time (5 MB of random bytes took 150 ms)."""
    from service.core import decoding

    fed: list[int] = []
    real = codecs.getincrementaldecoder

    def counting(encoding: str) -> type[codecs.IncrementalDecoder]:
        class Counting(real(encoding)):  # type: ignore[misc]
            def decode(self, data: bytes, final: bool = False) -> str:
                fed.append(len(data))
                return str(super().decode(data, final))

        return Counting

    russian = "<p>Съешь же ещё этих мягких французских булок, да выпей чаю.</p>\n".encode("cp1251") * 16384
    assert decode_html(russian).encoding == "cp1251"
    monkeypatch.setattr(codecs, "getincrementaldecoder", counting)
    assert decoding._mostly_utf8(russian) is None
    assert 0 < sum(fed) <= decoding._MOSTLY_UTF8_CHUNK < len(russian) // 10


UTF8_WITH_META = (
    '<html><head><meta charset="utf-8"></head><body><p>Grüße, Здравствуйте, 你好</p></body></html>'
)


@pytest.mark.parametrize(
    "label",
    ["latin-1", "latin_1", "cp437", "johab", "cp936", "utf_8", "'utf-8'", "windows-1252;", "<?windows-1251"],
)
def test_labels_the_encoding_standard_does_not_know_are_ignored(label: str) -> None:
    """A browser reads a label by the Encoding Standard's table alone; Python's lookup had honoured its
    own names and aliases, quotes and punctuation included: an HTTP `charset=latin-1` over a UTF-8 page
    whose `<meta>` says UTF-8 came out as mojibake. On every path (HTTP, a WARC record's or a JSONL row's
    charset, a `<meta>`, an XML declaration) the page's own evidence now decides."""
    data = UTF8_WITH_META.encode()
    decoded = decode_html(data, encoding=label)
    assert (decoded.text, decoded.source) == (UTF8_WITH_META, "meta")
    assert with_declared_encoding(data, label) is data
    assert prune_html(data, encoding=label) == prune_html(data)
    russian = "<p>Привет, как дела? Это тест новой системы.</p>".encode("cp1251")
    assert sniff_meta_charset(f'<meta charset="{label}">'.encode() + russian) is None
    assert sniff_xml_encoding(f'<?xml version="1.0" encoding="{label}"?>'.encode()) is None


def test_labels_are_read_with_ascii_white_space_and_case_only() -> None:
    """The standard strips ASCII white space (not a vertical tab) and lower-cases ASCII letters."""
    page = '<meta charset="windows-1251"><p>Привет, как дела? Это тест новой системы.</p>'
    data = page.encode("cp1251")
    assert decode_html(data, encoding="\t Windows-1251\r\n").source == "declared"
    assert sniff_meta_charset(b'<meta charset=" KOI8-R\x0c">') == "koi8-r"
    assert sniff_meta_charset(b'<meta charset="utf-8\x0b">') is None
    assert decode_html(data, encoding="utf-8\x0b").text == page


@pytest.mark.parametrize(
    "label", ["iso-2022-kr", "csiso2022kr", "hz-gb-2312", "iso-2022-cn", "iso-2022-cn-ext", "replacement"]
)
def test_replacement_encoding_labels_are_ignored(label: str) -> None:
    """The standard decodes a page under these labels to one U+FFFD, leaving nothing to embed; Python's
    7-bit codecs made every non-ASCII byte U+FFFD, and HZ ate `~` (`/~bob/` came out `/\ufffdbob/`). As
    undeclared, the page's own evidence decides."""
    page = "<html><body><p><a href='/~bob/'>Grüße, Здравствуйте, 你好</a> ~~</p></body></html>"
    meta = f'<meta charset="{label}">' + page
    assert sniff_meta_charset(meta.encode()) is None
    assert decode_html(meta.encode()).text == meta
    assert decode_html(page.encode(), encoding=label).text == page
    assert with_declared_encoding(page.encode(), label) == page.encode()


def test_windows_code_pages_read_the_bytes_microsoft_left_undefined_as_browsers_do() -> None:
    """windows-1252's 0x81, 0x8D, 0x8F, 0x90, 0x9D are C1 controls in the standard's table (U+FFFD in
    Python's, which counted against the page at extraction's U+FFFD share); windows-1255's 0xCA is a
    Hebrew point."""
    decoded = decode_html(b'<meta charset="windows-1252"><p>a\x81b\x8dc\x8fd\x90e\x9df \x80</p>')
    assert decoded.text.endswith("<p>a\x81b\x8dc\x8fd\x90e\x9df \u20ac</p>")
    hebrew = decode_html(b"<p>\xe5\xca\xf9</p>", encoding="windows-1255")
    assert hebrew.text == "<p>\u05d5\u05ba\u05e9</p>"


def test_koi8_u_reads_belarusian_short_u_as_the_standard_does() -> None:
    """KOI8-U's 0xAE/0xBE are ў/Ў in the Encoding Standard's table (its `koi8-ru` label is the same
    encoding); Python's koi8_u follows RFC 2319, where they are box-drawing characters."""
    data = b"".join(
        (b"<p>", "Беларуская мова: ".encode("koi8_u"), b"\xae", "сё, ".encode("koi8_u"), b"\xbe"),
    ) + "зыходзіць</p>".encode("koi8_u")
    for label in ("koi8-u", "koi8-ru"):
        decoded = decode_html(data, encoding=label)
        assert decoded.text == "<p>Беларуская мова: ўсё, Ўзыходзіць</p>", decoded.text


def test_iso2022_jp_with_nec_symbols_is_read_as_iso2022_jp() -> None:
    """Python's strict iso2022_jp lacks NEC's row 13 and IBM's rows (457 codes: ①, ㈱, Ⅱ, 髙), which the
    standard's decoder reads: undeclared, a page with one ① was read as UTF-8, its escape sequences and
    all; declared, "お問い合わせは㈱山田商事①本社まで" lost both symbols to U+FFFD."""
    data = b"<p>\x1b$B$*Ld$$9g$o$;$O-j;3ED>&;v-!K\\<R$^$G\x1b(B</p>"
    page = "<p>お問い合わせは㈱山田商事①本社まで</p>"
    assert sniff_iso2022_jp(data) == page
    for encoding, source in ((None, "detected"), ("iso-2022-jp", "declared")):
        decoded = decode_html(data, encoding=encoding)
        assert (decoded.text, decoded.encoding, decoded.source) == (page, "iso2022_jp", source)
    assert parser_input(data) == page
    # A pair neither table holds (row 85) is an error: the page stays UTF-8.
    bad = b"<p>\x1b$B-!u!\x1b(B</p>"
    assert sniff_iso2022_jp(bad) is None
    assert decode_html(bad).encoding == "utf-8"


def test_iso2022_jp_with_half_width_katakana_is_read_as_a_browser_reads_it() -> None:
    """ESC ( I (JIS X 0201 katakana) is one of the Encoding Standard's ISO-2022-JP escapes: a page that
    used it was refused by the sniff (an ESC outside the escapes it counted) and stayed UTF-8, its
    escapes as text, and a declared one read its katakana as U+FFFD and ASCII digits ("ｱｲ" as "12")."""
    data = b"<p>\x1b$BF|K\\\x1b(I12\x1b(B!A\x1b$B!A\x1b(B</p>"
    decoded = decode_html(data)
    assert (decoded.text, decoded.encoding) == ("<p>日本ｱｲ!A～</p>", "iso2022_jp")
    assert decode_html(data, encoding="iso-2022-jp").text == decoded.text
    assert prune_html(data) == prune_html(decoded.text)


def test_declared_euc_jp_reads_nec_symbols_without_misaligning_the_text_after_them() -> None:
    """Python's euc_jp lacks NEC's row 13 and dropped one byte of each such pair: the next byte started a
    character, so "お問い合わせは㈱山田商事①本社まで" came back "お問い合わせは�蟷嚇直�事…"."""
    body = "<p>お問い合わせは{}山田商事{}本社まで</p>"
    data = body.format("XX", "YY").encode("euc_jp").replace(b"XX", b"\xad\xea").replace(b"YY", b"\xad\xa1")
    expected = body.format("㈱", "①")
    assert decode_html(data, encoding="x-euc-jp").text == expected
    meta = '<meta charset="euc-jp">'
    assert decode_html(meta.encode() + data).text == meta + expected


@pytest.mark.parametrize(
    "data",
    [
        b"<p>\x1b$BF|K\\\x1b(B</p>\x1b",  # an ESC at the very end
        b"<p>\x1b$BF|K\\\x1b(</p>",  # an escape cut short
        b"<p>\x1b\x1b$BF|K\\\x1b(B</p>",  # two ESCs, one escape sequence
        b"<p>\x1b$BF|K\\\x1b(B\x1b$(D</p>",  # JIS X 0212, not in the Encoding Standard's ISO-2022-JP
    ],
)
def test_iso2022_jp_needs_every_esc_to_start_one_of_its_escapes(data: bytes) -> None:
    """The ESC bytes are counted against the escape sequences: one more ESC, anywhere, keeps the page
    UTF-8 (an error in the Encoding Standard's decoder)."""
    decoded = decode_html(data)
    assert (decoded.text, decoded.encoding) == (data.decode("ascii"), "utf-8")
    assert utf8_payload(data) == data


def test_an_iso2022_jp_page_is_sniffed_and_decoded_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """`prune_html` asked `utf8_payload` (which sniffed and decoded the page to turn it down) and then
    `decode_html` (which sniffed and decoded it again, then decoded it a third time): 16 MiB of escape
    sequences took 1.3 s and 360 MiB before the tag count refused them. `parser_input` sniffs once, and
    the sniff's text is the page's."""
    page = "<html><body><p>東京都の天気予報です。</p></body></html>"
    data = page.encode("iso2022_jp")
    calls = []

    def counted(data: bytes) -> str | None:
        calls.append(data)
        return sniff_iso2022_jp(data)

    monkeypatch.setattr(decoding, "sniff_iso2022_jp", counted)
    assert parser_input(data) == page
    assert len(calls) == 1
    assert prune_html(data) == prune_html(page)
    assert len(calls) == 2
    assert parser_input(b"<p>plain</p>") == b"<p>plain</p>"
    assert parser_input(b"<p>caf\xe9</p>") == "<p>café</p>"
    # Declared UTF-8 that is not: repaired, U+FFFD's bytes for the invalid one, as `decode_html` reads it.
    assert parser_input(b"<p>caf\xe9</p>", encoding="utf-8") == "<p>caf\ufffd</p>".encode()
    assert parser_input(b"<p>caf\xc3\xa9</p>", encoding="utf-8") == b"<p>caf\xc3\xa9</p>"


def test_the_iso2022_jp_sniff_allocates_nothing_per_escape() -> None:
    """Counting the escape sequences with `re.findall` made a bytes object of each (16 MiB of "\\x1b$B":
    5.6 million, 330 MiB); the counts hold none, and the decoded text (empty here) is all it keeps."""
    data = b"\x1b$B" * (512 * 1024)
    tracemalloc.start()
    try:
        assert decode_html(data).encoding == "iso2022_jp"
        assert utf8_payload(data) is None
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < len(data) // 4
