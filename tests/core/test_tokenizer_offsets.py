"""HtmlTokenizer.encode_with_offsets: the bounded encode's ids, each with the whole text's offsets where
the bounded read is certain of them (what TEI's /tokenize lists), by the one cut rule `encode` reads by."""

from __future__ import annotations

import random

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers

from service.core.tokenizer import SPECIAL_TOKENS, HtmlTokenizer, OffsetEncoding, TokenizerError
from tests.factories.tokenizer import WORDS, build_tiny_tokenizer, generate_pruned_page, generate_pruned_pages

# NFC composes "и" with the U+0306 after the run (the marks between are of a lower class), and U+3099
# makes the letter a word of its own: a cut inside the run reads the letter uncomposed, and the tokens
# after it one character off the whole text's offsets.
COMPOSED_ACROSS = "и\u3099" + "\u0316" * 3000 + "\u0306"


@pytest.fixture(scope="module")
def tok() -> HtmlTokenizer:
    return build_tiny_tokenizer()


def _texts() -> dict[str, str]:
    """Long texts whose first window (8 characters a token) is cut at awkward places."""
    rng = random.Random(5)
    pieces = [*WORDS, "e\u0301\u0301", "東京の天気", "x" * 150, "Příliš", "<p>", "</p>", " ", "  ", "\u3000"]
    words = " ".join(generate_pruned_pages(3, seed=2))
    return {
        "pages": words * 4,
        "mixed": generate_pruned_page(rng) + " ".join(rng.choice(pieces) for _ in range(3000)),
        "cjk": "<p>" + "北京是中华人民共和国的首都。東京の天気" * 400 + "</p>" + words,
        "punctuation": "<div>" + "!?-=*" * 2000 + "</div>" + words,
        "marks": "e\u0301," * 3000 + words,
        "composed across": "the " * 150 + COMPOSED_ACROSS + " sport" * 300,
        "giant words": (" " + "z" * 5000) * 6 + words,
    }


def assert_whole_texts_offsets(tok: HtmlTokenizer, text: str, max_length: int) -> int:
    """`encode_with_offsets` gives the bounded encode's ids and the whole text's offsets, None only in a
    suffix; returns how many offsets it gives."""
    got = tok.encode_with_offsets(text, max_length=max_length)
    want = tok.encode(text, max_length=max_length, count_all=False)
    assert got.ids == want.ids[1:-1] and got.truncated == want.truncated, max_length
    assert len(got.offsets) == len(got.ids)
    known = [o for o in got.offsets if o is not None]
    whole = tok.backend.encode_batch([text], add_special_tokens=False)[0]
    assert got.offsets[: len(known)] == known == whole.offsets[: len(known)], max_length
    return len(known)


@pytest.mark.parametrize("name", sorted(_texts()))
def test_the_ids_are_the_bounded_encodes_and_the_offsets_the_whole_texts(
    tok: HtmlTokenizer, name: str
) -> None:
    text = _texts()[name]
    for max_length in (2, 3, 17, 64, 300, 1500):
        assert_whole_texts_offsets(tok, text, max_length)


def test_a_text_the_first_window_holds_has_every_offset(tok: HtmlTokenizer) -> None:
    text = generate_pruned_pages(1, seed=3)[0]
    whole = tok.backend.encode_batch([text], add_special_tokens=False)[0]
    got = tok.encode_with_offsets(text, max_length=len(whole.ids) + 2)
    assert (got.ids, got.offsets, got.truncated) == (whole.ids, whole.offsets, False)
    cut = tok.encode_with_offsets(text, max_length=12)
    assert (cut.ids, cut.offsets, cut.truncated) == (whole.ids[:10], whole.offsets[:10], True)
    assert tok.encode_with_offsets("x", max_length=2) == OffsetEncoding(ids=[], offsets=[], truncated=True)
    assert tok.encode_with_offsets("", max_length=8) == OffsetEncoding(ids=[], offsets=[], truncated=False)


def test_ordinary_words_have_offsets_up_to_the_budget(tok: HtmlTokenizer) -> None:
    """The first window, 8 characters a token, holds far more than the budget of ordinary words."""
    text = _texts()["pages"]
    for max_length in (17, 64, 300):
        assert assert_whole_texts_offsets(tok, text, max_length) == max_length - 2


def test_marks_composing_across_the_cut_move_the_cut_before_the_letter(tok: HtmlTokenizer) -> None:
    """The window (8 * 254 characters) ends inside the run of marks: the tokens before the run have
    offsets, the letter's and those after it none (the prefix reads them one character off)."""
    text = _texts()["composed across"]
    start = text.index(COMPOSED_ACROSS)
    got = tok.encode_with_offsets(text, max_length=256)
    assert start < 8 * 254 < start + len(COMPOSED_ACROSS)
    known = [o for o in got.offsets if o is not None]
    assert 100 < len(known) < 150 and known[-1][1] <= start - 128
    assert_whole_texts_offsets(tok, text, 256)


def test_tokens_only_a_longer_read_finds_have_no_offsets(tok: HtmlTokenizer) -> None:
    """A giant word is one [UNK], read past in a shortened text whose offsets are not the text's."""
    text = "<p>weather " + "a" * 40_000 + " sport</p>"
    got = tok.encode_with_offsets(text, max_length=64)
    assert got.ids == tok.encode(text).ids[1:-1] and not got.truncated
    unk = got.ids.index(tok.special_ids.unk)
    assert all(o is not None for o in got.offsets[:unk])
    assert all(o is None for o in got.offsets[unk:])
    assert "".join(text[o[0] : o[1]] for o in got.offsets[:unk] if o is not None) == "<p>weather"


def test_a_tokenizer_not_ours_reads_by_the_margin_alone() -> None:
    """A foreign tokenizer (no `LongWords`, so no NFC-safe cut) still gets the whole text's ids and
    offsets."""
    vocab = {token: i for i, token in enumerate([*SPECIAL_TOKENS, "the", "page", "news", ",", "."])}
    raw = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    foreign = HtmlTokenizer.from_tokenizers(raw)
    assert foreign._long_words is None
    text = "the page, news. other " * 500
    for max_length in (2, 17, 300, 3000):
        assert_whole_texts_offsets(foreign, text, max_length)


def test_bad_input_is_a_tokenizer_error_and_lone_surrogates_are_read(tok: HtmlTokenizer) -> None:
    with pytest.raises(TokenizerError, match="at least 2"):
        tok.encode_with_offsets("<p>a</p>", max_length=1)
    with pytest.raises(TokenizerError, match="takes text"):
        tok.encode_with_offsets(b"<p>a</p>", max_length=16)  # type: ignore[arg-type]
    text = "<p>a\ud800b</p> " * 300
    got = tok.encode_with_offsets(text, max_length=64)
    assert got.ids == tok.encode(text, max_length=64).ids[1:-1] and got.truncated
    assert all(o is not None for o in got.offsets)  # the scrubbed text has the same length
