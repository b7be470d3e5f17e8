"""Encoding labels as browsers read them: the one mapping from a declared charset to a Python codec.

A page, an HTTP header or a JSONL row names its encoding with a WHATWG label; several labels mean
something else to a browser than to Python (`iso-8859-1` and `ascii` are windows-1252 on the web,
`shift_jis` is windows-31j), and some name no text codec at all (`base64`, `rot13`, a typo). A declared
label is read with `whatwg_codec`, the standard's table and nothing else: a browser ignores a label it
does not know (`latin-1`, `cp437`, `'utf-8'`), and so do we, where Python's lookup had honoured it over
the page's own `<meta>`. The detector's output, a Python codec name, goes through `normalize_encoding`
(the same table first, so a declared and a detected name agree). Page bytes are decoded with
`decode_bytes`, which gives what a browser's decoder gives where Python's codec of that name differs.
"""

from __future__ import annotations

import codecs
import functools
import itertools
import re

# Every label of the WHATWG Encoding Standard, by the Python codec that decodes what a browser decodes
# under it. Python knows many of these labels under another codec (`iso-8859-1`, `ksc5601`) or not at
# all (`windows-874`, `iso-8859-8-i`, `x-mac-roman`, `x-cp1250`); a label a browser knows must never
# be ignored or read as something else. Not here, so ignored where declared: the replacement encoding's
# labels (`iso-2022-kr`, `hz-gb-2312`, `iso-2022-cn`, ...: the standard decodes the whole page to one
# U+FFFD, leaving nothing to embed, and Python's 7-bit codecs made every non-ASCII byte U+FFFD and HZ
# ate `~`) and `x-user-defined` (bytes 0x80-0xFF as private-use characters; `decoding` reads it in a
# `<meta>` as the HTML Standard says, as windows-1252).
_WHATWG_LABELS: dict[str, tuple[str, ...]] = {
    "utf-8": ("unicode-1-1-utf-8", "unicode11utf8", "unicode20utf8", "utf-8", "utf8", "x-unicode20utf8"),
    "cp866": ("866", "cp866", "csibm866", "ibm866"),
    "iso8859-2": (
        "csisolatin2", "iso-8859-2", "iso-ir-101", "iso8859-2", "iso88592", "iso_8859-2", "iso_8859-2:1987",
        "l2", "latin2",
    ),
    "iso8859-3": (
        "csisolatin3", "iso-8859-3", "iso-ir-109", "iso8859-3", "iso88593", "iso_8859-3", "iso_8859-3:1988",
        "l3", "latin3",
    ),
    "iso8859-4": (
        "csisolatin4", "iso-8859-4", "iso-ir-110", "iso8859-4", "iso88594", "iso_8859-4", "iso_8859-4:1988",
        "l4", "latin4",
    ),
    "iso8859-5": (
        "csisolatincyrillic", "cyrillic", "iso-8859-5", "iso-ir-144", "iso8859-5", "iso88595", "iso_8859-5",
        "iso_8859-5:1988",
    ),
    "iso8859-6": (
        "arabic", "asmo-708", "csiso88596e", "csiso88596i", "csisolatinarabic", "ecma-114", "iso-8859-6",
        "iso-8859-6-e", "iso-8859-6-i", "iso-ir-127", "iso8859-6", "iso88596", "iso_8859-6",
        "iso_8859-6:1987",
    ),
    "iso8859-7": (
        "csisolatingreek", "ecma-118", "elot_928", "greek", "greek8", "iso-8859-7", "iso-ir-126", "iso8859-7",
        "iso88597", "iso_8859-7", "iso_8859-7:1987", "sun_eu_greek",
    ),
    # iso-8859-8-i (logical order) decodes as iso-8859-8; the order only matters to the renderer.
    "iso8859-8": (
        "csiso88598e", "csisolatinhebrew", "hebrew", "iso-8859-8", "iso-8859-8-e", "iso-ir-138", "iso8859-8",
        "iso88598", "iso_8859-8", "iso_8859-8:1988", "visual", "csiso88598i", "iso-8859-8-i", "logical",
    ),
    "iso8859-10": ("csisolatin6", "iso-8859-10", "iso-ir-157", "iso8859-10", "iso885910", "l6", "latin6"),
    "iso8859-13": ("iso-8859-13", "iso8859-13", "iso885913"),
    "iso8859-14": ("iso-8859-14", "iso8859-14", "iso885914"),
    "iso8859-15": ("csisolatin9", "iso-8859-15", "iso8859-15", "iso885915", "iso_8859-15", "l9"),
    "iso8859-16": ("iso-8859-16",),
    "koi8-r": ("cskoi8r", "koi", "koi8", "koi8-r", "koi8_r"),
    "koi8-u": ("koi8-ru", "koi8-u"),
    "mac-roman": ("csmacintosh", "mac", "macintosh", "x-mac-roman"),
    "cp874": ("dos-874", "iso-8859-11", "iso8859-11", "iso885911", "tis-620", "windows-874"),
    "cp1250": ("cp1250", "windows-1250", "x-cp1250"),
    "cp1251": ("cp1251", "windows-1251", "x-cp1251"),
    "cp1252": (
        "ansi_x3.4-1968", "ascii", "cp1252", "cp819", "csisolatin1", "ibm819", "iso-8859-1", "iso-ir-100",
        "iso8859-1", "iso88591", "iso_8859-1", "iso_8859-1:1987", "l1", "latin1", "us-ascii", "windows-1252",
        "x-cp1252",
    ),
    "cp1253": ("cp1253", "windows-1253", "x-cp1253"),
    "cp1254": (
        "cp1254", "csisolatin5", "iso-8859-9", "iso-ir-148", "iso8859-9", "iso88599", "iso_8859-9",
        "iso_8859-9:1989", "l5", "latin5", "windows-1254", "x-cp1254",
    ),
    "cp1255": ("cp1255", "windows-1255", "x-cp1255"),
    "cp1256": ("cp1256", "windows-1256", "x-cp1256"),
    "cp1257": ("cp1257", "windows-1257", "x-cp1257"),
    "cp1258": ("cp1258", "windows-1258", "x-cp1258"),
    "mac-cyrillic": ("x-mac-cyrillic", "x-mac-ukrainian"),
    # The standard's GBK decoder is its gb18030 decoder (four-byte sequences and all); Python's gbk
    # codec rejects both those and the lone 0x80 (see `decode_bytes`).
    "gb18030": (
        "chinese", "csgb2312", "csiso58gb231280", "gb18030", "gb2312", "gb_2312", "gb_2312-80", "gbk",
        "iso-ir-58", "x-gbk",
    ),
    "big5hkscs": ("big5", "big5-hkscs", "cn-big5", "csbig5", "x-x-big5"),
    "euc_jp": ("cseucpkdfmtjapanese", "euc-jp", "x-euc-jp"),
    "iso2022_jp": ("csiso2022jp", "iso-2022-jp"),
    "cp932": ("csshiftjis", "ms932", "ms_kanji", "shift-jis", "shift_jis", "sjis", "windows-31j", "x-sjis"),
    "cp949": (
        "cseuckr", "csksc56011987", "euc-kr", "iso-ir-149", "korean", "ks_c_5601-1987", "ks_c_5601-1989",
        "ksc5601", "ksc_5601", "windows-949",
    ),
    "utf-16-be": ("unicodefffe", "utf-16be"),
    "utf-16-le": ("csunicode", "iso-10646-ucs-2", "ucs-2", "unicode", "unicodefeff", "utf-16", "utf-16le"),
}  # fmt: skip
_WHATWG_ALIASES: dict[str, str] = {
    label: codec for codec, labels in _WHATWG_LABELS.items() for label in labels
}
# Python codecs a browser reads as a superset under every label it knows them by, for the labels only
# Python knows ("latin_1", "euc_kr", "iso8859_9"): a C1 control code is never what a page meant.
_BROWSER_CODECS = {
    "ascii": "cp1252",
    "iso8859-1": "cp1252",
    "iso8859-9": "cp1254",
    "iso8859-11": "cp874",
    "tis-620": "cp874",
    "gb2312": "gb18030",
    "gbk": "gb18030",
    "shift_jis": "cp932",
    "euc_kr": "cp949",
    "big5": "big5hkscs",
}


# Python codecs that undo Python's string escapes: text codecs to `codecs`, no page's encoding.
_ESCAPE_CODECS = frozenset({"unicode-escape", "raw-unicode-escape"})


# "ASCII whitespace", which the standard's "get an encoding" strips from a label (str.strip() would also
# strip a vertical tab or a no-break space, which make the label unknown to a browser).
_ASCII_WHITESPACE = "\t\n\f\r "


# Labels the Encoding Standard knows and `whatwg_codec` leaves out on purpose (see `_WHATWG_LABELS`): the
# replacement encoding's, and x-user-defined. A charset a browser knows all the same, not a typo.
_IGNORED_WHATWG_LABELS = frozenset(
    {
        "csiso2022kr",
        "hz-gb-2312",
        "iso-2022-cn",
        "iso-2022-cn-ext",
        "iso-2022-kr",
        "replacement",
        "x-user-defined",
    }
)


# The characters of a charset's name, IANA's (`ISO_8859-1:1987`) and Python's (`latin_1`). Python's
# codec lookup reads a run of any others as one `_` and drops it at either end, so `'utf-8'`, `utf-8,`
# and `utf 8` were names of UTF-8 to it, which a browser knows no charset by.
_CHARSET_NAME = re.compile(r"[A-Za-z0-9._:+-]+")


def known_label(label: str) -> bool:
    """Whether `label` names a charset to a browser (the Encoding Standard's labels, those `whatwg_codec`
    ignores included) or a text encoding to Python (`latin-1`, `utf-7`): a label neither knows is a typo.
    Python's codecs that are no text encoding (`base64`, `rot13`, `zlib`) name no charset, and neither
    does a label with characters no charset's name has (quotes, `;`, `,`, spaces), whatever Python's
    lookup, which reads them as `_`, makes of it."""
    if whatwg_codec(label) is not None:
        return True
    stripped = label.strip(_ASCII_WHITESPACE)
    if stripped.isascii() and stripped.lower() in _IGNORED_WHATWG_LABELS:
        return True
    if _CHARSET_NAME.fullmatch(stripped) is None:
        return False
    try:
        codec = codecs.lookup(stripped)
    except (LookupError, ValueError):
        return False
    return codec._is_text_encoding and codec.name != "undefined"  # `undefined` raises on every byte


def whatwg_codec(label: str | None) -> str | None:
    """The Python codec a browser decodes with for a declared `label` (an HTTP charset, a `<meta>`'s, an
    XML declaration's), or None where the Encoding Standard knows no such label and a browser ignores it.

    The standard's "get an encoding": ASCII white space stripped, ASCII letters lower-cased, the label
    table only. Python's own names are no labels to a browser: an HTTP `charset=latin-1` over a UTF-8
    page with `<meta charset=utf-8>` had made it mojibake where a browser ignores the header and reads
    the `<meta>`; `cp437`, `johab`, `'utf-8'` (quoted twice) or `windows-1252;` named codecs, too.
    """
    if not label or not label.isascii():  # str.lower() maps the Kelvin sign to "k"; ASCII lower-casing not
        return None
    return _WHATWG_ALIASES.get(label.strip(_ASCII_WHITESPACE).lower())


# The Encoding Standard's name (lower-cased: itself a label of the encoding) of what a browser decodes with
# each codec of `_WHATWG_LABELS`: what a page's encoding is reported as. Python's names (`cp1250`,
# `cp932`, `big5hkscs`) are no label to an HTTP client or a browser, and some name another decoder
# (Python's `shift_jis` and `euc_kr` are not windows-31j and cp949). The standard's GBK is its gb18030
# decoder, so a page read with that is reported as gb18030. `iso2022_jp_ext` is only how Python reads the
# standard's ISO-2022-JP (`iso2022_jp_codec`); UTF-32 (from a BOM, `decoding`) is no web encoding, and
# keeps its IANA name.
_WHATWG_NAMES: dict[str, str] = {
    "utf-8": "utf-8", "cp866": "ibm866", "iso8859-2": "iso-8859-2", "iso8859-3": "iso-8859-3",
    "iso8859-4": "iso-8859-4", "iso8859-5": "iso-8859-5", "iso8859-6": "iso-8859-6",
    "iso8859-7": "iso-8859-7", "iso8859-8": "iso-8859-8", "iso8859-10": "iso-8859-10",
    "iso8859-13": "iso-8859-13", "iso8859-14": "iso-8859-14", "iso8859-15": "iso-8859-15",
    "iso8859-16": "iso-8859-16", "koi8-r": "koi8-r", "koi8-u": "koi8-u", "mac-roman": "macintosh",
    "cp874": "windows-874", "cp1250": "windows-1250",
    "cp1251": "windows-1251", "cp1252": "windows-1252", "cp1253": "windows-1253", "cp1254": "windows-1254",
    "cp1255": "windows-1255", "cp1256": "windows-1256", "cp1257": "windows-1257", "cp1258": "windows-1258",
    "mac-cyrillic": "x-mac-cyrillic", "gb18030": "gb18030", "big5hkscs": "big5", "euc_jp": "euc-jp",
    "iso2022_jp": "iso-2022-jp", "iso2022_jp_ext": "iso-2022-jp", "cp932": "shift_jis", "cp949": "euc-kr",
    "utf-16-be": "utf-16be", "utf-16-le": "utf-16le", "utf-32-be": "utf-32be", "utf-32-le": "utf-32le",
}  # fmt: skip


def whatwg_name(codec: str) -> str:
    """The name a browser and an HTTP client know the encoding by that the Python codec `codec` (a
    `decoding.decode_html` result) decodes as: `windows-1250` for cp1250, `shift_jis` for cp932.

    The Encoding Standard's name lower-cased, as a `charset=` is usually written; `whatwg_codec` reads it
    back as `codec`. A codec outside the table (none that `decode_html` gives) is returned as it is."""
    return _WHATWG_NAMES.get(codec, codec)


def normalize_encoding(label: str | None) -> str | None:
    """The Python codec name a browser would use for `label`, or None if it names no text codec.

    For the detector's output (a Python codec name: `latin_1`, `euc_kr`, `utf_8`); a declared label
    goes through `whatwg_codec`, which knows the standard's labels only."""
    if not label:
        return None
    key = label.strip().strip("\"'").lower()
    key = _WHATWG_ALIASES.get(key, key)
    try:
        info = codecs.lookup(key)
    except (LookupError, ValueError):
        return None
    # bytes-to-bytes and str-to-str codecs (base64, rot13, ...) cannot decode a page, nor can Python's
    # escape codecs (`unicode_escape` turns a page's "\\n" into a newline).
    if (
        not getattr(info, "_is_text_encoding", True)
        or info.name in _ESCAPE_CODECS
        or not _decodes_any_bytes(info.name)
    ):
        return None
    return _BROWSER_CODECS.get(info.name, info.name)


@functools.cache
def _decodes_any_bytes(name: str) -> bool:
    """False for the text codecs that raise on some bytes even with errors="replace" (`idna`,
    `punycode`, `undefined`: no browser knows them, and `<meta charset="undefined">` is a real CMS
    template's output), which would fail a page that names them instead of being ignored."""
    try:
        bytes(range(256)).decode(name, errors="replace")
    except (UnicodeError, LookupError, ValueError):
        return False
    return True


def decode_bytes(data: bytes, codec: str) -> str:
    """`data` read with the Python codec `codec` (a `normalize_encoding` name) as a browser reads it.

    Undecodable bytes become U+FFFD. In the windows code pages the bytes Python's codecs reject are read
    by the standard's tables (`_web_single_byte_table`). In the double-byte codecs (GBK/gb18030, Big5,
    EUC-JP, Shift_JIS, EUC-KR) the bytes Python's codec rejects are read by the standard's decoders
    (`browser_character`): what their indexes define and Python's tables lack (GBK's lone 0x80 euro
    sign, Big5's 0xA3E1 euro sign and HKSCS-2008's additions, EUC-JP's NEC and IBM rows), and a bad
    pair as one U+FFFD unless its second byte is ASCII, which is read again: Python's codecs dropped the
    first byte only, and the second started a character of its own, which misaligned the text after it.
    In Shift_JIS (windows-31j) the lone bytes 0xA0 and 0xFD-0xFF are errors
    (`_CP932_LONE_BYTES`); in EUC-JP and ISO-2022-JP six JIS X 0208 codes are read as windows-31j reads
    them (`_WEB_JIS0208`, "～" for 0xA1C1); ISO-2022-JP reads JIS X 0201 katakana (`iso2022_jp_codec`)
    and, in JIS X 0208 mode, the NEC and IBM rows EUC-JP reads (`_iso2022_jp_character`). In gb18030
    the 18 codes GB18030-2022 moved out of the private-use area, and 0xA3A0 and 0xA8BC, are read as the
    standard's index gb18030 reads them (`_WEB_GB18030`).
    """
    if codec in _WEB_SINGLE_BYTE:
        return codecs.charmap_decode(data, "strict", _web_single_byte_table(codec))[0]
    if codec == "iso2022_jp":
        codec = iso2022_jp_codec(data)
    text = data.decode(codec, errors="replace")
    if codec not in _LEAD_BYTES and codec not in _ISO2022_JP_CODECS:
        return text
    # Python's "replace" runs in C; the standard's reading runs in Python once per undecodable byte
    # (16 MiB of 0x80 in gb18030 took 5 s), so only a page with a few of them is read again with it.
    if 0 < text.count("\ufffd") <= _MOST_BROWSER_ERRORS:
        text = data.decode(codec, errors=_browser_errors())
    if codec == "cp932" and _CP932_LONE_BYTES.search(text) is not None:
        text = _CP932_LONE_BYTES.sub("\ufffd", text)
    elif codec == "gb18030" and _WEB_GB18030_FROM.search(text) is not None:
        text = _web_gb18030(text)
    elif codec == "euc_jp" or codec in _ISO2022_JP_CODECS:
        text = web_jis0208(text)
    return text


def strict_iso2022_jp(data: bytes) -> str | None:
    """ISO-2022-JP `data` as the standard's decoder reads it, or None where that finds an error.

    Python's strict iso2022_jp rejects the NEC and IBM rows of JIS X 0208 (①, ㈱, Ⅱ, 髙) that the
    standard's index jis0208 holds: an undeclared page with one ① was read as UTF-8, its escape
    sequences and all. The pairs it rejects are read as `decode_bytes` reads them, and any other error
    fails the page; past `_MOST_BROWSER_ERRORS` such pairs (each read in Python) the page fails too.
    """
    codec = iso2022_jp_codec(data)
    try:
        return web_jis0208(data.decode(codec))
    except UnicodeDecodeError:
        pass
    if data.decode(codec, errors="replace").count("\ufffd") > _MOST_BROWSER_ERRORS:
        return None
    try:
        return web_jis0208(data.decode(codec, errors=_strict_browser_errors()))
    except UnicodeDecodeError:
        return None


# What Python's cp932 reads the lone bytes 0xA0, 0xFD, 0xFE and 0xFF as: Microsoft's private-use
# U+F8F0-U+F8F3, which no page means and the standard's Shift_JIS decoder reads as errors (U+FFFD).
# No two-byte code decodes to them (the user-defined rows 0xF0-0xF9 are U+E000-U+E757), so each in the
# text is one such byte. (0x80 is U+0080 in both.)
_CP932_LONE_BYTES = re.compile("[\uf8f0-\uf8f3]")


# The single-byte codecs whose Python tables leave bytes undefined that the Encoding Standard's define.
_WEB_SINGLE_BYTE = frozenset({"cp874", *(f"cp{page}" for page in range(1250, 1259)), "koi8-u"})
# Besides the C1 controls: windows-1255's 0xCA, HEBREW POINT HOLAM HASER FOR VAV, which the standard's
# table added and Python's cp1255 lacks; and KOI8-U's 0xAE/0xBE, Belarusian short u (ў, Ў) in the
# standard's table (KOI8-RU, which its `koi8-ru` label names too), box-drawing characters in RFC 2319's,
# which Python's koi8_u follows.
_WEB_EXTRA_BYTES: dict[str, dict[int, str]] = {
    "cp1255": {0xCA: "\u05ba"},
    "koi8-u": {0xAE: "\u045e", 0xBE: "\u040e"},
}


@functools.cache
def _web_single_byte_table(codec: str) -> str:
    """The 256-character decoding table of `codec` as the Encoding Standard's index reads it.

    Microsoft leaves bytes of 0x80-0x9F undefined in its code pages (0x81, 0x8D, 0x8F, 0x90 and 0x9D in
    windows-1252); the standard maps each to the C1 control of the same number, as browsers decode it,
    where Python's codecs give U+FFFD, which counted against a page at extraction's U+FFFD share. A
    table (rather than an error handler, which runs in Python once per such byte) keeps decoding in C.
    Bytes neither defines stay U+FFFD, as `errors="replace"` gives them.
    """
    table = list(bytes(range(256)).decode(codec, errors="replace"))
    for byte in range(0x80, 0xA0):
        if table[byte] == "\ufffd":
            table[byte] = chr(byte)
    for byte, char in _WEB_EXTRA_BYTES.get(codec, {}).items():
        table[byte] = char
    return "".join(table)


# The lead bytes of each double-byte codec's characters, by its Python name ("big5" is the detector's
# strict codec for Big5; pages decode with big5hkscs): the Encoding Standard's decoders read the byte
# after one as part of its character, unless it is ASCII.
_LEAD_BYTES: dict[str, frozenset[int]] = {
    "gb18030": frozenset(range(0x81, 0xFF)),
    "big5hkscs": frozenset(range(0x81, 0xFF)),
    "big5": frozenset(range(0x81, 0xFF)),
    "cp949": frozenset(range(0x81, 0xFF)),
    "cp932": frozenset((*range(0x81, 0xA0), *range(0xE0, 0xFD))),
    "euc_jp": frozenset((0x8E, 0x8F, *range(0xA1, 0xFF))),
}
# The codecs `iso2022_jp_codec` names: `_browser_error` reads their pairs (`_iso2022_jp_character`).
_ISO2022_JP_CODECS = frozenset({"iso2022_jp", "iso2022_jp_ext"})
# Past this many undecodable bytes in a page (a real page has a few euro signs or NEC symbols; binary
# junk has one every few bytes) `decode_bytes` keeps Python's reading, each such byte one U+FFFD.
_MOST_BROWSER_ERRORS = 65_536

# The codes of the standard's index Big5 that Python's big5hkscs (HKSCS-2004) lacks: HKSCS-2008's
# additions and compatibility codes, the control pictures 0xA3C0-0xA3E0 and the euro sign at 0xA3E1
# (code page 950's). Each piece is a code in hex and the characters of it and the codes after it.
_BIG5_ONLY_IN_THE_STANDARD = (
    "877A㡵𡵓𣚞𦀡㻬𥣞㫵竼龗𤅡𨤍𣇪𠪊𣉞䌊蒄龖鐯䤰蘓墖靊鈘秐 "
    "87B4稲晠権袝瑌篅枂稬剏遆㓦珄𥶹瓆鿇垳䤯呌䄱𣚎堘穲𧭥讏 "
    "87CC䚮𦺈䆁𥶙箮𢒼鿈𢓁𢓉𢓌鿉蔄𣖻䂴鿊䓡𪷿拁灮鿋 8E69箸 8E6F簆 8E7E糎 8EAB緒 8EB4縝 8ECD者 "
    "8ED0耨 8F57菁 8F69蒨 8F6E萏 8FCB覦覩 8FFE起 906D都 907A銹 90DC靜 90F1響 91BF鼖 9244蔃 "
    "92AF兙兛兝兞 92C8鍮 92D1瑹 9447浧 94CA禛 95D9邗 9644靝 96ED瀞 96FC嬨 9B76爁 9B78矗 9B7B纇 "
    "9BC6駖 9BDE釔 9BEC惞 9BF6澶 9C42輶 9C53侻 9C62營 9C68鄄 9C6B鷰 9C77菏 9CBC尐秣 9CD0婧 "
    "9D57輋 9D5A筑 9DC4拐 9EA9恢 9EEF痹 9EFD汊 9F60鬮 9F66鼗 9FCB僭 9FD8弌 A063蠏 A077拎 A0D5瑨 "
    "A0DF煢 A0E4牐 A3C0␀␁␂␃␄␅␆␇␈␉␊␋␌␍␎␏␐␑␒␓␔␕␖␗ A3D8␘␙␚␛␜␝␞␟␡€ C6CF廴 C6D3无 C6D5癶 C6D7隶 "
    "C6DE〃仝 FA5F倩 FA66偽 FABD包 FAC5卄 FAD5卿 FB48嘅 FBB8婷 FBF3幵 FBF9廐 FC4F彘 FC6C悤 "
    "FCB9撐 FCE2晴 FCF1杞 FDB7沜渝 FDBB港 FDF1煮 FE52猪 FE6F瑜 FEAA瓩 FEDD砉"
)  # fmt: skip
# What Python's gb18030 (GB18030-2005) reads where the standard's index gb18030 reads otherwise: the 18
# codes GB18030-2022 (and the standard, whatwg/encoding#336) moved out of the private-use area to the
# vertical forms U+FE10-U+FE19 (0xA6D9-0xA6DF, 0xA6EC, 0xA6ED, 0xA6F3) and the CJK radicals
# U+9FB4-U+9FBB (0xFE59 ... 0xFEA0), which the four-byte form also reads as those characters; 0xA3A0, the
# ideographic space (U+3000, as 0xA1A1) in the standard's index, U+E5E5 in Python's; and 0xA8BC (ḿ in
# the standard, U+E7C7 in Python), whose character Python reads from the four-byte 0x8135F437, which
# the standard reads as U+E7C7. Each character on the left comes from that one byte sequence alone in
# Python's gb18030 (every two-byte and four-byte BMP code checked), so translating the text is exact.
_WEB_GB18030 = dict(
    zip(
        "\ue78d\ue78e\ue78f\ue790\ue791\ue792\ue793\ue794\ue795\ue796"
        "\ue81e\ue826\ue82b\ue82c\ue832\ue843\ue854\ue864\ue5e5\ue7c7\u1e3f",
        "\ufe10\ufe12\ufe11\ufe13\ufe14\ufe15\ufe16\ufe17\ufe18\ufe19"
        "\u9fb4\u9fb5\u9fb6\u9fb7\u9fb8\u9fb9\u9fba\u9fbb\u3000\u1e3f\ue7c7",
        strict=True,
    )
)
_WEB_GB18030_TABLE = str.maketrans(_WEB_GB18030)
_WEB_GB18030_FROM = re.compile(f"[{''.join(_WEB_GB18030)}]")


def _web_gb18030(text: str) -> str:
    """`text` decoded by Python's gb18030 with the characters of `_WEB_GB18030` as the standard reads them.

    A substitution calls Python once per character it replaces (1.5 s for 16 MiB of them); a
    translation reads every character of the text (0.5 s for one in 16 MiB of CJK text). The first is
    taken where they are fewer than one in five characters, where it costs less.
    """
    few = len(text) // 5
    if sum(1 for _ in itertools.islice(_WEB_GB18030_FROM.finditer(text), few)) < few:
        return _WEB_GB18030_FROM.sub(lambda match: _WEB_GB18030[match[0]], text)
    return text.translate(_WEB_GB18030_TABLE)


# The six codes of JIS X 0208 that Python's euc_jp and iso2022_jp read by the JIS standard's mapping and
# the Encoding Standard's index jis0208 (windows-31j's) reads otherwise: 0xA1C1 is "～" in a browser and
# in a Shift_JIS page (0x8160), "〜" in Python. Python's codecs read no other code as these characters.
# (〜‖−¢£¬ become ～∥－￠￡￢.)
_WEB_JIS0208 = {
    "\u301c": "\uff5e",
    "\u2016": "\u2225",
    "\u2212": "\uff0d",
    "\xa2": "\uffe0",
    "\xa3": "\uffe1",
    "\xac": "\uffe2",
}
_WEB_JIS0208_FROM = re.compile(f"[{''.join(_WEB_JIS0208)}]")


def web_jis0208(text: str) -> str:
    """`text` decoded by Python's euc_jp or iso2022_jp with the six JIS X 0208 characters that the
    Encoding Standard reads otherwise (`_WEB_JIS0208`) as it reads them."""
    if _WEB_JIS0208_FROM.search(text) is None:  # (a regex search in C; most pages have none)
        return text
    return _WEB_JIS0208_FROM.sub(lambda match: _WEB_JIS0208[match[0]], text)


# ISO-2022-JP's escape sequence to JIS X 0201 katakana, which the standard's decoder reads and Python's
# iso2022_jp does not (its iso2022_jp_ext does), and the one to JIS X 0212, which only the latter reads.
_ISO2022_JP_KATAKANA = b"\x1b(I"
_ISO2022_JP_JIS0212 = b"\x1b$(D"


def iso2022_jp_codec(data: bytes) -> str:
    """The Python codec that reads ISO-2022-JP `data` as the Encoding Standard's decoder does: iso2022_jp,
    or iso2022_jp_ext where the page switches to half-width katakana (ESC ( I), which iso2022_jp read
    as U+FFFD and its katakana as ASCII letters, and not to JIS X 0212, an error to the standard."""
    if _ISO2022_JP_KATAKANA in data and _ISO2022_JP_JIS0212 not in data:
        return "iso2022_jp_ext"
    return "iso2022_jp"


@functools.cache
def _browser_errors() -> str:
    """The name of the decode error handler that reads bytes as the standard's decoders (registered on
    first use, not at import)."""
    name = "htmllm.whatwg-multi-byte"
    codecs.register_error(name, _browser_error)
    return name


def _browser_error(error: UnicodeError) -> tuple[str, int]:
    """The error handler: what the standard's decoder reads where Python's codec stopped."""
    if not isinstance(error, UnicodeDecodeError):
        raise error
    if error.encoding in _ISO2022_JP_CODECS:
        return _iso2022_jp_character(error) or ("\ufffd", error.end)
    return browser_character(error.object, error.start, error.encoding)


@functools.cache
def _strict_browser_errors() -> str:
    """The name of the decode error handler that reads ISO-2022-JP's pairs as `_browser_error` does and
    raises at any other error (registered on first use)."""
    name = "htmllm.whatwg-iso2022-jp-strict"
    codecs.register_error(name, _strict_browser_error)
    return name


def _strict_browser_error(error: UnicodeError) -> tuple[str, int]:
    """The strict error handler: the character of an ISO-2022-JP pair Python's table lacks, else raise."""
    if not isinstance(error, UnicodeDecodeError):
        raise error
    found = _iso2022_jp_character(error)
    if found is None or found[0] == "\ufffd":
        raise error
    return found


def _iso2022_jp_character(error: UnicodeDecodeError) -> tuple[str, int] | None:
    """(the character of the standard's index jis0208, else U+FFFD; where reading goes on) for a pair
    Python's iso2022_jp rejects in JIS X 0208 mode; None for any other error.

    The standard's ISO-2022-JP decoder reads a JIS X 0208 pair by the index EUC-JP reads it by
    (`_jis0208`, with the high bits set): NEC's row 13 and IBM's rows (①, ㈱, Ⅱ, 髙), which
    Python's table lacks, are characters, and "お問い合わせは㈱山田商事①本社まで" had come out with
    U+FFFD for both. Python's codecs report an error of two bytes in a double-byte mode only (an
    escape they do not know leaves the mode as it was), and the one such mode of the codecs
    `iso2022_jp_codec` names is JIS X 0208's (iso2022_jp_ext's JIS X 0212 is never chosen for a page
    that switches to it). So the error's shape says the mode; looking back for the pair's escape
    sequence instead would be quadratic (8 s for 65,536 such pairs after one escape in 16 MiB).
    """
    data, start = error.object, error.start
    if error.end - start != 2 or not all(0x21 <= byte <= 0x7E for byte in data[start : start + 2]):
        return None
    return _jis0208(data[start] | 0x80, data[start + 1] | 0x80) or "\ufffd", start + 2


def browser_character(data: bytes, start: int, codec: str) -> tuple[str, int]:
    """(what the Encoding Standard's decoder reads at `data[start]`, where the next character starts),
    where the double-byte Python codec `codec` (a key of `_LEAD_BYTES`) cannot decode: a character its
    index defines and Python's table lacks, else U+FFFD.

    As the standard's decoders read a lead byte and the byte after it: a pair that is no character is one
    error, but an ASCII second byte is read again (so markup cannot hide in a bad pair), and a lead byte
    at the end is one error. GB18030's four-byte form is read the same way: a sequence that breaks off
    is an error for its first byte, one that is complete but undefined an error for all four.
    """
    first = data[start]
    if codec == "gb18030" and first == 0x80:
        return "\u20ac", start + 1  # code page 936's euro sign, which Python's gb18030 lacks
    if first not in _LEAD_BYTES[codec]:
        return "\ufffd", start + 1
    if start + 1 >= len(data):
        return "\ufffd", len(data)
    second = data[start + 1]
    if codec == "gb18030" and 0x30 <= second <= 0x39:
        return "\ufffd", _gb18030_four_byte_end(data, start)
    if codec in ("big5", "big5hkscs"):
        found = _big5_character(first, second)
        if found is not None:
            return found, start + 2
    elif codec == "euc_jp" and first == 0x8F and 0xA1 <= second <= 0xFE:
        # JIS X 0212: Python's table holds the standard's, so the three bytes are an error (the third
        # read again where it is ASCII).
        if start + 2 >= len(data):
            return "\ufffd", len(data)
        return "\ufffd", start + (2 if data[start + 2] < 0x80 else 3)
    elif codec == "euc_jp" and first != 0x8E and 0xA1 <= second <= 0xFE:
        return _jis0208(first, second) or "\ufffd", start + 2
    return "\ufffd", start + (1 if second < 0x80 else 2)


def _gb18030_four_byte_end(data: bytes, start: int) -> int:
    """Where the standard's gb18030 decoder reads on after the undecodable four-byte sequence that starts
    at `start` (its second byte a digit): past all four where they are complete, past the end where it
    ends inside them, else past the first byte only (the others are read again)."""
    if start + 2 >= len(data):
        return len(data)
    if not 0x81 <= data[start + 2] <= 0xFE:
        return start + 1
    if start + 3 >= len(data):
        return len(data)
    return start + 4 if 0x30 <= data[start + 3] <= 0x39 else start + 1


@functools.cache
def _big5_only_in_the_standard() -> dict[int, str]:
    """`_BIG5_ONLY_IN_THE_STANDARD` as a table from the two-byte code to its character."""
    table: dict[int, str] = {}
    for piece in _BIG5_ONLY_IN_THE_STANDARD.split():
        code = int(piece[:4], 16)
        for char in piece[4:]:
            table[code] = char
            code += 0x23 if code & 0xFF == 0x7E else 1  # second bytes 0x40-0x7E, then 0xA1-0xFE
    return table


def _big5_character(first: int, second: int) -> str | None:
    """The character the standard's index Big5 holds at (`first`, `second`), or None: one of its codes
    that Python's big5hkscs lacks, or big5hkscs's (HKSCS codes, which the detector's strict big5 lacks)."""
    found = _big5_only_in_the_standard().get(first << 8 | second)
    if found is not None:
        return found
    try:
        return bytes((first, second)).decode("big5hkscs")
    except UnicodeDecodeError:
        return None


def _jis0208(first: int, second: int) -> str | None:
    """The character the standard's index jis0208 holds at EUC-JP's (`first`, `second`), both 0xA1-0xFE,
    where Python's euc_jp has none: NEC's row 13 (①, ㈱, Ⅱ) and NEC's selection of IBM's kanji (rows
    89-92, 髙), which EUC-JP pages written on Windows (CP51932, "eucJP-win") carry.

    The index is windows-31j's table, which Python's cp932 holds: the row and cell become the Shift_JIS
    code of the same pointer. Rows EUC-JP reaches never fall in windows-31j's user-defined rows.
    """
    pointer = (first - 0xA1) * 94 + second - 0xA1
    lead, trail = divmod(pointer, 188)
    code = bytes((lead + (0x81 if lead < 0x1F else 0xC1), trail + (0x40 if trail < 0x3F else 0x41)))
    try:
        return code.decode("cp932")
    except UnicodeDecodeError:
        return None
