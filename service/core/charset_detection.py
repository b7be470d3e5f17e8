"""Which encoding undeclared, non-UTF-8 page bytes are in: step 7 of `decoding.decode_html`.

charset-normalizer makes the first guess among the encodings a browser can decode, from the page's
non-ASCII bytes with a few bytes of context each (`_neighbourhoods`): given the page, it read five
chunks of 512 bytes spread over it, and its guess moved with the length of the ASCII markup. It
decodes with Python's strict codecs, which lack characters a browser reads (GBK's euro sign, Big5's
HKSCS characters, EUC-JP's NEC symbols) and fail a page on one stray byte: where only those (and a
few such bytes) rule an East Asian reading out, it looks again with them blanked out (`_second_look`).
Two corrections follow, both from pages it misread:

- Latin-script single-byte readings are re-ranked by how their non-ASCII letters fit the alphabets of
  the languages those encodings serve (`_best_latin_reading`): it cannot tell iso-8859-2 from
  windows-1250, nor windows-1252 from iso-8859-15, and calls a German page full of soft hyphens KOI8-R.
- A page whose non-ASCII bytes are few (at most `FEW_FOREIGN_BYTES`: an English page with a Russian
  place name or a Chinese shop name in it) gives the detector too little to go on; it called "Москва"
  Big5 and "Контакты" windows-1252. There the plausible readings compete on how many of their
  characters real text would not contain (`_few_foreign_words`).

In both, the single-byte readings judge a windows-1252 symbol repeated alone between ASCII non-letters
("£££" price levels) as the byte once (`_REPEATED_BYTE`; never a letter: Russian's "ООО" is a word);
and the alphabets leave out a micro sign before a unit ("5µg", `_without_unit_prefixes`).
"""

from __future__ import annotations

import codecs
import functools
import re
import threading
from collections import Counter
from collections.abc import Iterable
from typing import TYPE_CHECKING, NamedTuple

from service.core.encoding_labels import browser_character, decode_bytes, normalize_encoding

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt
    from charset_normalizer import CharsetMatch, CharsetMatches

DETECT_SAMPLE_BYTES = 524288  # the detector sees at most this much of the page's neighbourhoods (all decoded)
FEW_FOREIGN_BYTES = 256  # pages with at most this many non-ASCII bytes: the readings compete

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
# A non-ASCII character with the characters either side, matches overlapping (`_score`).
_WITH_NEIGHBOURS = re.compile(r"(?=(.[^\x00-\x7f].))", re.DOTALL)
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
# Non-letters that sit inside words in real text: the soft hyphen, apostrophes, the middle dot (Catalan),
# hyphens and the dashes English sets without spaces ("coercion—which", "1990–2000").
_IN_WORD = frozenset("\xad\u2019\u2018\u02bc\xb7\u2010\u2011\u2013\u2014")
# Characters no reading of real text should produce: the C1 controls, U+FFFD, the currency sign.
_ODD = frozenset([*map(chr, range(0x80, 0xA0)), "\ufffd", "\xa4"])

# The guesses `_few_foreign_words` re-examines on pages with few non-ASCII bytes, and the East Asian
# double-byte encodings it lets compete, most common on the web first; with the rows (first and last
# two-byte code, inclusive) of each where text of its language mostly lies: punctuation and symbols,
# then its common characters (see `_east_asian_cost`).
_EAST_ASIAN_ROWS: dict[str, tuple[tuple[int, int], ...]] = {
    "gb18030": ((0xA1A1, 0xA3FE), (0xB0A1, 0xD7FE)),
    "cp932": ((0x8140, 0x81FC), (0x824F, 0x82F1), (0x8340, 0x8396), (0x889F, 0x9872)),
    "euc_jp": ((0xA1A1, 0xA3FE), (0xA4A1, 0xA4F3), (0xA5A1, 0xA5F6), (0xB0A1, 0xCFD3)),
    "big5hkscs": ((0xA140, 0xA3BF), (0xA440, 0xC67E)),
    "cp949": ((0xA1A1, 0xA3FE), (0xB0A1, 0xC8FE)),
}
_EAST_ASIAN = tuple(_EAST_ASIAN_ROWS)
# The East Asian encodings whose pages one character can rule out with the detector (`_second_look`),
# by the strict codec it reads them with: one the standard's decoder reads and Python's table lacks
# (GBK, Big5, EUC-JP), or a stray byte (all five). How many such characters of one reading are collected
# at most (past them, the second look reads the sample up to the last), and how many bytes of the
# sample excuse one real error.
_STRICT_EAST_ASIAN = ("gb18030", "big5", "euc_jp", "cp949", "cp932")
_MOST_BROWSER_ONLY = 1024
_BYTES_PER_ERROR = 1024
_COST_SAMPLE_BYTES = 16384  # of the sample whose readings `_second_look` compares
_FEW_WORDS_GUESSES = frozenset({*_LATIN_SINGLE_BYTE, "cp1251", *_EAST_ASIAN})
_ASCII = bytes(range(128))
_NON_ASCII_BYTES = re.compile(rb"[\x80-\xff]+")
_HIGH_BYTES = bytes(range(0x80, 0x100))
_CONTEXT = 8  # ASCII bytes kept either side of non-ASCII ones (see _neighbourhoods)
# Non-ASCII punctuation of ordinary text, which sits next to letters and to itself ("«Été»", "…”").
_PUNCTUATION = frozenset("«»‘’‚“”„–—…•·‹›¡¿\xa0")
# Symbols that live beside letters and digits: "m²", "20°C", "Brand™", "©2023", "5µm".
_BESIDE_LETTERS = frozenset("°²³¹™®©µ")
# Three or more non-ASCII characters with no ASCII letter on either side.
_FOREIGN_RUN = re.compile(r"(?<![A-Za-z])[^\x00-\x7f]{3,}(?![A-Za-z])")
# One non-ASCII byte repeated, with no letter or other non-ASCII byte before it and an ASCII byte below
# 0x40 (no second byte of any double-byte encoding: space, digits, punctuation, "<") or the end after it:
# "£££" or "¥¥" price levels, a row of no-break spaces. Each reading makes one character of it repeated,
# yet the alphabets counted "ŁŁŁ" as Polish and the contest "ЈЈЈ" as clean Cyrillic: a page whose only
# non-ASCII bytes were "£££" read as windows-1251 or windows-1250. The single-byte readings judge such a
# run as the byte once (see `detect_encoding`), but only for a byte that is no letter in windows-1252 (a
# symbol there: "£", "¥", "©", "»", "¿"): words are written as one letter repeated in Russian ("ООО", the
# LLC of every company name; "ГГГГ" in a date's placeholder), and bytes 0xC0-0xFF are letters in
# windows-1252 too, so collapsing them made a Russian page's "ООО" read as windows-1252's "ÎÎÎ".
_SYMBOL_BYTES = bytes(b for b in range(0x80, 0x100) if not bytes([b]).decode("cp1252", "replace").isalpha())
_REPEATED_BYTE = re.compile(
    rb"(?<![A-Za-z\x80-\xff])([" + re.escape(_SYMBOL_BYTES) + rb"])\1+(?=[\x00-\x3f]|\Z)"
)
# The micro sign in every Latin candidate but iso-8859-2, where it is Slovak "ľ" (`_without_unit_prefixes`).
_MICRO_SIGN = 0xB5


def detect_encoding(data: bytes) -> str:
    """The codec undeclared, non-UTF-8 `data` is most likely in (a Python codec name)."""
    from charset_normalizer import from_bytes  # imported lazily: it is slow to import, rarely needed

    # The detector reads five chunks of 512 bytes spread over what it is given, so on the page itself its
    # answer moved with the length of the ASCII markup before the text: one GBK page came back cp1252 or
    # GBK as a comment in its <head> grew. Given the non-ASCII bytes in their context only, it reads the
    # text whatever surrounds it (see _neighbourhoods). Every later step looks at a non-ASCII byte and
    # its neighbours only, so the neighbourhoods stand for the page there too.
    neighbourhoods = _neighbourhoods(data)
    # The single-byte readings judge a symbol repeated alone ("£££", `_REPEATED_BYTE`) as the symbol
    # once: a letter with no letter beside it counts for no alphabet, and a lone letter of one script
    # costs no more than a symbol, so where nothing else tells them apart windows-1252, first in their
    # ties, wins; a reading that makes the byte odd still pays for it (iso-8859-15's "€€€€" is "¤¤¤¤" in
    # windows-1252). The double-byte readings see the run whole: there it can be characters ("　　", two
    # ideographic spaces in EUC-KR, GBK or EUC-JP, is 0xA1 four times), which one byte would break.
    single_byte = _REPEATED_BYTE.sub(rb"\1", neighbourhoods)
    matches = _second_look(neighbourhoods, from_bytes(neighbourhoods, cp_isolation=_DETECTED_ENCODINGS))
    best = matches.best()
    guess = _corrected_guess(single_byte, None if best is None else normalize_encoding(best.encoding))
    if guess in _FEW_WORDS_GUESSES and len(neighbourhoods.translate(None, _ASCII)) <= FEW_FOREIGN_BYTES:
        # On a word or two every East Asian reading is often as clean and as coherent as the next (0 and
        # 0), and the detector's first is merely the first it tried: Big5 for GBK's "你好" ("斕疑"). Its
        # guess breaks the contest's ties only where it chose it over the other East Asian readings.
        if guess in _EAST_ASIAN and best is not None:
            rivals = [m for m in matches if m is not best and normalize_encoding(m.encoding) in _EAST_ASIAN]
            if any(_tied(best, rival) for rival in rivals):
                return _few_foreign_words(neighbourhoods, single_byte, None)
        return _few_foreign_words(neighbourhoods, single_byte, guess)
    return guess


def _second_look(sample: bytes, matches: CharsetMatches) -> CharsetMatches:
    """The detector's `matches` for `sample`, or its matches for the sample with the characters only a
    browser reads (and a few stray bytes) blanked out where those name one of the East Asian encodings
    they were blanked for.

    The detector decodes with Python's strict codecs, so one character that Python's table lacks and
    the standard's decoder reads rules an encoding out: GBK's euro sign (a lone 0x80), Big5's HKSCS
    characters (its codec is Python's big5: 啱, 嘅) and euro sign (0xA3E1), EUC-JP's NEC and IBM rows
    (①, ㈱, Ⅱ, 髙: CP51932, which EUC-JP pages written on Windows are in). Such a page came out as
    windows-1252 or iso-8859-15 mojibake, or as GBK where EUC-JP was ruled out. So did a page with one
    stray byte (0xFF pasted into the text, a crawler's cut at the end of a chunk), which the standard's
    decoder reads as one U+FFFD. Where a reading fails Python's codec only on such characters and a
    few errors (`_browser_only_spans`), the detector looks again with them blanked out, with every other
    reading's too, and its answer counts where it is one of those readings and reads as more plausible
    text than the first; otherwise the first answer stands. Where a reading has more such characters
    than are collected (a Cantonese page of HKSCS characters), the second look reads the sample up to
    the last one collected.
    """
    best = matches.best()
    chosen = None if best is None else normalize_encoding(best.encoding)
    spans: list[tuple[int, int]] = []
    readings: set[str | None] = set()
    end = len(sample)
    for strict in _STRICT_EAST_ASIAN:
        reading = normalize_encoding(strict)
        if reading != chosen and (found := _browser_only_spans(sample, strict)) is not None and found.spans:
            spans += found.spans
            readings.add(reading)
            end = min(end, found.end)
    if not spans:
        return matches
    from charset_normalizer import from_bytes

    prefix = sample[:end]
    again = from_bytes(
        _blanked(prefix, [span for span in spans if span[1] <= end]), cp_isolation=_DETECTED_ENCODINGS
    )
    second = again.best()
    reading = None if second is None else normalize_encoding(second.encoding)
    if reading is None or reading not in readings:
        return matches
    # A Latin page's bytes can read as Big5 but for HKSCS characters (letters are Big5 second bytes):
    # the new answer must also read as more plausible text than the one it replaces (`_reading_cost`,
    # on the first `_COST_SAMPLE_BYTES`: it runs in Python).
    piece = prefix[: _cut(prefix, 0, min(len(prefix), _COST_SAMPLE_BYTES))]
    first = _corrected_guess(sample, chosen)
    return again if _reading_cost(piece, reading) < _reading_cost(piece, first) else matches


class _Spans(NamedTuple):
    """What `_browser_only_spans` found: the characters to blank out, and how far it read."""

    spans: list[tuple[int, int]]  # (start, end) of each, in the order of the sample
    end: int  # the sample's length, or the end of the last span where `_MOST_BROWSER_ONLY` were found


def _browser_only_spans(sample: bytes, codec: str) -> _Spans | None:
    """The (start, end) of each character of `sample` that Python's strict `codec` cannot decode and the
    standard's decoder reads (`encoding_labels.browser_character`), and of each it finds an error too,
    up to one per `_BYTES_PER_ERROR` bytes of the sample (one at least: a stray byte, a character the
    page's end cut off); None past that many errors (the sample is not in that encoding). At most
    `_MOST_BROWSER_ONLY` are collected: past those, the reading ends after the last one. In cp932 the
    lone bytes Python reads as private-use characters count as the errors they are to the standard
    (`_cp932_lone_bytes`).

    One decode in C, with an error handler that collects the characters (`_SpanCollector`) and stops
    the decode once it has enough. Decoding from each such character to the next had cost an exception,
    a view and a call each: 36 ms for the 4,095 HKSCS-range pairs of a 600 KiB GBK page read as Big5.
    """
    collector = _SpanCollector(max(1, len(sample) // _BYTES_PER_ERROR))
    _COLLECTING.collector = collector
    try:
        text: str | None = sample.decode(codec, errors=_collecting_errors())
    except _EnoughSpans:
        text = None
    finally:
        _COLLECTING.collector = None
    if collector.ruled_out:
        return None
    if text is not None and codec == "cp932" and _CP932_LONE.search(text) is not None:
        # (at most `most_errors` spans were collected, fewer than `_MOST_BROWSER_ONLY`: no cap here)
        lone = _cp932_lone_bytes(text, collector.most_errors - collector.errors)
        return None if lone is None else _Spans(sorted(collector.spans + lone), len(sample))
    return _Spans(collector.spans, len(sample) if collector.end is None else collector.end)


# What Python's cp932 reads the lone bytes 0xA0 and 0xFD-0xFF as (see `encoding_labels.decode_bytes`).
_CP932_LONE = re.compile("[\uf8f0-\uf8f3]")


def _cp932_lone_bytes(text: str, most: int) -> list[tuple[int, int]] | None:
    """The (start, end) of each lone 0xA0, 0xFD, 0xFE or 0xFF of the sample `text` was read from in cp932
    (by `_SpanCollector`: a "?" for each byte of an error), or None where there are more than `most`.

    Errors to the standard's decoder (a windows-1252 no-break space pasted into a Shift_JIS page, a
    stray 0xFF) that Python's codec reads as Microsoft's private-use characters, which the detector
    took for noise and ruled the page's encoding out for. 0xA0 is a second byte too, so their places
    come from the text: each character cp932 reads is as many bytes as it encodes to (every one of
    them checked), and so is each "?".
    """
    spans: list[tuple[int, int]] = []
    offset = done = 0
    for match in _CP932_LONE.finditer(text):
        if len(spans) == most:
            return None
        offset += len(text[done : match.start()].encode("cp932"))
        spans.append((offset, offset + 1))
        offset += 1
        done = match.end()
    return spans


class _EnoughSpans(Exception):
    """Raised by `_SpanCollector` to stop the decode it collects from."""


class _SpanCollector:
    """The decode error handler of one `_browser_only_spans` call: what it collects, and when it stops.
    Each character it is called for becomes a "?" per byte in the decoded text (`_cp932_lone_bytes`)."""

    def __init__(self, most_errors: int) -> None:
        self.spans: list[tuple[int, int]] = []
        self.most_errors = most_errors
        self.errors = 0
        self.end: int | None = None  # where the reading stops short of the sample's end (at the cap)
        self.ruled_out = False

    def __call__(self, error: UnicodeDecodeError) -> tuple[str, int]:
        if len(self.spans) == _MOST_BROWSER_ONLY:
            self.end = self.spans[-1][1]
            raise _EnoughSpans
        character, end = browser_character(error.object, error.start, error.encoding)
        if character == "\ufffd":
            self.errors += 1
            if self.errors > self.most_errors:
                self.ruled_out = True
                raise _EnoughSpans
        self.spans.append((error.start, end))
        return "?" * (end - error.start), end


# The collector of the `_browser_only_spans` call running in this thread: an error handler is registered
# once, by name, and a decode in one thread must not collect into another's.
_COLLECTING = threading.local()


@functools.cache
def _collecting_errors() -> str:
    """The name of the error handler that hands each decode error to this thread's `_SpanCollector`
    (registered on first use, not at import)."""
    name = "htmllm.browser-only-spans"
    codecs.register_error(name, _collect_span)
    return name


def _collect_span(error: UnicodeError) -> tuple[str, int]:
    """The registered error handler: the running collector's answer."""
    if not isinstance(error, UnicodeDecodeError):
        raise error
    collector: _SpanCollector = _COLLECTING.collector
    return collector(error)


def _blanked(sample: bytes, spans: list[tuple[int, int]]) -> bytes:
    """`sample` with each of `spans` (of several readings: they may overlap) a space."""
    pieces: list[bytes] = []
    done = 0
    for start, end in sorted(spans):
        if start < done:  # (overlaps the last one: one blank for both)
            done = max(done, end)
            continue
        pieces += (sample[done:start], b" ")
        done = end
    pieces.append(sample[done:])
    return b"".join(pieces)


def _tied(best: CharsetMatch, other: CharsetMatch) -> bool:
    """Whether charset-normalizer ranked `best` over `other` without telling them apart: their mess
    and coherence within the margins its own ordering treats as "a difficult decision"."""
    return abs(best.chaos - other.chaos) < 0.005 and abs(best.coherence - other.coherence) <= 0.02


def _corrected_guess(sample: bytes, name: str | None) -> str:
    """charset-normalizer's guess `name` with the Latin readings re-ranked."""
    if name in (None, "ascii", "utf-8"):
        # No usable guess (or the sample looked UTF-8 but the page is not): rank the Latin readings.
        return _best_latin_reading(sample, "cp1252")[0]
    assert name is not None
    if name in _LATIN_SINGLE_BYTE:
        return _best_latin_reading(sample, name)[0]
    if name in _NON_LATIN_SINGLE_BYTE:
        # A German page's "ä" and soft hyphens read as KOI8-R are "Д" and "╜" inside Latin words: when
        # the best Latin reading has well under half the misfits of the guess, the page is Latin.
        contexts = _byte_contexts(sample)
        latin, latin_misfits = _best_latin_reading(sample, "cp1252", contexts)
        _, guessed = _score_single_byte(contexts, name)
        if 2 * latin_misfits < guessed:
            return latin
    return name


def _few_foreign_words(sample: bytes, single_byte: bytes, guess: str | None) -> str:
    """The reading of a page with few non-ASCII bytes (`sample`: their `_neighbourhoods`; `single_byte`:
    the sample the single-byte readings judge, see `detect_encoding`) that has the fewest implausible
    characters; `guess` is the detector's (re-ranked) guess, None where it was an East Asian encoding
    the detector could not tell from the others.

    The contenders are the best Latin reading, windows-1251 (the web's Cyrillic), the East Asian
    double-byte encodings and windows-1252; their costs (`_reading_cost`) count, in bytes, what real
    text does not do. windows-1252 is there for when the alphabets chose another Latin reading from
    next to nothing (before a repeated byte counted once, a page whose non-ASCII bytes were "£££" price
    levels was "ŁŁŁ" in windows-1250, letters of Polish, and windows-1251 beat that reading); it comes
    last, as mojibake of a few CJK characters can cost it nothing ("北京" in GBK is "±±¾©"). A tie goes
    to the first in that order,
    the detector's own guess first among the East Asian ones:
    a few CJK characters can be valid common characters in several of them at once ("北京" in GBK is
    two common hangul syllables in EUC-KR), and only more text tells those apart. Guesses of other
    scripts (Greek, Hebrew, Arabic, Thai) do not come here: the detector gets those right from a
    sentence, and a few such words cannot be told from Cyrillic by their shapes alone.
    """
    # A Latin guess has been re-ranked among the Latin readings already (`_corrected_guess`).
    latin = guess if guess in _LATIN_SINGLE_BYTE else _best_latin_reading(single_byte, "cp1252")[0]
    east_asian = (guess, *_EAST_ASIAN) if guess is not None and guess in _EAST_ASIAN else _EAST_ASIAN
    best, best_cost = latin, None
    for name in dict.fromkeys((latin, "cp1251", *east_asian, "cp1252")):
        cost = _reading_cost(sample if name in _EAST_ASIAN else single_byte, name)
        if best_cost is None or cost < best_cost:
            best, best_cost = name, cost
        if cost == 0:
            break  # nothing later can beat it: ties go to the earlier
    return best


def _neighbourhoods(data: bytes, limit: int = DETECT_SAMPLE_BYTES) -> bytes:
    """The non-ASCII bytes of `data` with `_CONTEXT` bytes either side, the pieces joined by spaces, at
    most `limit` bytes of them (the pieces of the whole page, from its start, up to that).

    What the readings are judged on: every cost looks at a character and its neighbours only, so
    scoring these instead of a page of 500 KiB gives the same answer in a fraction of the time, and
    the detector given these reads the page's text, not where its chunks happen to fall in the markup.
    A piece starts and ends on ASCII bytes, which every contender decodes alone and the same way.
    Pieces that touch are merged as spans first and cut out once: appending to the last piece made a
    page of CJK text, one long piece, quadratic (2 s for 512 KiB). The cap is on what comes out, not on
    what is read: the first 512 KiB of the page had hidden legacy text after a long ASCII head (read as
    windows-1252), and the scan stops once the pieces fill `limit` (the regex skips ASCII in C; each
    match it returns adds a byte at least), so a page of 16 MiB costs no more than one of 512 KiB. The
    piece the cap cuts ends where a character ends (`_cut`): cut inside a double-byte character, a GBK
    page kept a lone lead byte, which no East Asian codec reads, and came out windows-874 half the time.
    So does the last piece of a page that ends inside a character (`_complete_end`: a crawler's byte
    cap), which had ruled the page's encoding out for the detector (GBK pages read as windows-1252).
    """
    spans: list[tuple[int, int]] = []
    size = start = end = 0  # size: the bytes of the pieces in `spans` and their separators; end 0: none yet
    for match in _NON_ASCII_BYTES.finditer(data):
        low, high = max(match.start() - _CONTEXT, 0), min(match.end() + _CONTEXT, len(data))
        if end and low <= end:
            end = high
        else:
            if end:
                spans.append((start, end))
                size += end - start + 1
            start, end = low, high
        if size + end - start > limit:
            end = _cut(data, start, start + limit - size)
            break
    if end > start:
        spans.append((start, _complete_end(data, start, end) if end == len(data) else end))
    return b" ".join(data[start:end] for start, end in spans)


def _complete_end(data: bytes, start: int, end: int) -> int:
    """Where the piece `data[start:end]` at the page's end ends without a character the end cut off: a
    run of non-ASCII bytes of odd length there (a run starts where a character does, see `_cut`) is a
    lead byte without its second byte, which is left out. A single-byte page loses a character of its
    sample, which says nothing of its encoding anyway. (GB18030's four-byte form cut after two or three
    bytes ends in a digit, or leaves one: that error the second look tolerates.)
    """
    if end > start and data[end - 1] >= 0x80 and _odd_run_before(data, start, end):
        return end - 1
    return end


def _odd_run_before(data: bytes, start: int, stop: int) -> bool:
    """Whether `data[start:stop]` ends in a run of non-ASCII bytes of odd length."""
    run = len(data[start:stop].rstrip(_HIGH_BYTES)) + start
    return (stop - run) % 2 == 1


def _cut(data: bytes, start: int, stop: int) -> int:
    """Where the piece `data[start:]` cut at `stop` ends: not inside a character of any encoding the
    detector chooses among.

    An ASCII byte before the cut ends a character (alone, or as the second byte of a double byte; but
    for the second of GB18030's rare four-byte ones, a digit). A
    cut inside a run of non-ASCII bytes moves back to the run's start, after an ASCII byte; where that
    would drop most of the piece (a page of CJK text without markup), to an even number of bytes into
    the run: the run starts where a character does, and a double-byte encoding's characters there are
    pairs of non-ASCII bytes.
    """
    if stop <= start or data[stop - 1] < 0x80:
        return stop
    run = len(data[start:stop].rstrip(_HIGH_BYTES)) + start  # where the run the cut falls in starts
    if run - start >= (stop - start) // 2:
        return run
    return run + (stop - run) // 2 * 2


def _reading_cost(sample: bytes, name: str) -> int:
    """How many bytes of `sample` read as `name` make characters real text would not have there."""
    text = decode_bytes(sample, name)  # as the page will be decoded (gb18030: 0x80 is the euro sign)
    if name in _EAST_ASIAN:
        return sum(_east_asian_cost(text, match.start(), name) for match in _NON_ASCII.finditer(text))
    cost = _score(text)[1] + _mojibake_marks(text)
    if name in _LATIN_SINGLE_BYTE:
        # Latin languages put their few non-ASCII letters inside ASCII words ("café", "Straße"); a word
        # of three or more characters with no ASCII letter at all ("Ìîñêâà") is another script misread.
        cost += sum(len(run) for run in _FOREIGN_RUN.findall(text) if sum(map(str.isalpha, run)) >= 2)
    return cost


def _mojibake_marks(text: str) -> int:
    """Marks of double-byte text read one byte at a time, which `_score` does not count.

    A symbol touching a letter ("±±ѕ©", "¥x¥_", "§AŠn"; the few that
    live next to letters, "m²", "20°C", "Brand™", are exempt), an ASCII capital right after a
    non-ASCII small letter ("ƒJƒ^"), and a lone non-ASCII letter wedged between non-ASCII
    punctuation ("“ú–{").
    """
    marks = 0
    for match in _NON_ASCII.finditer(text):
        i, ch = match.start(), match.group()
        before, after = _neighbours(text, i)
        wedged = all(c > "\x7f" and not c.isalpha() and not c.isspace() for c in (before, after))
        if ch.isalpha() and ch not in "ªº":
            marks += (ch.islower() and "A" <= after <= "Z") or wedged
        elif _is_non_ascii_mark(ch) and ch not in _BESIDE_LETTERS and not (before + after).isalpha():
            # (between two letters `_score` counts it already)
            marks += before.isalpha() or after.isalpha()
    return marks


def _is_non_ascii_mark(ch: str) -> bool:
    """A non-ASCII character that is neither a letter nor white space (ª and º count: they follow digits)."""
    return ch > "\x7f" and (not ch.isalpha() or ch in "ªº") and not ch.isspace() and ch not in _PUNCTUATION


def _east_asian_cost(text: str, i: int, name: str) -> int:
    """What the character `text[i]` of the East Asian encoding `name`'s reading costs: 0 in its common
    or punctuation rows, else its bytes; one more where it stands alone against ASCII letters.

    Each encoding orders its characters so the common ones sit in known rows: GB2312's level 1 (3,755
    hanzi), Big5's frequent characters, JIS X 0208's kana and level-1 kanji, KS X 1001's 2,350 hangul
    syllables. Mojibake of other bytes lands in the rare rows as often as not (GBK's extensions,
    level-2 kanji, hanja, half-width katakana); text of the language mostly does not. A double byte
    can also take an ASCII letter for its second byte: an English "magazine’s" in Shift_JIS is
    "magazine抯", a character with no other East Asian one beside it, glued to a Latin word, which
    text of those languages has only now and then ("A股").
    """
    ch = text[i]
    before, after = _neighbours(text, i)
    glued = 0 if before > "\x7f" or after > "\x7f" else before.isalpha() + after.isalpha()
    if ch == "\ufffd" or ch < "\xa0":
        return 2 + glued
    try:
        code = ch.encode(name)
    except UnicodeEncodeError:  # half of a pair Big5-HKSCS decodes one code to ("Ê̄" is 0x8862)
        return 2 + glued
    if len(code) == 4:
        return glued  # GB18030's four-byte form: a pattern mojibake seldom makes, so no sign against it
    if len(code) != 2:
        return len(code) + glued  # half-width katakana, JIS X 0212
    value = int.from_bytes(code, "big")
    common = any(low <= value <= high for low, high in _EAST_ASIAN_ROWS[name])
    return (0 if common else 2) + glued


def _best_latin_reading(sample: bytes, guess: str, contexts: _ByteContexts | None = None) -> tuple[str, int]:
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
    in far more often. A micro sign before a unit ("5µg") counts for no reading (`_without_unit_prefixes`).
    `contexts` are `_byte_contexts(sample)` when the caller has them already.
    """
    if contexts is None:
        contexts = _byte_contexts(sample)
    contexts = _without_unit_prefixes(contexts)
    best, best_score, best_misfits = guess, None, 0
    for name in dict.fromkeys((*_LATIN_CANDIDATES, guess)):
        fit, misfits = _score_single_byte(contexts, name)
        if best_score is None or fit - 2 * misfits > best_score:
            best, best_score, best_misfits = name, fit - 2 * misfits, misfits
    return best, best_misfits


def _without_unit_prefixes(contexts: _ByteContexts) -> _ByteContexts:
    """`contexts` less each micro sign that stands as a unit's prefix: 0xB5 with an ASCII non-letter or a
    no-break space before it and an ASCII letter other than a lowercase vowel or "n" after it ("5µg",
    "10 µm").

    iso-8859-2 alone among the Latin candidates reads 0xB5 as a letter, Slovak "ľ" (windows-1250, the
    Slovak web's other encoding, has "µ" there as windows-1252 does): there the alphabets counted an
    English page's "µg" as a Slovak letter for iso-8859-2 and as a letter of no alphabet against
    windows-1252, and read it "ľg". A word that starts with "ľ" has a vowel after it ("ľudia", "ľahko"),
    which keeps that byte's say; a unit's letter tells no encoding from another.
    """
    before, after = _unit_neighbours()
    unit = (contexts.byte == _MICRO_SIGN) & before[contexts.before] & after[contexts.after]
    if not unit.any():
        return contexts
    keep = ~unit
    return _ByteContexts(contexts.before[keep], contexts.byte[keep], contexts.after[keep])


@functools.cache
def _unit_neighbours() -> tuple[npt.NDArray[np.bool_], npt.NDArray[np.bool_]]:
    """Which bytes may stand before and which after a micro sign that is a unit's prefix (see
    `_without_unit_prefixes`), as two boolean tables indexed by the byte."""
    import numpy as np

    letters = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")
    before = [(b < 0x80 and b not in letters) or b == 0xA0 for b in range(256)]  # 0xA0: a no-break space
    # Not "n" either: no unit begins with it, and Slovak words do ("ľnený").
    after = [b in letters and b not in b"aeioun" for b in range(256)]
    return np.array(before, dtype=np.bool_), np.array(after, dtype=np.bool_)


def _score(text: str) -> tuple[int, int]:
    """(alphabet fit, misfits) of a reading's non-ASCII characters: how much they look like text.

    The fit is their letters' fit to the best-fitting alphabet of `_ALPHABETS`: letters of it count for
    the reading, other letters against. Misfits are what real text does not do: a capital letter right
    after a lowercase one, a letter next to a letter of another script ("MДrz"), a symbol between two
    letters (bar the few that live inside words), the currency sign "¤" (iso-8859-15 has "€" there), a
    C1 control code or U+FFFD. A letter with no letter on either side ("Copyright Š 2023" is "©" in
    windows-1252) says nothing about the language and counts neither way.
    """
    contexts = Counter(_WITH_NEIGHBOURS.findall(f" {text} "))
    return _score_contexts(
        (_neighbour_class(before), ch, _neighbour_class(after), count)
        for (before, ch, after), count in contexts.items()
    )


def _byte_contexts(sample: bytes) -> _ByteContexts:
    """The non-ASCII bytes of `sample` with the bytes either side (a space beyond either end): all that
    `_score` looks at, read once for every single-byte reading of the page."""
    import numpy as np  # imported lazily, as the detector is: most pages never get here

    padded = np.frombuffer(b" " + sample + b" ", dtype=np.uint8)
    at = np.flatnonzero(padded[1:-1] >= 0x80) + 1
    return _ByteContexts(padded[at - 1], padded[at], padded[at + 1])


def _score_single_byte(contexts: _ByteContexts, name: str) -> tuple[int, int]:
    """`_score` of the page's reading in the single-byte codec `name`, from its `_byte_contexts`.

    `_score` reads a neighbour only through `_neighbour_class`, and a single-byte codec reads each byte
    as one character (ASCII as ASCII, the others as non-ASCII or U+FFFD), so the contexts reduce to
    (class, byte, class) triples, at most 8 x 128 x 8 of them, counted in numpy. Scoring the characters
    one by one in Python took 3 s for a 1 MB page (seven readings of the detector's 512 KiB sample).
    """
    import numpy as np

    classes = _byte_classes(name)
    keys = (classes[contexts.before].astype(np.int64) << 11) | (contexts.byte.astype(np.int64) << 3)
    keys |= classes[contexts.after]
    counts = np.bincount(keys, minlength=1 << 14)
    characters = _single_byte_characters(name)
    return _score_contexts(
        (key >> 11, characters[(key >> 3) & 0xFF], key & 7, int(counts[key]))
        for key in np.flatnonzero(counts).tolist()
    )


def _score_contexts(contexts: Iterable[tuple[int, str, int, int]]) -> tuple[int, int]:
    """`_score` from (class of the character before, non-ASCII character, class of the one after,
    how often) tuples; the same context may come more than once."""
    letters: Counter[str] = Counter()
    misfits = 0
    for before, ch, after, count in contexts:
        if ch.isalpha():
            latin = _LATIN if _is_latin(ch) else 0
            if (ch.isupper() and before & _LOWER) or any(
                c & _ALPHA and c & _LATIN != latin for c in (before, after)
            ):
                misfits += count
            elif (before | after) & _ALPHA:
                letters[ch.lower()] += count
        elif ch in _ODD or (before & after & _ALPHA and ch not in _IN_WORD):
            misfits += count
    total = sum(letters.values())
    fit = max(2 * sum(letters[ch] for ch in alphabet) - total for alphabet in _ALPHABETS) if total else 0
    return fit, misfits


# What `_score` asks of a character next to a non-ASCII one, as the bits of its class.
_ALPHA, _LATIN, _LOWER = 1, 2, 4


@functools.cache
def _neighbour_class(ch: str) -> int:
    """`ch`'s class: whether it is a letter, Latin (`_is_latin`) and lowercase."""
    return (
        (_ALPHA if ch.isalpha() else 0) | (_LATIN if _is_latin(ch) else 0) | (_LOWER if ch.islower() else 0)
    )


@functools.cache
def _single_byte_characters(name: str) -> str:
    """The 256 characters the single-byte codec `name` reads the bytes 0-255 as (U+FFFD where undefined)."""
    characters = bytes(range(256)).decode(name, errors="replace")
    # Every byte alone makes one character, and so does it before any other: every non-ASCII byte
    # followed by every byte reads as the bytes one by one (UTF-8 reads each lone byte as U+FFFD too;
    # its pairs give it away). One decode of all the pairs: checked pair by pair it took 0.3 s a process.
    pairs = bytes(b for first in range(0x80, 0x100) for second in range(0x100) for b in (first, second))
    if (
        len(characters) != 256
        or characters[:128] != _ASCII.decode()
        or any(c.isascii() for c in characters[128:])
        or pairs.decode(name, errors="replace")
        != pairs.decode("latin-1").translate(dict(enumerate(characters)))
    ):
        raise ValueError(f"{name} is not a single-byte codec that reads ASCII as ASCII")
    return characters


@functools.cache
def _byte_classes(name: str) -> npt.NDArray[np.uint8]:
    """`_neighbour_class` of each byte's character in the single-byte codec `name`, indexed by the byte."""
    import numpy as np

    return np.array([_neighbour_class(ch) for ch in _single_byte_characters(name)], dtype=np.uint8)


class _ByteContexts(NamedTuple):
    """Each non-ASCII byte of a page with its neighbours (`_byte_contexts`), as three aligned arrays."""

    before: npt.NDArray[np.uint8]
    byte: npt.NDArray[np.uint8]
    after: npt.NDArray[np.uint8]


def _neighbours(text: str, i: int) -> tuple[str, str]:
    """The characters either side of `text[i]`, a space beyond either end."""
    return (text[i - 1] if i else " "), (text[i + 1] if i + 1 < len(text) else " ")


def _is_latin(ch: str) -> bool:
    """Latin script: ASCII, Latin-1, Latin Extended-A/B and IPA (below U+02B0), Latin Extended Additional."""
    return ch < "\u02b0" or "\u1e00" <= ch <= "\u1eff"
