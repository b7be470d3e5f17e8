"""The HTML-aware WordPiece tokenizer that the service and training both use.

A thin, typed wrapper over a Hugging Face `tokenizers.Tokenizer` (one `tokenizer.json`):
- the five BERT special tokens `[PAD] [UNK] [CLS] [SEP] [MASK]` must exist; their ids are exposed so the
  model config can be set from them (the ModernBERT defaults silently break a custom vocabulary);
- the opening and closing forms of the most frequent HTML tags (`<p>`, `</p>`, and ` <p>`, ` </p>` with
  the space before them) are *non-special* added tokens: the tokenizer extracts them from the raw text
  before normalization and pre-tokenization, so a tag is one token even when glued to text
  (`<p>Hello</p>`), and decoding keeps them (special tokens would be dropped by `decode`);
- every `Encoding` starts with `[CLS]` and ends with `[SEP]`; truncation cuts the content, never those
  two, and reports the full length so callers can tell how much was lost;
- text that spells a special token ("[SEP]" on a page about BERT) is text, never the control id;
- ids run exactly 0..vocab_size-1, so every id has a row in the model's embedding.

Our own tokenizers (see `model_training.tokenizer_training`) mark spaces with `▁` (Metaspace) instead of
dropping them, so `decode(encode(x))` gives back `x` up to Unicode NFC and whitespace collapsing. Foreign
tokenizers (e.g. the BERT baseline) load too, with their own normalization and decoding.

`sha256` hashes the canonical serialization (keys sorted, no whitespace) of the tokenizer with padding and
truncation disabled, so the same tokenizer always hashes the same, whatever file formatting it came from;
checkpoints record it to detect a tokenizer swapped under a model.
"""

from __future__ import annotations

import hashlib
import json
import operator
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenizers import Encoding as TokenizersEncoding
from tokenizers import Tokenizer

from service.core.atomic_files import replaced_atomically
from service.core.decoding import without_lone_surrogates
from service.core.errors import ErrorCode, HtmllmError
from service.core.words import LongWords, Shortened, word_chars

SPECIAL_TOKENS: tuple[str, ...] = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
TOKENIZER_FILE = "tokenizer.json"

# A tag token is an attribute-free opening or closing tag, as the pruner writes them, optionally with the
# space before it (pruned HTML has one at about half of all tag boundaries).
_TAG_TOKEN = re.compile(r" ?</?[A-Za-z][A-Za-z0-9-]*>")

# A bounded encode tokenizes a prefix of the text and keeps the tokens of the words (pre-tokens) that end
# at least this many characters before its cut. Every step before the model is local: a tag token (added
# tokens are at most a few dozen characters) can only match across the cut near it, whitespace collapsing
# and the Metaspace, CJK and punctuation splits look one character around, and NFC composes a letter with
# the marks right after it; so those words, and their WordPiece tokens, are the whole text's first ones.
# A cut at any character, not only at whitespace: a page of CJK text or punctuation has no whitespace for
# megabytes, and cutting there only after the next space had tokenized all of it (seconds, per page).
_MARGIN = 128
# First guess of the characters that hold a token budget (pruned HTML averages 3-4 per token); the
# window grows fourfold while it holds too few.
_CHARS_PER_TOKEN = 8


class TokenizerError(HtmllmError):
    """A tokenizer that cannot be loaded or used: missing/invalid file, missing special tokens, bad ids."""

    code = ErrorCode.VALIDATION


@dataclass(frozen=True)
class SpecialIds:
    pad: int
    unk: int
    cls: int
    sep: int
    mask: int

    def filler(self, length: int) -> list[int]:
        """A document of `length` ids (at least 2) that is no page: [CLS], [UNK]s, [SEP]. What a probe or a
        warm-up passes through the model."""
        return [self.cls, *([self.unk] * (length - 2)), self.sep]


@dataclass(frozen=True)
class Encoding:
    ids: list[int]  # with [CLS] first and [SEP] last, truncated to max_length
    truncated: bool
    # Tokens before truncation (with [CLS]/[SEP]). Exact, except from `encode(..., count_all=False)` of a
    # truncated text: then a lower bound (more than max_length), since the rest was never tokenized.
    full_length: int


@dataclass(frozen=True)
class OffsetEncoding:
    """A text's content tokens (no [CLS]/[SEP]) with their character offsets into it."""

    ids: list[int]  # `encode(text, max_length=..., count_all=False).ids` without [CLS] and [SEP]
    # (start, stop) in code points for each id, as the whole text's encoding gives them; None where the
    # bounded read cannot tell (always a suffix of the list)
    offsets: list[tuple[int, int] | None]
    truncated: bool


def _first_window(budget: int) -> int:
    """The characters a bounded encode of `budget` content tokens tokenizes first."""
    return max(2 * _MARGIN, budget * _CHARS_PER_TOKEN)


def _scrub(text: str) -> str:
    """`text` with lone surrogates (unencodable in UTF-8) replaced by U+FFFD, as `decode_html` does (the
    codec's own "replace" writes "?", which tokenized as punctuation where the page had a broken byte)."""
    return without_lone_surrogates(text)


def _check_dense_ids(vocab: dict[str, int], vocab_size: int) -> None:
    """Refuse a vocabulary whose ids are not exactly 0..n-1 (`vocab_size` = n).

    The model's embedding has `vocab_size` rows: an id left past them by a gap (a hand-edited or pruned
    vocabulary) passed every check and failed in the forward of the first page holding that token, with
    an IndexError on CPU and a device-side assert, fatal to the process, on CUDA.
    """
    ids = sorted(vocab.values())
    if ids == list(range(vocab_size)):
        return
    seen = set(ids)
    absent = next((i for i in range(vocab_size) if i not in seen), None)
    shared = len(seen) != len(ids)
    raise TokenizerError(
        f"tokenizer ids must be exactly 0..{vocab_size - 1} (its {vocab_size} tokens), but "
        + (f"id {absent} is unused and " if absent is not None else "")
        + (f"{len(ids) - len(seen)} ids are given to two tokens and " if shared else "")
        + f"the ids run from {ids[0] if ids else None} to {ids[-1] if ids else None}"
    )


def canonical_json(config: dict[str, Any]) -> str:
    """A tokenizer's parsed JSON with sorted keys and no insignificant whitespace: the input of `sha256`."""
    return json.dumps(config, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


class HtmlTokenizer:
    """A loaded tokenizer with the special and tag token ids resolved once, at construction."""

    def __init__(self, tok: Tokenizer) -> None:
        # Work on a private copy: padding or truncation configured in the file (BERT's tokenizer.json
        # ships both) would silently change lengths, and the caller's object must stay untouched.
        try:
            own = Tokenizer.from_str(tok.to_str())
        except Exception as exc:  # the Rust side raises plain Exception subclasses
            raise TokenizerError(f"tokenizer cannot be serialized: {exc}") from exc
        own.no_padding()
        own.no_truncation()
        # Page text spelling "[SEP]" or "[MASK]" (any page about BERT) had been cut out as that control id
        # inside the content, and `decode` dropped it. A runtime switch, not part of the serialization:
        # set on every construction, it leaves `sha256` as it was.
        own.encode_special_tokens = True
        self._tok = own
        vocab = own.get_vocab(with_added_tokens=True)
        missing = [t for t in SPECIAL_TOKENS if t not in vocab]
        if missing:
            raise TokenizerError(f"tokenizer lacks the special tokens {', '.join(missing)}")
        self.special_ids = SpecialIds(*(vocab[t] for t in SPECIAL_TOKENS))
        self.vocab_size: int = own.get_vocab_size(with_added_tokens=True)
        _check_dense_ids(vocab, self.vocab_size)
        self.tag_token_ids: dict[str, int] = {
            added.content: token_id
            for token_id, added in sorted(own.get_added_tokens_decoder().items())
            if not added.special and _TAG_TOKEN.fullmatch(added.content)
        }
        config = json.loads(own.to_str())
        # Our own tokenizers read a giant word as one [UNK]; a bounded encode shortens such words first.
        self._long_words = LongWords.of(own, config)
        self._canonical = canonical_json(config)
        self.sha256: str = hashlib.sha256(self._canonical.encode("utf-8")).hexdigest()

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Unpickled (a process pool's copy): `encode_special_tokens` is no part of the Rust tokenizer's
        pickled JSON, and a copy without it read "[SEP]" in page text as the control id again."""
        self.__dict__.update(state)
        self._tok.encode_special_tokens = True

    @classmethod
    def from_file(cls, path: str | Path) -> HtmlTokenizer:
        """Load a `tokenizer.json`, or the `tokenizer.json` inside a directory."""
        file = Path(path)
        if file.is_dir():
            file = file / TOKENIZER_FILE
        if not file.is_file():
            raise TokenizerError(f"tokenizer file {file} does not exist")
        try:
            tok = Tokenizer.from_file(str(file))
        except Exception as exc:
            raise TokenizerError(f"{file} is not a valid tokenizer.json: {exc}") from exc
        return cls(tok)

    @classmethod
    def from_json(cls, text: str) -> HtmlTokenizer:
        """A tokenizer from `to_json`'s text (how a preprocessing process receives its copy)."""
        try:
            tok = Tokenizer.from_str(text)
        except Exception as exc:
            raise TokenizerError(f"not a valid tokenizer.json: {exc}") from exc
        return cls(tok)

    @classmethod
    def from_tokenizers(cls, tok: Tokenizer) -> HtmlTokenizer:
        """Wrap an in-memory `tokenizers.Tokenizer` (it is copied, not modified)."""
        return cls(tok)

    @property
    def backend(self) -> Tokenizer:
        """The underlying `tokenizers.Tokenizer` (a private copy; do not enable padding or truncation)."""
        return self._tok

    def _finish(self, content: list[int], max_length: int | None) -> Encoding:
        full_length = len(content) + 2
        truncated = max_length is not None and full_length > max_length
        if truncated:
            assert max_length is not None
            content = content[: max_length - 2]
        return Encoding(
            ids=[self.special_ids.cls, *content, self.special_ids.sep],
            truncated=truncated,
            full_length=full_length,
        )

    @staticmethod
    def _check_max_length(max_length: int | None) -> None:
        if max_length is not None and max_length < 2:
            raise TokenizerError(f"max_length must be at least 2 ([CLS] and [SEP]), got {max_length}")

    def encode(self, text: str, *, max_length: int | None = None, count_all: bool = True) -> Encoding:
        """Token ids of `text` framed by [CLS] ... [SEP], the content cut to fit `max_length`.

        `count_all=False` tokenizes only a prefix of a long text, enough to fill `max_length`: the ids
        and `truncated` are the same, `full_length` of a truncated text is only a lower bound. A page
        of 100 KB cut to 512 tokens then costs a few KB of tokenization instead of all of it (the
        service's hot path; the whole page took 3x the model's time per page on CPU).
        """
        self._check_max_length(max_length)
        if not isinstance(text, str):
            raise TokenizerError(f"encode takes text (str), got {type(text).__name__}")
        if max_length is not None and not count_all:
            budget = max_length - 2
            window = _first_window(budget)
            if window < len(text):
                content = self._leading_ids(text, window)  # enough for nearly every page
                if len(content) <= budget:
                    content = self._read_on(text, window, budget)
                return self._finish(content, max_length)
        return self._finish(self._encode_one(text).ids, max_length)

    def encode_with_offsets(self, text: str, *, max_length: int) -> OffsetEncoding:
        """The content ids and `truncated` of `encode(text, max_length=max_length, count_all=False)`, each
        id with its character offsets into `text` where they are certain.

        Bounded as that encode, and by the same rule (`_leading`): the offsets come from the prefix it
        tokenizes first (`_first_window`), so those given are the whole text's, and the ids past what
        that prefix holds for certain (after a giant word, which the longer read sees shortened) have
        None. Computing offsets over the whole text instead took seconds and a gigabyte for a 16 MB
        page of one word (the encoding holds ~800 bytes a token and an alignment per character).
        """
        self._check_max_length(max_length)
        if not isinstance(text, str):
            raise TokenizerError(f"encode_with_offsets takes text (str), got {type(text).__name__}")
        budget = max_length - 2
        window = _first_window(budget)
        if window < len(text):
            ids, offsets, certain = self._leading(text, window)
            content = ids[:certain] if certain > budget else self._read_on(text, window, budget)
        else:
            encoding = self._encode_one(text)
            content, offsets = encoding.ids, encoding.offsets
            certain = len(content)
        known = min(certain, budget, len(content))
        listed: list[tuple[int, int] | None] = [*offsets[:known]]
        listed += [None] * (min(budget, len(content)) - known)
        return OffsetEncoding(ids=content[:budget], offsets=listed, truncated=len(content) > budget)

    def _read_on(self, text: str, window: int, budget: int) -> list[int]:
        """The first content ids of a text whose first `window` characters held at most `budget` of them
        for certain: more than `budget` of them, or all. Read on with the long words shortened
        (service.core.words): the same ids, where a text of a few giant words was tokenized whole."""
        source = Shortened(text, self._long_words)
        while True:
            window *= 4
            head, whole = source.prefix(window)
            if whole:
                return self._encode_one(head).ids
            content = self._leading_ids(head, window)
            if len(content) > budget:  # more than fits: the whole text is truncated too
                return content

    def warm(self) -> None:
        """Build now what a bounded encode may need later: the character tables of service.core.words
        (about a second, once per process), which the first long page would otherwise build mid-request,
        holding the GIL. Servers and worker processes call it as they start."""
        if self._long_words is not None:
            word_chars()

    def _leading_ids(self, text: str, end: int) -> list[int]:
        """The first tokens of `text`'s whole encoding that `text[:end]` holds for certain (`_leading`)."""
        ids, _, keep = self._leading(text, end)
        return ids[:keep]

    def _leading(self, text: str, end: int) -> tuple[list[int], list[tuple[int, int]], int]:
        """The ids and offsets of a prefix of `text` of at most `end` characters, and how many of them
        (`keep`) are the first of `text`'s whole encoding, offsets included: those of the words that end
        `_MARGIN` characters or more before the cut (a word that reaches closer may change past it).
        Our tokenizers cut at a character where NFC's segments begin (`LongWords.segment_start`), since
        NFC alone reaches further than the margin: a letter composed with a mark past the cut, and the
        offsets of the tokens after it, differ from the prefix's."""
        if self._long_words is not None:
            end = self._long_words.segment_start(text, end)
        encoding = self._encode_one(text[:end])
        ids, words, offsets = encoding.ids, encoding.word_ids, encoding.offsets
        keep = len(ids)
        while keep and offsets[keep - 1][1] > end - _MARGIN:  # tokens are in text order
            keep -= 1
        if keep < len(ids):  # the word of the first token dropped goes whole
            while keep and words[keep - 1] is not None and words[keep - 1] == words[keep]:
                keep -= 1
        return ids, offsets, keep

    def _encode_one(self, text: str) -> TokenizersEncoding:
        """One text's encoding, without [CLS]/[SEP]. Through `encode_batch`, which releases the GIL while
        Rust works (`Tokenizer.encode` holds it: a megabyte page stalled every other thread, the
        server's event loop included, for seconds)."""
        try:
            return self._tok.encode_batch([text], add_special_tokens=False)[0]
        except TypeError:  # lone surrogates cannot cross into Rust; bad input must not crash
            return self._tok.encode_batch([_scrub(text)], add_special_tokens=False)[0]

    def encode_batch(self, texts: Sequence[str], *, max_length: int | None = None) -> list[Encoding]:
        """`encode` for many texts at once (the Rust side runs them in parallel)."""
        self._check_max_length(max_length)
        if isinstance(texts, str):  # a str is a sequence too: of one-character texts
            raise TokenizerError("encode_batch takes a sequence of texts, not one text (str)")
        texts = list(texts)  # an iterator was consumed by the type check and encoded as nothing
        bad = [type(t).__name__ for t in texts if not isinstance(t, str)]
        if bad:
            raise TokenizerError(f"encode_batch takes texts (str), got {bad[0]}")
        if not texts:
            return []
        try:
            encodings = self._tok.encode_batch(texts, add_special_tokens=False)
        except TypeError:
            encodings = self._tok.encode_batch([_scrub(t) for t in texts], add_special_tokens=False)
        return [self._finish(e.ids, max_length) for e in encodings]

    def decode(self, ids: Sequence[int]) -> str:
        """The text of `ids`, special tokens left out, tag tokens kept."""
        values = []
        for token_id in ids:
            try:
                value = operator.index(token_id)  # numpy and torch integers too
            except TypeError:
                raise TokenizerError(f"token id {token_id!r} is not an integer") from None
            if not 0 <= value < self.vocab_size:
                raise TokenizerError(f"token id {token_id!r} is outside the vocabulary of {self.vocab_size}")
            values.append(value)
        return self._tok.decode(values, skip_special_tokens=True)

    def id_to_token(self, token_id: int) -> str | None:
        """The token string of one id (None outside the vocabulary); for debugging and reports."""
        return self._tok.id_to_token(token_id)

    def tokens(self, text: str) -> list[str]:
        """The token strings of `text` without [CLS]/[SEP]; for debugging and reports."""
        return list(self._encode_one(text).tokens)

    def to_json(self) -> str:
        """The canonical JSON that `sha256` hashes (what `save` writes, up to indentation)."""
        return self._canonical

    def save(self, path: str | Path) -> None:
        """Write `tokenizer.json` to `path` (a `.json` file, or a directory that gets `tokenizer.json`).

        Through a temporary file renamed over it: a symlink there (a Hugging Face cache snapshot) is
        replaced, not written through into the file it points at, and a killed save leaves no half file.
        """
        target = Path(path)
        if target.suffix != ".json":
            target = target / TOKENIZER_FILE
        target.parent.mkdir(parents=True, exist_ok=True)
        data: Any = json.loads(self._canonical)
        with replaced_atomically(target) as tmp:
            tmp.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")

    def __repr__(self) -> str:
        return (
            f"HtmlTokenizer(vocab_size={self.vocab_size}, tags={len(self.tag_token_ids)}, "
            f"sha256={self.sha256[:12]})"
        )
