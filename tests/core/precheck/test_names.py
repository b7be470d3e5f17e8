"""The bound of Lexbor's name lookups: names sharing a hash bucket (`estimate_name_lookups`), and the
pruner's refusal of pages whose names would make the parse walk long bucket lists."""

from __future__ import annotations

import itertools
import random

import pytest

from service.core.precheck import names as names_module
from service.core.precheck.names import (
    SELECTOR_ATTRIBUTE,
    _buckets,
    _fewest_steps,
    _most_names,
    _names_in,
    _names_of_rests,
    _read_tags,
    estimate_name_lookups,
)
from service.core.prune import TooManyNamesError, prune_html, prune_text
from tests.factories.names import colliding_names as _colliding
from tests.factories.names import reference_bucket as _reference_bucket


def _spread(count: int, prefix: bytes = b"") -> tuple[bytes, ...]:
    """`count` names of the same shape spread over the buckets."""
    return tuple(
        prefix + bytes(letters[::-1])
        for letters in itertools.islice(itertools.product(b"abcdefghijklmnopqrstuvwxyz", repeat=6), count)
    )


def test_buckets_are_lexbors_hash_of_the_name(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every width class (up to 16 bytes, up to 64), bytes of any value but NUL, the known names; hashed
    or kept from an earlier call, and after the kept names were emptied."""
    monkeypatch.setattr(names_module, "_BUCKET_OF", {})
    monkeypatch.setattr(names_module, "_BUCKETS_KEPT", 4000)
    rng = random.Random(7)
    names = [bytes(rng.randrange(1, 256) for _ in range(rng.randrange(1, 65))) for _ in range(3000)]
    names += [b"hidden", b"a", b"x" * 16, b"y" * 17, b"z" * 64, "\ufffd".encode()]
    expected = [_reference_bucket(name) for name in names]
    assert [int(bucket) for bucket in _buckets(names)] == expected
    assert len(names_module._BUCKET_OF) == len(set(names))
    more = [b"q" * length for length in range(1, 65)] + names[::-1]  # some new, most kept
    assert [int(bucket) for bucket in _buckets(more)] == [_reference_bucket(name) for name in more]
    assert [int(bucket) for bucket in _buckets(names[:10])] == expected[:10]
    past = [b"w%d" % number for number in range(1500)] + names[:5]  # past 4,000 kept: emptied first
    assert [int(bucket) for bucket in _buckets(past)] == [_reference_bucket(name) for name in past]
    assert len(names_module._BUCKET_OF) <= 4000
    many = [b"v%d" % number for number in range(4001)]  # more new names than may be kept: none kept
    assert [int(bucket) for bucket in _buckets(many)] == [_reference_bucket(name) for name in many]
    assert not set(many) & set(names_module._BUCKET_OF)
    for unhashed in (b"", b"x" * 65):  # (names `bound` leaves out of the buckets)
        with pytest.raises(ValueError):
            _buckets([b"a", unhashed])
        assert unhashed not in names_module._BUCKET_OF


def _attack(names: tuple[bytes, ...], use: bytes, repeats: int) -> bytes:
    """Each name once, then `repeats` uses of the last (`use` formats one use: {} the name)."""
    return b"".join(use.replace(b"{}", name) for name in names) + use.replace(b"{}", names[-1]) * repeats


# Where the tokenizer reads a tag's or an attribute's name: each shape is a use of the name ({}).
_USES = {
    "end tag": b"</{}>",
    "start tag": b"<{} a>x",
    "attribute": b"<br {}>",
    "attribute after a slash": b"<br/{}>",
    "attribute after a double-quoted value": b'<br a="1"{}>',
    "attribute after a single-quoted value": b"<br a='1'{}>",
    "attribute after a value holding a >": b'<br a=">"{}>',
    "attribute of an end tag": b"</br {}>",
    "uppercase attribute": b"<br {upper}>",
    # A DOCTYPE's name is in the attribute names' table, also without a space before it.
    "DOCTYPE name": b"<!DOCTYPE{}>",
    # Quotes a reading of values could pair wrongly: the `"` in a single-quoted value is no value's
    # opening, the `="` an attribute's name (review, session 26: 7 s for 1.7 MB, estimated at 0).
    "attribute after a value a false one held": b'<br c=\'="\'a=""{}>',
    'attribute after a name of ="': b'<br =" a=""{}>',
}


@pytest.mark.parametrize("shape", list(_USES))
def test_names_sharing_a_bucket_are_counted_wherever_the_tokenizer_reads_them(shape: str) -> None:
    """3,000 names of one bucket, then 60,000 uses of the last: each use walks all 3,000 (1.8e8 steps),
    which the estimate must count; the same page with its names spread over the buckets is cheap."""
    use = _USES[shape]
    names = _colliding(3000, 5)
    if b"{upper}" in use:
        names = tuple(name.upper() for name in names)
        use = use.replace(b"{upper}", b"{}")
    steps = estimate_name_lookups(_attack(names, use, 60_000)).steps
    assert steps >= 3000 * 60_000
    assert estimate_name_lookups(_attack(_spread(3000), use, 60_000)).steps < steps / 10


def test_a_page_of_names_sharing_a_bucket_is_refused_before_the_parse() -> None:
    """Refused typed (the parse would take seconds); the same page with its names spread is pruned."""
    names = _colliding(3000, 5)
    with pytest.raises(TooManyNamesError, match="steps per byte"):
        prune_html(_attack(names, b"<br {}>", 60_000))
    with pytest.raises(TooManyNamesError):
        prune_html(_attack(names, b"<br {}>", 60_000).decode("latin-1") + "\u0161")  # decoded text too
    assert prune_html(_attack(_spread(3000), b"<br {}>", 60_000)).count("<br>") == 63_000


def test_distinct_names_sharing_a_bucket_cost_their_insertion() -> None:
    """Each new name walks the names before it: 20,000 distinct names of one bucket, used once each, are
    2e8 steps (60,000 took 9 s to parse)."""
    names = _colliding(20_000, 9)
    assert (
        estimate_name_lookups(b"".join(b"<br " + name + b">" for name in names)).steps >= 20_000 * 19_999 // 2
    )
    with pytest.raises(TooManyNamesError):
        prune_html(b"".join(b"</" + name + b">" for name in names))


def test_a_nul_in_a_name_is_the_replacement_character() -> None:
    """The tokenizer reads NUL in a name as U+FFFD, and hashes that."""
    names = tuple(name for name in _colliding(3000, 11, prefix="\ufffd".encode()))
    page = _attack(tuple(name.replace("\ufffd".encode(), b"\0") for name in names), b"<br {}>", 60_000)
    assert estimate_name_lookups(page).steps >= 3000 * 60_000


@pytest.mark.parametrize(
    ("spelling", "filler", "use"),
    [(b"clipPath", b"<{}>", b"<clippath>"), (b"viewBox", b"<br {}>", b"<g viewbox></g>")],
)
def test_svg_spellings_are_looked_up_as_spelled(spelling: bytes, filler: bytes, use: bytes) -> None:
    """In SVG the parser looks `clipPath` (a tag) and `viewBox` (an attribute) up as spelled, mixed case:
    names filling that spelling's bucket make each use walk them, against the same page with its names
    spread."""

    def page(names: tuple[bytes, ...]) -> bytes:
        return b"".join(filler.replace(b"{}", name) for name in names) + b"<svg>" + use * 60_000

    colliding = estimate_name_lookups(page(_colliding(3000, _reference_bucket(spelling)))).steps
    assert colliding - estimate_name_lookups(page(_spread(3000))).steps >= 0.9 * 3000 * 60_000


def test_a_foreign_attribute_is_looked_up_twice() -> None:
    """`xlink:href` (adjusted in foreign content) walks its bucket twice a use: against another name
    of the same bucket, 30,000 uses cost 30,000 walks more."""
    names = _colliding(3000, _reference_bucket(b"xlink:href"))
    filler = b"".join(b"<br " + name + b">" for name in names)
    foreign = estimate_name_lookups(filler + b"<svg>" + b"<g xlink:href></g>" * 30_000).steps
    plain = estimate_name_lookups(filler + b"<svg>" + (b"<g " + names[0] + b"></g>") * 30_000).steps
    assert foreign - plain >= 3000 * 30_000
    # The local name (`show` of `xlink:show`) is looked up too.
    names = _colliding(3000, _reference_bucket(b"show"))
    filler = b"".join(b"<br " + name + b">" for name in names)
    foreign = estimate_name_lookups(filler + b"<svg>" + b"<g xlink:show></g>" * 30_000).steps
    plain = estimate_name_lookups(filler + b"<svg>" + b"<g xlink:shoq></g>" * 30_000).steps
    assert foreign - plain >= 3000 * 30_000


def test_the_selector_attribute_is_counted_at_every_element_only_where_an_element_may_have_it() -> None:
    """The hidden-element selector looks `hidden` up at every element: with 3,000 names in its bucket
    and 100,000 elements, 3e8 steps, but only where the page holds the name at all (else the pruner
    leaves it out of the selector); the page's hidden elements are still removed."""
    filler = b"".join(
        b"<br " + name + b">" for name in _colliding(3000, _reference_bucket(SELECTOR_ATTRIBUTE))
    )
    plain = filler + b"<i>x</i>" * 100_000
    assert estimate_name_lookups(plain).per_element == 0
    with_hidden = filler + b"<p hidden>gone</p>" + b"<i>x</i>" * 100_000
    assert estimate_name_lookups(with_hidden).per_element >= 3000
    # SVG's spellings and foreign attributes, looked up besides, change nothing of `hidden`'s bucket.
    svg = b"<svg viewbox='0 0 1 1' preserveaspectratio=none xlink:href=x></svg>"
    per_element = estimate_name_lookups(with_hidden).per_element
    assert estimate_name_lookups(svg + with_hidden).per_element == per_element
    with pytest.raises(TooManyNamesError):
        prune_html(with_hidden)
    assert "x" in prune_html(plain)
    assert prune_html(b"<p hidden>gone</p><p>kept</p>") == "<p>kept</p>"
    assert prune_html(b'<div c=\'="\'a=""hidden>gone</div><p>kept</p>') == "<p>kept</p>"  # (a value misread)
    assert prune_html(b"<p HIDDEN=1>gone</p><p>kept</p>") == "<p>kept</p>"
    assert prune_html(b"<p style='display:none'>gone</p><p>kept</p>") == "<p>kept</p>"


def test_text_after_a_tag_is_no_name() -> None:
    """A page's text (after a `>`, before any `<` or quote) is not read as names: a long article of
    distinct words costs nothing."""
    words = b" ".join(b"w%d" % index for index in range(200_000))
    assert estimate_name_lookups(b"<p>" + words + b"</p>").steps < 10_000


def test_names_lexbor_knows_walk_no_list() -> None:
    """`<div>` and `class` are in Lexbor's static tables: filling their buckets costs their uses nothing
    (only the fillers' own insertion, 3,000 names: 4.5e6 steps)."""
    for filler, use in ((b"<{}>", b"<div>x</div>"), (b"<br {}>", b"<p class=a>x</p>")):
        bucket = _reference_bucket(b"div" if b"div" in use else b"class")
        names = _colliding(3000, bucket)
        page = b"".join(filler.replace(b"{}", name) for name in names) + use * 60_000
        assert estimate_name_lookups(page).steps < 3000 * 60_000 / 10


def test_tags_inside_a_false_tags_quoted_value_are_read() -> None:
    """A `<` and a letter in a comment reads as a tag whose quoted value runs over the comment's end and
    the real tags after it: every tag starting after a `>` in such a value is read from its own start."""
    names = _colliding(3000, 5)
    page = b'<!-- <a title=" -->' + _attack(names, b"<br {}>", 60_000) + b'<p>"</p>'
    assert estimate_name_lookups(page).steps >= 3000 * 60_000
    with pytest.raises(TooManyNamesError):
        prune_html(page)


def test_end_tags_of_raw_text_inside_a_false_tag_are_read() -> None:
    """In a `<title>`, `<a b="` is text, but read as a tag its value holds the real `</title ...>`, whose
    attribute names the tokenizer reads after no `>`: raw text's end tags are read wherever they are
    (3,000 names of one bucket on one end tag: each appended after the names before it)."""
    names = _colliding(3000, 5)
    page = b'<title><a b="</title ' + b" ".join(names) + b'><p>"</p>'
    assert estimate_name_lookups(page).steps >= 3000 * 2999 // 2


def test_tags_read_again_past_the_budget_fall_back_to_every_name_anywhere() -> None:
    """Tags inside a quoted value that holds a `>`, none closed (each read runs to the page's end):
    past `_READ_AGAIN` bytes a byte the estimate reads names anywhere instead (still counting them)."""
    names = _colliding(3000, 5)
    inner = b"".join(b"<c " + name + b" " for name in names) + (b"<c " + names[-1] + b" ") * 20_000
    page = b'<a b=">' + inner + b'">'
    assert _read_tags(page) is None
    assert estimate_name_lookups(page).steps >= 3000 * 20_000


def test_words_in_quoted_values_scripts_and_text_are_no_names() -> None:
    """What the tokenizer never reads as a name costs nothing: SVG path data (2 MB of distinct numbers
    between spaces), JSON in a script, prose (a review found these refused when read as names)."""
    rng = random.Random(3)
    path = b" ".join(
        b"L %d.%02d %d" % (rng.randrange(1000), rng.randrange(100), index) for index in range(20)
    )
    svg = b"<svg>" + b"".join(b'<path d="M 0 0 ' + path + b'"/>' for _ in range(10_000)) + b"</svg>"
    script = (
        b"<script>var ids = ["
        + b", ".join(b'"%x"' % rng.getrandbits(40) for _ in range(150_000))
        + b"];</script>"
    )
    for page in (svg, script):
        assert estimate_name_lookups(page).steps < 1_000_000
        assert prune_html(page) is not None


def test_an_annotation_xml_looks_up_its_encoding_at_every_token() -> None:
    """While an `<annotation-xml>` is the current node the tree builder looks its `encoding` up at each
    token: 3,000 names in that bucket and 60,000 tokens walk 1.8e8 steps (a review, session 26: 20,000
    names and 2 MB of `</q>` took 19 s)."""
    filler = b"".join(b"<br " + name + b">" for name in _colliding(3000, _reference_bucket(b"encoding")))
    assert estimate_name_lookups(filler + b"<math><annotation-xml>" + b"</q>" * 60_000).steps >= 3000 * 60_000
    assert estimate_name_lookups(filler + b"<math><mi>" + b"</q>" * 60_000).steps < 3000 * 60_000 / 10


def test_many_names_spread_over_the_buckets_cost_more_a_step() -> None:
    """Lists of many names interleave in memory, so each step misses the cache: 60,000 distinct names
    spread over the buckets, each used twice (842 KB), parse in 0.64 s (60,000 random ones, 722 KB:
    1.1 s, a review, session 26), about 2.8e8 steps at the cache's 2.3 ns; counted so, not as the 4e7
    steps they are."""
    names = _spread(60_000)
    chunks = [b"<br " + b" ".join(names[index : index + 200]) + b">" for index in range(0, len(names), 200)]
    page = b"".join(chunks) * 2
    assert estimate_name_lookups(page).steps >= 2.8e8


def test_a_rest_ending_in_spaces_is_read_without_its_trailing_run() -> None:
    """The names of a tag's rest are read once: a run of spaces, slashes and `>` after the last is
    dropped first (read from each of its bytes, 1 MB of it took minutes: quadratic)."""
    assert _names_in(b" a=1 b='x' / c " + b" /" * 1000) == [b"a", b"b", b"c"]
    assert _names_in(b"") == []
    assert _names_in(b"a>" + b">" * 1000) == [b"a"]  # (the rests of tags without attributes, joined)
    assert estimate_name_lookups(b"<a" + b" " * 200_000).steps == 0


def test_a_page_of_more_distinct_names_than_its_cap_allows_is_answered_before_counting_them_all() -> None:
    """Past the distinct names whose fewest steps pass `within`, the estimate stops (a review, session 26:
    16 MB of distinct names in a comment held 1 GiB of counts for 12 s); its answer passes `within`, as
    the whole count's does."""
    for within in (0, 10**6, 10**8, 10**9):
        most = _most_names(within)
        assert _fewest_steps(most) <= within < _fewest_steps(most + 1)
    page = b"<!--<a " + b" ".join(b"n%x" % index for index in range(150_000)) + b"-->"
    within = 100 * len(page) + 10**8
    assert estimate_name_lookups(page).steps > within
    assert estimate_name_lookups(page, within=within).steps > within


def test_lone_surrogates_are_read_as_the_parser_reads_them() -> None:
    """The parser's encoding drops lone surrogates, so `prune_text` reads the page without them: names
    that collide only without a `\\udc80` are still counted (a review, session 26: 3 MB, 11.5 s)."""
    names = [name.decode() for name in _colliding(3000, 5)]
    page = "".join(f"<br {name}\udc80>" for name in names) + f"<br {names[-1]}\udc80>" * 60_000
    with pytest.raises(TooManyNamesError):
        prune_text(page)
    assert prune_text("<p>a\udc80b</p>") == "<p>ab</p>"


def test_rests_are_read_a_megabyte_at_a_time_as_one() -> None:
    """Batches of rests (cut between two) and a rest of more than a batch (read a match at a time) give
    the names of the whole, in order."""
    rests = [b' a%d b="1 > 2" c=3' % index for index in range(120_000)]  # (2.4 MB)
    assert [name for batch in _names_of_rests(rests) for name in batch] == _names_in(b">".join(rests))
    large = [b" x", b" " + b" ".join(b"n%d=v" % index for index in range(200_000)), b" y"]
    assert [name for batch in _names_of_rests(large) for name in batch] == _names_in(b">".join(large))
    assert list(_names_of_rests([])) == []
