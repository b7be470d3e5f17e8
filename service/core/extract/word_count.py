"""Word counts of extracted text, and its unreadable characters, in bounded memory and linear time.

A word is a run of characters between whitespace (what `str.split()` splits on) that holds at least one
letter or digit (Unicode categories L* and N*): a run of invisible characters, punctuation or symbols
("\u200b", ".", "|", "-") is no word: 80 zero-width spaces, or full stops, between spaces had passed
the 50-word filter as 80 words.
In a text with any Han, Hiragana or Katakana letter, each such letter is a word of its own and their
punctuation (、。「」, full-width ，！？, the other characters of those blocks) separates words like a space:
Chinese and Japanese put no spaces between words, and split on whitespace alone a 2,000-character
Chinese article had 40 "words" and the union's 50-word filter refused every such page.
Thai, Lao, Khmer and Myanmar put no spaces between words either (a space ends a phrase or a sentence,
if anything), but their words are several letters long: 200 Thai words in phrases of 8 were 25
"words", and a page of four such paragraphs failed the 50-word filter. Their letters and digits
(Unicode L* and N*; vowel signs, tone marks and the other combining marks are not counted) are divided
by the script's average letters per word (`UNSPACED_SCRIPTS`), rounded up; the other characters of
their blocks (those marks, and signs such as ๚ ។ ၊ ။) separate like the Chinese punctuation. The
averages were measured with ICU 72's dictionary word breaker over the Thai, Lao, Khmer and Burmese
message catalogues of Debian's packages (the words wholly in the script): Thai 3.0 letters a word
(49,835 words; 3.8 code points with the marks), Lao 3.8 (426 words: few, and Lao spells like Thai),
Khmer 2.9 (10,625), Myanmar 1.8 (22,769; 4.0 code points). In a text with a letter of any of these
scripts, the words are those of the scripts plus the runs of other word characters between spaces,
the scripts' letters and their separators; a text without one is counted by whitespace alone.

The unreadable characters are U+FFFD (what undecodable bytes and lone surrogates become), the C0
controls that are not whitespace, the C1 controls (U+0080-U+009F: what a single-byte codec that leaves
those bytes undefined makes of them, as windows-1252 does of five and Latin-1 of all 32; a Shift_JIS
page read as windows-1254 is 9% C1 controls, and none is in a corpus output but one character of
p0364), and the invisible format characters (`normalize.INVISIBLE_FORMAT`, which every extractor's
output is cleared of already): text made of them comes from binary input or a page read with the wrong
codec, not from a page's prose. The same pass counts the non-ASCII characters and the signs of a page
read with the wrong single-byte codec (`mojibake`), and the letters and digits they are shares of.

The counts run in the server process on every extractor's output, which can be as long as the page.
Counted with `str.split()` and `re.findall` they built one Python string per word or per character: a
16 MiB page of Chinese took 1.96 s and 471 MB per output. Here the text is read in chunks of `_CHUNK`
characters as arrays of code points, each character classed through one lookup table, and words are
counted as the runs that hold a letter or digit: a few MiB and tens of milliseconds for 16 MiB
(tests/core/test_extract_word_count.py checks the counts against a split-based reference).
"""

from __future__ import annotations

import functools
import unicodedata
from typing import Final, NamedTuple

import numpy as np
import numpy.typing as npt

from service.core.extract.mojibake import chunk_counts
from service.core.extract.normalize import ASSIGNED_BOUND, PLANE_14, is_invisible_format

# Han ideographs (with extensions and compatibility forms), Hiragana and Katakana (with the half-width
# forms): each letter one word, as word processors count them.
CJK_RANGES: Final = (
    (0x3040, 0x30FF),
    (0x31F0, 0x31FF),
    (0x3400, 0x4DBF),
    (0x4E00, 0x9FFF),
    (0xF900, 0xFAFF),
    (0xFF66, 0xFF9F),
    (0x20000, 0x3134F),
)
# Their punctuation: it stands between words like a space, and is no word.
CJK_PUNCTUATION_RANGES: Final = (
    (0x3000, 0x303F),
    (0xFF01, 0xFF0F),
    (0xFF1A, 0xFF20),
    (0xFF3B, 0xFF40),
    (0xFF5B, 0xFF65),
)


class UnspacedScript(NamedTuple):
    """A script written without spaces between words: its blocks, and its average word length."""

    name: str
    ranges: tuple[tuple[int, int], ...]
    # Letters and digits per 10 words (an integer, so the division rounds exactly).
    letters_per_10_words: int


# Measured as the module docstring says; Chinese and Japanese count a letter a word.
UNSPACED_SCRIPTS: Final = (
    UnspacedScript("Chinese and Japanese", CJK_RANGES, 10),
    UnspacedScript("Thai", ((0x0E00, 0x0E7F),), 30),
    UnspacedScript("Lao", ((0x0E80, 0x0EFF),), 38),
    UnspacedScript("Khmer", ((0x1780, 0x17FF),), 29),
    UnspacedScript("Myanmar", ((0x1000, 0x109F), (0xA9E0, 0xA9FF), (0xAA60, 0xAA7F)), 18),
)
# Every character `str.isspace()` accepts is below this (the last is U+3000, IDEOGRAPHIC SPACE); a
# test checks it against the whole Unicode range of the running Python.
SPACE_BOUND: Final = 0x3001
_CHUNK = 1 << 18  # characters per step: about 2 MiB of arrays
_BMP = 0x10000
_UNICODE = 0x110000
# Character flags in the lookup table. A letter of an unspaced script has its script's index in
# `UNSPACED_SCRIPTS` in the top bits.
_SPACE, _UNSPACED, _SEPARATOR, _ALNUM, _UNREADABLE = 1, 2, 4, 8, 16
_SCRIPT_SHIFT = 5
_SCRIPTS = 1 << (8 - _SCRIPT_SHIFT)


def _flags_of(code_point: int) -> int:
    char = chr(code_point)
    flags = 0
    category = unicodedata.category(char)
    if category[0] in "LN":
        flags |= _ALNUM
    if char.isspace():
        flags |= _SPACE
    control = (code_point < 0x20 and not char.isspace()) or 0x80 <= code_point <= 0x9F  # C0 and C1
    if code_point == 0xFFFD or control or is_invisible_format(code_point):
        flags |= _UNREADABLE
    return flags


@functools.cache
def _table(size: int) -> npt.NDArray[np.uint8]:
    """The flags of every code point below `size` (the BMP, 64 KiB, or all of Unicode, 1.1 MiB; each
    built on first use, the second only for a text with a character above the BMP)."""
    table = np.zeros(size, dtype=np.uint8)
    assigned = range(min(size, ASSIGNED_BOUND))
    table[: len(assigned)] = np.frombuffer(bytes(_flags_of(c) for c in assigned), dtype=np.uint8)
    if size > PLANE_14.start:
        table[PLANE_14.start : PLANE_14.stop] = np.frombuffer(
            bytes(_flags_of(c) for c in PLANE_14), dtype=np.uint8
        )
    for index, script in enumerate(UNSPACED_SCRIPTS):
        for low, high in script.ranges:
            if low < size:
                block = table[low : min(high, size - 1) + 1]
                # A letter or digit is counted for its script; the block's other characters (・, ゛,
                # ゠, Thai and Myanmar vowel signs and tone marks, ๚, ။) separate, as the punctuation does.
                letter = block | _UNSPACED | (index << _SCRIPT_SHIFT)
                block[:] = np.where(block & _ALNUM, letter, block | _SEPARATOR)
    # U+3000 is punctuation here and whitespace to str.split: it separates in both readings.
    for low, high in CJK_PUNCTUATION_RANGES:
        table[low : high + 1] |= _SEPARATOR
    return table


def _code_points(chunk: str) -> npt.NDArray[np.uint8] | npt.NDArray[np.uint32]:
    if chunk.isascii():
        return np.frombuffer(chunk.encode("ascii"), dtype=np.uint8)
    # surrogatepass: a lone surrogate is a character like any other here (category Cs: no letter).
    return np.frombuffer(chunk.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)


class _Runs:
    """Counts, across chunks, the runs of True in a mask that hold at least one `good` position."""

    def __init__(self) -> None:
        self.count = 0
        self._in_run = False  # the last chunk ended inside a run
        self._counted = False  # ... and that run was counted already

    def add(self, in_run: npt.NDArray[np.bool_], good: npt.NDArray[np.bool_]) -> None:
        """`good` must be False outside `in_run`."""
        starts = in_run.copy()
        starts[1:] &= ~in_run[:-1]
        starts[0] = bool(in_run[0]) and not self._in_run
        # Each position's run, numbered from 1 in this chunk; 0 is the run the last chunk ended in.
        run = np.cumsum(starts, dtype=np.int32)
        good_runs = run[good]
        last_run = int(run[-1])
        if good_runs.size:
            self.count += 1 + int(np.count_nonzero(good_runs[1:] != good_runs[:-1]))
            if good_runs[0] == 0 and self._counted:
                self.count -= 1
            last_counted = int(good_runs[-1]) == last_run or (last_run == 0 and self._counted)
        else:
            last_counted = last_run == 0 and self._counted
        self._in_run = bool(in_run[-1])
        self._counted = self._in_run and last_counted


class TextCounts(NamedTuple):
    words: int
    unreadable: int  # U+FFFD, C0 controls other than whitespace, C1 controls, invisible format characters
    unspaced: int  # of the words, those counted from the letters of `UNSPACED_SCRIPTS`
    alnum: int  # letters and digits (Unicode L* and N*)
    non_ascii: int
    utf8_misread: int  # characters of UTF-8 sequences read one byte a character (`mojibake`)
    latin_runs: int  # characters of runs of 3+ Latin-1 letters (`mojibake`)


def text_counts(text: str) -> TextCounts:
    """The words of `text` (see the module docstring), its unreadable characters and the other counts of
    `TextCounts`, in one pass."""
    spaced = _Runs()  # words when the text has no unspaced letter
    others = _Runs()  # runs of word characters between spaces, unspaced letters and separators
    letters = np.zeros(_SCRIPTS, dtype=np.int64)  # unspaced letters per script
    unreadable = alnum_count = non_ascii = utf8_misread = latin_runs = 0
    for start in range(0, len(text), _CHUNK):
        points = _code_points(text[start : start + _CHUNK])
        table = _table(_UNICODE) if points.dtype == np.uint32 and points.max() >= _BMP else _table(_BMP)
        flags = table[points]
        alnum = (flags & _ALNUM).astype(bool)
        not_space = (flags & _SPACE) == 0
        spaced.add(not_space, alnum)
        # Both readings are counted as the chunks go; which one holds is known only at the end.
        word = (flags & (_SPACE | _UNSPACED | _SEPARATOR)) == 0
        others.add(word, alnum & word)
        in_chunk = int(np.count_nonzero(flags & _UNSPACED))
        if in_chunk:
            # Only the letters of the scripts after the first have bits this high: a Chinese text costs
            # one comparison, not a copy of its letters.
            scripted = flags >= 1 << _SCRIPT_SHIFT
            in_scripts = int(np.count_nonzero(scripted))
            if in_scripts:
                letters += np.bincount(flags[scripted] >> _SCRIPT_SHIFT, minlength=_SCRIPTS)
            letters[0] += in_chunk - in_scripts
        unreadable += int(np.count_nonzero(flags & _UNREADABLE))
        alnum_count += int(np.count_nonzero(alnum))
        if points.dtype == np.uint32:  # an ASCII chunk has none of the rest
            misread = chunk_counts(points)
            non_ascii += misread.non_ascii
            utf8_misread += misread.utf8
            latin_runs += misread.latin_runs
    rest = (alnum_count, non_ascii, utf8_misread, latin_runs)
    if not letters.any():
        return TextCounts(spaced.count, unreadable, 0, *rest)
    # Each script's letters over its average word length, rounded up: one letter is one word.
    unspaced = sum(
        -(-int(count) * 10 // script.letters_per_10_words)
        for count, script in zip(letters, UNSPACED_SCRIPTS, strict=False)
    )
    return TextCounts(unspaced + others.count, unreadable, unspaced, *rest)


def count_words(text: str) -> int:
    """Words that hold a letter or digit, the yield measure of "Beyond a Single Extractor", with every
    Chinese or Japanese letter a word of its own and the letters of Thai, Lao, Khmer and Myanmar divided
    by their scripts' average word length (see the module docstring)."""
    return text_counts(text).words
