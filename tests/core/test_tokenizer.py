"""HtmlTokenizer: round trips, tag tokens, truncation, special ids, loading errors and the stable hash."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers

from service.core.tokenizer import SPECIAL_TOKENS, HtmlTokenizer, TokenizerError
from tests.factories.tokenizer import build_tiny_tokenizer, generate_pruned_pages, record_reads


@pytest.fixture(scope="module")
def tok() -> HtmlTokenizer:
    return build_tiny_tokenizer()


def test_special_ids_are_the_ids_of_the_special_tokens(tok: HtmlTokenizer) -> None:
    ids = tok.special_ids
    assert [ids.pad, ids.unk, ids.cls, ids.sep, ids.mask] == [
        tok.backend.token_to_id(t) for t in SPECIAL_TOKENS
    ]
    assert len({ids.pad, ids.unk, ids.cls, ids.sep, ids.mask}) == 5
    encoding = tok.encode("<p>Hello</p>")
    assert encoding.ids[0] == ids.cls and encoding.ids[-1] == ids.sep
    assert ids.pad not in encoding.ids and ids.mask not in encoding.ids


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_decode_encode_round_trips_unseen_pages(tok: HtmlTokenizer, seed: int) -> None:
    for page in generate_pruned_pages(5, seed=seed):
        assert tok.decode(tok.encode(page).ids) == page


@pytest.mark.parametrize(
    "text",
    [
        "<p>Hello</p>",
        "<div>Prague <b>news</b>: weather today.</div><br><p>Praha, úterý</p>",
        "<li>price 3.5 &amp; 50%</li> <li>(new)</li>",
        "<p>text with <unknowntag>inside</unknowntag> it</p>",
        "plain text without any tags",
    ],
)
def test_decode_keeps_tags_and_text(tok: HtmlTokenizer, text: str) -> None:
    assert tok.decode(tok.encode(text).ids) == text


def test_each_top_tag_is_one_token_even_glued_to_text(tok: HtmlTokenizer) -> None:
    assert tok.tag_token_ids, "the tiny tokenizer should have tag tokens"
    for tag, token_id in tok.tag_token_ids.items():
        tokens = tok.tokens(f"word{tag}Text")
        assert tag in tokens, (tag, tokens)
        assert tok.encode(f"x{tag}y").ids.count(token_id) == 1
    tokens = tok.tokens("<p>Hello</p>")
    assert tokens[0] == "<p>" and tokens[-1] == "</p>"
    assert not {"<", "/", ">", "p"} & set(tokens)


def test_tag_tokens_cover_the_frequent_tags_and_void_tags_only_open(tok: HtmlTokenizer) -> None:
    for tag in ("div", "p", "a", "li"):
        assert f"<{tag}>" in tok.tag_token_ids and f"</{tag}>" in tok.tag_token_ids
    assert "<br>" in tok.tag_token_ids and " <br>" in tok.tag_token_ids
    assert "</br>" not in tok.tag_token_ids and " </br>" not in tok.tag_token_ids


def test_tags_are_not_special_so_decode_keeps_them(tok: HtmlTokenizer) -> None:
    added = tok.backend.get_added_tokens_decoder()
    assert all(not added[i].special for i in tok.tag_token_ids.values())
    assert tok.decode([tok.tag_token_ids["<p>"], tok.special_ids.cls]) == "<p>"


def test_casing_is_kept(tok: HtmlTokenizer) -> None:
    assert tok.decode(tok.encode("Prague PRAGUE prague").ids) == "Prague PRAGUE prague"
    assert tok.encode("Home").ids != tok.encode("home").ids


def test_truncation_keeps_cls_and_sep(tok: HtmlTokenizer) -> None:
    page = generate_pruned_pages(1, seed=9)[0]
    full = tok.encode(page)
    assert not full.truncated and full.full_length == len(full.ids) > 40
    cut = tok.encode(page, max_length=32)
    assert len(cut.ids) == 32 and cut.truncated and cut.full_length == full.full_length
    assert cut.ids[0] == tok.special_ids.cls and cut.ids[-1] == tok.special_ids.sep
    assert cut.ids[1:-1] == full.ids[1:31]
    exact = tok.encode(page, max_length=full.full_length)
    assert exact.ids == full.ids and not exact.truncated
    assert tok.encode(page, max_length=2).ids == [tok.special_ids.cls, tok.special_ids.sep]
    with pytest.raises(TokenizerError):
        tok.encode(page, max_length=1)


def _awkward_page(seed: int) -> str:
    """A long generated page with what a prefix cut could break: whitespace runs, tags glued to text
    and after spaces, decomposed accents, CJK without spaces, surrogates, a long unbroken token."""
    import random

    rng = random.Random(seed)
    parts = generate_pruned_pages(6, seed=seed)
    extras = [
        "  \n\t <p>",
        "e\u0301t\u00e9 ",
        "\u6f22\u5b57\u6587\u5b57\u5217" * 20,
        " </div>",
        "\ud800 ",
        "x" * 700,
        " <br>",
        "caf\u00e9\u0301 ",
        "\u00a0\u00a0",
        "<li>a</li>",
        ". , ; ",
        "\u3000",
    ]
    out = []
    for part in parts:
        words = part.split(" ")
        for word in words:
            out.append(word)
            out.append(rng.choice([" ", " ", "  ", "\n", rng.choice(extras)]))
    return "".join(out)


@pytest.mark.parametrize("seed", range(4))
def test_bounded_encoding_equals_the_full_encoding_cut(tok: HtmlTokenizer, seed: int) -> None:
    page = _awkward_page(seed)
    full = tok.encode(page)
    assert full.full_length > 2000  # long enough that the bounded path cuts it
    for max_length in (2, 3, 17, 64, 129, 512, 1000, full.full_length - 1, full.full_length, 10**6):
        exact = tok.encode(page, max_length=max_length)
        bounded = tok.encode(page, max_length=max_length, count_all=False)
        assert bounded.ids == exact.ids, max_length
        assert bounded.truncated == exact.truncated, max_length
        if bounded.truncated:
            assert max_length < bounded.full_length <= exact.full_length  # a lower bound
        else:
            assert bounded.full_length == exact.full_length


def _unspaced_texts() -> dict[str, str]:
    """Long texts without whitespace for megabytes, as real pages have them (CJK prose, punctuation art,
    tags glued to text, an inline blob), each followed by ordinary words."""
    words = " ".join(generate_pruned_pages(2, seed=9))
    return {
        "cjk": "<p>" + "北京是中华人民共和国的首都。東京の天気" * 400 + "</p>" + words,
        "punctuation": "<div>" + "!?-=*" * 2000 + "</div>" + words,
        "glued tags": "<ul>" + "<li>item</li><li>x,y</li>" * 500 + "</ul>" + words,
        "one long word": "x" * 5000 + words,
        "marks": "e\u0301," * 3000 + words,  # a combining mark at many cuts
    }


@pytest.mark.parametrize("name", sorted(_unspaced_texts()))
def test_bounded_encoding_is_exact_and_bounded_without_whitespace(
    tok: HtmlTokenizer, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bounded encode cuts at any character, not only at whitespace: the ids are the whole text's
    first ones, and it reads a prefix of the order of the budget, not the text up to its next space."""
    text = _unspaced_texts()[name]
    exact = {n: tok.encode(text, max_length=n) for n in (2, 17, 64, 300)}
    read = record_reads(tok, monkeypatch)
    for max_length, want in exact.items():
        read.clear()
        got = tok.encode(text, max_length=max_length, count_all=False)
        assert got.ids == want.ids and got.truncated == want.truncated, max_length
        if name != "one long word":  # one token in 5,000 characters: read on past it (bounded in test_words)
            assert sum(read) <= 4 * max(256, 8 * max_length), (max_length, read)


@pytest.mark.parametrize("name", sorted(_unspaced_texts()))
def test_a_cut_at_any_character_keeps_only_the_whole_texts_first_tokens(
    tok: HtmlTokenizer, name: str
) -> None:
    """The invariant under the bounded encode, at every cut position: inside a tag token, between a
    letter and its combining mark, within a word, in a run of punctuation."""
    text = _unspaced_texts()[name][:700] + " " + _awkward_page(0)[:300]
    whole = tok.encode(text).ids[1:-1]
    for end in range(1, len(text)):
        leading = tok._leading_ids(text, end)
        assert leading == whole[: len(leading)], end


def test_empty_text_is_cls_sep(tok: HtmlTokenizer) -> None:
    encoding = tok.encode("")
    assert encoding.ids == [tok.special_ids.cls, tok.special_ids.sep] and encoding.full_length == 2


def test_encode_batch_equals_encode(tok: HtmlTokenizer) -> None:
    pages = generate_pruned_pages(6, seed=4)
    assert tok.encode_batch(pages, max_length=64) == [tok.encode(p, max_length=64) for p in pages]
    assert tok.encode_batch([]) == []
    with pytest.raises(TokenizerError):
        tok.encode_batch(["ok", b"bytes"])  # type: ignore[list-item]


def test_encode_batch_takes_any_iterable_but_not_one_str(tok: HtmlTokenizer) -> None:
    # A generator was consumed by the type check and came back as no encodings at all; a str was
    # encoded character by character.
    pages = ["<p>one</p>", "<p>two</p>"]
    assert tok.encode_batch(page for page in pages) == tok.encode_batch(pages)  # type: ignore[arg-type]
    with pytest.raises(TokenizerError, match="not one text"):
        tok.encode_batch("<p>one</p>")


def test_unknown_script_becomes_unk_not_an_error(tok: HtmlTokenizer) -> None:
    encoding = tok.encode("<p>東京の天気</p>")
    assert tok.special_ids.unk in encoding.ids
    assert tok.decode(encoding.ids) == "<p></p>"


def test_lone_surrogates_and_control_characters_do_not_crash(tok: HtmlTokenizer) -> None:
    text = "<p>a\ud800b</p>"
    encoding = tok.encode(text)
    assert encoding.ids[0] == tok.special_ids.cls and tok.decode(encoding.ids).startswith("<p>")
    assert tok.encode_batch([text, "<p>ok</p>"])[0] == encoding
    # As decode_html reads the same character: U+FFFD, not the codec's "?" (a punctuation token).
    assert encoding == tok.encode("<p>a\ufffdb</p>") != tok.encode("<p>a?b</p>")
    assert tok.decode(tok.encode("<p>\x00\x01</p>").ids).startswith("<p>")


def test_encoder_is_picklable_for_worker_processes(tok: HtmlTokenizer) -> None:
    clone = pickle.loads(pickle.dumps(tok))
    page = generate_pruned_pages(1, seed=13)[0]
    assert clone.sha256 == tok.sha256 and clone.encode(page) == tok.encode(page)


def test_decode_rejects_ids_outside_the_vocabulary(tok: HtmlTokenizer) -> None:
    with pytest.raises(TokenizerError):
        tok.decode([tok.vocab_size])
    with pytest.raises(TokenizerError):
        tok.decode([-1])
    with pytest.raises(TokenizerError, match="not an integer"):
        tok.decode([1.5])  # type: ignore[list-item]


def test_decode_takes_numpy_integers(tok: HtmlTokenizer) -> None:
    ids = tok.encode("<p>hello world</p>").ids
    assert tok.decode(list(np.array(ids, dtype=np.int64))) == tok.decode(ids)


def test_save_load_keeps_the_tokenizer_and_its_hash(tok: HtmlTokenizer, tmp_path: Path) -> None:
    tok.save(tmp_path)
    loaded = HtmlTokenizer.from_file(tmp_path)
    assert loaded.sha256 == tok.sha256 and loaded.vocab_size == tok.vocab_size
    assert loaded.tag_token_ids == tok.tag_token_ids and loaded.special_ids == tok.special_ids
    page = generate_pruned_pages(1, seed=11)[0]
    assert loaded.encode(page) == tok.encode(page)
    # The hash does not depend on how the file is formatted.
    compact = tmp_path / "compact.json"
    compact.write_text(json.dumps(json.loads((tmp_path / "tokenizer.json").read_text())), encoding="utf-8")
    assert HtmlTokenizer.from_file(compact).sha256 == tok.sha256


def test_hash_changes_with_the_vocabulary(tok: HtmlTokenizer) -> None:
    other = build_tiny_tokenizer(vocab_size=576)
    assert other.sha256 != tok.sha256 and len(tok.sha256) == 64


def test_from_tokenizers_copies_and_disables_padding_and_truncation(tok: HtmlTokenizer) -> None:
    raw = Tokenizer.from_str(tok.to_json())
    raw.enable_truncation(max_length=8)
    raw.enable_padding(length=300, pad_id=tok.special_ids.pad)
    wrapped = HtmlTokenizer.from_tokenizers(raw)
    page = generate_pruned_pages(1, seed=12)[0]
    assert wrapped.encode(page) == tok.encode(page)
    assert wrapped.sha256 == tok.sha256
    assert raw.truncation is not None and raw.padding is not None


def test_missing_file_is_a_tokenizer_error(tmp_path: Path) -> None:
    with pytest.raises(TokenizerError, match="does not exist"):
        HtmlTokenizer.from_file(tmp_path / "nope.json")
    with pytest.raises(TokenizerError, match="does not exist"):
        HtmlTokenizer.from_file(tmp_path)


def test_invalid_file_is_a_tokenizer_error(tmp_path: Path) -> None:
    bad = tmp_path / "tokenizer.json"
    bad.write_text("{not json", encoding="utf-8")
    with pytest.raises(TokenizerError, match="not a valid"):
        HtmlTokenizer.from_file(bad)
    bad.write_text('{"model": {"type": "Nonsense"}}', encoding="utf-8")
    with pytest.raises(TokenizerError, match="not a valid"):
        HtmlTokenizer.from_file(tmp_path)


def test_missing_special_tokens_are_a_tokenizer_error() -> None:
    raw = Tokenizer(models.WordLevel({"[PAD]": 0, "[UNK]": 1, "hello": 2}, unk_token="[UNK]"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    with pytest.raises(TokenizerError, match=r"\[CLS\], \[SEP\], \[MASK\]"):
        HtmlTokenizer.from_tokenizers(raw)


SPELT_SPECIALS = "<p>BERT marks [CLS] and [SEP]; pad with [PAD], mask with [MASK], unknown is [UNK]</p>"


def test_page_text_spelling_a_special_token_is_text_not_a_control_id(tok: HtmlTokenizer) -> None:
    """A page about BERT had its "[SEP]" read as the separator id inside the content (and "[PAD]" as
    padding), and `decode` dropped them. As for every other copy a worker gets: pickled, or rebuilt
    from its JSON."""
    special = set(vars(tok.special_ids).values())
    for copy in (tok, pickle.loads(pickle.dumps(tok)), HtmlTokenizer.from_json(tok.to_json())):
        ids = copy.encode(SPELT_SPECIALS).ids
        assert not special & set(ids[1:-1]), [copy.id_to_token(i) for i in ids[1:-1] if i in special]
        assert copy.decode(ids) == SPELT_SPECIALS
        assert copy.encode_batch([SPELT_SPECIALS])[0].ids == ids
        bounded = copy.encode(SPELT_SPECIALS * 200, max_length=24, count_all=False).ids
        assert bounded == copy.encode(SPELT_SPECIALS * 200, max_length=24).ids
        assert not special & set(bounded[1:-1])


def test_reading_specials_as_text_leaves_the_serialization_and_hash_alone(tok: HtmlTokenizer) -> None:
    """The switch is the Rust tokenizer's runtime state, not part of tokenizer.json: checkpoints
    recording the tokenizer's sha256 still match."""
    assert tok.backend.to_str() == Tokenizer.from_str(tok.to_json()).to_str()
    assert HtmlTokenizer.from_json(tok.to_json()).sha256 == tok.sha256


def test_a_vocabulary_with_gaps_in_its_ids_is_refused(tok: HtmlTokenizer) -> None:
    """Ids past the token count passed as vocab_size = token count: the model's embedding then had no
    row for them (IndexError on CPU, a fatal device assert on CUDA) on any page holding the token."""
    data = json.loads(tok.to_json())
    vocab = data["model"]["vocab"]
    last = max(vocab, key=vocab.get)
    vocab[last] = 5000
    with pytest.raises(TokenizerError, match=r"ids must be exactly 0\.\.\d+ .* id \d+ is unused"):
        HtmlTokenizer.from_json(json.dumps(data))
    data = json.loads(tok.to_json())
    first, second = sorted(data["model"]["vocab"], key=data["model"]["vocab"].get)[10:12]
    data["model"]["vocab"][second] = data["model"]["vocab"][first]  # two tokens, one id
    with pytest.raises(TokenizerError, match="ids must be exactly"):
        HtmlTokenizer.from_json(json.dumps(data))


def test_save_replaces_a_symlink_rather_than_writing_through_it(tok: HtmlTokenizer, tmp_path: Path) -> None:
    """A checkpoint from a Hugging Face cache holds links into its blob store: writing through one
    changed the blob every other snapshot sharing it reads."""
    blob = tmp_path / "blob"
    blob.write_text("shared", encoding="utf-8")
    (tmp_path / "ckpt").mkdir()
    link = tmp_path / "ckpt" / "tokenizer.json"
    link.symlink_to(blob)
    tok.save(tmp_path / "ckpt")
    assert blob.read_text(encoding="utf-8") == "shared"
    assert not link.is_symlink() and HtmlTokenizer.from_file(link).sha256 == tok.sha256
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["tokenizer.json"]
