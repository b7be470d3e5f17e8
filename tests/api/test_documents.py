"""JSON bodies: their structure bounded before pydantic parses them, the lone-surrogate repair never a
500, and validation errors that do not echo what was sent; a Content-Type read as Fetch reads it, and
compressed bodies told by their first bytes."""

from __future__ import annotations

import gzip
import json
import random
import zlib

import brotli
import pytest
import zstandard
from pydantic import BaseModel

from service.api.documents import (
    MAX_JSON_MARKS,
    _json_marks,
    json_marks_limit,
    media_type_of,
    parse_json,
    undeclared_coding,
)
from service.api.schemas import EmbedRequest, OpenAIEmbeddingsRequest
from service.core.errors import ErrorCode, HtmllmError

# What a page's text, script and style put inside JSON strings: every mark counted outside them.
TRICKY = ['"', "\\", ",", "[", "{", "]", "}", ":", "a", " ", "\\u00e9", "\n"]


def _marks(value: object) -> int:
    """The commas, `[` and `{` that `json.dumps(value)` writes outside strings, from the value itself."""
    if isinstance(value, list):
        return 1 + max(len(value) - 1, 0) + sum(_marks(item) for item in value)
    if isinstance(value, dict):
        return 1 + max(len(value) - 1, 0) + sum(_marks(item) for item in value.values())
    return 0


def _value(rng: random.Random, depth: int = 0) -> object:
    kind = rng.choice(["str", "str", "num", "list", "dict"] if depth < 4 else ["str", "num"])
    if kind == "str":
        return "".join(rng.choice(TRICKY) for _ in range(rng.randint(0, 12))) + "\\" * rng.randint(0, 3)
    if kind == "num":
        return rng.choice([0, -1.5, True, None])
    if kind == "list":
        return [_value(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    return {str(_value(rng, 4)): _value(rng, depth + 1) for _ in range(rng.randint(0, 4))}


def _check(body: bytes, want: int) -> None:
    for most in {0, want - 1, want, want + 1, 10 * want}:
        got = _json_marks(body, most)
        assert got == want if want <= most else got > most, (body[:200], most, got, want)


def test_marks_are_counted_outside_strings_only() -> None:
    """Against a count made from the parsed value: escaped quotes, escaped backslashes before a quote,
    and brackets in strings never count; the JSON is written the ways clients write it."""
    rng = random.Random(7)
    for _ in range(2000):
        value = _value(rng)
        for ensure_ascii, indent in ((True, None), (False, None), (False, 1)):
            _check(json.dumps(value, ensure_ascii=ensure_ascii, indent=indent).encode(), _marks(value))


@pytest.mark.parametrize("run", [1, 2, 3, 63, 64, 65, 200, 201])
@pytest.mark.parametrize("strings", [1, 1000, 1001])
def test_runs_of_backslashes_before_a_quote(run: int, strings: int) -> None:
    """A quote after a run of backslashes closes its string when the run is even: a few short runs are
    measured one by one, many or long ones the other way; both agree."""
    value = [["a" + "\\" * run, "x,y[{"] for _ in range(strings)] + [[] for _ in range(20)]
    _check(json.dumps(value).encode(), _marks(value))
    # An odd run escapes the quote, and the string runs on to the end.
    assert _json_marks(b'["' + b"\\" * run + b'", [], []]', 100) == (1 if run % 2 else 5)


def test_an_unterminated_string_runs_to_the_end() -> None:
    assert _json_marks(b'{"a": [1, 2], "b": "x,[{', 100) == 4
    assert _json_marks(b"", 0) == 0


def test_junk_in_a_field_no_route_reads_is_refused_before_parsing() -> None:
    """16.7 MB of `"x": [[],[],...]` was parsed in full: 5.1 s of CPU and 750 MB for a 422 on /v1/embed,
    and accepted after 1.2 s on /v1/embeddings (which ignores unknown fields)."""
    junk = b"[" + b"[]," * MAX_JSON_MARKS + b"[]]"
    bodies: dict[type[BaseModel], bytes] = {
        EmbedRequest: b'{"documents": [{"html": "<p>hi</p>"}], "x": ' + junk + b"}",
        OpenAIEmbeddingsRequest: b'{"input": "<p>hi</p>", "x": ' + junk + b"}",
    }
    for model, body in bodies.items():
        with pytest.raises(HtmllmError) as caught:
            parse_json(model, body)
        assert caught.value.code is ErrorCode.VALIDATION
        assert f"more than {MAX_JSON_MARKS} list items and objects" in caught.value.message
    # After a lone surrogate (the repair parses the body again, in Python) and as many strings.
    strings = b'{"input": "\\ud800", "x": [' + b'"",' * MAX_JSON_MARKS + b'""]}'
    with pytest.raises(HtmllmError, match="list items and objects"):
        parse_json(OpenAIEmbeddingsRequest, strings)


def test_past_the_bound_only_a_field_of_token_ids_is_named_as_token_ids() -> None:
    """Token ids answered as such; a page whose text holds the same key (escaped quotes) and a route
    without such a field keep the bound's message."""
    ids = b"[" + b"1," * MAX_JSON_MARKS + b"2]"
    with pytest.raises(HtmllmError, match=r"^input: token ids are not accepted"):
        parse_json(OpenAIEmbeddingsRequest, b'{"model": "m", "input" : [ ' + ids[1:] + b"}")
    in_text = json.dumps({"input": ['"input": [1'], "x": [1] * (MAX_JSON_MARKS + 1)}).encode()
    with pytest.raises(HtmllmError, match="list items and objects"):
        parse_json(OpenAIEmbeddingsRequest, in_text)
    with pytest.raises(HtmllmError, match="list items and objects"):
        parse_json(EmbedRequest, b'{"input": ' + ids + b', "documents": []}')


def test_pages_full_of_brackets_and_quotes_pass() -> None:
    """What counts is outside strings: 64 pages of script, style and attributes are a few hundred."""
    html = '<script>var a = {"b": [1, 2, "\\\\"]};</script><p class="x,y">[{' * 5000
    body = json.dumps({"documents": [{"html": html, "id": str(i), "url": "u"} for i in range(64)]})
    parsed = parse_json(EmbedRequest, body.encode())
    assert len(parsed.documents) == 64 and parsed.documents[0].html == html


def test_the_cap_grows_with_the_document_cap() -> None:
    assert json_marks_limit(64) == MAX_JSON_MARKS
    many = 3000
    body = json.dumps({"documents": [{"html": "<p>x</p>", "id": str(i), "url": "u"} for i in range(many)]})
    with pytest.raises(HtmllmError, match="list items and objects"):
        parse_json(EmbedRequest, body.encode())
    assert len(parse_json(EmbedRequest, body.encode(), max_marks=json_marks_limit(many)).documents) == many


@pytest.mark.parametrize("depth", [300, 1000, 3000])
def test_deep_nesting_after_a_lone_surrogate_is_a_validation_error(depth: int) -> None:
    """pydantic refused the surrogate before it reached the nesting; the repair's `json.loads` then
    raised RecursionError, a 500. pydantic refuses nesting past 200 levels: so does the repair."""
    for model, head in (
        (OpenAIEmbeddingsRequest, b'{"input": "\\ud800", "x": '),
        (EmbedRequest, b'{"documents": [{"html": "\\ud800"}], "x": '),
    ):
        with pytest.raises(HtmllmError) as caught:
            parse_json(model, head + b"[" * depth + b"]" * depth + b"}")
        assert caught.value.code is ErrorCode.VALIDATION
        assert "recursion limit exceeded" in caught.value.message


def test_validation_errors_do_not_echo_the_body() -> None:
    """A field's name is cut short in the message: an unknown key may be megabytes long."""
    key = "k" * 1_000_000
    body = json.dumps({"documents": [{"html": "<p>x</p>", key: 1}], key: [1, 2]}).encode()
    with pytest.raises(HtmllmError) as caught:
        parse_json(EmbedRequest, body)
    assert caught.value.code is ErrorCode.VALIDATION
    assert "Extra inputs are not permitted" in caught.value.message
    assert len(caught.value.message) < 500


def test_a_key_given_twice_takes_its_last_value_as_documented() -> None:
    """docs/service.md says which of two values of one key is read (RFC 8259 leaves it to the parser)."""
    body = b'{"documents": [{"html": "<p>one</p>", "id": "a", "html": "<p>two</p>"}], "normalize": true}'
    assert parse_json(EmbedRequest, body).documents[0].html == "<p>two</p>"


@pytest.mark.parametrize(
    "value, expected",
    [
        ("text/html; charset=koi8-r", ("text/html", "koi8-r")),
        ("text/html, text/html; charset=koi8-r", ("text/html", "koi8-r")),  # the last one's own
        ("text/html; charset=koi8-r, text/html", ("text/html", "koi8-r")),  # carried from the first
        ("text/html; charset=a, text/html; charset=b, text/html", ("text/html", "a")),  # Fetch's quirk
        ('text/html; foo="a, b"; charset=koi8-r', ("text/html", "koi8-r")),  # a quoted comma
        ('text/html; foo="a\\", b"; charset=koi8-r', ("text/html", "koi8-r")),  # an escaped quote
        ("*/*, nonsense, , TEXT/HTML;charset=koi8-r", ("text/html", "koi8-r")),  # skipped values
        ("application/xhtml+xml, application/xhtml+xml; charset=koi8-r", ("application/xhtml+xml", "koi8-r")),
        ("nonsense, more", ("text/plain", None)),  # no valid value: the email parser's reading, a 415
    ],
)
def test_a_content_type_is_read_as_fetch_extracts_a_mime_type(
    value: str, expected: tuple[str, str | None]
) -> None:
    assert media_type_of(value) == expected


def test_a_list_of_different_media_types_is_a_415() -> None:
    with pytest.raises(HtmllmError) as caught:
        media_type_of("text/html; charset=koi8-r, application/json")
    assert caught.value.code is ErrorCode.UNSUPPORTED_MEDIA_TYPE
    assert "'text/html', 'application/json'" in caught.value.message


PAGE = ("<!DOCTYPE html><html><body>" + "<p>hello world</p>" * 300 + "</body></html>").encode()


def test_compressed_bodies_are_told_by_their_first_bytes() -> None:
    assert undeclared_coding(gzip.compress(PAGE)) == "gzip"
    assert undeclared_coding(gzip.compress(b"")) == "gzip"
    assert undeclared_coding(zstandard.ZstdCompressor().compress(PAGE)) == "zstd"
    for level in range(10):  # the four zlib headers of deflate's levels
        assert undeclared_coding(zlib.compress(PAGE, level)) == "deflate", level
    assert undeclared_coding(brotli.compress(PAGE)) is None  # no magic number: cannot be told


def test_text_with_a_compressed_start_is_not_taken_for_it() -> None:
    """`x^` is a zlib header, and the gzip magic can be followed by anything: the start must inflate."""
    rng = random.Random(3)
    for start in (b"x^", b"x\x01", b"x\x9c", b"x\xda", b"\x1f\x8b\x08"):
        for _ in range(200):
            text = "".join(rng.choice("<p> abcdefghij,.\n") for _ in range(rng.randint(0, 3000))).encode()
            assert undeclared_coding(start + text) is None, (start, text[:40])
    for body in (PAGE, b"", b'{"documents": []}', "<p>\u8b1f</p>".encode("utf-16-le")):
        assert undeclared_coding(body) is None
