"""How our tokenizers cut text into words, and the shortening of words too long for WordPiece to read.

Our normalizer and pre-tokenizer (`html_normalizer`, `html_pre_tokenizer`; `model_training` builds every
tokenizer with them): Unicode NFC, each whitespace run to one space; then Metaspace (a space becomes a
`▁` glued to the next word), each CJK character a word of its own, each punctuation character a word of
its own. A word is therefore a run of characters that are none of those.

WordPiece reads a word of more than `max_input_chars_per_word` characters (100 in ours) as one [UNK],
however long it is. A bounded encode (`HtmlTokenizer.encode(count_all=False)`) tokenizes a growing
prefix of the text until it holds `max_length` tokens; a text of few, giant words holds few tokens per
character, so that prefix grew to the whole text: a 16 MB page of one word, or of 530 words of 30 KB,
took 6 s of a worker for three or 512 ids. `LongWords.shorten` cuts every run of word characters longer
than twice `keep` (`keep` is twice the limit, and some): it removes the text from the first stable
character after a head of `keep` characters (or 2, 4... times that where NFC composes the head's
characters: three jamo, or a letter and its marks, make one) to the run's last stable character. Every
token id stays as it was:
- a run is inside one word: every character `word_chars` marks is one that `tokenizers` keeps inside a
  word, NFC form included (everything but whitespace, punctuation, CJK and `▁`: letters, marks,
  symbols, controls, format, private-use and unassigned characters; the table is checked against
  `tokenizers` as it is built, since its Unicode tables are not Python's);
- the text around the cut normalizes as before: both ends of the removed text are stable characters
  (combining class 0, composing with nothing before them, their own NFC form; checked against
  `tokenizers` too), where NFC's segments begin, so what precedes the cut, what was removed and what
  follows it normalize apart; the run's last combining sequence stays, with whatever NFC does between it
  and the character after the run (U+3099, a mark in the CJK range, moves before the run's trailing
  marks: a cut that replaced them changed the ids);
- the word is [UNK] before and after: its head alone normalizes to more than `max_input_chars_per_word`
  + 4 characters (checked per run with the tokenizer's own normalizer when the head is not already NFC);
- nothing else moves: an added token (a tag) starts and ends with a character outside any run and is
  shorter than `keep`, so it never overlaps a removed piece.
Shortening any piece of a text alone is as valid as shortening the whole (a run cut between two pieces is
cut in each, at stable characters), so a bounded encode shortens only what it reads (`Shortened`). A
run with nothing to cut at (a pile of combining marks, a row of jamo vowels) is left whole up to
`MAX_UNCUT` characters, and refused beyond (`WordTooLongError`): 4 MB of U+0301 after one letter took
2.7 s to tokenize, and text has a few marks per letter, not thousands.

Only a tokenizer with exactly this normalizer and pre-tokenizer, a WordPiece model and such added tokens
gets a `LongWords` (`LongWords.of`); any other keeps the plain bounded encode.
"""

from __future__ import annotations

import functools
import json
import sys
import unicodedata
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt
from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers

from service.core.errors import ErrorCode, HtmllmError

# Han ideographs and kana, each a piece of its own as in BERT: these scripts put no spaces between words,
# so without this a whole sentence would be one word, and [UNK] as soon as one character is unknown.
CJK_RANGES = ((0x3040, 0x30FF), (0x3400, 0x4DBF), (0x4E00, 0x9FFF), (0xF900, 0xFAFF), (0x20000, 0x2FA1F))
CJK_CLASS = "[" + "".join(f"{chr(a)}-{chr(b)}" for a, b in CJK_RANGES) + "]"
METASPACE = "▁"

# The longest run of word characters with nowhere to cut that a bounded encode reads (about 50 ms).
MAX_UNCUT = 1 << 16
# The first chunk a bounded encode shortens; later chunks are as long as all before them, so a giant run
# is cut into a few dozen heads at most.
_FIRST_CHUNK = 1 << 14


def html_normalizer() -> normalizers.Normalizer:
    """NFC, then each whitespace run to one space. No lowercasing: casing is kept."""
    return normalizers.Sequence([normalizers.NFC(), normalizers.Replace(Regex(r"\s+"), " ")])


def html_pre_tokenizer() -> pre_tokenizers.PreTokenizer:
    """Metaspace (a space becomes a `▁` glued to the next word), CJK characters and punctuation isolated."""
    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Metaspace(replacement=METASPACE, prepend_scheme="never", split=True),
            pre_tokenizers.Split(Regex(CJK_CLASS), behavior="isolated"),
            pre_tokenizers.Punctuation(behavior="isolated"),
        ]
    )


@functools.cache
def _ours() -> tuple[Any, Any]:
    """The JSON of our normalizer and pre-tokenizer, as a loaded tokenizer's JSON holds them."""
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = html_normalizer()
    tok.pre_tokenizer = html_pre_tokenizer()
    config = json.loads(tok.to_str())
    return config["normalizer"], config["pre_tokenizer"]


def _plain_word_char(char: str) -> bool:
    """Whether Python's tables make `char` a character inside a word: not whitespace, punctuation, CJK
    or `▁` (letters, marks, numbers, symbols, controls, format, private-use and unassigned ones are)."""
    code = ord(char)
    if char.isspace() or char == METASPACE or unicodedata.category(char)[0] in "PZ":
        return False
    if code < 0x80:
        return char.isalnum() or unicodedata.category(char) == "Cc"
    return not any(low <= code <= high for low, high in CJK_RANGES)


# Code points no Unicode version so far assigns (planes 4-13) and private use (planes 15-16): word
# characters that NFC leaves alone, to every version of the tables; only the rest is checked.
_UNASSIGNED_PLANES = (0x40000, 0xE0000)
_PRIVATE_PLANES = 0xF0000
# The jamo that compose with the syllable before them (algorithmically, so not in `decomposition`).
_JAMO_SECONDS = ((0x1161, 0x1175), (0x11A8, 0x11C2))
# Segments checked against `tokenizers` at once (bisected where one splits).
_SEGMENT = 64


WordTables = tuple[npt.NDArray[np.bool_], npt.NDArray[np.bool_], npt.NDArray[np.bool_]]

# Tables this process took from the one that built them (`adopt_word_tables`), instead of building.
_adopted: WordTables | None = None


def word_tables() -> WordTables:
    """(word, stable, starts): adopted, or built on first use (`_built_tables`)."""
    return _adopted if _adopted is not None else _built_tables()


def built_word_tables() -> WordTables | None:
    """The tables if this process has them already (built or adopted), else None; builds nothing."""
    if _adopted is not None:
        return _adopted
    return _built_tables() if _built_tables.cache_info().currsize else None


def adopt_word_tables(tables: WordTables) -> None:
    """Use `tables`, built by another process of this installation (the server, for the preprocessing
    workers it starts), instead of building them: the same Python and `tokenizers` give the same
    tables, and building took a second of every worker's start, after every kill too."""
    global _adopted
    _adopted = tables


@functools.cache
def _built_tables() -> WordTables:
    """(word, stable, starts) for every code point (tables of 0x110000 booleans, built once per process,
    as the engine starts: about a second).

    `word`: a character `tokenizers` keeps inside a word, NFC form included. Python's Unicode tables and
    those compiled into `tokenizers` are of different versions (U+166D is a symbol to Python 3.11,
    punctuation to `tokenizers`), so the table is checked against `tokenizers` itself: every character,
    between two letters, in segments of `_SEGMENT`; a segment that splits is bisected, and one whose
    halves each pass is dropped whole.

    `starts`: a character where NFC's segments start (combining class 0, composing with nothing before
    it, its own NFC form): what precedes it and what follows it normalize apart. Checked against
    `tokenizers`' NFC too: after U+0345 (combining class 240) it must stay where it is and as it is.
    Unassigned characters count (`tokenizers`' newer tables must agree, and no character assigned later
    composes with the one before it: Unicode's stability policy). `stable`: the word characters among
    them, where a long run may be cut.
    """
    word = np.zeros(sys.maxunicode + 1, dtype=np.bool_)
    starts = np.zeros(sys.maxunicode + 1, dtype=np.bool_)
    low, high = _UNASSIGNED_PLANES
    word[low:high] = starts[low:high] = True
    word[_PRIVATE_PLANES:] = starts[_PRIVATE_PLANES:] = True
    word[[0xFFFFE, 0xFFFFF, 0x10FFFE, 0x10FFFF]] = False
    seconds = {code for low_, high_ in _JAMO_SECONDS for code in range(low_, high_ + 1)}
    for code in (*range(low), *range(high, _PRIVATE_PLANES)):
        if 0xD800 <= code <= 0xDFFF:
            continue
        char = chr(code)
        decomposition = unicodedata.decomposition(char)
        parts = decomposition.split()
        if len(parts) == 2 and not parts[0].startswith("<"):
            seconds.add(int(parts[1], 16))  # it may compose with the character before it
        normal = unicodedata.normalize("NFC", char) if decomposition else char
        starts[code] = unicodedata.combining(char) == 0 and normal == char
        word[code] = _plain_word_char(char) and (normal == char or all(_plain_word_char(c) for c in normal))
    starts[list(seconds)] = False
    normalizer, pre_tokenizer = html_normalizer(), html_pre_tokenizer()
    checked = np.ones(sys.maxunicode + 1, dtype=np.bool_)
    checked[low:high] = checked[_PRIVATE_PLANES:] = False
    for code in _split_by_tokenizers(np.flatnonzero(word & checked).tolist(), normalizer, pre_tokenizer):
        word[code] = False
    for code in _moved_by_nfc(np.flatnonzero(starts & checked).tolist(), normalizers.NFC()):
        starts[code] = False
    return word, word & starts, starts


def word_chars() -> npt.NDArray[np.bool_]:
    """`word_tables`' word characters."""
    return word_tables()[0]


def _split_by_tokenizers(
    codes: list[int], normalizer: normalizers.Normalizer, pre_tokenizer: pre_tokenizers.PreTokenizer
) -> list[int]:
    """The code points among `codes` that `tokenizers` may not keep inside a word."""

    def words_of(segments: list[list[int]]) -> int:
        text = " ".join("a" + "".join(chr(c) for c in segment) + "a" for segment in segments)
        return len(pre_tokenizer.pre_tokenize_str(normalizer.normalize_str(text)))

    segments = [codes[i : i + _SEGMENT] for i in range(0, len(codes), _SEGMENT)]
    if words_of(segments) == len(segments):
        return []
    if len(segments) > 1:
        half = len(segments) // 2 * _SEGMENT
        return _split_by_tokenizers(codes[:half], normalizer, pre_tokenizer) + _split_by_tokenizers(
            codes[half:], normalizer, pre_tokenizer
        )
    if len(codes) == 1:
        return codes
    half = len(codes) // 2
    found = _split_by_tokenizers(codes[:half], normalizer, pre_tokenizer) + _split_by_tokenizers(
        codes[half:], normalizer, pre_tokenizer
    )
    rest = [code for code in codes if code not in found]
    if not found or (rest and words_of([rest]) != 1):
        return codes  # they split only together: drop them all
    return found


def _moved_by_nfc(codes: list[int], normalizer: normalizers.Normalizer) -> list[int]:
    """The code points among `codes` that `tokenizers`' NFC reorders after U+0345, or changes."""
    text = "".join("a\u0345" + chr(code) for code in codes)
    if normalizer.normalize_str(text) == text:
        return []
    if len(codes) == 1:
        return codes
    half = len(codes) // 2
    return _moved_by_nfc(codes[:half], normalizer) + _moved_by_nfc(codes[half:], normalizer)


def _code_points(text: str) -> npt.NDArray[np.uint32]:
    """`text`'s code points, lone surrogates included (they index the tables as non-word characters)."""
    return np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype="<u4")


def _last_flagged(flags: Callable[[int, int], npt.NDArray[np.bool_]], low: int, high: int, span: int) -> int:
    """The last position in [low, high) whose flag is set, looking back over spans growing fourfold
    (`flags(a, b)` gives those of [a, b)); -1 if none is."""
    while True:
        start = max(low, high - span)
        found = np.flatnonzero(flags(start, high))
        if found.size:
            return start + int(found[-1])
        if start <= low:
            return -1
        span *= 4


class WordTooLongError(HtmllmError):
    """A page with a run of word characters that cannot be shortened and is too long to tokenize."""

    code = ErrorCode.PREPROCESS_FAILED


class LongWords:
    """Shortens the runs of word characters longer than `keep` for one tokenizer (see the module)."""

    def __init__(self, normalizer: normalizers.Normalizer, max_word_chars: int) -> None:
        self._normalizer = normalizer
        self._over = max_word_chars + 4  # a head normalizing to more characters is surely [UNK]
        self.keep = 2 * self._over

    @classmethod
    def of(cls, tok: Tokenizer, config: dict[str, Any]) -> LongWords | None:
        """A `LongWords` for `tok` (whose parsed JSON is `config`) if it splits words as ours do, else
        None."""
        model = config.get("model") or {}
        if model.get("type") != "WordPiece" or not isinstance(model.get("max_input_chars_per_word"), int):
            return None
        if (config.get("normalizer"), config.get("pre_tokenizer")) != _ours() or tok.normalizer is None:
            return None
        long_words = cls(tok.normalizer, model["max_input_chars_per_word"])
        for added in tok.get_added_tokens_decoder().values():
            content = added.content
            if not content or len(content) >= long_words.keep:
                return None
            if _plain_word_char(content[0]) or _plain_word_char(content[-1]):
                return None  # a token that could start or end inside a run
        return long_words

    def segment_start(self, text: str, end: int) -> int:
        """The last position at or before `end` (and inside `text`) where an NFC segment starts: NFC of
        the text before it is the start of NFC of the whole text, whatever follows. A mark can compose
        with a letter hundreds of characters before it (the marks between of a lower class do not block
        it, and U+3099 between makes the letter a word of its own), so a bounded encode cuts there.
        0 if there is none."""
        starts = word_tables()[2]

        def flags(low: int, high: int) -> npt.NDArray[np.bool_]:
            flagged: npt.NDArray[np.bool_] = starts[_code_points(text[low:high])]
            return flagged

        return max(0, _last_flagged(flags, 0, min(end, len(text) - 1) + 1, 256))

    def shorten(self, text: str) -> str:
        """`text` with every run of more than 2 `keep` word characters cut: from the first stable
        character after a head that is surely [UNK] to the run's last stable character."""
        if len(text) <= 2 * self.keep:
            return text
        codes = _code_points(text)
        word_table, stable_table, _ = word_tables()
        word = np.zeros(len(codes) + 2, dtype=np.bool_)
        word[1:-1] = word_table[codes]
        edges = np.flatnonzero(word[1:] != word[:-1])  # where runs start and end, alternately
        starts, ends = edges[0::2], edges[1::2]
        long = np.flatnonzero(ends - starts > 2 * self.keep)  # a run just over `keep` gains nothing
        if long.size == 0:
            return text
        stable = stable_table[codes]
        pieces = []
        done = 0
        for index in long:
            start, end = int(starts[index]), int(ends[index])
            cut = self._cut(text, stable, start, end)
            if cut is None and end - start > MAX_UNCUT:
                raise WordTooLongError(
                    f"the page has a word of {end - start} or more characters with nothing to shorten "
                    f"it at (combining marks or jamo after one another); at most {MAX_UNCUT} are read"
                )
            if cut is not None:
                pieces.append(text[done : cut[0]])
                done = cut[1]
        if not pieces:
            return text
        pieces.append(text[done:])
        return "".join(pieces)

    def _cut(self, text: str, stable: npt.NDArray[np.bool_], start: int, end: int) -> tuple[int, int] | None:
        """What to remove of the run `text[start:end]`: from the first stable character at or after
        `keep`, 2 `keep`, 4 `keep`... characters whose head normalizes to more than the limit, to the
        run's last stable character; None where that would remove little or nothing."""
        last = _last_flagged(lambda low, high: stable[low:high], start, end, self.keep)
        size = self.keep
        while last >= 0 and start + size < last - self.keep:
            after = stable[start + size : last]
            first = start + size + int(np.argmax(after))
            if not after[first - start - size] or first >= last - self.keep:
                return None
            head = text[start:first]
            # Text already in NFC (nearly all) stays as it is: its length is the count.
            if (
                unicodedata.is_normalized("NFC", head)
                or len(self._normalizer.normalize_str(head)) > self._over
            ):
                return first, last
            size *= 2
        return None


class Shortened:
    """A text read from its start with its long runs shortened as far as read (`LongWords.shorten` of
    growing chunks), or as it is where the tokenizer has no `LongWords`."""

    def __init__(self, text: str, long_words: LongWords | None) -> None:
        self._text = text
        self._long_words = long_words
        self._parts: list[str] = []
        self._length = 0
        self._read = 0  # characters of `text` shortened into `_parts`

    def prefix(self, length: int) -> tuple[str, bool]:
        """The first `length` characters of the shortened text and False, or all of it and True when it
        is no longer than `length`."""
        if self._long_words is None:
            return (self._text, True) if len(self._text) <= length else (self._text[:length], False)
        while self._length <= length and self._read < len(self._text):
            size = max(length - self._length + 1, self._read, _FIRST_CHUNK)
            part = self._long_words.shorten(self._text[self._read : self._read + size])
            self._parts.append(part)
            self._length += len(part)
            self._read += size
        if len(self._parts) > 1:
            self._parts = ["".join(self._parts)]
        shortened = self._parts[0] if self._parts else ""
        if self._read >= len(self._text) and self._length <= length:
            return shortened, True
        return shortened[:length], False
