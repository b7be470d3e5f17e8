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
from starlette.requests import Request
from starlette.types import Message

from service.api import documents
from service.api.documents import (
    CONTENT_ENCODING_KEY,
    MAX_JSON_MARKS,
    _json_marks,
    check_not_compressed,
    json_marks_limit,
    media_type_of,
    parse_json,
    read_body,
    read_json_body,
    request_content_type,
)
from service.api.schemas import EmbedRequest, OpenAIEmbeddingsRequest
from service.core.content_coding import undeclared_coding
from service.core.errors import ErrorCode, HtmllmError
from service.core.media_types import split_values

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


def _headed(*content_types: str) -> Request:
    """A bodiless request with these Content-Type field lines, in order."""
    headers = [(b"content-type", value.encode("latin-1")) for value in content_types]
    return Request({"type": "http", "method": "POST", "path": "/", "query_string": b"", "headers": headers})


@pytest.mark.parametrize(
    "lines, expected",
    [
        ((), (None, "application/json", None)),
        (("",), ("", "application/json", None)),
        (("text/html; charset=koi8-r",), ("text/html; charset=koi8-r", "text/html", "koi8-r")),
        (("text/html", "text/html"), ("text/html", "text/html", None)),  # identical lines are one
        (
            ("text/html", "text/html; charset=koi8-r"),  # merged as a proxy merges them
            ("text/html, text/html; charset=koi8-r", "text/html", "koi8-r"),
        ),
    ],
)
def test_a_requests_content_type_lines_are_one_list(
    lines: tuple[str, ...], expected: tuple[str | None, str, str | None]
) -> None:
    assert request_content_type(_headed(*lines)) == expected


@pytest.mark.parametrize(
    "lines, said",
    [
        (("text/html", "application/json", "text/html"), "3 Content-Type headers with different media types"),
        (("text/html, application/json",) * 2, "the Content-Type header lists different media types"),
    ],
)
def test_content_type_lines_of_different_media_types_are_a_415(lines: tuple[str, ...], said: str) -> None:
    with pytest.raises(HtmllmError) as caught:
        request_content_type(_headed(*lines))
    assert caught.value.code is ErrorCode.UNSUPPORTED_MEDIA_TYPE
    assert caught.value.message.startswith(said) and "'text/html', 'application/json'" in caught.value.message


def test_content_type_lines_are_split_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Here, the lines joined had been split (and their media types found) to refuse different ones, then
    again to read the one they name (`extract_media_type` splits them once more, in its own module)."""
    splits: list[str] = []

    def counted(value: str) -> list[str]:
        splits.append(value)
        return split_values(value)

    monkeypatch.setattr(documents, "split_values", counted)
    request = _headed("text/html", "text/html; charset=koi8-r")
    assert request_content_type(request)[1:] == ("text/html", "koi8-r")
    assert splits == ["text/html, text/html; charset=koi8-r"]


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


@pytest.mark.parametrize(
    "text",
    [b"x^2+1", "x\u00dabc".encode("latin-1"), b"x^", b"x\x01", b"x^ab", b"x^2 cats", b"\x1f\x8b\x08ab"],
)
def test_short_text_with_a_compressed_start_is_a_page(text: bytes) -> None:
    """A few bytes of text read as fixed-Huffman literals before the input runs out: `x^2+1` posted as
    text/html was refused as deflate-compressed. A short body counts only as a whole stream."""
    assert undeclared_coding(text) is None


@pytest.mark.parametrize("run", [b"*", b"z", b"{", b"*O58", b"z1G<9L)-"])
@pytest.mark.parametrize("start", [b"x^", b"x\x01", b"x\x9c", b"x\xda"])
def test_a_run_that_reads_as_deflate_for_ever_is_text(start: bytes, run: bytes) -> None:
    """These runs read as deflate without an error to any length (a fixed-Huffman block of literals or
    matches); they look nothing like compressed data, which looks random."""
    body = start + run * (6000 // len(run))
    inflater = zlib.decompressobj()
    inflater.decompress(body[:4096])  # no error: inflating alone cannot tell
    assert not inflater.eof
    assert undeclared_coding(body) is None


def _varied_page(size: int) -> bytes:
    """A page that compresses about threefold, so its compressed form is longer than the sample."""
    rng = random.Random(11)
    words = [
        "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9)))
        for _ in range(3000)
    ]
    parts, length = ["<!DOCTYPE html><html><body>"], 0
    while length < size:
        parts.append(f'<p class="c{rng.randint(0, 99)}">{" ".join(rng.choices(words, k=12))}</p>\n')
        length += len(parts[-1])
    return "".join(parts).encode()


BIG_PAGE = _varied_page(200_000)


@pytest.mark.parametrize("level", range(10))
@pytest.mark.parametrize("cut", [None, 4096, 1100])
def test_compressed_bodies_whole_or_cut_off_are_told(level: int, cut: int | None) -> None:
    """A whole stream of any length, or the start of one (cut off at 4 KiB or less, as a stored body
    may be): its first KiB inflates without error and looks random, or is a stored block."""
    gzipped, zlibbed = gzip.compress(BIG_PAGE, level, mtime=0), zlib.compress(BIG_PAGE, level)
    assert undeclared_coding(gzipped[:cut]) == "gzip"
    assert undeclared_coding(zlibbed[:cut]) == "deflate"


@pytest.mark.parametrize("data", [b"", b"a", b"<p>hi</p>", b'{"input": "hi"}'])
def test_tiny_compressed_bodies_are_told_by_their_checksum(data: bytes) -> None:
    for level in (0, 1, 9):
        assert undeclared_coding(zlib.compress(data, level)) == "deflate"
        assert undeclared_coding(gzip.compress(data, level)) == "gzip"


def _gzip_member(data: bytes, *, flags: int, fields: bytes) -> bytes:
    deflater = zlib.compressobj(6, zlib.DEFLATED, -15)
    deflated = deflater.compress(data) + deflater.flush()
    trailer = zlib.crc32(data).to_bytes(4, "little") + len(data).to_bytes(4, "little")
    return b"\x1f\x8b\x08" + bytes([flags]) + b"\0\0\0\0\0\x03" + fields + deflated + trailer


def test_a_gzip_header_with_a_long_name_is_read_past() -> None:
    """The deflate data is sampled after the header's name and extra field: a 5,000-byte name had left
    nothing of it in the sample, and the body was embedded as noise."""
    named = _gzip_member(PAGE, flags=0x08, fields=b"n" * 5000 + b"\0")
    extra = _gzip_member(BIG_PAGE, flags=0x04 | 0x10, fields=b"\x88\x13" + b"e" * 5000 + b"a comment\0")
    assert zlib.decompress(named, 31) == PAGE and zlib.decompress(extra, 31) == BIG_PAGE
    assert undeclared_coding(named) == undeclared_coding(extra) == "gzip"
    assert undeclared_coding(extra[:6200]) == "gzip"  # cut off 1,178 bytes into its deflate data
    reserved = _gzip_member(PAGE, flags=0x20, fields=b"")  # a flag RFC 1952 reserves: no gzip member
    assert undeclared_coding(reserved) is None


def test_a_body_compressed_once_more_than_declared_is_told_so() -> None:
    """gzip(gzip(page)) sent with `Content-Encoding: gzip` was told no Content-Encoding said so."""
    twice = gzip.compress(PAGE)
    with pytest.raises(HtmllmError) as caught:
        check_not_compressed(twice, "gzip")
    message = caught.value.message
    assert caught.value.code is ErrorCode.UNSUPPORTED_MEDIA_TYPE
    assert "still gzip-compressed" in message and "`Content-Encoding: gzip, gzip`" in message
    assert "no Content-Encoding" not in message
    with pytest.raises(HtmllmError) as caught:
        check_not_compressed(zlib.compress(PAGE), "br, gzip")
    assert "`Content-Encoding: deflate, br, gzip`" in caught.value.message
    with pytest.raises(HtmllmError) as caught:
        check_not_compressed(twice)
    assert "no Content-Encoding says so: send `Content-Encoding: gzip`" in caught.value.message
    check_not_compressed(PAGE, "gzip")  # what is left is the page: nothing to say


def _request(body: bytes, content_type: bytes, content_encoding: str | None) -> Request:
    """A request as routes get it from `limits.py`: the body decoded, the coding it undid in the scope."""
    scope = {
        "type": "http",
        "method": "POST",
        "path": "/v1/embed",
        "query_string": b"",
        "headers": [(b"content-type", content_type)],
    }
    if content_encoding is not None:
        scope[CONTENT_ENCODING_KEY] = content_encoding

    async def receive() -> Message:
        return {"type": "http.request", "body": body, "more_body": False}

    return Request(scope, receive)


async def test_the_routes_name_the_declared_coding() -> None:
    twice = gzip.compress(PAGE)
    with pytest.raises(HtmllmError) as caught:
        await read_body(_request(twice, b"text/html", "gzip"), EmbedRequest, raw_options={"id": None})
    assert "`Content-Encoding: gzip, gzip`" in caught.value.message
    with pytest.raises(HtmllmError) as caught:
        await read_json_body(_request(twice, b"application/json", "x-gzip"), OpenAIEmbeddingsRequest)
    assert "`Content-Encoding: gzip, x-gzip`" in caught.value.message
    with pytest.raises(HtmllmError) as caught:
        await read_body(_request(twice, b"text/html", None), EmbedRequest, raw_options={"id": None})
    assert "no Content-Encoding says so" in caught.value.message
