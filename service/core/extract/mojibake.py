"""Signs of a page read with the wrong single-byte codec, counted on a chunk of code points.

Two misreadings leave text that has words and no U+FFFD, so neither the word count nor the unreadable
share (`word_count`) catches them:

- **UTF-8 read as windows-1252 or Latin-1** ("Привет" as "ÐŸÑ€Ð¸Ð²ÐµÑ‚", "Straße" as "StraÃŸe"):
  every non-ASCII character of the page becomes two to four characters that, written back as the
  single bytes they were read from, are one valid UTF-8 sequence: a lead byte (0xC2-0xF4, "Â"-"ô")
  followed by continuation bytes (0x80-0xBF: U+00A0-U+00BF, the C1 controls, or the windows-1252
  characters of 0x80-0x9F such as "€", "™", "Ÿ"). `utf8` counts the characters of such sequences.
  Real text has a few ("CAFÉ”", "é »" with French spacing: p0821 of the corpus has 6), but never most
  of its non-ASCII characters; a UTF-8 page misread so has all of them.
- **A page of another script in a legacy codec read as Latin-1** (windows-1251 "Привет" as
  "Ïðèâåò"; Greek, Hebrew or Arabic codecs alike): the other script's letters sit at 0xC0-0xFF, so
  every word becomes a run of U+00C0-U+00FF. `latin_runs` counts the characters of runs of three or
  more of them. No language writes so: accented Latin letters stand between unaccented ones ("ção"
  and Estonian "jäääär" are the longest runs real words make, and are rare), and the runs the corpus
  holds are emphasis ("ööööööööö", "Ääää": at most 0.2% of an output's letters).

Both are read from the chunk the word count converted already, in a few array operations, and only
for a chunk that is not ASCII. A sequence or run split across two chunks (one place per 256 Ki
characters) is not counted: the counts are shares of large numbers, not exact.
"""

from __future__ import annotations

import functools
from typing import Any, Final, NamedTuple

import numpy as np
import numpy.typing as npt

# One past U+2122 (™), the highest code point windows-1252 reads a byte as: nothing from here up is a
# character either check looks for.
_BOUND: Final = 0x2123
# A code point's kind in the table (low three bits) and whether it is a Latin-1 letter (or × ÷, which
# windows-1251 "ч" and "Ч" become: they sit between letters there).
_CONTINUATION, _LEAD2, _LEAD3, _LEAD4 = 1, 2, 3, 4
_KIND = 7
_LATIN1_LETTER = 8
# The characters a run is made of: U+00C0-U+00FF.
LATIN1_LETTERS: Final = range(0xC0, 0x100)
RUN_LENGTH: Final = 3


class MojibakeCounts(NamedTuple):
    non_ascii: int  # characters at or above U+0080
    utf8: int  # characters in UTF-8 sequences read one byte a character
    latin_runs: int  # characters in runs of at least `RUN_LENGTH` characters of U+00C0-U+00FF


@functools.cache
def _table() -> npt.NDArray[np.uint8]:
    """Each code point below `_BOUND` (the last one stands for all above it): its byte's kind in UTF-8
    when it was read from one byte, and the Latin-1 letter flag."""
    table = np.zeros(_BOUND + 1, dtype=np.uint8)
    for byte in range(0x80, 0xC0):
        table[byte] = _CONTINUATION  # read as Latin-1 (C1 controls, U+00A0-U+00BF)
        as_cp1252 = bytes([byte]).decode("cp1252", errors="ignore")  # 5 bytes are undefined there
        if as_cp1252:
            table[ord(as_cp1252)] = _CONTINUATION  # "€", "™", "Ÿ", ...
    table[0xC2:0xE0] = _LEAD2
    table[0xE0:0xF0] = _LEAD3
    table[0xF0:0xF5] = _LEAD4
    table[LATIN1_LETTERS.start : LATIN1_LETTERS.stop] |= _LATIN1_LETTER
    return table


def chunk_counts(points: npt.NDArray[np.unsignedinteger[Any]]) -> MojibakeCounts:
    """The counts of one chunk of code points (`word_count` reads text so).

    Every character of a sequence or a run is non-ASCII, so only the non-ASCII characters are looked
    at, with their positions to tell which of them stand next to each other: a few per cent of a page
    in a Latin script, and nothing past one comparison for a text without a Latin-1 letter (Chinese,
    Russian), where neither can be.
    """
    high = points >= 0x80
    non_ascii = int(np.count_nonzero(high))
    # Every lead byte reads as a Latin-1 letter; the subtraction wraps below U+00C0.
    if not non_ascii or not ((points - np.uint32(LATIN1_LETTERS.start)) < len(LATIN1_LETTERS)).any():
        return MojibakeCounts(non_ascii, 0, 0)
    where = np.flatnonzero(high)
    kinds = _table()[np.minimum(points[where], _BOUND)]
    beside = where[1:] == where[:-1] + 1  # the next non-ASCII character is the next character
    kind = kinds & _KIND
    cont = kind == _CONTINUATION
    # A lead and its continuations: leads are no continuations, so no two sequences overlap.
    two = (kind[:-1] == _LEAD2) & cont[1:] & beside
    three = (kind[:-2] == _LEAD3) & cont[1:-1] & cont[2:] & beside[:-1] & beside[1:]
    four = (
        (kind[:-3] == _LEAD4) & cont[1:-2] & cont[2:-1] & cont[3:] & beside[:-2] & beside[1:-1] & beside[2:]
    )
    utf8 = 2 * np.count_nonzero(two) + 3 * np.count_nonzero(three) + 4 * np.count_nonzero(four)
    # Each start of `RUN_LENGTH` Latin-1 letters in a row marks itself and the letters after it.
    latin = (kinds & _LATIN1_LETTER) != 0
    width = len(latin) - RUN_LENGTH + 1
    if width <= 0:
        return MojibakeCounts(non_ascii, int(utf8), 0)
    starts = latin[:width].copy()
    for offset in range(1, RUN_LENGTH):
        starts &= latin[offset : offset + width] & beside[offset - 1 : offset - 1 + width]
    covered = np.zeros(len(latin), dtype=bool)
    for offset in range(RUN_LENGTH):
        covered[offset : offset + width] |= starts
    return MojibakeCounts(non_ascii, int(utf8), int(np.count_nonzero(covered)))
