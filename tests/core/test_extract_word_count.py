"""`count_words` gives the counts of the split-based count it replaced, in memory that does not grow with
the number of words."""

from __future__ import annotations

import random
import re

import pytest

from service.core.extract import word_count
from service.core.extract.word_count import PUNCTUATION_RANGES, SPACE_BOUND, UNSPACED_RANGES, count_words
from tests.memory import traced_peak

# The implementation it replaced, verbatim: the reference for every count.
_OLD_UNSPACED_CHAR = re.compile(
    "[\u3040-\u30ff\u31f0-\u31ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uff66-\uff9f\U00020000-\U0003134f]"
)
_OLD_UNSPACED_PUNCTUATION = re.compile("[\u3000-\u303f\uff01-\uff0f\uff1a-\uff20\uff3b-\uff40\uff5b-\uff65]")


def split_count(text: str) -> int:
    if text.isascii():
        return len(text.split())
    unspaced = len(_OLD_UNSPACED_CHAR.findall(text))
    if not unspaced:
        return len(text.split())
    spaced = _OLD_UNSPACED_PUNCTUATION.sub(" ", _OLD_UNSPACED_CHAR.sub(" ", text))
    return unspaced + len(spaced.split())


SPACES = [chr(c) for c in range(SPACE_BOUND) if chr(c).isspace()]
# Each range's ends and their neighbours, so an off-by-one in a table shows.
EDGES = [chr(c) for low, high in UNSPACED_RANGES + PUNCTUATION_RANGES for c in (low - 1, low, high, high + 1)]
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
