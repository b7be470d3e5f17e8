"""Encoding labels as browsers read them: the one mapping from a declared charset to a Python codec.

A page, an HTTP header or a JSONL row names its encoding with a WHATWG label; several labels mean
something else to a browser than to Python (`iso-8859-1` and `ascii` are windows-1252 on the web,
`shift_jis` is windows-31j), and some name no text codec at all (`base64`, `rot13`, a typo). Decoding
and detection both go through `normalize_encoding`, so a declared and a detected name always agree.
"""

from __future__ import annotations

import codecs
import functools

# WHATWG label aliases that differ from Python's reading of the same label.
_WHATWG_ALIASES: dict[str, str] = {
    **dict.fromkeys(
        (
            "ascii",
            "us-ascii",
            "ansi_x3.4-1968",
            "iso-8859-1",
            "iso8859-1",
            "iso_8859-1",
            "iso88591",
            "latin1",
            "latin-1",
            "l1",
            "cp819",
            "ibm819",
            "iso-ir-100",
            "x-cp1252",
        ),
        "cp1252",
    ),
    **dict.fromkeys(("iso-8859-9", "iso8859-9", "iso_8859-9", "latin5", "l5"), "cp1254"),
    **dict.fromkeys(("iso-8859-11", "iso8859-11", "tis-620", "dos-874"), "cp874"),
    **dict.fromkeys(("gb2312", "gbk", "x-gbk", "chinese", "csgb2312", "gb_2312-80"), "gbk"),
    **dict.fromkeys(("shift_jis", "shift-jis", "sjis", "x-sjis", "ms_kanji", "windows-31j"), "cp932"),
    **dict.fromkeys(("euc-kr", "ks_c_5601-1987", "windows-949", "cseuckr"), "cp949"),
    **dict.fromkeys(("big5", "big5-hkscs", "x-x-big5", "cn-big5"), "big5hkscs"),
    "unicode-1-1-utf-8": "utf-8",
    "utf8": "utf-8",
    "x-mac-cyrillic": "mac-cyrillic",
}


def normalize_encoding(label: str | None) -> str | None:
    """The Python codec name a browser would use for `label`, or None if it names no text codec."""
    if not label:
        return None
    key = label.strip().strip("\"'").lower()
    key = _WHATWG_ALIASES.get(key, key)
    try:
        info = codecs.lookup(key)
    except (LookupError, ValueError):
        return None
    # bytes-to-bytes and str-to-str codecs (base64, rot13, ...) cannot decode a page.
    if not getattr(info, "_is_text_encoding", True) or not _decodes_any_bytes(info.name):
        return None
    return info.name


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
