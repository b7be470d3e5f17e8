"""service.core.words: the word-character table agrees with `tokenizers`, shortening long words keeps
every id, and a bounded encode of a text of giant words reads a bounded amount of it."""

from __future__ import annotations

import random
import sys

import numpy as np
import pytest
from tokenizers import AddedToken, Tokenizer, models, normalizers, pre_tokenizers

from service.core.tokenizer import HtmlTokenizer
from service.core.words import LongWords, html_normalizer, html_pre_tokenizer, word_chars
from tests.factories.tokenizer import build_tiny_tokenizer, generate_pruned_pages


@pytest.fixture(scope="module")
def tok() -> HtmlTokenizer:
    return build_tiny_tokenizer()


def test_every_word_character_is_inside_a_word_for_tokenizers() -> None:
    """Each character the table marks, between two letters, normalizes and pre-tokenizes as part of one
    word (checked for all of them, against the installed `tokenizers`)."""
    table = word_chars()
    marked = np.flatnonzero(table)
    assert 40_000 < marked.size < sys.maxunicode
    normalizer, pre_tokenizer = html_normalizer(), html_pre_tokenizer()
    for chunk in np.array_split(marked, 16):
        segments = ["a" + chr(code) + "a" for code in chunk]
        pieces = pre_tokenizer.pre_tokenize_str(normalizer.normalize_str(" ".join(segments)))
        assert len(pieces) == len(segments), next(
            (
                hex(int(code))
                for code in chunk
                if len(pre_tokenizer.pre_tokenize_str(normalizer.normalize_str("a" + chr(code) + "a"))) != 1
            ),
            None,
        )
    for char in " \t\u00a0\u3000.,!<>_-$+\u2581\u4e2d\u3042\u0085\ufeff\u200b":
        assert not table[ord(char)], hex(ord(char))  # boundaries (and format characters) never are


def _runs_text(rng: random.Random) -> str:
    """Text of giant and ordinary words from many kinds of characters, with the boundaries our
    pre-tokenizer knows, tags, and marks and jamo that NFC composes."""
    word_alphabets = [
        "x",
        "abcXYZ019",
        "é\u0301ü",  # precomposed letters and a combining acute
        "\u1100\u1161\u11a8",  # jamo that NFC composes three into one syllable
        "©®∑€",  # symbols: one word with letters for the pre-tokenizer
        "привет",
        "e\u0301\u0302\u0303",  # a letter under a pile of marks
    ]
    separators = [" ", ".", ", ", "中", "<p>", "</p>", " <li>", "▁", "\u3000", "\n\n", "-", "\ufeff"]
    parts = []
    for _ in range(rng.randint(1, 12)):
        alphabet = rng.choice(word_alphabets)
        length = rng.choice([1, 5, 99, 100, 101, 104, 105, 207, 208, 209, 500, 3_000, 20_000])
        parts.append("".join(rng.choice(alphabet) for _ in range(length)))
        parts.append(rng.choice(separators))
    return "".join(parts) + " ".join(generate_pruned_pages(1, seed=rng.randint(0, 9))[0].split()[:50])


@pytest.mark.parametrize("seed", range(30))
def test_bounded_encoding_of_giant_words_is_exact(tok: HtmlTokenizer, seed: int) -> None:
    assert tok._long_words is not None  # our tokenizers get the shortening
    rng = random.Random(seed)
    text = _runs_text(rng)
    for max_length in (2, 3, 8, 64, 512):
        want = tok.encode(text, max_length=max_length)
        got = tok.encode(text, max_length=max_length, count_all=False)
        assert (got.ids, got.truncated) == (want.ids, want.truncated), max_length
    shortened = tok._long_words.shorten(text)
    assert tok.encode(shortened).ids == tok.encode(text).ids


@pytest.mark.parametrize(
    "text",
    [
        "x" * 4_000_000,
        " ".join(["y" * 30_000] * 140),
        " ".join(["\u1100\u1161\u11a8" * 1000] * 1000),
        "©" * 2_000_000 + " the end",
    ],
    ids=["one 4 MB word", "words of 30 KB", "jamo words", "symbols"],
)
def test_a_text_of_giant_words_is_read_in_a_bounded_prefix(
    tok: HtmlTokenizer, text: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The whole text was tokenized (a 16 MB word: 6 s of a worker); now what is read is of the order
    of the budget times the kept head of a word (416 characters for jamo, which NFC composes 3 to 1)."""
    want = tok.encode(text, max_length=130)
    read: list[int] = []
    encode_one = tok._encode_one

    def counting(prefix: str) -> object:
        read.append(len(prefix))
        return encode_one(prefix)

    monkeypatch.setattr(tok, "_encode_one", counting)
    got = tok.encode(text, max_length=130, count_all=False)
    assert (got.ids, got.truncated) == (want.ids, want.truncated)
    assert sum(read) < 500_000 < len(text), read


def test_tokenizers_that_split_otherwise_are_not_shortened() -> None:
    """Only our normalizer and pre-tokenizer, a WordPiece model and tags that start and end outside
    a word get the shortening: for any other, a cut run could change the ids."""
    ours = build_tiny_tokenizer()
    assert LongWords.of(ours.backend) is not None

    other = Tokenizer.from_str(ours.backend.to_str())
    other.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), html_pre_tokenizer()]
    )
    assert LongWords.of(other) is None
    lowercased = Tokenizer.from_str(ours.backend.to_str())
    lowercased.normalizer = normalizers.Sequence([html_normalizer(), normalizers.Lowercase()])
    assert LongWords.of(lowercased) is None
    wordy = Tokenizer.from_str(ours.backend.to_str())
    wordy.add_tokens([AddedToken("abc", normalized=False)])
    assert LongWords.of(wordy) is None
    bpe = Tokenizer(models.BPE())
    bpe.normalizer, bpe.pre_tokenizer = html_normalizer(), html_pre_tokenizer()
    assert LongWords.of(bpe) is None
    digits = HtmlTokenizer.from_tokenizers(other)
    text = "1" * 5000 + " " + "x" * 5000 + " end"
    assert digits.encode(text, max_length=64, count_all=False).ids == digits.encode(text, max_length=64).ids


def _composing_tokenizer() -> HtmlTokenizer:
    """A WordPiece vocabulary that knows the characters NFC composes three to one ("ế" from e and two
    marks, "각" from three jamo), so a word of them under the limit is read, not [UNK]."""
    pieces = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "▁", "x", "##x", "▁x"]
    for char in ("ế", "각", "e", "ê", "ᄀ", "가"):  # and what a cut between the three leaves
        pieces += [char, "##" + char, "▁" + char]
    tok = Tokenizer(models.WordPiece({piece: i for i, piece in enumerate(pieces)}, unk_token="[UNK]"))
    tok.normalizer, tok.pre_tokenizer = html_normalizer(), html_pre_tokenizer()
    return HtmlTokenizer.from_tokenizers(tok)


@pytest.mark.parametrize("count", [30, 69, 70, 99, 100, 277, 278, 400])
@pytest.mark.parametrize("unit", ["e\u0302\u0301", "\u1100\u1161\u11a8"])
def test_a_run_that_composes_is_shortened_only_to_a_head_over_the_limit(count: int, unit: str) -> None:
    """300 characters that NFC makes 100 are one word WordPiece reads (100 pieces); a head of 208 would
    be 69 pieces, so the run is kept whole, or cut to a head that is over the limit once composed."""
    tok = _composing_tokenizer()
    assert tok._long_words is not None
    text = "x " * 40 + unit * count + " x" * 200
    for max_length in (50, 200, 600):
        want = tok.encode(text, max_length=max_length)
        got = tok.encode(text, max_length=max_length, count_all=False)
        assert (got.ids, got.truncated) == (want.ids, want.truncated), max_length
    assert tok.encode(tok._long_words.shorten(text)).ids == tok.encode(text).ids
    unk = tok.special_ids.unk
    assert (unk in tok.encode(text).ids) == (1 + count > 100)  # the word is `▁` and the run
