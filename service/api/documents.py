"""Request bodies in, Engine documents out; Engine results in, response pieces out.

A model route's body is either JSON (`application/json`, or no Content-Type) or one raw page
(`text/html; charset=...`, the XHTML and XML types, or `application/octet-stream`), whose bytes go to the
decoder untouched with the declared charset (octet-stream's is no parameter of that type: the decoder
finds the encoding); raw-body options come from the query string. The Content-Type is read as the Fetch
standard's "extract a MIME type" reads it (`media_type_of`), and a body compressed without a
Content-Encoding saying so is refused (`undeclared_coding`).

A JSON body's structure is bounded before it is parsed (`check_json_structure`): pydantic parses every
field in full, one it ignores or refuses included, holding the GIL, and builds Python objects for a
refused field's value. 16.7 MB of `"x": [[],[],...]` (5.6 million arrays) took 5.1 s of CPU and 750 MB
to be refused, with `/health` waiting 3.5 s; it is now refused in milliseconds, before pydantic sees it.
"""

from __future__ import annotations

import asyncio
import base64
import codecs
import json
import re
import sys
from collections.abc import Sequence
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt
from fastapi import Request
from pydantic import BaseModel, ValidationError

from service.api.runtime import CHARGE_KEY, CONTENT_ENCODING_KEY
from service.api.schemas import TOKEN_IDS_MESSAGE, DocumentIn, EncodingFormat
from service.api.timing import milliseconds
from service.core.content_coding import undeclared_coding
from service.core.errors import ErrorCode, HtmllmError, shown
from service.core.media_types import essences, extract_media_type, looks_like_markup, split_values
from service.core.pages import valid_json
from service.engine import Document, DocumentResult

M = TypeVar("M", bound=BaseModel)


# One raw page, and the types whose `charset` parameter is the page's declared encoding (all but
# octet-stream): crawlers forward an origin's Content-Type as it came, and XHTML is served as
# application/xhtml+xml or as the generic XML types (RFC 7303, whose charset parameter is authoritative
# as HTTP's is for text/html; the decoder reads an XML declaration where there is none).
CHARSET_PAGE_TYPES = frozenset({"text/html", "application/xhtml+xml", "text/xml", "application/xml"})
RAW_MEDIA_TYPES = CHARSET_PAGE_TYPES | {"application/octet-stream"}
# JSON bodies above this are parsed on a worker thread, off the event loop.
INLINE_PARSE_BYTES = 256 * 1024
# The commas, `[` and `{` a JSON body may have outside its strings (one per list item or object member
# but the first, and one per list or object): a document takes four, so 64 take a few hundred, while
# every one past this costs pydantic work for nothing a route reads. The cap grows with the document
# cap (`_MARKS_PER_DOCUMENT` each) where that is raised past 1,000.
MAX_JSON_MARKS = 10_000
_MARKS_PER_DOCUMENT = 10
_QUOTE, _BACKSLASH = ord('"'), ord("\\")
# Runs of backslashes before quotes measured one by one, and the longest so measured.
_FEW_RUNS, _SHORT_RUN = 1000, 64
# The longest Content-Type header parsed: the email parser takes about 0.5 ms per KiB of parameters, on
# the event loop (`a=b; ` 12,000 times, a 60 KB header under the head cap, took 97 ms of it per
# request). A media type with its charset is some 30 characters; a multipart boundary at most 70.
MAX_CONTENT_TYPE_CHARS = 1024


def request_content_type(request: Request) -> tuple[str | None, str, str | None]:
    """(header, media type, charset) of the request's Content-Type; no header reads as JSON (header None).

    Several field lines are one comma-separated list (RFC 9110 section 5.3), as a proxy that merges them
    writes it, and are read as that list is (`media_type_of`); refused (415) where they name different
    media types: reading the first one had embedded `text/html` then `application/json` as a page, the
    other order as JSON. A header longer than `MAX_CONTENT_TYPE_CHARS` is refused (415) before it is
    parsed, and the list is split once, here (`service.core.media_types` does the parsing)."""
    lines = request.headers.getlist("content-type")
    distinct = list(dict.fromkeys(lines))
    header = ", ".join(distinct) if distinct else None
    if not header:
        return header, "application/json", None
    _check_length(header)
    media_type, charset = media_type_of(header, lines=len(lines) if len(distinct) > 1 else 1)
    return header, media_type, charset


def _check_length(value: str) -> None:
    if len(value) > MAX_CONTENT_TYPE_CHARS:
        raise HtmllmError(
            f"the Content-Type header is {len(value)} characters long; at most {MAX_CONTENT_TYPE_CHARS} "
            "are read (`text/html; charset=utf-8` takes 24)",
            code=ErrorCode.UNSUPPORTED_MEDIA_TYPE,
        )


def media_type_of(value: str, *, lines: int = 1) -> tuple[str, str | None]:
    """(media type, charset) of a Content-Type value, as the Fetch standard's "extract a MIME type"
    reads it (`service.core.media_types.extract_media_type`): a list (two headers a proxy merged:
    `text/html, text/html; charset=koi8-r`) is its last valid value, with the charset of the first of
    the same type where the last has none. Browsers read it so; the email parser read such a list as
    text/plain (a 415). A list of different media types is refused (415), and so are `lines` (more than
    one) different header lines joined into `value` that name them: which one is meant decides between
    JSON and a page."""
    listed = essences(split_values(value))
    if len(listed) > 1:
        where = f"{lines} Content-Type headers with" if lines > 1 else "the Content-Type header lists"
        raise HtmllmError(
            f"{where} different media types ({shown(listed)}); send one",
            code=ErrorCode.UNSUPPORTED_MEDIA_TYPE,
        )
    return extract_media_type(value)


def check_not_compressed(body: bytes, declared: str | None = None) -> None:
    """415 for a body that is compressed data sent without a Content-Encoding saying so: embedded, it
    was binary noise answered 200. `declared` is the Content-Encoding `limits.py` undid before (scope
    key `CONTENT_ENCODING_KEY`): a body left compressed after it was compressed once more than it lists,
    and the message says so, with the whole list to send (it had said no Content-Encoding was sent).
    Refused rather than decoded unasked: brotli, which no first bytes tell, would still be embedded as
    noise, while the 415 names the header that makes every coding work (and decoding here would bypass
    the decoded-size cap and in-flight charge `limits.py` applies)."""
    coding = undeclared_coding(body)
    if coding is None:
        return
    start = body[:4].hex(" ")
    if declared:
        declared = declared[:100]
        message = (
            f"the body is still {coding}-compressed (it starts {start}) once its Content-Encoding "
            f"({declared!r}) is undone: it was compressed once more than that lists; send every coding "
            f"applied, in order: `Content-Encoding: {coding}, {declared}`"
        )
    else:
        message = (
            f"the body is {coding}-compressed (it starts {start}) and no Content-Encoding says so: send "
            f"`Content-Encoding: {coding}` (every coding applied, in order) and it is decompressed before "
            "it is read"
        )
    raise HtmllmError(message, code=ErrorCode.UNSUPPORTED_MEDIA_TYPE)


def is_json(media_type: str) -> bool:
    return media_type == "application/json" or (
        media_type.startswith("application/") and media_type.endswith("+json")
    )


def validation_error(exc: ValidationError) -> HtmllmError:
    """A pydantic error as our 422, naming the first few fields at fault (a key is cut short: an unknown
    one may be megabytes long, and the answer is no place to echo it)."""
    parts = []
    for error in exc.errors(include_url=False, include_input=False)[:5]:
        location = ".".join(_shortened(str(p)) for p in error.get("loc", ()))
        parts.append(f"{location}: {error['msg']}" if location else error["msg"])
    return HtmllmError("; ".join(parts) or "invalid request", code=ErrorCode.VALIDATION)


def _shortened(text: str, most: int = 40) -> str:
    return text if len(text) <= most else f"{text[:most]}..."


def json_marks_limit(max_documents: int) -> int:
    """The commas, `[` and `{` outside strings a JSON body may have, for a server taking `max_documents`."""
    return max(MAX_JSON_MARKS, _MARKS_PER_DOCUMENT * max_documents)


def parse_json(model: type[M], body: bytes, *, max_marks: int = MAX_JSON_MARKS) -> M:
    """`body` as `model`. Also what strict parsers refuse but clients send: a UTF-8 byte order mark (RFC
    8259 lets a parser ignore it) and lone UTF-16 surrogate escapes ("\\ud800"), which Python's
    `json.dumps` writes for text decoded with `surrogateescape` (a crawler's undecodable bytes); they
    become U+FFFD, as undecodable bytes do in a raw page. A body of more than `max_marks` commas, `[`
    and `{` outside its strings is refused unparsed (`check_json_structure`)."""
    if body.startswith(codecs.BOM_UTF8):
        body = body[len(codecs.BOM_UTF8) :]
    try:
        check_json_structure(body, max_marks)
    except HtmllmError:
        field = _token_ids_field(model, body)
        if field is None:
            raise
        raise HtmllmError(f"{field}: {TOKEN_IDS_MESSAGE}", code=ErrorCode.VALIDATION) from None
    try:
        return model.model_validate_json(body)
    except ValidationError as exc:
        repaired = _lone_surrogates_replaced(body) if _surrogate_escape_refused(exc) else None
        if repaired is None:
            raise validation_error(exc) from exc
    try:
        return model.model_validate_json(repaired)
    except ValidationError as exc:
        raise validation_error(exc) from exc


# OpenAI's `input` and TEI's `inputs` as token ids: a list of ints or of lists of ints. A key's quotes are
# bare only outside strings (inside one they are escaped), so a page's text cannot match.
_TOKEN_IDS = re.compile(rb'"(inputs?)"\s*:\s*\[\s*(?:\[\s*)?-?[0-9]')


def _token_ids_field(model: type[BaseModel], body: bytes) -> str | None:
    """The field of `model` that `body` gives token ids, if any, for a body too long to parse: the page
    of tiktoken ids langchain-openai sends by default has ten thousand of them or more, and was refused
    by its length, which sent the user to trim fields, not to the setting that sends the page."""
    match = _TOKEN_IDS.search(body)
    if match is None:
        return None
    field = match.group(1).decode("ascii")
    return field if field in model.model_fields else None


def _surrogate_escape_refused(exc: ValidationError) -> bool:
    first = exc.errors(include_url=False, include_input=False)[0]
    return first["type"] == "json_invalid" and ("surrogate" in first["msg"] or "hex escape" in first["msg"])


def _lone_surrogates_replaced(body: bytes) -> bytes | None:
    """The same JSON with every lone surrogate escape as U+FFFD, or None if Python's parser refuses it too.

    Python's parser, `valid_json` and `json.dumps` recurse: arrays nested a thousand deep after a lone
    surrogate raised `RecursionError`, a 500. pydantic refuses nesting past 200 levels anyway, so such a
    body is the 422 it would have been without the surrogate."""
    try:
        value = json.loads(body)  # Python's parser keeps a lone surrogate escape as the lone surrogate
        return json.dumps(valid_json(value), ensure_ascii=False).encode("utf-8")
    except ValueError:
        return None
    except RecursionError:
        raise HtmllmError(
            "Invalid JSON: recursion limit exceeded (arrays and objects nest too deeply)",
            code=ErrorCode.VALIDATION,
        ) from None


def check_json_structure(body: bytes, max_marks: int) -> None:
    """422 for a body with more than `max_marks` commas, `[` and `{` outside its strings: what pydantic
    would spend time and memory on, counted without parsing anything, at about the speed pydantic
    parses plain strings (16 MB of pages in 15 to 30 ms, most of it in numpy, which lets go of the GIL)."""
    if len(body) > max_marks and _json_marks(body, max_marks) > max_marks:
        raise HtmllmError(
            f"the JSON body has more than {max_marks} list items and objects (commas, `[` and `{{` outside "
            "strings); a document needs at most four: send only the fields the route reads",
            code=ErrorCode.VALIDATION,
        )


def _json_marks(body: bytes, most: int) -> int:
    """The commas, `[` and `{` outside the strings of `body` when there are at most `most` of them;
    otherwise some number above `most`.

    The strings are found first, from their unescaped quotes; only the bytes between them are counted,
    which in a request's JSON are a few per string. An invalid body is counted as if it were valid:
    pydantic stops at its first error either way. Memory: a few masks of the body's bytes, and the
    positions of at most `4 * (most + 1)` quotes.
    """
    quotes = _unescaped_quotes(body)
    if np.count_nonzero(quotes) > 4 * (most + 1):
        return most + 1  # that many strings take more than `most` commas between them
    # Outside strings: before the first quote, between a closing quote and the next opening one, and
    # after the last closing one (an unterminated last string runs to the end, leaving the end unpaired).
    bounds = [-1, *np.flatnonzero(quotes).tolist(), len(body)]
    count = 0
    for start, end in zip(bounds[::2], bounds[1::2], strict=False):
        count += sum(body.count(mark, start + 1, end) for mark in (b",", b"[", b"{"))
        if count > most:
            break
    return count


def _unescaped_quotes(body: bytes) -> npt.NDArray[np.bool_]:
    """A mask of the quotes in `body` that open or close a string (in valid JSON, where backslashes are
    escapes and only in strings): those after no backslash, or after an even run of them."""
    data = np.frombuffer(body, dtype=np.uint8)
    quotes: npt.NDArray[np.bool_] = data == _QUOTE
    after_backslash = data[:-1] == _BACKSLASH  # byte i + 1 follows a backslash
    escaped = quotes[1:] & after_backslash
    doubtful = np.flatnonzero(escaped[1:] & after_backslash[:-1]) + 2  # after two backslashes or more
    quotes[1:] &= ~escaped
    if doubtful.size:
        quotes[doubtful] = _after_even_runs(body, doubtful)
    return quotes


def _after_even_runs(body: bytes, positions: npt.NDArray[np.intp]) -> npt.NDArray[np.bool_]:
    """Whether the run of backslashes before each of `positions` is even (all escaped backslashes).

    A few short runs (a string ending in an escaped backslash, as a page's script may) are measured one
    by one; many, or a long one, blank the escaped backslashes as a parser pairs them, from the left, in
    a copy of the body (17 ms for 16 MB, holding the GIL), after which the byte before each position
    says it.
    """
    if positions.size <= _FEW_RUNS:
        even = []
        for position in positions.tolist():
            window = body[max(0, position - _SHORT_RUN) : position]
            run = len(window) - len(window.rstrip(b"\\"))
            if run == _SHORT_RUN:
                break
            even.append(run % 2 == 0)
        else:
            return np.array(even, dtype=bool)
    paired = np.frombuffer(body.replace(b"\\\\", b"  "), dtype=np.uint8)  # the same length
    result: npt.NDArray[np.bool_] = paired[positions - 1] != _BACKSLASH
    return result


async def read_body(
    request: Request, model: type[M], *, raw_options: dict[str, Any]
) -> tuple[M | None, Document | None]:
    """The JSON body as `model`, or one raw page as a Document; exactly one of the two is set.

    `raw_options` are the query-string options, which only a raw body may use: on a JSON request any
    set option is an error rather than silently ignored, and so is a query parameter that is none of
    them on any request (`?normalise=false` would otherwise answer normalised embeddings). Those
    checked, an empty raw body is 400 `empty_input` whatever its options, and so is an empty body
    without a Content-Type: no JSON is empty (or white space alone), while an empty page is what a
    crawler sends untyped.
    """
    header, media_type, charset = request_content_type(request)
    body = await request.body()
    unknown = sorted({name for name in request.query_params if name not in raw_options})
    if unknown:
        raise HtmllmError(
            f"unknown query option(s) {shown(unknown)}; this route takes {', '.join(sorted(raw_options))} "
            "(with a raw body only)",
            code=ErrorCode.VALIDATION,
        )
    # FastAPI keeps the last of a repeated scalar option, but `?normalize=true&normalize=false` (a
    # crawler appending its options to a URL that had some) may mean either: refused, as strictly as a
    # JSON body's types are. A list option (`heads`, `extractors`) takes every value, and is a list
    # whenever it is given.
    repeated = sorted(
        name
        for name, value in raw_options.items()
        if not isinstance(value, list) and len(request.query_params.getlist(name)) > 1
    )
    if repeated:
        raise HtmllmError(
            f"query option(s) {', '.join(repr(name) for name in repeated)} given more than once; "
            "each takes one value",
            code=ErrorCode.VALIDATION,
        )
    check_not_compressed(body, request.scope.get(CONTENT_ENCODING_KEY))
    if not header and (not body.strip(b"\t\n\r ") or looks_like_markup(body)):
        # `requests.post(url, data=page)` and `httpx.post(url, content=page)` send no Content-Type.
        # JSON cannot start so: the body is one page, as application/octet-stream would say. Nor can
        # JSON be empty or white space alone: an empty page so sent (a crawler's empty fetch) is the raw
        # body's 400 `empty_input`, and one of white space is the page it is, as with text/html; read as
        # JSON each was a 422, "Invalid JSON", or with its `?id=` "query options ['id'] apply to raw
        # bodies only; put them in the JSON body".
        media_type = "application/octet-stream"
    if is_json(media_type):
        given = sorted(name for name, value in raw_options.items() if value is not None)
        if given:
            raise HtmllmError(
                f"query options {given} apply to raw bodies only; put them in the JSON body",
                code=ErrorCode.VALIDATION,
            )
        hint = _NO_TYPE_HINT if not header else _charset_hint(charset)
        return await _parse_json_off_loop(request, model, body, hint=hint), None
    if media_type in RAW_MEDIA_TYPES:
        if not body:
            raise HtmllmError("the request body is empty", code=ErrorCode.EMPTY)
        doc_id = raw_options.get("id")
        url = raw_options.get("url")
        # application/octet-stream has no charset parameter (RFC 2046 §4.5.1): a client that sends one
        # there (many add `charset=utf-8` to every type) has not said what the page is in, and the
        # decoder finds it (BOM, <meta charset>, detection) as for none. The page types' is the HTTP one.
        encoding = charset if media_type in CHARSET_PAGE_TYPES else None
        return None, Document(html=body, id=doc_id, url=url, encoding=encoding)
    # Quote the header as sent: the email parser reads one it cannot parse as text/plain.
    raise HtmllmError(
        f"unsupported Content-Type {(header or '')[:100]!r}: send application/json, or one page as "
        "text/html; charset=... (or application/xhtml+xml, text/xml, application/xml) or "
        "application/octet-stream",
        code=ErrorCode.UNSUPPORTED_MEDIA_TYPE,
    )


async def read_json_body(request: Request, model: type[M]) -> M:
    """The JSON body as `model`, for routes that take JSON only (the OpenAI and TEI compatible ones).

    Read here rather than by FastAPI so these routes treat bodies as `/v1/embed` does: no Content-Type
    reads as JSON, and any other type (curl's `-d` sends a form type) is a clear 415, not a 422 saying
    the input "should be a valid dictionary".
    """
    header, media_type, charset = request_content_type(request)
    if not is_json(media_type):
        raise HtmllmError(
            f"unsupported Content-Type {(header or '')[:100]!r}: send application/json",
            code=ErrorCode.UNSUPPORTED_MEDIA_TYPE,
        )
    body = await request.body()
    check_not_compressed(body, request.scope.get(CONTENT_ENCODING_KEY))
    if not header and looks_like_markup(body):
        # `requests.post(url, data=page)`: a page, which these routes take only inside JSON. As a
        # text/html body would be, a 415, saying where a raw page goes (it was "Invalid JSON: expected
        # value at line 1 column 1").
        raise HtmllmError(
            "this route takes JSON only, and the body (without Content-Type) is a page: send it as a "
            "string in the JSON body, or post it raw to /v1/embed as text/html; charset=... or "
            "application/octet-stream",
            code=ErrorCode.UNSUPPORTED_MEDIA_TYPE,
        )
    return await _parse_json_off_loop(request, model, body, hint=_charset_hint(charset))


_UTF8_LABELS = frozenset({"utf-8", "utf8", "us-ascii", "ascii"})
_NO_TYPE_HINT = (
    "a body without Content-Type is read as JSON; send one page as text/html; charset=... "
    "or application/octet-stream"
)


def _charset_hint(charset: str | None) -> str | None:
    """What to add to a JSON error when the body declares a charset other than UTF-8: JSON is UTF-8
    (RFC 8259), and the body was read so (ASCII JSON reads the same in most charsets)."""
    if charset is None or charset.strip().lower() in _UTF8_LABELS:
        return None
    return f"JSON bodies are read as UTF-8; this one declares charset={charset[:40]!r}"


def _wide_json_hint(body: bytes) -> str | None:
    """What to add to a JSON error when the body is UTF-16 or UTF-32 (PowerShell's and .NET's default
    text encoding) with no charset said: it failed at its first byte, "expected value at line 1 column
    1", which told the client nothing. A byte order mark, or a NUL among the first bytes, which UTF-8
    JSON never has (JSON escapes it)."""
    if body.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)) or b"\0" in body[:4]:
        return "JSON bodies are read as UTF-8 (RFC 8259), and this one is in UTF-16 or UTF-32: send UTF-8"
    return None


async def _parse_json_off_loop(request: Request, model: type[M], body: bytes, *, hint: str | None) -> M:
    """`body` parsed, its strings charged to the in-flight budget: the body stays (Starlette keeps it)
    and the strings are as large again, or four times larger where one character is outside the BMP (an
    emoji makes Python store the whole page in 4 bytes a character). A parse error ends with `hint`."""
    runtime = getattr(request.app.state, "runtime", None)
    max_marks = MAX_JSON_MARKS if runtime is None else json_marks_limit(runtime.settings.max_documents)
    try:
        if len(body) > INLINE_PARSE_BYTES:
            # Parsing megabytes of JSON takes milliseconds the other requests should not wait for.
            parsed = await asyncio.to_thread(parse_json, model, body, max_marks=max_marks)
        else:
            parsed = parse_json(model, body, max_marks=max_marks)
    except HtmllmError as exc:
        if hint is None or hint is _NO_TYPE_HINT:  # (a declared charset says more: it names the cause)
            hint = _wide_json_hint(body) or hint
        if hint is None or not exc.message.startswith("Invalid JSON"):
            raise
        raise HtmllmError(f"{exc.message} ({hint})", code=exc.code) from exc
    charge = request.scope.get(CHARGE_KEY)
    if charge is not None:  # absent only where the app runs without its middleware
        charge(_text_bytes(parsed))
    return parsed


def _text_bytes(value: object) -> int:
    """Memory of the strings in a parsed request (models, lists and dicts walked); the rest is small."""
    if isinstance(value, str):
        return sys.getsizeof(value)
    if isinstance(value, BaseModel):
        return sum(_text_bytes(field) for field in value.__dict__.values())
    if isinstance(value, list | tuple):
        return sum(_text_bytes(item) for item in value)
    if isinstance(value, dict):
        return sum(_text_bytes(item) for item in value.values())
    return 0


def to_documents(documents: Sequence[DocumentIn]) -> list[Document]:
    return [Document(html=d.html, id=d.id, url=d.url) for d in documents]


def encode_embedding(vector: np.ndarray, encoding_format: EncodingFormat) -> list[float] | str:
    """A float list, or OpenAI's base64 of little-endian float32 bytes."""
    if encoding_format == "base64":
        return base64.b64encode(np.ascontiguousarray(vector, dtype="<f4").tobytes()).decode("ascii")
    values: list[float] = vector.astype(np.float32).tolist()
    return values


def check_dimensions(dimensions: int | None, embedding_dim: int) -> None:
    """The compatible APIs' `dimensions`: only the model's own size (no Matryoshka training)."""
    if dimensions is not None and dimensions != embedding_dim:
        raise HtmllmError(
            f"dimensions={dimensions} is not supported: the model's embeddings have {embedding_dim}",
            code=ErrorCode.VALIDATION,
        )


def timing_headers(results: Sequence[DocumentResult]) -> dict[str, str]:
    """The stage headers of an embedding answer, in milliseconds: per stage the slowest document (they
    run concurrently, so the slowest is the request's critical path); none when nothing was embedded.
    `x-total-time` is the middleware's (`service.api.timing`), on every answer."""
    if not results:
        return {}
    return {
        "x-prune-time": milliseconds(max(r.timings.prune_s for r in results)),
        "x-tokenize-time": milliseconds(max(r.timings.tokenize_s for r in results)),
        "x-queue-time": milliseconds(max(r.timings.queue_s for r in results)),
        "x-inference-time": milliseconds(max(r.timings.inference_s for r in results)),
    }
