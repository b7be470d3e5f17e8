"""service.core.words: the word-character table agrees with `tokenizers`, shortening long words keeps
every id, and a bounded encode of a text of giant words reads a bounded amount of it."""

from __future__ import annotations

import json
import random
import sys

import numpy as np
import pytest
from tokenizers import AddedToken, Tokenizer, models, normalizers, pre_tokenizers

from service.core.tokenizer import HtmlTokenizer
from service.core.words import LongWords, html_normalizer, html_pre_tokenizer, word_chars
from tests.factories.tokenizer import build_tiny_tokenizer, generate_pruned_pages, record_reads


@pytest.fixture(scope="module")
def tok() -> HtmlTokenizer:
    return build_tiny_tokenizer()


def test_every_word_character_is_inside_a_word_for_tokenizers() -> None:
    """Each character the table marks, between two letters, normalizes and pre-tokenizes as part of one
    word (checked one by one, against the installed `tokenizers`, in every plane anything is assigned
    in; planes 4-13 are unassigned and 15-16 private use, the same to every version of the tables)."""
    table = word_chars()
    marked = np.flatnonzero(table)
    assert 1_000_000 < marked.size < sys.maxunicode
    normalizer, pre_tokenizer = html_normalizer(), html_pre_tokenizer()
    checked = marked[(marked < 0x40000) | ((marked >= 0xE0000) & (marked < 0xF0000))]
    for chunk in np.array_split(checked, 32):
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
    for char in " \t\u00a0\u3000.,!<>_-$+\u2581\u4e2d\u3042\u3099\u0085\u166d\u1fef":
        assert not table[ord(char)], hex(ord(char))  # boundaries never are
    # What `tokenizers` keeps inside a word is: format, control, private-use and unassigned characters
    # split no run (one every 400 characters kept a 16 MB word from being shortened: 11.9 s).
    for char in "\u00ad\u200b\ufeff\x01\x7f\u0378\ue000\U00050000\U0010fffd":
        assert table[ord(char)], hex(ord(char))


def test_stable_characters_are_where_nfc_can_cut() -> None:
    """After a mark of the highest combining class, a stable character stays where and as it is, so
    NFC of what precedes it and of what follows it are independent; marks, the jamo that compose with
    the syllable before them, and characters NFC changes are not stable."""
    from service.core.words import word_tables

    word, stable, starts = word_tables()
    assert not (stable & ~starts).any()
    assert not (stable & ~word).any()
    normalizer = normalizers.NFC()
    codes = np.flatnonzero(starts)
    checked = codes[(codes < 0x40000) | ((codes >= 0xE0000) & (codes < 0xF0000))]
    for chunk in np.array_split(checked, 16):
        text = "".join("a\u0345" + chr(code) for code in chunk)
        assert normalizer.normalize_str(text) == text
    for char in "\u0301\u0345\u1161\u11a8\u0b3e\u212b\u3099":
        assert not stable[ord(char)], hex(ord(char))
    for char in "xé\u00ad\u0378\ue000":
        assert stable[ord(char)], hex(ord(char))


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
        ("x" * 400 + "\u00ad") * 10_000,  # characters tokenizers keeps inside a word split no run
        ("y" * 300 + "\x01") * 10_000,
    ],
    ids=["one 4 MB word", "words of 30 KB", "jamo words", "symbols", "soft hyphens", "controls"],
)
def test_a_text_of_giant_words_is_read_in_a_bounded_prefix(
    tok: HtmlTokenizer, text: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The whole text was tokenized (a 16 MB word: 6 s of a worker); now what is read is of the order
    of the budget times the kept head of a word (416 characters for jamo, which NFC composes 3 to 1)."""
    want = tok.encode(text, max_length=130)
    read = record_reads(tok, monkeypatch)
    got = tok.encode(text, max_length=130, count_all=False)
    assert (got.ids, got.truncated) == (want.ids, want.truncated)
    assert sum(read) < 500_000 < len(text), read


def test_tokenizers_that_split_otherwise_are_not_shortened() -> None:
    """Only our normalizer and pre-tokenizer, a WordPiece model and tags that start and end outside
    a word get the shortening: for any other, a cut run could change the ids."""
    ours = build_tiny_tokenizer()
    assert LongWords.of(ours.backend, json.loads(ours.backend.to_str())) is not None

    other = Tokenizer.from_str(ours.backend.to_str())
    other.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), html_pre_tokenizer()]
    )
    assert LongWords.of(other, json.loads(other.to_str())) is None
    lowercased = Tokenizer.from_str(ours.backend.to_str())
    lowercased.normalizer = normalizers.Sequence([html_normalizer(), normalizers.Lowercase()])
    assert LongWords.of(lowercased, json.loads(lowercased.to_str())) is None
    wordy = Tokenizer.from_str(ours.backend.to_str())
    wordy.add_tokens([AddedToken("abc", normalized=False)])
    assert LongWords.of(wordy, json.loads(wordy.to_str())) is None
    bpe = Tokenizer(models.BPE())
    bpe.normalizer, bpe.pre_tokenizer = html_normalizer(), html_pre_tokenizer()
    assert LongWords.of(bpe, json.loads(bpe.to_str())) is None
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


@pytest.mark.parametrize(
    "text",
    [
        "x\u0301" * 104 + "x" * 400 + "\u3099 y",
        "x" * 500 + "\u0301" * 50 + "\u3099 y",
        "x" * 500 + "\u0301" * 50 + "\u309a\u0301 y",
        "x" * 900 + "\u1100" + "\u1161" * 400 + "\u11a8 y",
        "x" * 900 + "\u0301" * 600 + " y",
    ],
    ids=["head ends in a mark", "run ends in marks", "semi-voiced", "jamo tail", "a pile of marks"],
)
def test_a_cut_keeps_how_nfc_reorders_and_composes_the_runs_end(tok: HtmlTokenizer, text: str) -> None:
    """U+3099 and U+309A are combining marks outside every run (they are in the CJK range): NFC moves
    them before a run's trailing marks of higher class, so a cut that replaced the run's last
    combining sequence changed the ids. The cut ends at the run's last stable character."""
    assert tok._long_words is not None
    shortened = tok._long_words.shorten(text)
    assert tok.encode(shortened).ids == tok.encode(text).ids
    page = "z " * 3000 + text * 20
    for max_length in (16, 130, 4000, 6100):
        want = tok.encode(page, max_length=max_length)
        got = tok.encode(page, max_length=max_length, count_all=False)
        assert (got.ids, got.truncated) == (want.ids, want.truncated), max_length


@pytest.mark.parametrize("pile", ["x" + "\u0301" * 300_000, "\u1161" * 300_000])
def test_a_word_with_nowhere_to_cut_is_refused_past_the_bound(tok: HtmlTokenizer, pile: str) -> None:
    """A pile of combining marks (or of jamo vowels) has no stable character to cut at: 4 MB of them
    took 2.7 s to tokenize. Past `MAX_UNCUT` characters the bounded encode refuses the page, as the
    pruner refuses pathological nesting; below it, the ids are exact."""
    from service.core.words import MAX_UNCUT, WordTooLongError

    with pytest.raises(WordTooLongError) as caught:
        tok.encode(pile + " end", max_length=64, count_all=False)
    assert caught.value.code.value == "preprocess_failed" and str(MAX_UNCUT) in caught.value.message
    short = pile[: MAX_UNCUT // 2] + " and then ordinary words" * 50
    assert tok.encode(short, max_length=64, count_all=False).ids == tok.encode(short, max_length=64).ids


@pytest.mark.parametrize("max_length", [3, 64, 512])
def test_nfc_reaching_past_the_margin_does_not_change_the_leading_ids(
    tok: HtmlTokenizer, max_length: int
) -> None:
    """A letter composes with a mark hundreds of characters later when the marks between are of a lower
    class, and U+3099 between makes the letter a word of its own that ends long before the window's cut:
    the window must end where NFC's segments start, not merely a margin after the last word kept."""
    text = "." * (max_length - 3) + "a\u3099" + "\u0316" * (10 * max_length + 300) + "\u0301" + " word" * 50
    want = tok.encode(text, max_length=max_length)
    got = tok.encode(text, max_length=max_length, count_all=False)
    assert (got.ids, got.truncated) == (want.ids, want.truncated)
