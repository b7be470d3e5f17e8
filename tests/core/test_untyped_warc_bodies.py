"""A WARC response whose HTTP head has no Content-Type is a page where its body, its Content-Encoding
undone, looks like markup as the API reads an untyped request body (`media_types.looks_like_markup`).

The reader's own test (the body's first byte after white space, before its coding was undone) had
passed over, with no row and "0 failed" in the summary, an untyped page that starts with a byte order
mark or is UTF-16, and every gzip-coded one; the API embedded the same bytes. A coding that cannot be
undone is the record's error row: it had vanished too.
"""

from __future__ import annotations

import codecs
import gzip
import random
import zlib
from pathlib import Path

import brotli
import pytest
import zstandard

from service.core.decoding import decode_html
from service.core.errors import ErrorCode
from service.core.pages import Page
from tests.factories.warc import HttpResponse, pages_and_errors, response

PAGE = (
    "<!doctype html><html><head><title>Grüße</title></head><body><p>Schöne Grüße aus Köln</p></body></html>"
)
TEXT = "Schöne Grüße aus Köln"

UNTYPED_PAGES = {
    "utf8-bom": codecs.BOM_UTF8 + PAGE.encode(),
    "utf16le-bom": codecs.BOM_UTF16_LE + PAGE.encode("utf-16-le"),
    "utf16be-bom": codecs.BOM_UTF16_BE + PAGE.encode("utf-16-be"),
    "utf16le": PAGE.encode("utf-16-le"),
    "white-space": b" \r\n\t" + PAGE.encode(),
    "white-space-bom": codecs.BOM_UTF8 + b"\n\n" + PAGE.encode(),
}
CODERS = {
    "gzip": lambda data: gzip.compress(data, mtime=0),
    "deflate": zlib.compress,
    "br": brotli.compress,
    "zstd": zstandard.ZstdCompressor().compress,
}


def _read(tmp_path: Path, *records: bytes) -> tuple[list[Page], list[Page]]:
    path = tmp_path / "crawl.warc"
    path.write_bytes(b"".join(records))
    return pages_and_errors(path)


def _untyped(record_id: str, body: bytes, coding: str | None = None) -> bytes:
    headers = {} if coding is None else {"Content-Encoding": coding}
    return response(record_id, HttpResponse(body, None, headers=headers))


def _text(page: Page) -> str:
    return decode_html(page.html, encoding=page.encoding).text


@pytest.mark.parametrize("name", list(UNTYPED_PAGES))
def test_an_untyped_page_with_a_bom_or_in_utf16_is_read(tmp_path: Path, name: str) -> None:
    good, errors = _read(tmp_path, _untyped(name, UNTYPED_PAGES[name]), _untyped("after", b"<p>after</p>"))
    assert errors == []
    assert [page.id for page in good] == [f"<urn:uuid:{name}>", "<urn:uuid:after>"]
    assert TEXT in _text(good[0])
    assert good[0].meta["http_status"] == 200 and good[0].meta["content_type"] is None


@pytest.mark.parametrize("name", ["plain", "utf8-bom", "utf16le-bom", "utf16be-bom", "white-space"])
@pytest.mark.parametrize("coding", list(CODERS))
def test_an_untyped_page_is_read_once_its_content_coding_is_undone(
    tmp_path: Path, coding: str, name: str
) -> None:
    body = PAGE.encode() if name == "plain" else UNTYPED_PAGES[name]
    good, errors = _read(tmp_path, _untyped("coded", CODERS[coding](body), coding))
    assert errors == []
    assert [page.id for page in good] == ["<urn:uuid:coded>"]
    assert TEXT in _text(good[0])


def test_two_codings_are_both_undone_before_the_body_is_looked_at(tmp_path: Path) -> None:
    body = brotli.compress(gzip.compress(PAGE.encode(), mtime=0))
    good, errors = _read(tmp_path, _untyped("twice", body, "gzip, br"))
    assert errors == [] and [page.html for page in good] == [PAGE.encode()]


@pytest.mark.parametrize(
    ("coding", "body", "code", "message"),
    [
        (
            "gzip",
            gzip.compress(PAGE.encode(), mtime=0)[:-12],
            ErrorCode.VALIDATION,
            "the gzip body is corrupt",
        ),
        ("gzip", b"<p>not gzip at all</p>", ErrorCode.VALIDATION, "the gzip body is corrupt"),
        ("br", b"\xff\xfe garbage", ErrorCode.VALIDATION, "the br body is corrupt"),
        ("compress", b"\x1f\x9d\x90<p>", ErrorCode.UNSUPPORTED_MEDIA_TYPE, "unsupported Content-Encoding"),
    ],
    ids=["gzip-cut", "gzip-not-gzip", "br-corrupt", "unknown-coding"],
)
def test_an_untyped_body_whose_coding_cannot_be_undone_is_an_error_row(
    tmp_path: Path, coding: str, body: bytes, code: ErrorCode, message: str
) -> None:
    good, errors = _read(tmp_path, _untyped("bad", body, coding), _untyped("after", b"<p>after</p>"))
    assert [page.id for page in good] == ["<urn:uuid:after>"]
    assert [(page.id, page.error_code) for page in errors] == [("<urn:uuid:bad>", code)]
    assert message in (errors[0].error or "") and errors[0].meta["http_status"] == 200


@pytest.mark.parametrize(
    ("body", "coding"),
    [
        (b"\x89PNG\r\n\x1a\n" + bytes(40), None),
        (b'{"a": "<p>"}', None),
        (b"plain text, no markup", None),
        (gzip.compress(b"plain text, no markup", mtime=0), "gzip"),
        (gzip.compress(b"\x89PNG\r\n\x1a\n" + bytes(40), mtime=0), "gzip"),
        (b"\x89PNG\r\n\x1a\n" + bytes(40), "identity"),
        (gzip.compress(b"<p>compressed, but not said so</p>", mtime=0), None),
    ],
    ids=["png", "json", "text", "gzip-text", "gzip-png", "identity-png", "undeclared-gzip"],
)
def test_an_untyped_body_that_is_no_markup_is_still_passed_over(
    tmp_path: Path, body: bytes, coding: str | None
) -> None:
    """docs/engine.md reads HTML responses only: an untyped one that is no markup (an image, JSON, text)
    is no page and no row, as before, its coding undone or not."""
    good, errors = _read(tmp_path, _untyped("data", body, coding), _untyped("after", b"<p>after</p>"))
    assert errors == [] and [page.id for page in good] == ["<urn:uuid:after>"]


def test_an_untyped_coded_record_over_the_read_bound_is_refused_as_too_large(
    tmp_path: Path, cap_1_kib: int
) -> None:
    """Only the start of a record over the read bound is read, and a coded body's start tells nothing:
    it is refused as a typed page over the bound is, not passed over unseen. An uncoded one is told by
    its start, as before."""
    noise = random.Random(0).randbytes(8 * cap_1_kib)
    good, errors = _read(
        tmp_path,
        _untyped("coded", gzip.compress(b"<p>" + noise, mtime=0), "gzip"),
        _untyped("markup", b"<p>" + noise),
        _untyped("data", b"\x89PNG" + noise),
        _untyped("after", b"<p>after</p>"),
    )
    assert [page.id for page in good] == ["<urn:uuid:after>"]
    assert [(page.id, page.error_code) for page in errors] == [
        ("<urn:uuid:coded>", ErrorCode.PAYLOAD_TOO_LARGE),
        ("<urn:uuid:markup>", ErrorCode.PAYLOAD_TOO_LARGE),
    ]


def test_a_bodiless_untyped_response_with_a_coding_is_still_an_empty_page(tmp_path: Path) -> None:
    """A bare redirect is an empty page with its status; one that says its (empty) body is gzip too."""
    moved = {"Location": "https://example.com/b", "Content-Encoding": "gzip"}
    good, errors = _read(
        tmp_path, response("moved", HttpResponse(b"", None, status="301 Moved", headers=moved))
    )
    assert errors == [] and [(page.html, page.meta["http_status"]) for page in good] == [(b"", 301)]


@pytest.mark.parametrize(
    "body",
    [
        *UNTYPED_PAGES.values(),
        PAGE.encode("utf-16-be"),
        b"\x0c<p>form feed</p>",
        b'{"html": "<p>"}',
        b"\xef\xbb\xbf{}",
        codecs.BOM_UTF16_LE + '{"html": "<p>"}'.encode("utf-16-le"),
        b"text <p>",
        b"\x89PNG",
    ],
    ids=[*UNTYPED_PAGES, "utf16be", "form-feed", "json", "bom-json", "utf16-bom-json", "text", "png"],
)
def test_the_warc_reader_and_the_api_take_the_same_untyped_bodies_as_pages(
    tmp_path: Path, body: bytes
) -> None:
    """One rule: the WARC reader reads an untyped body as a page exactly where the API's raw-body routes
    read one sent without a Content-Type as a page (`looks_like_markup`, which `service.api.documents`
    asks). A UTF-16 BOM is a page to both, as docs/service.md says, JSON after it or not."""
    from service.api import documents
    from service.core.media_types import looks_like_markup

    assert documents.looks_like_markup is looks_like_markup
    good, errors = _read(tmp_path, _untyped("body", body))
    assert errors == [] and bool(good) == looks_like_markup(body)
