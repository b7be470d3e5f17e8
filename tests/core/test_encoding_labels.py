"""service.core.encoding_labels: the Encoding Standard's labels and its single-byte tables."""

from __future__ import annotations

import pytest

from service.core import encoding_labels
from service.core.encoding_labels import (
    decode_bytes,
    normalize_encoding,
    strict_iso2022_jp,
    whatwg_codec,
    whatwg_name,
)

# The Encoding Standard's encodings.json (https://encoding.spec.whatwg.org/encodings.json): every label,
# by the encoding it names. Copied here so the test checks the module against the standard, not itself.
WHATWG_LABELS: dict[str, tuple[str, ...]] = {
    "UTF-8": ("unicode-1-1-utf-8", "unicode11utf8", "unicode20utf8", "utf-8", "utf8", "x-unicode20utf8"),
    "IBM866": ("866", "cp866", "csibm866", "ibm866"),
    "ISO-8859-2": (
        "csisolatin2", "iso-8859-2", "iso-ir-101", "iso8859-2", "iso88592", "iso_8859-2", "iso_8859-2:1987",
        "l2", "latin2",
    ),
    "ISO-8859-3": (
        "csisolatin3", "iso-8859-3", "iso-ir-109", "iso8859-3", "iso88593", "iso_8859-3", "iso_8859-3:1988",
        "l3", "latin3",
    ),
    "ISO-8859-4": (
        "csisolatin4", "iso-8859-4", "iso-ir-110", "iso8859-4", "iso88594", "iso_8859-4", "iso_8859-4:1988",
        "l4", "latin4",
    ),
    "ISO-8859-5": (
        "csisolatincyrillic", "cyrillic", "iso-8859-5", "iso-ir-144", "iso8859-5", "iso88595", "iso_8859-5",
        "iso_8859-5:1988",
    ),
    "ISO-8859-6": (
        "arabic", "asmo-708", "csiso88596e", "csiso88596i", "csisolatinarabic", "ecma-114", "iso-8859-6",
        "iso-8859-6-e", "iso-8859-6-i", "iso-ir-127", "iso8859-6", "iso88596", "iso_8859-6",
        "iso_8859-6:1987",
    ),
    "ISO-8859-7": (
        "csisolatingreek", "ecma-118", "elot_928", "greek", "greek8", "iso-8859-7", "iso-ir-126", "iso8859-7",
        "iso88597", "iso_8859-7", "iso_8859-7:1987", "sun_eu_greek",
    ),
    "ISO-8859-8": (
        "csiso88598e", "csisolatinhebrew", "hebrew", "iso-8859-8", "iso-8859-8-e", "iso-ir-138", "iso8859-8",
        "iso88598", "iso_8859-8", "iso_8859-8:1988", "visual",
    ),
    "ISO-8859-8-I": ("csiso88598i", "iso-8859-8-i", "logical"),
    "ISO-8859-10": ("csisolatin6", "iso-8859-10", "iso-ir-157", "iso8859-10", "iso885910", "l6", "latin6"),
    "ISO-8859-13": ("iso-8859-13", "iso8859-13", "iso885913"),
    "ISO-8859-14": ("iso-8859-14", "iso8859-14", "iso885914"),
    "ISO-8859-15": ("csisolatin9", "iso-8859-15", "iso8859-15", "iso885915", "iso_8859-15", "l9"),
    "ISO-8859-16": ("iso-8859-16",),
    "KOI8-R": ("cskoi8r", "koi", "koi8", "koi8-r", "koi8_r"),
    "KOI8-U": ("koi8-ru", "koi8-u"),
    "macintosh": ("csmacintosh", "mac", "macintosh", "x-mac-roman"),
    "windows-874": ("dos-874", "iso-8859-11", "iso8859-11", "iso885911", "tis-620", "windows-874"),
    "windows-1250": ("cp1250", "windows-1250", "x-cp1250"),
    "windows-1251": ("cp1251", "windows-1251", "x-cp1251"),
    "windows-1252": (
        "ansi_x3.4-1968", "ascii", "cp1252", "cp819", "csisolatin1", "ibm819", "iso-8859-1", "iso-ir-100",
        "iso8859-1", "iso88591", "iso_8859-1", "iso_8859-1:1987", "l1", "latin1", "us-ascii", "windows-1252",
        "x-cp1252",
    ),
    "windows-1253": ("cp1253", "windows-1253", "x-cp1253"),
    "windows-1254": (
        "cp1254", "csisolatin5", "iso-8859-9", "iso-ir-148", "iso8859-9", "iso88599", "iso_8859-9",
        "iso_8859-9:1989", "l5", "latin5", "windows-1254", "x-cp1254",
    ),
    "windows-1255": ("cp1255", "windows-1255", "x-cp1255"),
    "windows-1256": ("cp1256", "windows-1256", "x-cp1256"),
    "windows-1257": ("cp1257", "windows-1257", "x-cp1257"),
    "windows-1258": ("cp1258", "windows-1258", "x-cp1258"),
    "x-mac-cyrillic": ("x-mac-cyrillic", "x-mac-ukrainian"),
    "GBK": (
        "chinese", "csgb2312", "csiso58gb231280", "gb2312", "gb_2312", "gb_2312-80", "gbk", "iso-ir-58",
        "x-gbk",
    ),
    "gb18030": ("gb18030",),
    "Big5": ("big5", "big5-hkscs", "cn-big5", "csbig5", "x-x-big5"),
    "EUC-JP": ("cseucpkdfmtjapanese", "euc-jp", "x-euc-jp"),
    "ISO-2022-JP": ("csiso2022jp", "iso-2022-jp"),
    "Shift_JIS": (
        "csshiftjis", "ms932", "ms_kanji", "shift-jis", "shift_jis", "sjis", "windows-31j", "x-sjis",
    ),
    "EUC-KR": (
        "cseuckr", "csksc56011987", "euc-kr", "iso-ir-149", "korean", "ks_c_5601-1987", "ks_c_5601-1989",
        "ksc5601", "ksc_5601", "windows-949",
    ),
    "replacement": (
        "csiso2022kr", "hz-gb-2312", "iso-2022-cn", "iso-2022-cn-ext", "iso-2022-kr", "replacement",
    ),
    "UTF-16BE": ("unicodefffe", "utf-16be"),
    "UTF-16LE": ("csunicode", "iso-10646-ucs-2", "ucs-2", "unicode", "unicodefeff", "utf-16", "utf-16le"),
    "x-user-defined": ("x-user-defined",),
}  # fmt: skip
# The Python codec that decodes what a browser decodes under each encoding; None: no declaration (the
# replacement encoding leaves nothing to embed, x-user-defined is private-use characters).
CODECS: dict[str, str | None] = {
    "UTF-8": "utf-8", "IBM866": "cp866", "ISO-8859-2": "iso8859-2", "ISO-8859-3": "iso8859-3",
    "ISO-8859-4": "iso8859-4", "ISO-8859-5": "iso8859-5", "ISO-8859-6": "iso8859-6",
    "ISO-8859-7": "iso8859-7",
    "ISO-8859-8": "iso8859-8", "ISO-8859-8-I": "iso8859-8", "ISO-8859-10": "iso8859-10",
    "ISO-8859-13": "iso8859-13", "ISO-8859-14": "iso8859-14", "ISO-8859-15": "iso8859-15",
    "ISO-8859-16": "iso8859-16", "KOI8-R": "koi8-r", "KOI8-U": "koi8-u", "macintosh": "mac-roman",
    "windows-874": "cp874", "windows-1250": "cp1250", "windows-1251": "cp1251", "windows-1252": "cp1252",
    "windows-1253": "cp1253", "windows-1254": "cp1254", "windows-1255": "cp1255", "windows-1256": "cp1256",
    "windows-1257": "cp1257", "windows-1258": "cp1258", "x-mac-cyrillic": "mac-cyrillic", "GBK": "gb18030",
    "gb18030": "gb18030", "Big5": "big5hkscs", "EUC-JP": "euc_jp", "ISO-2022-JP": "iso2022_jp",
    "Shift_JIS": "cp932", "EUC-KR": "cp949", "UTF-16BE": "utf-16-be", "UTF-16LE": "utf-16-le",
    "replacement": None, "x-user-defined": None,
}  # fmt: skip


def test_every_label_of_the_standard_names_its_codec_and_no_other_label_names_one() -> None:
    expected = {label: CODECS[name] for name, labels in WHATWG_LABELS.items() for label in labels}
    assert {label: whatwg_codec(label) for label in expected} == expected
    assert {label for label, codec in expected.items() if codec} == set(encoding_labels._WHATWG_ALIASES)


# The two encodings that share another one's decoder: a page read with it is reported by that one's name.
SAME_DECODER = {"ISO-8859-8-I": "ISO-8859-8", "GBK": "gb18030"}


def test_a_codec_is_reported_by_the_standards_name_of_its_encoding() -> None:
    """/v1/extract and `htmllm extract` rows said `cp1250`, `cp932`, `big5hkscs`: Python's codec names,
    which no HTTP client or browser knows (and Python's `shift_jis` is another decoder than cp932)."""
    names = {codec: name.lower() for name, codec in CODECS.items() if codec and name not in SAME_DECODER}
    assert {codec: whatwg_name(codec) for codec in names} == names
    assert set(names) == set(encoding_labels._WHATWG_LABELS)
    for codec in names:
        assert whatwg_codec(whatwg_name(codec)) == codec  # the name is a label of its own encoding
    assert whatwg_name("cp1250") == "windows-1250" and whatwg_name("cp932") == "shift_jis"
    # How Python reads the standard's ISO-2022-JP where a page has half-width katakana.
    assert whatwg_name("iso2022_jp_ext") == "iso-2022-jp"
    assert whatwg_name("utf-32-le") == "utf-32le"  # a BOM's, no web encoding: its IANA name


@pytest.mark.parametrize(
    ("label", "codec"),
    [
        ("\t\n\f\r UTF-8 \r\f\n\t", "utf-8"),  # ASCII white space stripped, ASCII letters lower-cased
        ("Windows-1251", "cp1251"),
        ("utf-8\v", None),  # a vertical tab is no ASCII white space
        ("\xa0utf-8", None),
        ("'utf-8'", None),
        ("windows-1252;", None),
        ("<?windows-1251", None),
        ("\u212aoi8-r", None),  # the Kelvin sign, which str.lower() makes a "k"
        ("latin-1", None),  # Python's names are no labels to a browser
        ("latin_1", None),
        ("utf_8", None),
        ("cp437", None),
        ("johab", None),
        ("cp936", None),
        ("", None),
        (None, None),
    ],
)
def test_whatwg_codec_is_the_standards_get_an_encoding(label: str | None, codec: str | None) -> None:
    assert whatwg_codec(label) == codec


def test_the_detectors_python_names_still_read_as_browsers_read_their_codecs() -> None:
    """charset-normalizer names Python codecs: those keep Python's lookup, with the browser's superset."""
    assert normalize_encoding("latin_1") == "cp1252"
    assert normalize_encoding("euc_kr") == "cp949"
    assert normalize_encoding("cp936") == "gb18030"
    assert normalize_encoding("utf_8") == "utf-8"
    assert normalize_encoding("utf-16") == "utf-16-le"


@pytest.mark.parametrize("codec", sorted({codec for codec in CODECS.values() if codec}))
def test_every_codec_a_label_names_reads_ascii_as_ascii(codec: str) -> None:
    """A declaration is read in ASCII bytes, so no label may name a codec that reads them as something
    else (UTF-7 made "C++" "C\ufffd", HZ ate `~`); UTF-16 labels read in a page mean UTF-8 there."""
    if codec.startswith("utf-16"):
        return
    ascii_text = bytes([9, 10, 13, *range(0x20, 0x7F)])
    expected = ascii_text.decode("ascii")
    if codec == "iso2022_jp":  # its ESC sequences aside, ISO-2022-JP starts in ASCII
        expected = ascii_text.replace(b"\x1b", b"").decode("ascii")
    assert decode_bytes(ascii_text, codec) == expected


# The bytes of 0x80-0xFF that the standard's index-windows-*.txt leaves undefined (U+FFFD in a browser);
# it maps the ones Microsoft left undefined among 0x80-0x9F to the C1 controls of the same number.
UNDEFINED_IN_THE_STANDARD: dict[str, set[int]] = {
    "cp874": {0xDB, 0xDC, 0xDD, 0xDE, 0xFC, 0xFD, 0xFE, 0xFF},
    "cp1250": set(),
    "cp1251": set(),
    "cp1252": set(),
    "cp1253": {0xAA, 0xD2, 0xFF},
    "cp1254": set(),
    "cp1255": {0xD9, 0xDA, 0xDB, 0xDC, 0xDD, 0xDE, 0xDF, 0xFB, 0xFC, 0xFF},
    "cp1256": set(),
    "cp1257": {0xA1, 0xA5},
    "cp1258": set(),
}


@pytest.mark.parametrize("codec", sorted(UNDEFINED_IN_THE_STANDARD))
def test_windows_code_pages_decode_what_the_standards_tables_define(codec: str) -> None:
    """Python's tables give U+FFFD for bytes the standard defines (windows-1252's 0x81, 0x8D, 0x8F, 0x90,
    0x9D; windows-1255's 0xCA): a browser reads them, and extraction counted them against the page."""
    high = bytes(range(0x80, 0x100))
    text = decode_bytes(high, codec)
    assert len(text) == 128
    assert {
        byte for byte, char in zip(high, text, strict=True) if char == "\ufffd"
    } == UNDEFINED_IN_THE_STANDARD[codec]
    python = high.decode(codec, errors="replace")
    for byte, char, before in zip(high, text, python, strict=True):
        if before != "\ufffd":
            assert char == before, hex(byte)  # where Python's table defines a byte, the standard agrees
        elif byte < 0xA0:
            assert char == chr(byte), hex(byte)
    if codec == "cp1255":
        assert text[0xCA - 0x80] == "\u05ba"  # HEBREW POINT HOLAM HASER FOR VAV, which Python's lacks


def test_shift_jis_lone_bytes_the_standard_leaves_undefined_are_errors() -> None:
    """Python's cp932 (Microsoft's table) reads the lone bytes 0xA0, 0xFD, 0xFE and 0xFF as the
    private-use U+F8F0-U+F8F3; the standard's Shift_JIS decoder reads them as errors (U+FFFD), and
    0x80 as U+0080. As a trail byte 0xA0 is part of a character, and the user-defined rows (lead
    0xF0-0xF9) stay private-use in both."""
    assert whatwg_codec("shift_jis") == "cp932"
    assert decode_bytes(b"a\xa0b\xfd\xfe\xffc\x80d", "cp932") == "a\ufffdb\ufffd\ufffd\ufffdc\x80d"
    assert decode_bytes("日本 □".encode("cp932"), "cp932") == "日本 □"  # □ is 0x81 0xA0
    assert decode_bytes(b"\xf0\x40\xf9\xfc", "cp932") == "\ue000\ue757"
    lone = bytes([0xA0, 0xFD, 0xFE, 0xFF])
    assert not {"\uf8f0", "\uf8f1", "\uf8f2", "\uf8f3"} & set(decode_bytes(bytes(range(256)) + lone, "cp932"))


# Bytes with what the Encoding Standard's decoders read them as (checked against its reference
# implementation): a pair that is no character is one U+FFFD and the text after it stays aligned, but an
# ASCII second byte is read again. Python's codecs dropped the first byte only, and the second started
# a character of its own ("\ufffd歟" for 0x859F before "本社" in Shift_JIS).
BAD_PAIRS: list[tuple[str, bytes, str]] = [
    ("cp932", b"\x85\x9f" + "本社".encode("cp932") + b"\x85A", "\ufffd本社\ufffdA"),
    ("cp949", b"\xfe\xa1" + "한국".encode("cp949") + b"\xfeA", "\ufffd한국\ufffdA"),
    ("big5hkscs", b"\xa3\xe2" + "台灣".encode("big5") + b"\xa1\x7f", "\ufffd台灣\ufffd\x7f"),
    ("gb18030", b"\xa1\xff" + "中文".encode("gb18030") + b"\xa1\x7f", "\ufffd中文\ufffd\x7f"),
    ("euc_jp", b"\xa9\xa1" + "日本".encode("euc_jp") + b"\xa4A", "\ufffd日本\ufffdA"),
    # JIS X 0212 (0x8F and two bytes) where it defines nothing; a katakana prefix before a non-katakana
    (
        "euc_jp",
        b"\x8f\xa1\xa1" + "語".encode("euc_jp") + b"\x8e\xe0" + "語".encode("euc_jp"),
        "\ufffd語\ufffd語",
    ),
    # GB18030's four-byte form: complete but undefined, one error; broken off, an error for its first byte
    ("gb18030", b"\x84\x31\xa5\x30A\x81\x30A", "\ufffdA\ufffd0A"),
    ("gb18030", b"A\x81\x30\x81", "A\ufffd"),  # cut off at the end: one error
]


@pytest.mark.parametrize(("codec", "data", "expected"), BAD_PAIRS)
def test_a_bad_double_byte_is_one_error_and_an_ascii_second_byte_is_read_again(
    codec: str, data: bytes, expected: str
) -> None:
    assert decode_bytes(data, codec) == expected


def test_euc_jp_reads_the_nec_and_ibm_rows_as_browsers_do() -> None:
    """The standard's index jis0208 is windows-31j's: EUC-JP pages written on Windows (CP51932) carry NEC's
    row 13 (①, ㈱, Ⅰ) and NEC's selection of IBM's kanji (rows 89-92: 髙, 纊), which Python's euc_jp
    lacks; "お問い合わせは㈱山田商事①本社まで" came back as "お問い合わせは�蟷嚇直�事..."."""
    nec = b"\xad\xa1\xad\xea\xad\xb5\xfc\xe2\xf9\xa1"
    assert decode_bytes(nec, "euc_jp") == "①㈱Ⅰ髙纊"
    sentence = "お問い合わせは{}山田商事{}本社まで"
    data = (
        sentence.format("XX", "YY").encode("euc_jp").replace(b"XX", b"\xad\xea").replace(b"YY", b"\xad\xa1")
    )
    assert decode_bytes(data, "euc_jp") == sentence.format("㈱", "①")
    assert decode_bytes(b"\xf5\xa1A", "euc_jp") == "\ufffdA"  # row 85: nothing in either table
    # Every code the standard's index holds and Python's table lacks: row 13's 83, rows 89-92's 374.
    pairs = [bytes((first, second)) for first in range(0xA1, 0xFF) for second in range(0xA1, 0xFF)]
    added = [
        pair for pair in pairs if _python_rejects(pair, "euc_jp") and decode_bytes(pair, "euc_jp") != "\ufffd"
    ]
    assert len(added) == 457
    assert {pair[0] for pair in added} == {0xAD, 0xF9, 0xFA, 0xFB, 0xFC}


def test_big5_reads_what_the_standards_index_adds_to_python_s_hkscs() -> None:
    """Python's big5hkscs is HKSCS-2004: the standard's index Big5 adds the euro sign at 0xA3E1 (code page
    950's), the control pictures 0xA3C0-0xA3E0 and HKSCS-2008's characters; each was U+FFFD, and the
    byte after it the start of a character."""
    assert decode_bytes(b"\xa3\xe1\xa3\xc0\x8e\x69\x87\xdf\xfb\x48\x87\x7a", "big5hkscs") == "€␀箸鿋嘅㡵"
    assert decode_bytes("價格".encode("big5") + b"\xa3\xe1100", "big5hkscs") == "價格€100"
    pairs = [
        bytes((first, second))
        for first in range(0x81, 0xFF)
        for second in (*range(0x40, 0x7F), *range(0xA1, 0xFF))
    ]
    added = [
        pair
        for pair in pairs
        if _python_rejects(pair, "big5hkscs") and "\ufffd" not in decode_bytes(pair, "big5hkscs")
    ]
    assert len(added) == 192


def _python_rejects(data: bytes, codec: str) -> bool:
    try:
        data.decode(codec)
    except UnicodeDecodeError:
        return True
    return False


def test_euc_jp_and_iso_2022_jp_read_six_jis_codes_as_windows_31j_does() -> None:
    """The standard's index jis0208 reads 0xA1C1 (ISO-2022-JP's 0x2141) as "～", as a Shift_JIS page's
    0x8160 reads in Python too; Python's euc_jp and iso2022_jp read it as "〜" (and ‖ − ¢ £ ¬ likewise)."""
    web = "～∥－￠￡￢"
    assert decode_bytes(b"\xa1\xc1\xa1\xc2\xa1\xdd\xa1\xf1\xa1\xf2\xa2\xcc", "euc_jp") == web
    assert decode_bytes(b'\x1b$B!A!B!]!q!r"L\x1b(B', "iso2022_jp") == web


def test_iso_2022_jp_reads_half_width_katakana() -> None:
    """ESC ( I switches the standard's ISO-2022-JP decoder to JIS X 0201 katakana; Python's iso2022_jp
    read it as U+FFFD and the katakana as ASCII letters ("ｱｲ" as "12"). JIS X 0212 (ESC $ ( D), an error
    to the standard, is not read where it appears."""
    assert decode_bytes(b"\x1b(I12\x1b(B!", "iso2022_jp") == "ｱｲ!"
    assert "\ufffd" in decode_bytes(b"\x1b(I12\x1b(B\x1b$(D0!\x1b(B", "iso2022_jp")


def test_iso_2022_jp_reads_the_nec_and_ibm_rows_as_euc_jp_does() -> None:
    """The standard's ISO-2022-JP decoder reads JIS X 0208 pairs by the index EUC-JP reads them by:
    NEC's row 13 and IBM's rows (①, ㈱, Ⅰ, 髙), which Python's iso2022_jp lacks, were U+FFFD
    ("お問い合わせは�山田商事�本社まで"). Only in JIS X 0208 mode (ESC $ B, ESC $ @): in ASCII the
    same bytes are ASCII, and a pair neither table holds is still one U+FFFD."""
    assert decode_bytes(b"\x1b$B-!-j-5|b\x1b(B", "iso2022_jp") == "①㈱Ⅰ髙"
    assert decode_bytes(b"\x1b$@-!\x1b(B-!", "iso2022_jp") == "①-!"
    assert decode_bytes(b'\x1b$Bu!$"\x1b(B', "iso2022_jp") == "\ufffdあ"  # row 85: in neither
    assert decode_bytes(b"\x1b(I1\x1b$B-!\x1b(B", "iso2022_jp") == "ｱ①"  # (iso2022_jp_ext's pages too)
    # Every pair of JIS X 0208 mode reads as the EUC-JP pair with the high bits set.
    for first in range(0x21, 0x7F):
        for second in range(0x21, 0x7F):
            euc_jp = decode_bytes(bytes((first | 0x80, second | 0x80)), "euc_jp")
            assert decode_bytes(b"\x1b$B" + bytes((first, second)) + b"\x1b(B", "iso2022_jp") == euc_jp


def test_strict_iso2022_jp_fails_a_page_on_any_error_but_the_pairs_python_lacks() -> None:
    """The undeclared-page sniff's reading (`decoding.sniff_iso2022_jp`): a page with one ① is ISO-2022-JP,
    one with a pair no table holds, or a pair cut short, is not."""
    assert strict_iso2022_jp(b"<p>\x1b$B$3-!\x1b(B</p>") == "<p>こ①</p>"
    assert strict_iso2022_jp(b"<p>\x1b$B!A\x1b(B</p>") == "<p>～</p>"
    assert strict_iso2022_jp(b"<p>\x1b$Bu!\x1b(B</p>") is None
    assert strict_iso2022_jp(b"<p>\x1b$B-\x1b(B</p>") is None
    assert strict_iso2022_jp(b"<p>\x1b$B-!\x1b(B\x1b$(D0!\x1b(B</p>") is None  # JIS X 0212: an error


def test_strict_iso2022_jp_reads_a_page_of_many_such_pairs_in_c(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each pair Python lacks is read in Python: past `_MOST_BROWSER_ERRORS` of them the page fails
    (16 MiB of ① would take seconds), as `decode_bytes` keeps Python's U+FFFD past them."""
    monkeypatch.setattr(encoding_labels, "_MOST_BROWSER_ERRORS", 3)
    assert strict_iso2022_jp(b"\x1b$B" + b"-!" * 3 + b"\x1b(B") == "①①①"
    assert strict_iso2022_jp(b"\x1b$B" + b"-!" * 4 + b"\x1b(B") is None
    assert decode_bytes(b"\x1b$B" + b"-!" * 4 + b"\x1b(B", "iso2022_jp") == "\ufffd" * 4


# The 21 codes whose character Python's gb18030 (GB18030-2005) and the standard's index gb18030 (after
# whatwg/encoding#336, GB18030-2022) differ on, as the WHATWG reference implementation reads them.
GB18030_2022 = {
    b"\xa6\xd9": "\ufe10", b"\xa6\xda": "\ufe12", b"\xa6\xdb": "\ufe11", b"\xa6\xdc": "\ufe13",
    b"\xa6\xdd": "\ufe14", b"\xa6\xde": "\ufe15", b"\xa6\xdf": "\ufe16", b"\xa6\xec": "\ufe17",
    b"\xa6\xed": "\ufe18", b"\xa6\xf3": "\ufe19", b"\xfe\x59": "\u9fb4", b"\xfe\x61": "\u9fb5",
    b"\xfe\x66": "\u9fb6", b"\xfe\x67": "\u9fb7", b"\xfe\x6d": "\u9fb8", b"\xfe\x7e": "\u9fb9",
    b"\xfe\x90": "\u9fba", b"\xfe\xa0": "\u9fbb", b"\xa3\xa0": "\u3000", b"\xa8\xbc": "\u1e3f",
    b"\x81\x35\xf4\x37": "\ue7c7",
}  # fmt: skip


@pytest.mark.parametrize(("code", "character"), GB18030_2022.items())
def test_gb18030_reads_the_codes_gb18030_2022_changed_as_browsers_do(code: bytes, character: str) -> None:
    """Python's gb18030 read the vertical forms and CJK radicals GB18030-2022 took out of the private-use
    area (and 0xA3A0, 0xA8BC) as private-use characters, which no font shows as the page meant."""
    assert decode_bytes(b"a" + code + b"z", "gb18030") == f"a{character}z"
    assert (
        decode_bytes(b"a" + code + b"z" + "中".encode("gb18030") + b"\xff", "gb18030")
        == f"a{character}z中\ufffd"
    )


def test_gb18030_s_translated_characters_come_from_one_code_each() -> None:
    """The reading translates Python's text after decoding (`_WEB_GB18030`): exact only while each
    character it translates comes from that one code alone, among every two-byte code and every
    four-byte one of the BMP."""
    two = [bytes((a, b)) for a in range(0x81, 0xFF) for b in (*range(0x40, 0x7F), *range(0x80, 0xFF))]
    four = [
        bytes((a, b, c, d))
        for a in range(0x81, 0x85)
        for b in range(0x30, 0x3A)
        for c in range(0x81, 0xFF)
        for d in range(0x30, 0x3A)
    ]
    sources: dict[str, list[bytes]] = {}
    for code in two + four:
        sources.setdefault(code.decode("gb18030", errors="replace"), []).append(code)
    translated = set(encoding_labels._WEB_GB18030)
    assert len(translated) == 21
    assert sorted(code for character in translated for code in sources[character]) == sorted(GB18030_2022)
