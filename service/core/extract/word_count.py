"""Word counts of extracted text, in bounded memory and linear time whatever the text.

A word is a run of characters between whitespace (what `str.split()` splits on), except that in a
text with any Han, Hiragana or Katakana character each such character is a word of its own and their
punctuation (、。「」, full-width ，！？) separates words like a space: Chinese and Japanese put no
spaces between words, and split on whitespace alone a 2,000-character Chinese article had 40 "words"
and the union's 50-word filter refused every such page.

The count runs in the server process on every extractor's output, which can be as long as the page.
Counted with `str.split()` and `re.findall` it built one Python string per word or per character: a
16 MiB page of Chinese took 1.96 s and 471 MB per output. Here the text is read in chunks of
`_CHUNK` characters as arrays of code points, each character classed through one lookup table, and
words are counted as the starts of runs: a few MiB and tens of milliseconds for 16 MiB, with the
same counts as the split (tests/core/test_extract_word_count.py checks that against it).
"""

from __future__ import annotations

import functools
from typing import Final

import numpy as np
import numpy.typing as npt

# Han ideographs (with extensions and compatibility forms), Hiragana and Katakana (with the half-width
# forms): each one character one word, as word processors count them.
UNSPACED_RANGES: Final = (
    (0x3040, 0x30FF),
    (0x31F0, 0x31FF),
    (0x3400, 0x4DBF),
    (0x4E00, 0x9FFF),
    (0xF900, 0xFAFF),
    (0xFF66, 0xFF9F),
    (0x20000, 0x3134F),
)
# Their punctuation: it stands between words like a space, and is no word.
PUNCTUATION_RANGES: Final = (
    (0x3000, 0x303F),
    (0xFF01, 0xFF0F),
    (0xFF1A, 0xFF20),
    (0xFF3B, 0xFF40),
    (0xFF5B, 0xFF65),
)
# Every character `str.isspace()` accepts is below this (the last is U+3000, IDEOGRAPHIC SPACE); a
# test checks it against the whole Unicode range of the running Python.
SPACE_BOUND: Final = 0x3001

_CHUNK = 1 << 18  # characters per step: about 2 MiB of arrays
_BMP = 0x10000
# Character classes in the lookup table.
_WORD, _SPACE, _UNSPACED, _PUNCTUATION = 0, 1, 2, 3


@functools.cache
def _classes() -> npt.NDArray[np.uint8]:
    """The class of every code point of the Basic Multilingual Plane (64 KiB, built on first use)."""
    table = np.full(_BMP, _WORD, dtype=np.uint8)
    for ranges, kind in ((UNSPACED_RANGES, _UNSPACED), (PUNCTUATION_RANGES, _PUNCTUATION)):
        for low, high in ranges:
            if low < _BMP:
                table[low : min(high, _BMP - 1) + 1] = kind
    # Last: U+3000 is punctuation above but whitespace to str.split, and separates in both readings.
    table[[c for c in range(SPACE_BOUND) if chr(c).isspace()]] = _SPACE
    return table


def _code_points(chunk: str) -> npt.NDArray[np.uint8] | npt.NDArray[np.uint32]:
    if chunk.isascii():
        return np.frombuffer(chunk.encode("ascii"), dtype=np.uint8)
    # surrogatepass: a lone surrogate is a character like any other here (a word character).
    return np.frombuffer(chunk.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)


def _runs(mask: npt.NDArray[np.bool_], after_run: bool) -> int:
    """The runs of True in `mask`, less one when its first continues the run the last chunk ended in."""
    starts = int(np.count_nonzero(mask[1:] & ~mask[:-1]))
    return starts + int(bool(mask[0]) and not after_run)


def count_words(text: str) -> int:
    """Whitespace-separated words, the yield measure of "Beyond a Single Extractor", with every Chinese
    or Japanese character counted as a word of its own (see the module docstring)."""
    table = _classes()
    spaced_words = 0  # runs of non-space: the count when the text has no unspaced character
    unspaced = 0
    cjk_words = 0  # runs of word characters between spaces, unspaced characters and punctuation
    in_spaced = in_cjk = False  # whether the previous chunk ended inside such a run
    for start in range(0, len(text), _CHUNK):
        points = _code_points(text[start : start + _CHUNK])
        if points.dtype == np.uint8:
            kind = table[points]
        else:
            # Above the BMP, clipped to U+FFFF (a non-character: a word character, as is every code
            # point up there but the unspaced ranges, classed here).
            kind = table[np.minimum(points, _BMP - 1)]
            if points.max() >= _BMP:
                for low, high in UNSPACED_RANGES:
                    if high >= _BMP:
                        kind[(points >= max(low, _BMP)) & (points <= high)] = _UNSPACED
        not_space = kind != _SPACE
        spaced_words += _runs(not_space, in_spaced)
        in_spaced = bool(not_space[-1])
        # Both readings are counted as the chunks go; which one holds is known only at the end.
        word = kind == _WORD
        cjk_words += _runs(word, in_cjk)
        in_cjk = bool(word[-1])
        unspaced += int(np.count_nonzero(kind == _UNSPACED))
    return spaced_words if not unspaced else unspaced + cjk_words
