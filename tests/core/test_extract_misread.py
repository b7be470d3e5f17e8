"""Pages read with the wrong codec fail the filter: C1 control characters count as unreadable, and UTF-8
read one byte a character ("StraÃŸe") or another script read as Latin-1 ("Ïðèâåò") is caught by its
shape (`mojibake`), where text in any real language, accents and all, passes."""

from __future__ import annotations

import random
import re

import pytest

from service.core.extract import (
    EXTRACTORS,
    MISREAD_MIN_CHARS,
    InlineRunner,
    extract,
    extract_all,
    misread_codec,
    unreadable_chars,
)
from service.core.extract.mojibake import chunk_counts
from service.core.extract.word_count import _CHUNK, _code_points, text_counts
from tests.core.test_extract import CHINESE, GERMAN, JAPANESE, RUSSIAN, SENTENCES

INLINE = InlineRunner()

# Sentences of languages with many accented Latin-1 letters, or none: real text passes.
REAL = {
    "en": " ".join(SENTENCES),
    "de": " ".join(GERMAN) + " Äpfel, Öl und Übermut; die Straße heißt „Süß“.",
    "fr": "L’été à Noël, où l’on mange du pâté près de la forêt « très » célèbre, n’était plus qu’un rêve.",
    "pt": "A informação sobre as condições de produção não está disponível até à próxima reunião.",
    "es": "¿Dónde está el niño? ¡Qué año! El señor Muñoz llegó a la estación después de la reunión.",
    "is": "Þýðingar á íslensku eru mikilvægar fyrir þjóðina og þær þýða að bækurnar ná til fleiri lesenda.",
    "et": "Jäääär on koht, kus jää lõpeb; öösel on õues külm ja üksik öökull hõikab metsas.",
    "vi": "Tiếng Việt là ngôn ngữ của người Việt và là ngôn ngữ chính thức tại Việt Nam hiện nay.",
    "ru": " ".join(RUSSIAN),
    "zh": "".join(CHINESE),
    "ja": "".join(JAPANESE),
}


def _page(text: str, charset: str) -> str:
    paragraphs = "".join(f"<p>{text} ({i})</p>" for i in range(6))
    head = f'<head><meta charset="{charset}"><title>t</title></head>'
    return f"<html>{head}<body><article>{paragraphs}</article></body></html>"


@pytest.mark.parametrize("language", list(REAL))
def test_real_text_in_any_language_passes(language: str) -> None:
    html = _page(REAL[language], "utf-8")
    assert extract(html.encode("utf-8"), runner=INLINE, min_words=0).passed
    for name, result in extract_all(html.encode("utf-8"), runner=INLINE, min_words=0).items():
        assert not isinstance(result, Exception), (name, result)
        assert result.passed or result.words == 0, (language, name, result.attempts[0].reason)
    assert misread_codec(text_counts(REAL[language] * 20)) is None


GREEK = "Η πόλη δίπλα στο ποτάμι ξαναχτίστηκε μετά την πλημμύρα. " * 4
MISREAD = [
    # (what, the page's bytes): every one passed the filter, on words, with no U+FFFD.
    ("UTF-8 Russian declared windows-1252", _page(" ".join(RUSSIAN), "windows-1252").encode("utf-8")),
    ("UTF-8 German declared iso-8859-1", _page(" ".join(GERMAN), "iso-8859-1").encode("utf-8")),
    ("UTF-8 French declared windows-1252", _page(REAL["fr"] * 3, "windows-1252").encode("utf-8")),
    ("windows-1251 Russian declared iso-8859-1", _page(" ".join(RUSSIAN), "iso-8859-1").encode("cp1251")),
    ("windows-1253 Greek declared windows-1252", _page(GREEK, "windows-1252").encode("cp1253")),
]  # fmt: skip


@pytest.mark.parametrize(("what", "data"), MISREAD, ids=[what for what, _ in MISREAD])
def test_a_page_read_with_the_wrong_single_byte_codec_fails_the_filter(what: str, data: bytes) -> None:
    union = extract(data, runner=INLINE)
    assert union.words >= 50 and "\ufffd" not in union.text  # text, words, nothing undecodable
    assert not union.passed
    assert union.attempts[0].words >= 50  # resiliparse's text, and any other that has words, says why
    for attempt in union.attempts:
        if attempt.words:
            assert attempt.reason is not None and "read with the wrong encoding" in attempt.reason, attempt


def test_the_utf8_check_names_the_share_and_the_latin_check_the_runs() -> None:
    utf8 = extract(MISREAD[1][1], "resiliparse", runner=INLINE).attempts[0].reason
    assert utf8 is not None and "non-ASCII characters are UTF-8 read one byte a character" in utf8
    runs = extract(MISREAD[3][1], "resiliparse", runner=INLINE).attempts[0].reason
    assert runs is not None and "runs of Latin-1 letters" in runs


def test_a_few_utf8_lookalikes_in_real_text_pass() -> None:
    """ "CAFÉ”" and French "é »" read as UTF-8 sequences; the corpus has such text (p0741: 4 of 11
    non-ASCII characters), never most of a page's non-ASCII characters nor 20 such characters."""
    text = " ".join(SENTENCES) + " The sign read “CAFÉ”, and the menu « thé glacé »."
    counts = text_counts(text)
    assert counts.utf8_misread == 2 and counts.utf8_misread < MISREAD_MIN_CHARS
    assert misread_codec(counts) is None
    assert extract(_page(text, "utf-8"), "resiliparse", runner=INLINE).passed


def test_emphasis_runs_of_latin_letters_pass() -> None:
    text = " ".join(GERMAN) + " Ööööööööö! Ääää, sagte er. " + " ".join(GERMAN)
    counts = text_counts(text)
    assert counts.latin_runs == 13 and misread_codec(counts) is None


@pytest.mark.parametrize("control", ["\x81", "\x85", "\x8d", "\x9f"])
def test_c1_control_characters_are_unreadable(control: str) -> None:
    """What a codec that leaves bytes undefined makes of them (a Shift_JIS page read as windows-1254: 9%
    of its text); they passed the filter uncounted."""
    text = " ".join(f"word{control}" for _ in range(200))
    assert unreadable_chars(text) == 200
    html = f"<html><body><article><p>{text}</p></article></body></html>"
    result = extract(html, "resiliparse", runner=INLINE)
    assert result.words == 200 and not result.passed
    assert result.attempts[0].reason is not None and "control" in result.attempts[0].reason


# The counts, against regular expressions over the whole text (a sequence or run split across two chunks
# is not counted: the generated texts are shorter than a chunk).
_CONT = "[\u0080-\u00bf" + re.escape(bytes(range(0x80, 0xA0)).decode("cp1252", errors="ignore")) + "]"
_SEQUENCE = re.compile(f"[\u00c2-\u00df]{_CONT}|[\u00e0-\u00ef]{_CONT}{{2}}|[\u00f0-\u00f4]{_CONT}{{3}}")
_RUN = re.compile("[\u00c0-\u00ff]{3,}")
_ALPHABET = "ab é\u00c2\u00c3\u00e2\u00f0\u00ff\u00a0\u00bf\u0080\u009f€™Ÿ東Ж\U00020000ÀÏ".replace(" ", "  ")


@pytest.mark.parametrize("seed", range(40))
def test_chunk_counts_match_regular_expressions(seed: int) -> None:
    rng = random.Random(seed)
    text = "".join(rng.choice(_ALPHABET) for _ in range(rng.randrange(0, 400)))
    counts = chunk_counts(_code_points(text)) if not text.isascii() else None
    utf8 = sum(len(m) for m in _SEQUENCE.findall(text))
    runs = sum(len(m) for m in _RUN.findall(text))
    non_ascii = sum(ord(c) >= 0x80 for c in text)
    assert counts is None or tuple(counts) == (non_ascii, utf8, runs), text
    whole = text_counts(text)
    assert (whole.non_ascii, whole.utf8_misread, whole.latin_runs) == (non_ascii, utf8, runs)


def test_counts_add_up_over_chunks() -> None:
    """Read in chunks, a long text gives the sum of its chunks' counts."""
    unit = "StraÃŸe Ïðèâåò plain € text\u0085 "
    text = unit * (_CHUNK // len(unit) * 3)
    counts = text_counts(text)
    per_unit = text_counts(unit)
    repeats = len(text) // len(unit)
    assert counts.non_ascii == per_unit.non_ascii * repeats
    assert counts.unreadable == repeats
    # Up to one sequence or run per chunk boundary may be split and not counted.
    assert per_unit.utf8_misread * repeats - 4 * 3 <= counts.utf8_misread <= per_unit.utf8_misread * repeats
    assert per_unit.latin_runs * repeats - 6 * 3 <= counts.latin_runs <= per_unit.latin_runs * repeats


def test_every_extractor_reports_the_misread_page() -> None:
    data = MISREAD[0][1]
    for name in EXTRACTORS:
        result = extract(data, name, runner=INLINE, min_words=0)
        assert not result.passed, name
