"""`count_words` gives the counts of a split-based reference (the count it replaced, where a word now needs
a letter or digit, and Thai, Lao, Khmer and Myanmar letters count by their average word length), in
memory that does not grow with the number of words; `text_counts` also counts the unreadable characters."""

from __future__ import annotations

import math
import random
import re
import unicodedata
from fractions import Fraction

import pytest

from service.core.extract import unreadable_chars, word_count
from service.core.extract.normalize import ASSIGNED_BOUND, KEPT_FORMAT, PLANE_14
from service.core.extract.word_count import (
    CJK_PUNCTUATION_RANGES,
    SPACE_BOUND,
    UNSPACED_SCRIPTS,
    UnspacedScript,
    count_words,
    text_counts,
)
from tests.memory import traced_peak

# The implementation it replaced (its character classes verbatim), with the rule that a word holds a
# letter or digit: the reference for every count.
_OLD_UNSPACED_CHAR = re.compile(
    "[\u3040-\u30ff\u31f0-\u31ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uff66-\uff9f\U00020000-\U0003134f]"
)
_OLD_UNSPACED_PUNCTUATION = re.compile("[\u3000-\u303f\uff01-\uff0f\uff1a-\uff20\uff3b-\uff40\uff5b-\uff65]")
# Thai, Lao, Khmer and Myanmar blocks, and the letters (and digits) per word the module documents.
_SCRIPT_BLOCKS = [
    (re.compile("[\u0e00-\u0e7f]"), Fraction("3.0")),
    (re.compile("[\u0e80-\u0eff]"), Fraction("3.8")),
    (re.compile("[\u1780-\u17ff]"), Fraction("2.9")),
    (re.compile("[\u1000-\u109f\ua9e0-\ua9ff\uaa60-\uaa7f]"), Fraction("1.8")),
]


def _alnum(char: str) -> bool:
    return unicodedata.category(char)[0] in "LN"


def _words(text: str) -> int:
    return sum(1 for word in text.split() if any(_alnum(c) for c in word))


def split_count(text: str) -> int:
    # A Chinese or Japanese letter is a word; a Thai, Lao, Khmer or Myanmar letter a fraction of one;
    # the other characters of those blocks separate.
    unspaced = sum(1 for c in _OLD_UNSPACED_CHAR.findall(text) if _alnum(c))
    for block, letters_per_word in _SCRIPT_BLOCKS:
        letters = sum(1 for c in block.findall(text) if _alnum(c))
        unspaced += math.ceil(letters / letters_per_word)
    if not unspaced:
        return _words(text)
    spaced = _OLD_UNSPACED_PUNCTUATION.sub(" ", _OLD_UNSPACED_CHAR.sub(" ", text))
    for block, _ in _SCRIPT_BLOCKS:
        spaced = block.sub(" ", spaced)
    return unspaced + _words(spaced)


SPACES = [chr(c) for c in range(SPACE_BOUND) if chr(c).isspace()]
# Each range's ends and their neighbours, so an off-by-one in a table shows.
RANGES = [r for script in UNSPACED_SCRIPTS for r in script.ranges] + list(CJK_PUNCTUATION_RANGES)
EDGES = [chr(c) for low, high in RANGES for c in (low - 1, low, high, high + 1)]
ALPHABET = [
    *"abcXYZ019.,-_'",
    *SPACES,
    *EDGES,
    *"中文字東京は年にカタカナｶﾀ한국어éßŋ",
    *"、。「」，！？・〜",
    "\U00020000",
    "\U0002a6df",
    "\U0003134f",
    "\U00031350",
    "\U0001f600",  # an emoji: a word character above the BMP
    "\U0010ffff",
    "\ud800",  # lone surrogates: count_words takes any str
    "\udcff",
    "\x00",
    "\uffff",
    # No letter, so no word alone: format characters (the joiners too), marks, signs, symbols.
    *"\u200b\xad\u2060\ufeff\u200e\u200c\u200d\u0301|•…$",
    "\U000e0041",
    "\u30fb",  # ・, in the Katakana block but no letter: it separates
    "\u3005",  # 々, a letter among the punctuation: it separates, as before
    "\U0001d7d8",  # a digit above the BMP
    # Thai, Lao, Khmer, Myanmar: letters, digits, vowel signs and tone marks (no letters), punctuation.
    *"กขไทย๑\u0e31\u0e48ฯๆ๚ລາວ\u0eb4ໆខ្មែរ\u17d2\u17c1។ៗမြန်\u103a\u1037၊။၁",
]


def test_the_space_bound_covers_every_whitespace_character() -> None:
    assert all(not chr(c).isspace() for c in range(SPACE_BOUND, 0x110000))


@pytest.mark.parametrize("chunk", [1, 2, 3, 7, 64, 1 << 18])
def test_counts_match_the_split_count_on_generated_texts(chunk: int, monkeypatch: pytest.MonkeyPatch) -> None:
    # Small chunks put a chunk boundary inside every kind of run.
    monkeypatch.setattr(word_count, "_CHUNK", chunk)
    rng = random.Random(chunk)
    for _ in range(1500):
        pool = rng.sample(ALPHABET, rng.randint(1, 8))
        text = "".join(rng.choices(pool, k=rng.randint(0, 60)))
        assert count_words(text) == split_count(text), repr(text)


@pytest.mark.parametrize(
    "text",
    [
        "",
        " ",
        "\u3000\u3000",
        " \t\n\x1c\x1d\x1e\x1f\x85\xa0\u2028",
        "hello、world",  # no unspaced character: the punctuation is part of a word
        "中hello、world",  # one: it separates
        "the harbour town",
        "東京は2020年に",
        "「東京」、 x。",
        "서울은 대한민국의 수도",
        "\U00020000\U00020001 a",
        "a" * 1000,
        "中" * 1000,
        "中a " * 1000,
    ],
)
def test_counts_match_the_split_count_on_edge_cases(text: str, monkeypatch: pytest.MonkeyPatch) -> None:
    assert count_words(text) == split_count(text)
    monkeypatch.setattr(word_count, "_CHUNK", 3)
    assert count_words(text) == split_count(text)


def test_a_long_chinese_text_is_counted_without_an_object_per_character() -> None:
    # The split-based count held a string per character: 474 MB traced for 5.6 million. 2 million here
    # took it about 170 MB; the chunks take a few.
    text = "中" * 2_000_000
    words, peak = traced_peak(lambda: count_words(text))
    assert words == 2_000_000
    assert peak < 16 * 1024 * 1024


def test_a_long_text_of_short_words_is_counted_without_an_object_per_word() -> None:
    text = "a b " * 1_000_000  # str.split's list alone: 16 MB of pointers
    words, peak = traced_peak(lambda: count_words(text))
    assert words == 2_000_000
    assert peak < 8 * 1024 * 1024


@pytest.mark.parametrize(
    "junk", ["\u200b", "\xad", "\u2060", "\ufeff", "\u200e", ".", "|", "-", "\u2022", "\U0001f600"]
)
def test_a_run_without_a_letter_or_digit_is_no_word(junk: str) -> None:
    """80 zero-width spaces (or full stops, bars, soft hyphens) between spaces passed the 50-word filter."""
    assert count_words(f"{junk} " * 80) == 0
    assert count_words(f"a{junk}b {junk}1 {junk}") == 2


def test_unreadable_characters_are_replacement_controls_and_invisible_format_characters() -> None:
    text = "a\ufffd\x00\t \u200b\xad\U000e0041 \u200c\u200d\u0600 é\x81\x9f"
    # U+FFFD, NUL, ZWSP, the soft hyphen, a tag and two C1 controls; not the tab, the joiners or the
    # Arabic number sign.
    assert text_counts(text)[:3] == (2, 7, 0)
    assert unreadable_chars(text) == 7
    assert unreadable_chars("\x7f\xa0\x80") == 1  # DEL and NBSP are no C1 controls
    assert all(unicodedata.category(chr(c)) == "Cf" for c in KEPT_FORMAT)


def test_the_table_covers_every_assigned_code_point() -> None:
    """Between the planes the table reads (up to ASSIGNED_BOUND, and plane 14) nothing is assigned that
    could be a letter, a space or a format character."""
    outside = (*range(ASSIGNED_BOUND, PLANE_14.start), *range(PLANE_14.stop, 0x110000))
    assert {unicodedata.category(chr(c)) for c in outside} <= {"Cn", "Co"}


# Common words of each script (particles, nouns, verbs), as a page would use them: no spaces between
# words, a space between phrases of 8 words.
SCRIPT_WORDS = {
    "Thai": "ที่ และ ใน เป็น ของ ได้ มี ไม่ ว่า การ จะ ประเทศ รัฐบาล ประชาชน วันนี้ ทำงาน",
    "Lao": "ແລະ ທີ່ ໃນ ເປັນ ຂອງ ໄດ້ ມີ ບໍ່ ວ່າ ການ ຈະ ປະເທດ ລັດຖະບານ ປະຊາຊົນ ມື້ນີ້",
    "Khmer": "និង ជា នៅ ក្នុង មាន ការ បាន ដែល ប្រទេស កម្ពុជា រដ្ឋាភិបាល ប្រជាជន ថ្ងៃ ឆ្នាំ ធ្វើ",
    "Myanmar": "သည် နှင့် ကို မှာ တွင် ရှိ မြန်မာ နိုင်ငံ အစိုးရ ပြည်သူ ယနေ့ အလုပ် လုပ် သော",
}


def unspaced_text(script: str, words: int, seed: int = 0) -> str:
    rng = random.Random(seed)
    chosen = rng.choices(SCRIPT_WORDS[script].split(), k=words)
    return " ".join("".join(chosen[i : i + 8]) for i in range(0, words, 8))


@pytest.mark.parametrize("script", list(SCRIPT_WORDS))
def test_thai_lao_khmer_and_myanmar_words_are_counted_near_their_number(script: str) -> None:
    """Split on whitespace, 200 words in phrases of 8 were 25 "words" and failed the 50-word filter."""
    text = unspaced_text(script, 200)
    assert len(text.split()) == 25
    counts = text_counts(text)
    assert counts.words == counts.unspaced == split_count(text)
    assert 0.6 * 200 <= counts.words <= 1.6 * 200, counts


@pytest.mark.parametrize("script", UNSPACED_SCRIPTS[1:], ids=lambda s: s.name)
def test_an_unspaced_script_counts_its_letters_over_its_average_word_length(script: UnspacedScript) -> None:
    low = script.ranges[0][0]
    letter = next(chr(c) for c in range(low, low + 0x80) if unicodedata.category(chr(c)) == "Lo")
    per_word = script.letters_per_10_words
    assert count_words(letter) == 1  # one letter is a word, rounded up
    assert count_words(letter * per_word) == 10
    assert count_words(letter * (per_word + 1)) == 11
    # English words among them are words as before; the script's letters separate them.
    assert count_words(f"{letter * per_word}word, 2024 {letter}x") == 10 + 2 + 1 + 1


def test_marks_and_punctuation_of_the_unspaced_scripts_are_no_words() -> None:
    # Thai tone marks and vowel signs, Khmer coeng and sign, Myanmar asat and dot below, their
    # sentence and section marks: no letter, so no word alone, whitespace or not.
    for junk in ("\u0e48", "\u0e31", "\u0e5a", "\u17d2", "\u17d4", "\u103a", "\u1037", "\u104b"):
        assert count_words(f"{junk} " * 80) == 0
        assert count_words(junk * 80) == 0


def test_the_unspaced_scripts_fit_the_table() -> None:
    """Each script's index is kept in the flags' top three bits, and no two scripts share a block."""
    assert len(UNSPACED_SCRIPTS) <= 8
    code_points = [
        c for script in UNSPACED_SCRIPTS for low, high in script.ranges for c in range(low, high + 1)
    ]
    assert len(code_points) == len(set(code_points))
    assert all(script.letters_per_10_words >= 10 for script in UNSPACED_SCRIPTS)
