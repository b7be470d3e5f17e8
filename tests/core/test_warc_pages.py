"""The WARC page reader (`service.core.warc_pages`), through `iter_pages`, on WARC files the test writes."""

from __future__ import annotations

import codecs
import gzip
from collections.abc import Callable
from pathlib import Path

import brotli
import pytest
import zstandard
from fastwarc.stream_io import Lz4Writer

from service.core.decoding import decode_html
from service.core.errors import ErrorCode
from service.core.pages import PageSourceError, iter_pages
from tests.factories.warc import HttpResponse, gzip_pieces, response, warc_gz, warc_record
from tests.memory import gzip_bomb, traced_peak

CZECH = "Příliš žluťoučký kůň úpěl ďábelské ódy"


def _warc_records() -> list[bytes]:
    czech = f"<html><body><p>{CZECH}</p></body></html>".encode("cp1250")
    plain = b"<html><body><p>plain page</p></body></html>"
    return [
        warc_record(
            "info",
            b"software: test\r\n",
            record_type="warcinfo",
            uri=None,
            content_type="application/warc-fields",
        ),
        warc_record(
            "req",
            b"GET / HTTP/1.1\r\nHost: example.com\r\n\r\n",
            record_type="request",
            content_type="application/http; msgtype=request",
        ),
        response("cz", HttpResponse(czech, "text/html; charset=windows-1250"), "https://cz.example/"),
        response("gz", HttpResponse(gzip.compress(plain), "text/html", headers={"Content-Encoding": "gzip"})),
        response(
            "br",
            HttpResponse(brotli.compress(plain), "application/xhtml+xml", headers={"Content-Encoding": "br"}),
        ),
        response(
            "chunked",
            HttpResponse(
                gzip.compress(plain), "text/html", headers={"Content-Encoding": "gzip"}, chunked=True
            ),
        ),
        response("png", HttpResponse(b"\x89PNG\r\n\x1a\n....", "image/png")),
        response(
            "missing",
            HttpResponse(
                b"<html><p>not found</p></html>", "text/html; charset=utf-8", status="404 Not Found"
            ),
        ),
        response("untyped", HttpResponse(b"  <!doctype html><p>sniffed</p>", None)),
        warc_record("revisit", b"HTTP/1.1 200 OK\r\n\r\n", record_type="revisit"),
        warc_record("dns", b"20261130120000\nexample.com. 300 IN A 1.2.3.4\n", content_type="text/dns"),
        warc_record(
            "res",
            b"<html><p>a resource</p></html>",
            record_type="resource",
            content_type="text/html",
            uri="file:///local.html",
            extra={"WARC-Truncated": "length"},
        ),
    ]


WARC_PAGES = ["cz", "gz", "br", "chunked", "missing", "untyped", "res"]


@pytest.mark.parametrize("suffix", [".warc", ".warc.gz", ".warc.zst", ".warc.lz4"])
def test_warc_pages(tmp_path: Path, suffix: str) -> None:
    records = _warc_records()
    path = tmp_path / f"crawl{suffix}"
    if suffix == ".warc.zst":
        path.write_bytes(b"".join(zstandard.ZstdCompressor().compress(r) for r in records))
    elif suffix == ".warc.lz4":
        writer = Lz4Writer(str(path))  # FastWARC's own LZ4 frames, as its tools write them
        for record in records:
            writer.write(record)
        writer.close()
    else:
        path.write_bytes(warc_gz(records) if suffix.endswith(".gz") else b"".join(records))
    pages = list(iter_pages(path))
    assert [p.id for p in pages] == [f"<urn:uuid:{name}>" for name in WARC_PAGES]
    assert all(p.error is None for p in pages)
    texts = {p.id[10:-1]: decode_html(p.html).text for p in pages}
    assert CZECH in texts["cz"]  # the HTTP charset read the windows-1250 bytes
    for name in ("gz", "br", "chunked"):
        assert texts[name] == "<html><body><p>plain page</p></body></html>", name
    assert "sniffed" in texts["untyped"] and "a resource" in texts["res"]
    by_id = {p.id[10:-1]: p for p in pages}
    assert by_id["cz"].url == "https://cz.example/" and by_id["res"].url == "file:///local.html"
    assert by_id["cz"].meta == {
        "warc_file": path.name,
        "warc_date": "2026-11-30T12:00:00Z",
        "http_status": 200,
        "content_type": "text/html; charset=windows-1250",
    }
    assert by_id["missing"].meta["http_status"] == 404
    assert by_id["res"].meta["warc_truncated"] == "length"
    assert len(list(iter_pages(path, limit=2))) == 2


def test_http_charset_wins_over_a_contrary_meta(tmp_path: Path) -> None:
    """Browsers read the HTTP charset first; the bytes then carry it as UTF-8 behind a BOM."""
    html = f'<html><head><meta charset="iso-8859-1"></head><body>{CZECH}</body></html>'.encode("cp1250")
    agreeing = f'<html><head><meta charset="windows-1250"></head><body>{CZECH}</body></html>'.encode("cp1250")
    path = tmp_path / "a.warc"
    path.write_bytes(
        response("contrary", HttpResponse(html, "text/html; charset=windows-1250"))
        + response("agreeing", HttpResponse(agreeing, 'text/html; charset="Windows-1250"'))
    )
    contrary, same = iter_pages(path)
    assert contrary.html.startswith(codecs.BOM_UTF8) and CZECH in decode_html(contrary.html).text
    assert same.html == agreeing  # nothing to change: the raw bytes as crawled
    # The codec the transcoded page was read with stays known (an extraction reported utf-8 for it).
    assert contrary.encoding == "cp1250" and same.encoding is None


def test_a_merged_content_type_is_read_as_browsers_read_it(tmp_path: Path) -> None:
    """Two Content-Type headers a proxy merged into one list: the email parser read it as text/plain,
    and the page was skipped as no HTML; browsers (Fetch's "extract a MIME type") read text/html with
    the charset."""
    html = f'<html><head><meta charset="iso-8859-1"></head><body>{CZECH}</body></html>'.encode("cp1250")
    path = tmp_path / "a.warc"
    path.write_bytes(response("merged", HttpResponse(html, "text/html, text/html; charset=windows-1250")))
    (page,) = iter_pages(path)
    assert CZECH in decode_html(page.html).text and page.encoding == "cp1250"


def test_bad_warc_records_are_error_rows(tmp_path: Path) -> None:
    records = [
        response("good", HttpResponse(b"<p>good</p>")),
        response("corrupt", HttpResponse(b"not gzip at all", headers={"Content-Encoding": "gzip"})),
        response("unknown", HttpResponse(b"<p>?</p>", headers={"Content-Encoding": "compress"})),
        response("after", HttpResponse(b"<p>after</p>")),
    ]
    path = tmp_path / "bad.warc.gz"
    path.write_bytes(warc_gz(records))
    with pytest.raises(PageSourceError, match="the gzip body is corrupt"):
        list(iter_pages(path))
    pages = list(iter_pages(path, bad_rows="report"))
    assert [p.id for p in pages] == [
        "<urn:uuid:good>",
        "<urn:uuid:corrupt>",
        "<urn:uuid:unknown>",
        "<urn:uuid:after>",
    ]
    assert [p.error is None for p in pages] == [True, False, False, True]
    assert "unsupported Content-Encoding" in (pages[2].error or "")
    # An unknown coding is the API's 415 code, a corrupt body the row's fault.
    assert [p.error_code for p in pages[1:3]] == [ErrorCode.VALIDATION, ErrorCode.UNSUPPORTED_MEDIA_TYPE]


def _lz4(records: list[bytes], *, frame_per_record: bool, tmp: Path) -> bytes:
    """LZ4 as FastWARC writes it: one frame for the whole file, or one frame per record."""
    out = b""
    for group in [[r] for r in records] if frame_per_record else [records]:
        writer = Lz4Writer(str(tmp))
        for record in group:
            writer.write(record)
        writer.close()
        out += tmp.read_bytes()
    return out


def _zstd(records: list[bytes]) -> bytes:
    return b"".join(zstandard.ZstdCompressor().compress(r) for r in records)


WARC_LAYOUTS: dict[str, tuple[str, Callable[[list[bytes], Path], bytes]]] = {
    "plain": (".warc", lambda rs, _: b"".join(rs)),
    "gzip per record": (".warc.gz", lambda rs, _: b"".join(gzip.compress(r, mtime=0) for r in rs)),
    "gzip one stream": (".warc.gz", lambda rs, _: gzip.compress(b"".join(rs), mtime=0)),
    "gzip fixed-size members": (".warc.gz", lambda rs, _: gzip_pieces(b"".join(rs), 50)),
    "zstd per record": (".warc.zst", lambda rs, _: _zstd(rs)),
    "zstd one stream": (".warc.zst", lambda rs, _: _zstd([b"".join(rs)])),
    "lz4 per record": (".warc.lz4", lambda rs, tmp: _lz4(rs, frame_per_record=True, tmp=tmp)),
    "lz4 one stream": (".warc.lz4", lambda rs, tmp: _lz4(rs, frame_per_record=False, tmp=tmp)),
}


PAGES = ["<p>first</p>", "<p>last</p>"]


@pytest.mark.parametrize("layout", WARC_LAYOUTS)
def test_a_warc_cut_anywhere_never_loses_a_page_quietly(tmp_path: Path, layout: str) -> None:
    """A killed writer leaves a partial last record: every cut either keeps both pages whole or ends the
    file's pages with an error row; none drops a page without a word. Uncut, the file reads clean; cut
    exactly after the first record's frame, member or content, it is a whole file of one record."""
    suffix, write = WARC_LAYOUTS[layout]
    records = [response(f"r{i}", HttpResponse(html.encode())) for i, html in enumerate(PAGES)]
    data = write(records, tmp_path / "f")
    first_alone = write(records[:1], tmp_path / "f")
    path = tmp_path / f"cut{suffix}"
    for cut in range(len(data) - 1):
        path.write_bytes(data[: len(data) - cut])
        pages = list(iter_pages(path, bad_rows="report"))
        whole = [decode_html(p.html).text for p in pages if p.error is None]
        errors = [p.error for p in pages if p.error is not None]
        alone = data[: len(data) - cut].rstrip(b"\r\n") == first_alone.rstrip(b"\r\n")
        complete = PAGES[:1] if alone else PAGES
        assert errors or whole == complete, cut
        assert cut or not errors, errors
        assert set(whole) <= set(PAGES), cut


def test_warc_records_over_the_cap_are_error_rows_and_never_held(tmp_path: Path, cap_1_kib: int) -> None:
    records = [
        response("good", HttpResponse(b"<p>good</p>")),
        response("long", HttpResponse(b"<p>" + b"x" * (64 << 20))),  # read 4 KiB of it, no more
        response("image", HttpResponse(b"\x89PNG" + b"\0" * 10_000, "image/png")),  # no page: skipped
        response("bomb", HttpResponse(gzip_bomb(b"<p>", 64 << 20), headers={"Content-Encoding": "gzip"})),
        response("over", HttpResponse(b"<p>" + b"x" * 2000)),  # a block within the bound, a page over
        warc_record("resource", b"<p>" + b"y" * 10_000, record_type="resource", content_type="text/html"),
        response("after", HttpResponse(b"<p>after</p>")),
    ]
    path = tmp_path / "big.warc.gz"
    path.write_bytes(warc_gz(records))
    del records
    read, peak = traced_peak(lambda: list(iter_pages(path, bad_rows="report")))
    assert isinstance(read, list)
    assert [(p.id, p.error_code if p.error else None) for p in read] == [
        ("<urn:uuid:good>", None),
        ("<urn:uuid:long>", ErrorCode.PAYLOAD_TOO_LARGE),
        ("<urn:uuid:bomb>", ErrorCode.PAYLOAD_TOO_LARGE),
        ("<urn:uuid:over>", ErrorCode.PAYLOAD_TOO_LARGE),
        ("<urn:uuid:resource>", ErrorCode.PAYLOAD_TOO_LARGE),
        ("<urn:uuid:after>", None),
    ]
    assert read[1].url == "https://example.com/" and read[1].meta["http_status"] == 200
    assert peak < 8 << 20


LF_HEADS = {
    "bare LF": "\n",
    "mixed": ("\n", "\r\n", "\n", "\r\n", "\r\n"),
    "LF blank line only": ("\r\n", "\r\n", "\r\n", "\r\n", "\n"),
    "LF then CRLF blank line": ("\n", "\n", "\n", "\n", "\r\n"),
}


@pytest.mark.parametrize("eol", LF_HEADS.values(), ids=LF_HEADS.keys())
def test_a_head_with_bare_lf_line_ends_is_read_as_browsers_read_it(
    tmp_path: Path, eol: str | tuple[str, ...]
) -> None:
    """warcio and browsers end a head's lines at CRLF or a bare LF; FastWARC's parser only at CRLF, so
    such a head swallowed the body with its Content-Type: a small page was skipped without a word, one
    over 32 KiB was a "Maximum header length exceeded" error row."""
    # A <meta> the HTTP charset contradicts: the page is transcoded only when that header was read.
    czech = f'<html><head><meta charset="iso-8859-1"></head><p>{CZECH}</p></html>'.encode("cp1250")
    big = b"<html><body><p>" + b"big page " * 8000 + b"</p></body></html>"
    gzipped = {"Content-Encoding": "gzip"}
    path = tmp_path / "lf.warc"
    path.write_bytes(
        response("small", HttpResponse(czech, "text/html; charset=windows-1250", headers={"X": "1"}, eol=eol))
        + response("big", HttpResponse(big, headers={"X": "1"}, eol=eol))
        + response("gzip", HttpResponse(gzip.compress(czech), "text/html", headers=gzipped, eol=eol))
        + response(
            "missing", HttpResponse(b"<p>gone</p>", status="404 Not Found", headers={"X": "1"}, eol=eol)
        )
    )
    pages = list(iter_pages(path, bad_rows="report"))
    assert [(p.id[10:-1], p.error) for p in pages] == [(n, None) for n in ("small", "big", "gzip", "missing")]
    small, large, gz, missing = pages
    assert CZECH in decode_html(small.html).text and small.encoding == "cp1250"
    assert small.meta["content_type"] == "text/html; charset=windows-1250"
    assert large.html == big and gz.html == czech  # Content-Encoding read, and no charset in the header
    assert small.meta["http_status"] == 200 and missing.meta["http_status"] == 404
    assert missing.html == b"<p>gone</p>"


def test_a_bare_lf_head_folds_and_repeats_as_a_crlf_one(tmp_path: Path) -> None:
    """A folded line (obs-fold) goes on the previous header and a repeated header's lines are one list,
    with either line end."""
    czech = f'<html><head><meta charset="iso-8859-1"></head><p>{CZECH}</p></html>'.encode("cp1250")
    records = []
    for name, eol in (("crlf", "\r\n"), ("lf", "\n")):
        block = eol.join(
            [
                "HTTP/1.1 200 OK",
                "Content-Type: text/html;",
                "\t charset=windows-1250",
                "Content-Type: text/html",
                "no colon here",
                "Content-Encoding: gzip",
                "",
                "",
            ]
        ).encode() + gzip.compress(czech)
        records.append(warc_record(name, block))
    path = tmp_path / "fold.warc"
    path.write_bytes(b"".join(records))
    crlf, lf = iter_pages(path)
    merged = "text/html; charset=windows-1250, text/html"  # the same type again: the charset stays
    assert crlf.meta["content_type"] == lf.meta["content_type"] == merged
    assert crlf.html == lf.html and CZECH in decode_html(lf.html).text
    assert crlf.encoding == lf.encoding == "cp1250"  # the folded charset, transcoded from the gzip body


CYRILLIC = "Привет, мир: съешь же ещё этих мягких французских булок"


def _two_line_head(record_id: str, lines: list[str], body: bytes) -> bytes:
    return warc_record(record_id, "\r\n".join(["HTTP/1.1 200 OK", *lines, "", ""]).encode() + body)


def test_repeated_content_type_and_encoding_lines_are_one_list(tmp_path: Path) -> None:
    """Fetch combines a header's lines with ", " and reads the list: `text/html` then `text/html;
    charset=iso-8859-5` is iso-8859-5 (the first line alone was read as windows-1251, mojibake), the
    last media type counts, and two Content-Encoding lines are two codings (RFC 9110 section 5.3)."""
    # Its <meta> says windows-1251: only the HTTP charset, which outranks it, reads it right.
    html = f'<html><head><meta charset="windows-1251"></head><p>{CYRILLIC}</p></html>'.encode("iso-8859-5")
    charset = "text/html; charset=iso-8859-5"
    path = tmp_path / "repeated.warc"
    path.write_bytes(
        _two_line_head("later", ["Content-Type: text/html", f"Content-Type: {charset}"], html)
        + _two_line_head("earlier", [f"Content-Type: {charset}", "Content-Type: text/html"], html)
        + _two_line_head("html last", ["Content-Type: text/plain", f"Content-Type: {charset}"], html)
        + _two_line_head("plain last", [f"Content-Type: {charset}", "Content-Type: text/plain"], html)
        + _two_line_head(
            "twice gzipped",
            ["Content-Type: text/html", "Content-Encoding: gzip", "X: 1", "Content-Encoding: gzip"],
            gzip.compress(gzip.compress(html)),
        )
        + _two_line_head(
            "brotli then gzip",
            ["Content-Type: text/html", "Content-Encoding: br", "Content-Encoding: gzip"],
            gzip.compress(brotli.compress(html)),
        )
    )
    pages = {p.id[10:-1]: p for p in iter_pages(path, bad_rows="report")}
    assert list(pages) == ["later", "earlier", "html last", "twice gzipped", "brotli then gzip"]
    assert all(p.error is None for p in pages.values())
    assert pages["later"].meta["content_type"] == f"text/html, {charset}"
    for name in ("later", "earlier", "html last"):
        assert pages[name].encoding == codecs.lookup("iso-8859-5").name, name
        assert CYRILLIC in decode_html(pages[name].html).text, name
    for name in ("twice gzipped", "brotli then gzip"):  # the charset left to the decoder: bytes as sent
        assert pages[name].html == html, name


def test_an_http_head_without_end_is_bounded(tmp_path: Path) -> None:
    """A head is at most 32 KiB: a block with no blank line in them is an error row (never a page made of
    a head, nor read to its end), while a short one with none is all head, as a bodiless redirect."""
    endless = b"HTTP/1.1 200 OK\nContent-Type: text/html\nX: " + b"x" * (40 << 10) + b"\n<p>lost</p>"
    path = tmp_path / "head.warc"
    path.write_bytes(
        warc_record("endless", endless)
        + warc_record("redirect", b"HTTP/1.1 301 Moved\nContent-Type: text/html\nLocation: /b\n")
        + response("after", HttpResponse(b"<p>after</p>", eol="\n"))
    )
    endless_row, redirect, after = iter_pages(path, bad_rows="report")
    assert endless_row.error_code == ErrorCode.VALIDATION
    assert "the HTTP response head is malformed: no blank line ends it" in (endless_row.error or "")
    assert redirect.error is None and redirect.html == b"" and redirect.meta["http_status"] == 301
    assert after.error is None and after.html == b"<p>after</p>"


def test_a_response_without_a_body_or_content_type_is_an_empty_page(tmp_path: Path) -> None:
    """A redirect stored bare (no body, no Content-Type) was dropped before it became a page, where one
    typed text/html is an empty page with its status: the docs promise rows by which empty redirects can
    be filtered out. A bodiless response typed as something else, an untyped body that is no HTML, and
    an empty untyped resource record (no HTTP status to tell anything by) stay no page."""
    moved = {"Location": "https://example.com/b"}
    path = tmp_path / "redirects.warc"
    path.write_bytes(
        response("bare", HttpResponse(b"", None, status="301 Moved Permanently", headers=moved))
        + response("blank", HttpResponse(b" \r\n", None, status="302 Found", headers=moved))
        + response("chunked", HttpResponse(b"", None, status="304 Not Modified", chunked=True))
        + response("typed", HttpResponse(b"", "text/html", status="301 Moved Permanently", headers=moved))
        + response("image", HttpResponse(b"", "image/png", status="301 Moved Permanently", headers=moved))
        + response("data", HttpResponse(b"\x89PNG\r\n\x1a\n", None))
        + warc_record("resource", b"", record_type="resource", content_type="")
    )
    pages = {page.id[10:-1]: page for page in iter_pages(path, bad_rows="report")}
    assert list(pages) == ["bare", "blank", "chunked", "typed"]
    assert all(page.error is None and page.html.strip() == b"" for page in pages.values())
    assert pages["bare"].meta == {
        "warc_file": path.name,
        "warc_date": "2026-11-30T12:00:00Z",
        "http_status": 301,
        "content_type": None,
    }
    assert [page.meta["http_status"] for page in pages.values()] == [301, 302, 304, 301]


def test_a_bracketed_target_uri_and_an_untyped_http_response_are_read(tmp_path: Path) -> None:
    """wget writes every WARC-Target-URI in WARC 1.0's angle brackets, which had stayed in each page's
    `url`; a response record without a WARC Content-Type (a SHOULD) whose block is an HTTP response had
    been passed over in silence."""
    page = b"<html><body><p>a page</p></body></html>"
    path = tmp_path / "wget.warc"
    path.write_bytes(
        response("wget", HttpResponse(page, "text/html"), "<http://example.org/a>")
        + warc_record("untyped", HttpResponse(page, "text/html").block(), content_type="")
        + warc_record("dns", b"example.org. 60 IN A 192.0.2.1\r\n", uri="dns:example.org", content_type="")
    )
    wget, untyped = iter_pages(path, bad_rows="report")
    assert wget.url == "http://example.org/a" and wget.error is None
    assert untyped.id == "<urn:uuid:untyped>" and untyped.html == page and untyped.meta["http_status"] == 200
