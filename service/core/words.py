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
than twice `keep` (`keep` is twice the limit, and some) to a head of `keep` characters (or 2, 4... times
that where NFC composes the head's characters: three jamo, or a letter and its marks, make one), which
leaves every token id as it was:
- a run is inside one word: every character `word_chars` marks is a word character for the normalizer
  and the pre-tokenizer (letters, marks, numbers, non-ASCII symbols; not CJK, not `▁`, not a character
  whose NFC form holds anything else; checked against `tokenizers` itself by the tests); characters the
  table leaves out (format and unassigned characters, say) only make runs shorter;
- that word is [UNK] before and after: the head alone normalizes to more than
  `max_input_chars_per_word` + 4 characters (checked per run with the tokenizer's own normalizer; NFC may
  compose a run's edge with its neighbour, which moves the count by at most one at each end);
- nothing else moves: the run's neighbours are the same characters; a run's last character composes
  with no neighbour (a combining mark would be in the run); an added token (a tag) starts and ends
  with a character outside any run and is shorter than `keep`, so it never overlaps a long run.
Shortening any piece of a text alone is as valid as shortening the whole (a run cut between two pieces
becomes two heads, each over the limit), so a bounded encode shortens only what it reads
(`Shortened`).

Only a tokenizer with exactly this normalizer and pre-tokenizer, a WordPiece model and such added tokens
gets a `LongWords` (`LongWords.of`); any other keeps the plain bounded encode.
"""

from __future__ import annotations

import functools
import json
import sys
import unicodedata
from typing import Any

import numpy as np
import numpy.typing as npt
from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers

# Han ideographs and kana, each a piece of its own as in BERT: these scripts put no spaces between words,
# so without this a whole sentence would be one word, and [UNK] as soon as one character is unknown.
CJK_RANGES = ((0x3040, 0x30FF), (0x3400, 0x4DBF), (0x4E00, 0x9FFF), (0xF900, 0xFAFF), (0x20000, 0x2FA1F))
CJK_CLASS = "[" + "".join(f"{chr(a)}-{chr(b)}" for a, b in CJK_RANGES) + "]"
METASPACE = "▁"

# The first chunk a bounded encode shortens; later chunks are as long as all before them, so a giant run
# is cut into a few dozen heads at most.
_FIRST_CHUNK = 1 << 14
# Categories of word characters: letters, marks, numbers and symbols (ASCII symbols are punctuation to
# the pre-tokenizer and are left out below). Format, control, private-use and unassigned characters
# are left out too: only a run's length depends on them.
_WORD_CATEGORIES = frozenset(
    {"Lu", "Ll", "Lt", "Lm", "Lo", "Mn", "Mc", "Me", "Nd", "Nl", "No", "Sm", "Sc", "Sk", "So"}
)


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
    code = ord(char)
    if unicodedata.category(char) not in _WORD_CATEGORIES or char.isspace() or char == METASPACE:
        return False
    if code < 0x80:
        return char.isalnum()
    return not any(low <= code <= high for low, high in CJK_RANGES)


@functools.cache
def word_chars() -> npt.NDArray[np.bool_]:
    """For every code point, whether it is a word character that stays one through NFC (a table of
    0x110000 booleans, built once per process on first need: about half a second).

    Python's Unicode tables and those compiled into `tokenizers` are of different Unicode versions (U+166D
    is a symbol to Python, punctuation to `tokenizers`), so the table is checked against `tokenizers`
    itself: a character it splits a word at is dropped."""
    table = np.zeros(sys.maxunicode + 1, dtype=np.bool_)
    for code in range(sys.maxunicode + 1):
        if 0xD800 <= code <= 0xDFFF:
            continue
        char = chr(code)
        if _plain_word_char(char):
            table[code] = all(_plain_word_char(c) for c in unicodedata.normalize("NFC", char))
    normalizer, pre_tokenizer = html_normalizer(), html_pre_tokenizer()
    for code in _splitting(np.flatnonzero(table).tolist(), normalizer, pre_tokenizer):
        table[code] = False
    return table


def _splitting(
    codes: list[int], normalizer: normalizers.Normalizer, pre_tokenizer: pre_tokenizers.PreTokenizer
) -> list[int]:
    """The code points among `codes` that `tokenizers` does not keep inside a word (bisecting: each
    `a<c>a` must be one word of a space-separated list)."""
    segments = " ".join("a" + chr(code) + "a" for code in codes)
    if len(pre_tokenizer.pre_tokenize_str(normalizer.normalize_str(segments))) == len(codes):
        return []
    if len(codes) == 1:
        return codes
    half = len(codes) // 2
    return _splitting(codes[:half], normalizer, pre_tokenizer) + _splitting(
        codes[half:], normalizer, pre_tokenizer
    )


class LongWords:
    """Shortens the runs of word characters longer than `keep` for one tokenizer (see the module)."""

    def __init__(self, normalizer: normalizers.Normalizer, max_word_chars: int) -> None:
        self._normalizer = normalizer
        self._over = max_word_chars + 4  # a head normalizing to more characters is surely [UNK]
        self.keep = 2 * self._over

    @classmethod
    def of(cls, tok: Tokenizer) -> LongWords | None:
        """A `LongWords` for `tok` if it splits words as ours do, else None."""
        config = json.loads(tok.to_str())
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

    def shorten(self, text: str) -> str:
        """`text` with every run of more than `keep` word characters cut to a head that is surely [UNK]."""
        if len(text) <= self.keep:
            return text
        codes = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype="<u4")
        word = np.zeros(len(codes) + 2, dtype=np.bool_)
        word[1:-1] = word_chars()[codes]
        edges = np.flatnonzero(word[1:] != word[:-1])  # where runs start and end, alternately
        starts, ends = edges[0::2], edges[1::2]
        long = np.flatnonzero(ends - starts > 2 * self.keep)  # a run just over `keep` gains nothing
        pieces = []
        done = 0
        for index in long:
            start, end = int(starts[index]), int(ends[index])
            head = self._head(text, start, end)
            if head is None:
                continue  # marks that compose away: not surely [UNK], left whole
            pieces.append(text[done:start])
            pieces.append(head)
            done = end
        if not pieces:
            return text
        pieces.append(text[done:])
        return "".join(pieces)

    def _head(self, text: str, start: int, end: int) -> str | None:
        """The shortest head of `keep`, 2 `keep`, 4 `keep`... characters of the run `text[start:end]`
        that normalizes to more than the limit; None if only the whole run would."""
        size = self.keep
        while size < end - start:
            head = text[start : start + size]
            # Text already in NFC (nearly all) stays as it is: its length is the count.
            if (
                unicodedata.is_normalized("NFC", head)
                or len(self._normalizer.normalize_str(head)) > self._over
            ):
                return head
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
