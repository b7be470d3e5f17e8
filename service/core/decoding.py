"""Raw page bytes to text: the one decoder the pruner, the extractors and the training stack share.

The order follows what a browser does (the WHATWG "encoding sniffing" steps), with a statistical
detector where a browser would guess from the user's locale:

1. a byte-order mark (UTF-8, UTF-16 LE/BE, UTF-32 LE/BE) wins over everything;
2. the `encoding` argument, as an HTTP `Content-Type` charset would declare it;
3. a `<meta charset>` / `<meta http-equiv="Content-Type" content="...; charset=...">` or an XML
   declaration in the first `PRESCAN_BYTES` bytes (browsers stop at 1024; real pages put long scripts
   before the meta tag, so we look further);
4. bytes that are valid UTF-8 are UTF-8 (cheap, exact, and what most of the web is);
5. otherwise `charset-normalizer`, with one correction: it cannot tell `iso-8859-2` from
   `windows-1250` (Czech, Slovak, Polish, Hungarian...) and picks `windows-1250` for both, so the two
   candidates are compared on how many of their non-ASCII characters are letters (see
   `_central_european`);
6. nothing to go on: windows-1252, the web's legacy default.

Encoding labels are mapped the way browsers map them (`iso-8859-1` and `ascii` mean windows-1252,
`shift_jis` means windows-31j, ...), and a declaration naming no text codec (`base64`, `rot13`, an
unknown label) is ignored. Undecodable bytes become U+FFFD; decoding never raises.
"""

from __future__ import annotations

import codecs
import re
from collections import Counter
from dataclasses import dataclass
from email.message import Message

PRESCAN_BYTES = 16384  # how far into the page a <meta> charset declaration is looked for
DETECT_SAMPLE_BYTES = 524288  # charset-normalizer sees at most this much; the whole page is decoded

_BOMS: tuple[tuple[bytes, str], ...] = (
    # UTF-32 LE before UTF-16 LE: its BOM starts with the UTF-16 LE one.
    (codecs.BOM_UTF8, "utf-8"),
    (codecs.BOM_UTF32_LE, "utf-32-le"),
    (codecs.BOM_UTF32_BE, "utf-32-be"),
    (codecs.BOM_UTF16_LE, "utf-16-le"),
    (codecs.BOM_UTF16_BE, "utf-16-be"),
)

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

_META_CHARSET = re.compile(rb"<meta\b[^>]*?charset\s*=\s*[\"']?\s*([A-Za-z0-9_:.+-]+)", re.IGNORECASE)
_XML_DECL = re.compile(rb"^\s*<\?xml[^>]*?encoding\s*=\s*[\"']([A-Za-z0-9_:.+-]+)", re.IGNORECASE)
# The encodings the detector chooses among, as charset-normalizer names them: those a browser can decode
# (the WHATWG Encoding Standard; a page no browser could read in cp775 or hp-roman8 is not in cp775 or
# hp-roman8, however its bytes look), less the ones next to no page uses, which the detector otherwise
# picks for ordinary text: mac-roman for an English page's curly quotes, iso-8859-14 or ibm866 for a
# German page. Declared, all of them still decode. UTF-16 and UTF-32 need a BOM (step 1).
_DETECTED_ENCODINGS = [
    "iso8859_2", "iso8859_5", "iso8859_6", "iso8859_7", "iso8859_8", "iso8859_13", "iso8859_15",
    "iso8859_16", "koi8_r", "koi8_u", "cp874", "cp1250", "cp1251", "cp1252", "cp1253", "cp1254", "cp1255",
    "cp1256", "cp1257", "cp1258", "gb18030", "big5", "euc_jp", "iso2022_jp", "cp932", "cp949", "utf_8",
]  # fmt: skip
# The single-byte codecs of `_DETECTED_ENCODINGS` (Python names) by script. A Latin guess is re-ranked
# among the Latin readings (see _best_latin_reading); a guess of another script is checked against the
# best Latin reading.
_LATIN_SINGLE_BYTE = frozenset(
    {"cp1250", "cp1252", "cp1254", "cp1257", "cp1258", "iso8859-2", "iso8859-13", "iso8859-15", "iso8859-16"}
)
_NON_LATIN_SINGLE_BYTE = frozenset(
    {"cp1251", "koi8-r", "koi8-u", "iso8859-5", "cp1253", "iso8859-7", "cp1255", "iso8859-8", "cp1256",
     "iso8859-6", "cp874"}
)  # fmt: skip
# The Latin-script readings re-ranked by _best_latin_reading, most common on the web first; the detector's
# own guess joins them when it is another Latin one.
_LATIN_CANDIDATES = ("cp1252", "iso8859-15", "cp1250", "iso8859-2", "cp1254", "cp1257")
_NON_ASCII = re.compile(r"[^\x00-\x7f]")
# Non-ASCII letters of the languages iso-8859-2 and windows-1250 were made for (lowercase).
_ALPHABETS: tuple[str, ...] = (
    "áčďéěíňóřšťúůýž",  # Czech
    "áäčďéíĺľňóôŕšťúýž",  # Slovak
    "ąćęłńóśźż",  # Polish
    "áéíóöőúüű",  # Hungarian
    "čćđšž",  # Slovenian, Croatian, Bosnian
    "ăâîşșţț",  # Romanian
    "äöüß",  # German
    "àâæçéèêëîïôœùûüÿ",  # French
    "áéíñóúü",  # Spanish
    "àáâãçéêíóôõú",  # Portuguese
    "àèéìíîòóù",  # Italian
    "åäæöø",  # Nordic
    "áðéíóúýþæö",  # Icelandic
    "çğıöşü",  # Turkish
    "ąčęėįšųūž",  # Lithuanian
    "āčēģīķļņšūž",  # Latvian
    "äõöüšž",  # Estonian
)
# Non-letters that sit inside words in real text: the soft hyphen, apostrophes, the middle dot (Catalan).
_IN_WORD = frozenset("\xad\u2019\u2018\u02bc\xb7\u2010\u2011")
# Characters no reading of real text should produce: the C1 controls, U+FFFD, the currency sign.
_ODD = frozenset([*map(chr, range(0x80, 0xA0)), "\ufffd", "\xa4"])


@dataclass(frozen=True)
class DecodedHtml:
    """Decoded page text and how the encoding was chosen."""

    text: str
    encoding: str  # Python codec name actually used ("utf-8" for str input)
    source: str  # "bom" | "declared" | "meta" | "detected" | "default" | "str"


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
    if not getattr(info, "_is_text_encoding", True):
        return None
    return info.name


def parse_content_type(value: str) -> tuple[str, str | None]:
    """(lower-case media type, charset label or None) of a `Content-Type` value, as HTTP sends it.

    The email parser does the RFC 2045 work (quoted parameters, case); one it cannot parse reads as
    `text/plain`, which callers that must quote the header back keep in mind.
    """
    message = Message()
    message["content-type"] = value
    charset = message.get_param("charset")
    return message.get_content_type(), charset if isinstance(charset, str) and charset else None


def sniff_meta_charset(data: bytes) -> str | None:
    """The codec a `<meta>` charset or XML declaration near the top of the page names, if any."""
    head = data[:PRESCAN_BYTES]
    for pattern in (_XML_DECL, _META_CHARSET):
        match = pattern.search(head)
        if match is None:
            continue
        name = normalize_encoding(match.group(1).decode("ascii", "replace"))
        if name is None:
            continue
        # A document that says "utf-16" in ASCII bytes cannot be UTF-16 (the spec reads it as UTF-8).
        if name.startswith(("utf-16", "utf-32")):
            return "utf-8"
        return name
    return None


def decode_html(data: bytes | str, *, encoding: str | None = None) -> DecodedHtml:
    """Decode a page's raw bytes (BOM, declared, meta, detected, default); never raises on bad bytes."""
    if isinstance(data, str):
        return DecodedHtml(text=data, encoding="utf-8", source="str")
    for bom, name in _BOMS:
        if data.startswith(bom):
            return DecodedHtml(data[len(bom) :].decode(name, errors="replace"), name, "bom")
    declared = normalize_encoding(encoding)
    if declared is not None:
        return DecodedHtml(data.decode(declared, errors="replace"), declared, "declared")
    meta = sniff_meta_charset(data)
    if meta is not None:
        return DecodedHtml(data.decode(meta, errors="replace"), meta, "meta")
    try:
        return DecodedHtml(data.decode("utf-8"), "utf-8", "detected" if data else "default")
    except UnicodeDecodeError:
        pass
    detected = _detect(data)
    return DecodedHtml(data.decode(detected, errors="replace"), detected, "detected")


def with_declared_encoding(data: bytes, encoding: str | None) -> bytes:
    """`data` as bytes `decode_html` reads, without being told, the way `encoding` says to read them.

    For page collections, where the declaration (an HTTP charset kept in a WARC record, a JSONL row's
    `encoding`, or "utf-8" for a row that carries text) would otherwise be lost between the reader and
    the many consumers that only take bytes. The bytes come back unchanged when the declaration changes
    nothing (no codec named, a BOM, a `<meta>` that agrees, UTF-8 declared for valid UTF-8 without a
    contrary `<meta>`); otherwise the declared reading comes back as UTF-8 behind a BOM, which wins
    over everything else in `decode_html`.
    """
    declared = normalize_encoding(encoding)
    if declared is None or any(data.startswith(bom) for bom, _ in _BOMS):
        return data
    meta = sniff_meta_charset(data)
    if meta == declared:
        return data
    if meta is None and declared == "utf-8" and _is_utf8(data):
        return data
    reading = data.decode(declared, errors="replace")
    if decode_html(data).text == reading:
        return data
    return codecs.BOM_UTF8 + reading.encode("utf-8")


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def utf8_payload(data: bytes, *, encoding: str | None = None) -> bytes | None:
    """The page's bytes as UTF-8, when `decode_html` would read them as UTF-8 without looking at them.

    That is: a UTF-8 BOM (the rest of the page is returned), a UTF-8 declaration (argument or meta),
    or pure ASCII. A UTF-8 consumer (Lexbor) can then take the bytes as they are and skip a decode and
    a re-encode; undecodable bytes become U+FFFD there exactly as in `decode_html` (both follow the
    WHATWG decoder). Everything else returns None: decode with `decode_html`.
    """
    for bom, name in _BOMS:
        if data.startswith(bom):
            return data[len(bom) :] if name == "utf-8" else None
    declared = normalize_encoding(encoding)
    if declared is None:
        declared = sniff_meta_charset(data)
    if declared is not None:
        return data if declared == "utf-8" else None
    return data if data.isascii() else None


def _detect(data: bytes) -> str:
    """charset-normalizer's guess among the web's encodings for non-UTF-8 bytes, Latin readings re-ranked."""
    from charset_normalizer import from_bytes  # imported lazily: it is slow to import, rarely needed

    sample = data[:DETECT_SAMPLE_BYTES]
    best = from_bytes(sample, cp_isolation=_DETECTED_ENCODINGS).best()
    name = None if best is None else normalize_encoding(best.encoding)
    if name in (None, "ascii", "utf-8"):
        # No usable guess (or the sample looked UTF-8 but the page is not): rank the Latin readings.
        return _best_latin_reading(sample, "cp1252")[0]
    if name in _LATIN_SINGLE_BYTE:
        return _best_latin_reading(sample, name)[0]
    if name in _NON_LATIN_SINGLE_BYTE:
        # A German page's "ä" and soft hyphens read as KOI8-R are "Д" and "╜" inside Latin words: when
        # the best Latin reading has well under half the misfits of the guess, the page is Latin.
        latin, latin_misfits = _best_latin_reading(sample, "cp1252")
        _, guessed = _score(sample.decode(name, errors="replace"))
        if 2 * latin_misfits < guessed:
            return latin
    return name


def _best_latin_reading(sample: bytes, guess: str) -> tuple[str, int]:
    """Re-rank the Latin-script single-byte readings, which charset-normalizer confuses on short text.

    It cannot tell iso-8859-2 from windows-1250 (Czech, Slovak, Polish, Hungarian...), nor windows-1252
    from iso-8859-15, and with a few dozen words, or a German page full of soft hyphens, it says
    windows-1250 or mac-roman for either. The readings differ only in the bytes 0x80-0xBF and a few
    letters: a Czech "š" in iso-8859-2 is a Polish "ą" in windows-1250, a "ť" is a "»", windows-1250's
    "š" (0x9A) is a C1 control code in iso-8859-2, and a German soft hyphen (0xAD) is a "Ł" mid-word in
    some. Each candidate reading is scored by its alphabet fit less twice its misfits (`_score`); the
    best wins and is returned with its misfits. A tie goes to the more common encoding (the order of
    `_LATIN_CANDIDATES`, windows-1252 first, then the detector's guess): with a German page's one "ø",
    windows-1252 and windows-1250 ("ř") fit German equally well, and windows-1252 is what such a page is
    in far more often.
    """
    best, best_score, best_misfits = guess, None, 0
    for name in dict.fromkeys((*_LATIN_CANDIDATES, guess)):
        fit, misfits = _score(sample.decode(name, errors="replace"))
        if best_score is None or fit - 2 * misfits > best_score:
            best, best_score, best_misfits = name, fit - 2 * misfits, misfits
    return best, best_misfits


def _score(text: str) -> tuple[int, int]:
    """(alphabet fit, misfits) of a reading's non-ASCII characters: how much they look like text.

    The fit is their letters' fit to the best-fitting alphabet of `_ALPHABETS`: letters of it count for
    the reading, other letters against. Misfits are what real text does not do: a capital letter right
    after a lowercase one, a letter next to a letter of another script ("MДrz"), a symbol between two
    letters (bar the few that live inside words), the currency sign "¤" (iso-8859-15 has "€" there), a
    C1 control code or U+FFFD. A letter with no letter on either side ("Copyright Š 2023" is "©" in
    windows-1252) says nothing about the language and counts neither way.
    """
    letters: Counter[str] = Counter()
    misfits = 0
    for match in _NON_ASCII.finditer(text):
        i, ch = match.start(), match.group()
        before = text[i - 1] if i else " "
        after = text[i + 1] if i + 1 < len(text) else " "
        if ch.isalpha():
            latin = _is_latin(ch)
            if (ch.isupper() and before.islower()) or any(
                c.isalpha() and _is_latin(c) != latin for c in (before, after)
            ):
                misfits += 1
            elif before.isalpha() or after.isalpha():
                letters[ch.lower()] += 1
        elif ch in _ODD or (before.isalpha() and after.isalpha() and ch not in _IN_WORD):
            misfits += 1
    total = sum(letters.values())
    fit = max(2 * sum(letters[ch] for ch in alphabet) - total for alphabet in _ALPHABETS) if total else 0
    return fit, misfits


def _is_latin(ch: str) -> bool:
    """Latin script: ASCII, Latin-1, Latin Extended-A/B and IPA (below U+02B0), Latin Extended Additional."""
    return ch < "\u02b0" or "\u1e00" <= ch <= "\u1eff"
