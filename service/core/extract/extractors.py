"""The three HTML-to-text extractors, as plain in-process functions.

Each takes decoded HTML (a `str`) and returns the extracted text and, for jusText, the language whose
stoplist was used. They run inside the isolated worker processes of `service.core.extract.pool` (and,
for benchmarks and tests, in-process through `InlineRunner`); nothing here knows about time limits.

Settings, chosen to match how the paper "Beyond a Single Extractor" and DCLM ran them:
- resiliparse in main-content mode as DCLM extracted its pool: `main_content=True, alt_texts=False`,
  every other option at resiliparse's default (block formatting preserved, list bullets on, links,
  form fields and `<noscript>` off).
- trafilatura with its defaults (which include comments and tables), tables kept explicitly.
- jusText with the stoplist of the page's language, detected offline by resiliparse's `detect_fast` on
  the page's main-content text (all its visible text when that is short; `language_sample`), a detection
  ranked past `MAX_LANGUAGE_RANK` being none; jusText's own language-independent mode (no stoplist,
  length and link density only) for a language it has no stoplist for (Chinese, Japanese, Thai, ...) and
  for an unknown one, where the English stoplist that had stood in kept nothing of a page in another
  language (0 words of a Korean page the detector ranked past the cutoff; pages mostly in a script
  written without spaces had been spared it by a check of their own). On a page of mostly Chinese and
  Japanese characters that mode's length thresholds are divided by `CJK_LENGTH_SCALE` (see there). Its
  context-sensitive stage (also trafilatura's fallback) runs in linear time (`justext_revise`).

trafilatura and jusText see only characters XML can hold (`normalize.xml_compatible`), and parse with
lxml's `huge_tree`: without it libxml2 drops a text node over 10,000,000 bytes (both gave empty text, no
error, for a page of one 10 MB paragraph; pages are accepted up to 16 MiB) and stops parsing 255
elements deep (both gave empty text for a page whose article sits 300 deep); with it the depth limit is
2,047. The structural limits (`limits`) bound the work.

Every extractor sees the page without its ruby annotations and every output is normalised
(`normalize`), in `run_extractor`.
"""

from __future__ import annotations

import functools
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from html.entities import html5
from typing import Any, Final

from service.core.extract.justext_revise import revise_paragraph_classification
from service.core.extract.normalize import (
    character_class,
    code_point_ranges,
    drop_ruby_annotations,
    normalize_text,
    xml_compatible,
)
from service.core.extract.word_count import CJK_RANGES, count_words

RESILIPARSE: Final = "resiliparse"
TRAFILATURA: Final = "trafilatura"
JUSTEXT: Final = "justext"
EXTRACTORS: Final[tuple[str, ...]] = (RESILIPARSE, TRAFILATURA, JUSTEXT)

# The text fed to the language detector is capped: detection is linear and a few thousand characters
# decide the language as well as the whole page does.
_LANGUAGE_SAMPLE_CHARS: Final = 4000
# The language is detected on the page's main content (resiliparse's, as `run_resiliparse` extracts it)
# when that holds at least this many characters, else on all its visible text. The visible text's first
# 4,000 characters are mostly navigation on a news page, and detected on them German pages came out
# Luxembourgish, Swedish or Norwegian, English ones Danish or Latin, French Latin, Spanish Galician,
# ranked 246-726: the stoplist of the wrong language kept nothing of the article (p0124, German read as
# Luxembourgish: 0 words and 0 of its 3 `with` snippets; as German, 425 words and 3). On the main text
# 23 of the corpus's 1,033 pages get another language and jusText keeps text on 15 more (yield 92.8% ->
# 94.2%, `with` snippets 81.1% -> 82.3%, `without` absent 87.7% -> 87.6%). A main text of a few hundred
# characters is too little to tell (p0538, 368 characters of an English notice: Swedish; p0854, 385 of
# German: Luxembourgish), and an empty one matches English at rank 1015.
MAIN_TEXT_MIN_CHARS: Final = 400
# `detect_fast`'s out-of-place rank (lower is closer; its own cutoff is 1200) past which a detection is
# none, and jusText runs language-independent. On the samples above two corpus pages rank past it: p0853
# (Google's security blog, empty main text, its visible text mostly a label list: Luxembourgish at 648;
# without a stoplist, as with the English one, jusText finds its 3 `with` snippets) and p0054 (an Angular
# template of `{{...}}`: French at 714; jusText keeps none of its snippets either way).
MAX_LANGUAGE_RANK: Final = 600

# ISO 639-1 codes -> jusText stoplist names: every stoplist jusText ships whose language has such a code.
# 73 are languages resiliparse's detector returns; the detector's others (e.g. ja, zh, th, which jusText
# has no stoplists for) run in jusText's language-independent mode. 13 codes the detector never returns
# can only be given (`language=`): an, bs, ht, ig, ms, nb, nn, oc, qu, sh, su, wa, yo; they were refused
# as languages jusText had no stoplist for. The stoplists left out have no ISO 639-1 code (Asturian,
# Cebuano, Low Saxon, Waray, ...; Simple_English and Belarusian_Taraskievica are variants of en and be),
# and Western_Panjabi is in the Shahmukhi script where the detector's "pa" is Gurmukhi.
# tests/core/extract/test_stoplist_languages.py checks every name here is a stoplist jusText ships and
# which are left out.
JUSTEXT_STOPLISTS: Final[dict[str, str]] = {
    "af": "Afrikaans",
    "an": "Aragonese",
    "ar": "Arabic",
    "az": "Azerbaijani",
    "be": "Belarusian",
    "bg": "Bulgarian",
    "bn": "Bengali",
    "br": "Breton",
    "bs": "Bosnian",
    "ca": "Catalan",
    "cs": "Czech",
    "cv": "Chuvash",
    "cy": "Welsh",
    "da": "Danish",
    "de": "German",
    "el": "Greek",
    "en": "English",
    "eo": "Esperanto",
    "es": "Spanish",
    "et": "Estonian",
    "eu": "Basque",
    "fa": "Persian",
    "fi": "Finnish",
    "fr": "French",
    "fy": "West_Frisian",
    "ga": "Irish",
    "gl": "Galician",
    "gu": "Gujarati",
    "he": "Hebrew",
    "hi": "Hindi",
    "hr": "Croatian",
    "ht": "Haitian",
    "hu": "Hungarian",
    "hy": "Armenian",
    "id": "Indonesian",
    "ig": "Igbo",
    "io": "Ido",
    "is": "Icelandic",
    "it": "Italian",
    "jv": "Javanese",
    "ka": "Georgian",
    "kk": "Kazakh",
    "kn": "Kannada",
    "ko": "Korean",
    "ku": "Kurdish",
    "ky": "Kyrgyz",
    "la": "Latin",
    "lb": "Luxembourgish",
    "lt": "Lithuanian",
    "lv": "Latvian",
    "mk": "Macedonian",
    "ml": "Malayalam",
    "mr": "Marathi",
    "ms": "Malay",
    "mt": "Maltese",
    "nb": "Norwegian_Bokmal",
    "ne": "Nepali",
    "nl": "Dutch",
    "nn": "Norwegian_Nynorsk",
    "no": "Norwegian_Bokmal",
    "oc": "Occitan",
    "pl": "Polish",
    "pt": "Portuguese",
    "qu": "Quechua",
    "ro": "Romanian",
    "ru": "Russian",
    "sh": "Serbo_Croatian",
    "sk": "Slovak",
    "sl": "Slovenian",
    "sq": "Albanian",
    "sr": "Serbian",
    "su": "Sundanese",
    "sv": "Swedish",
    "sw": "Swahili",
    "ta": "Tamil",
    "te": "Telugu",
    "tk": "Turkmen",
    "tl": "Tagalog",
    "tr": "Turkish",
    "uk": "Ukrainian",
    "ur": "Urdu",
    "uz": "Uzbek",
    "vi": "Vietnamese",
    "vo": "Volapuk",
    "wa": "Walloon",
    "yo": "Yoruba",
}
# One character class of every Han, Hiragana and Katakana code point (`count_words`' own ranges).
_CJK_CHAR: Final = re.compile(character_class(CJK_RANGES))
# jusText's length thresholds (under 70 characters a paragraph is short, over 200 it can be good on its
# own) are set for scripts that space their words: 70 and 200 characters are about 12 and 35 English
# words of 4.7 letters and a space. A Chinese word is 1.5-2 characters, so a Chinese or Japanese
# character holds about as much text as 3 English ones, and in the language-independent mode a
# paragraph of 60 Chinese words (about 100 characters) was never good on its own: on NHK Easy (corpus
# p0751, paragraphs of 60-140 characters once its ruby readings are dropped) and on a Chinese page
# (p1018) jusText kept nothing, on another (p0241) 89 words of the 1,400 the other extractors kept. On
# a mostly Chinese or Japanese page both are divided by 3 (23 and 67 characters): on the corpus's five
# such pages the `with` snippets jusText finds went from 4 to 15 of 15, and their 15 `without` snippets
# stay absent. (The heading distance, 200 characters, is left as it is: dividing it too changed no
# output of the five.)
CJK_LENGTH_SCALE: Final = 3


@dataclass(frozen=True)
class RawOutput:
    """What one extractor produced: its text and, for jusText, the language it assumed."""

    text: str
    language: str | None = None
    # Seconds the extraction took in the process that ran it: a worker's start-up, the wait for one and
    # the page's trip through the pipe are not the page's (`Attempt.elapsed_s`). None: not timed there (a
    # caller's own `Runner`), so the whole call is the page's.
    elapsed_s: float | None = None


def visible_text(html: str) -> str:
    """All visible text of a page (no main-content heuristics), as the language detector's input."""
    from resiliparse.extract.html2text import extract_plain_text

    return str(extract_plain_text(html, main_content=False, alt_texts=False))


def detect_language(text: str) -> str | None:
    """The ISO 639-1 code of `text`'s language, or None when the detector is not confident (no language
    ranks within `MAX_LANGUAGE_RANK`)."""
    from resiliparse.parse.lang import detect_fast

    if not text.strip():
        return None
    lang, _rank = detect_fast(text[:_LANGUAGE_SAMPLE_CHARS], cutoff=MAX_LANGUAGE_RANK)
    return None if lang == "unknown" else str(lang)


def language_sample(html: str) -> str:
    """The text a page's language is detected from: its main-content text (`run_resiliparse`'s,
    normalised) when that holds at least `MAIN_TEXT_MIN_CHARS` characters, else all its visible text."""
    main = normalize_text(run_resiliparse(html).text)
    if len(main) >= MAIN_TEXT_MIN_CHARS:
        return main
    return visible_text(html)


@functools.cache
def known_languages() -> frozenset[str]:
    """The ISO 639-1 codes a `language` option may name: those jusText has a stoplist for
    (`JUSTEXT_STOPLISTS`) and the others the detector returns, which run language-independent."""
    from resiliparse.parse.lang import supported_langs

    return frozenset(JUSTEXT_STOPLISTS) | frozenset(str(code) for code in supported_langs())


def stoplist_name(language: str | None) -> str | None:
    """The jusText stoplist for an ISO 639-1 code; None (jusText's language-independent mode) for an
    unknown language (None) and for one jusText has no stoplist for.

    An unknown language had English's: it found no stopword in a page of another language (a Korean page
    ranked past `MAX_LANGUAGE_RANK`) and jusText kept 0 words of it."""
    if language is None:
        return None
    return JUSTEXT_STOPLISTS.get(language.lower())


def mostly_cjk(text: str) -> bool:
    """Whether most words of `text`'s first characters (as `count_words` counts them) are Chinese or
    Japanese characters."""
    sample = text[:_LANGUAGE_SAMPLE_CHARS]
    _, cjk = _CJK_CHAR.subn("", sample)  # a count in C, no Python loop over characters
    return cjk * 2 > count_words(sample)


def _kept_alone(code_point: int) -> bool:
    """Whether resiliparse skips a lone character between tags that is no icon: one of three UTF-8
    bytes, neither private use nor white space (see `_LONE_CHARACTER`)."""
    return (
        0x800 <= code_point < 0x10000 and not 0xD800 <= code_point <= 0xF8FF and not chr(code_point).isspace()
    )


# resiliparse's main-content mode skips a text node holding one character of the BMP's private use area
# (an icon font), and an element whose only child is one. Its test reads the character's three UTF-8
# bytes as a little-endian integer and compares that with the big-endian range, so it skips nearly
# every lone character of three UTF-8 bytes: 親 in `<span>親</span>`, を in `</a>を<a>` (a Japanese
# page lost a character at every such place, NHK Easy's at every dictionary link). Such a character is
# followed by a word joiner, which makes the node two characters long and which `normalize` removes
# from the output; a private-use character (or a space) stays alone, so icons are still skipped.
# The test runs on the parsed text, so a lone character written as a character reference was skipped as
# well: the quotes of `<em>&bdquo;</em>Titel<em>&ldquo;</em>`, the sign of `<span>&euro;</span>`, an
# `&ndash;`, `&#x89aa;` or `&#150;` (windows-1252's en dash to an HTML parser), and every such character
# of a page that writes all its non-ASCII characters as references. A reference is read as HTML's
# tokenizer reads one in text, numeric (decimal or hexadecimal, the ";" optional; groups 1 and 2) or
# named with its ";" (group 3; the names valid without one are Latin-1 characters, two UTF-8 bytes,
# never skipped), decoded (`_referenced_character`), and followed by the joiner when its character
# would be. It is decoded once: `&amp;euro;` is the text "&euro;", no euro sign.
# The quantifiers are possessive: backtracking over the white space after each tag cost 0.28 ms a corpus
# page, 0.11 ms without. Both forms are one pattern, one scan (on a loaded machine: the characters alone
# 0.15 ms a corpus page, both 0.21, a second pattern for the references 0.34); 16 MiB of
# `<b>&euro;</b>` take 1.7 s, as 16 MiB of `<b>€</b>` took 2.3 s.
_WHITE_SPACE: Final = "[ \t\n\f\r]*+"
_LONE_CHARACTER: Final = re.compile(
    f">{_WHITE_SPACE}(?:"
    + character_class(code_point_ranges(c for c in range(0x800, 0x10000) if _kept_alone(c)))
    + f"|&(?:#(?:[xX]([0-9a-fA-F]++)|([0-9]++));?|([A-Za-z][A-Za-z0-9]*+;)))(?={_WHITE_SPACE}<)"
)
_WORD_JOINER: Final = "\u2060"
# A numeric reference past U+10FFFF is U+FFFD: one of more significant digits than this is past it (and
# `int` refuses a string of over 4,300 digits).
_MAX_REFERENCE_DIGITS: Final = 8


def _referenced_character(match: re.Match[str]) -> str:
    """The text a `_LONE_CHARACTER` match's reference stands for, as HTML's tokenizer decodes it in text
    (numeric: 0, surrogates and past U+10FFFF are U+FFFD, 0x80-0x9F windows-1252); "" for no name."""
    hexadecimal, decimal, name = match.group(1, 2, 3)
    if name is not None:
        return html5.get(name, "")
    digits = (hexadecimal if decimal is None else decimal).lstrip("0")
    if len(digits) > _MAX_REFERENCE_DIGITS:
        return "\ufffd"
    code_point = int(digits or "0", 10 if hexadecimal is None else 16)
    if code_point == 0 or code_point > 0x10FFFF or 0xD800 <= code_point <= 0xDFFF:
        return "\ufffd"
    if 0x80 <= code_point <= 0x9F:
        try:
            return bytes((code_point,)).decode("cp1252")
        except UnicodeDecodeError:  # the five bytes windows-1252 leaves undefined stay C1 controls
            return chr(code_point)
    return chr(code_point)


def _join_lone_character(match: re.Match[str]) -> str:
    """A `_LONE_CHARACTER` match with the word joiner after it where resiliparse would skip it."""
    if match.lastindex is not None:  # a reference
        character = _referenced_character(match)
        if len(character) != 1 or not _kept_alone(ord(character)):
            return match.group()
    return match.group() + _WORD_JOINER


def keep_lone_characters(html: str) -> str:
    """`html` with a word joiner after every lone character between tags that resiliparse's main-content
    mode would skip, raw or written as a character reference (`_LONE_CHARACTER`)."""
    if html.isascii() and "&" not in html:
        return html
    return _LONE_CHARACTER.sub(_join_lone_character, html)


def run_resiliparse(html: str, language: str | None = None) -> RawOutput:
    """resiliparse main-content extraction with DCLM's options (lone characters kept, see above)."""
    from resiliparse.extract.html2text import extract_plain_text

    html = keep_lone_characters(html)
    return RawOutput(str(extract_plain_text(html, main_content=True, alt_texts=False)).strip())


def run_trafilatura(html: str, language: str | None = None) -> RawOutput:
    """trafilatura with its defaults, tables kept."""
    import trafilatura
    import trafilatura.external
    import trafilatura.utils

    if not html.strip():
        return RawOutput("")
    html = xml_compatible(html)  # one `&#11;` made it return nothing
    # trafilatura falls back on jusText's classification when its own text is short, and calls jusText's
    # quadratic context stage by the name it imported (10,000 `<ul><li>x</li></ul>`, 190 KB, took 7.3
    # s). The linear one gives the same classes; the name is rebound in the process running trafilatura
    # (a worker), on its first page. Its parser is rebound the same way, for `huge_tree`.
    trafilatura.external.revise_paragraph_classification = revise_paragraph_classification  # type: ignore[attr-defined]
    trafilatura.utils.HTML_PARSER = _trafilatura_parser()
    text = trafilatura.extract(html, include_tables=True)
    return RawOutput((text or "").strip())


def run_justext(html: str, language: str | None = None) -> RawOutput:
    """jusText with the stoplist of `language`, detected from `language_sample` when not given.

    The language reported is the given or detected one (whose stoplist was used, where jusText has one),
    and None where none is known: an empty page, or one the detector could not place, which runs
    language-independent as a language without a stoplist does (it had English's, and was reported as
    "en": a page of no text, and 0 words of a Korean page ranked past the cutoff).
    """
    import justext
    from lxml.etree import ParserError

    if not html.strip():
        return RawOutput("", language)
    html = xml_compatible(html)  # binary input raised "All strings must be XML compatible"
    if language is None:
        language = detect_language(language_sample(html))
    name = stoplist_name(language)
    try:
        if name is None:
            # jusText's documented language-independent mode (its command line's `-s None`): an empty
            # stoplist with both stopword thresholds at 0 classifies by length and link density alone.
            # Another language's stoplist finds no stopwords in the page and marks every paragraph
            # boilerplate.
            paragraphs = _justext(html, frozenset(), stopwords_low=0, stopwords_high=0, cjk_lengths=True)
        else:
            paragraphs = _justext(html, justext.get_stoplist(name))
    except ParserError as exc:
        # lxml refuses a document with no element at all: "", a lone comment, an XML declaration.
        # Such a page simply has no text, as the other two extractors say.
        if "Document is empty" not in str(exc):
            raise
        return RawOutput("", language)
    text = "\n".join(p.text for p in paragraphs if not p.is_boilerplate)
    return RawOutput(text.strip(), language)


@functools.cache
def _trafilatura_parser() -> Any:
    """trafilatura's own parser (`trafilatura.utils.HTML_PARSER`, these options) with `huge_tree`."""
    from lxml.html import HTMLParser

    return HTMLParser(
        collect_ids=False,
        default_doctype=False,
        encoding="utf-8",
        remove_comments=True,
        remove_pis=True,
        huge_tree=True,
    )


def _justext_dom(html: str) -> Any:
    """jusText's `core.html_to_dom` for decoded text, with `huge_tree`."""
    import lxml.html

    try:
        return lxml.html.fromstring(html, parser=lxml.html.HTMLParser(huge_tree=True))
    except ValueError:
        # lxml refuses a str whose XML declaration names an encoding: html_to_dom parses the text's
        # UTF-8 bytes then, and the parser is told they are UTF-8 (the declaration may name another).
        data = html.encode("utf-8", "replace")
        return lxml.html.fromstring(data, parser=lxml.html.HTMLParser(huge_tree=True, encoding="utf-8"))


def _justext(
    html: str, stoplist: frozenset[str], *, cjk_lengths: bool = False, **thresholds: float
) -> list[Any]:
    """`justext.justext(html, stoplist, **thresholds)`, with its context-sensitive stage in linear time.

    The same steps with jusText's defaults (parse, clean, split into paragraphs, classify each), then
    `justext_revise.revise_paragraph_classification` for jusText's own, which is quadratic in a run
    of short paragraphs (20,000 `<p>x` took 31 s) and gives the same classes. The page is parsed with
    `huge_tree` (`_justext_dom`). With `cjk_lengths`, a page whose paragraphs are mostly Chinese or
    Japanese characters has the length thresholds divided by `CJK_LENGTH_SCALE`.
    """
    from justext import core

    dom = core.preprocessor(_justext_dom(html))
    paragraphs: list[Any] = core.ParagraphMaker.make_paragraphs(dom)
    if cjk_lengths and mostly_cjk(_paragraph_sample(paragraphs)):
        thresholds.setdefault("length_low", core.LENGTH_LOW_DEFAULT)
        thresholds.setdefault("length_high", core.LENGTH_HIGH_DEFAULT)
        for key in ("length_low", "length_high"):
            thresholds[key] = round(thresholds[key] / CJK_LENGTH_SCALE)
    core.classify_paragraphs(paragraphs, stoplist, **thresholds)
    revise_paragraph_classification(paragraphs, core.MAX_HEADING_DISTANCE_DEFAULT)
    return paragraphs


def _paragraph_sample(paragraphs: list[Any]) -> str:
    """The text of the first paragraphs, up to the language sample's length."""
    texts: list[str] = []
    length = 0
    for paragraph in paragraphs:
        if length >= _LANGUAGE_SAMPLE_CHARS:
            break
        texts.append(paragraph.text)
        length += len(texts[-1]) + 1
    return "\n".join(texts)


EXTRACTOR_FUNCTIONS: Final[dict[str, Callable[[str, str | None], RawOutput]]] = {
    RESILIPARSE: run_resiliparse,
    TRAFILATURA: run_trafilatura,
    JUSTEXT: run_justext,
}


def run_extractor(name: str, html: str, language: str | None = None) -> RawOutput:
    """Run the extractor called `name` in this process (the worker's entry and `InlineRunner`'s).

    The one place every extractor's input and output pass: the page goes in without its ruby
    annotations, the text comes out normalised (`normalize`), so the three texts of a page differ only
    in what each extractor kept. Both run here, in the worker, under the extractor's time limit.
    """
    started = time.perf_counter()
    out = EXTRACTOR_FUNCTIONS[name](drop_ruby_annotations(html), language)
    text = normalize_text(out.text)
    return RawOutput(text, out.language, time.perf_counter() - started)
