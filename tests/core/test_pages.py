"""The page-source reader, on sources the test writes itself."""

from __future__ import annotations

import errno
import gzip
import io
import json
import os
import re
import threading
from pathlib import Path
from typing import Any

import pytest

from service.core import page_jsonl, pages
from service.core.decoding import decode_html
from service.core.errors import ErrorCode
from service.core.pages import (
    PageSourceError,
    PageTooLargeError,
    PageUnreadableError,
    count_pages,
    iter_pages,
    named_files,
    read_page,
)
from service.core.prune import prune_html
from tests.factories.disk import closed_directory, eio_for, unlistable_directory
from tests.factories.warc import HttpResponse, response, warc_gz
from tests.memory import gzip_bomb, traced_peak


def test_manifest_directory_with_gzip(tmp_path: Path) -> None:
    (tmp_path / "pages").mkdir()
    (tmp_path / "pages" / "a.html.gz").write_bytes(gzip.compress(b"<p>\xe8au</p>"))
    (tmp_path / "pages" / "b.html").write_bytes(b"<p>plain</p>")
    rows = [
        {"id": "a", "file": "pages/a.html.gz", "url": "https://a.example/", "with": ["x"]},
        {"id": "b", "file": "pages/b.html", "url": None},
    ]
    (tmp_path / "manifest.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    pages = list(iter_pages(tmp_path))
    assert [p.id for p in pages] == ["a", "b"]
    assert pages[0].html == b"<p>\xe8au</p>"
    assert pages[0].url == "https://a.example/"
    assert pages[0].meta == {"with": ["x"]}
    assert pages[1].url is None
    assert len(list(iter_pages(tmp_path, limit=1))) == 1


def test_jsonl_inline_html(tmp_path: Path) -> None:
    source = tmp_path / "pages.jsonl"
    source.write_text(json.dumps({"html": "<b>é</b>", "label": "x"}) + "\n\n")
    (page,) = iter_pages(source)
    assert page.id == "0" and page.html == "<b>é</b>".encode() and page.meta == {"label": "x"}


def test_html_directory_and_single_file(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "x.htm").write_bytes(b"<i>1</i>")
    (tmp_path / "y.html").write_bytes(b"<i>2</i>")
    (tmp_path / "notes.txt").write_bytes(b"skip me")
    assert [p.id for p in iter_pages(tmp_path)] == ["sub/x.htm", "y.html"]
    assert next(iter_pages(tmp_path / "y.html")).html == b"<i>2</i>"


@pytest.mark.parametrize("content", ["not json\n", json.dumps({"id": "1"}) + "\n", "[1, 2]\n", "\xff\xfe\n"])
def test_bad_rows_raise_typed_errors(tmp_path: Path, content: str) -> None:
    source = tmp_path / "bad.jsonl"
    source.write_bytes(content.encode("latin-1") if content.startswith("\xff") else content.encode())
    with pytest.raises(PageSourceError, match="line 1"):
        list(iter_pages(source))


def _mixed_jsonl(path: Path) -> Path:
    (path.parent / "broken.html.gz").write_bytes(b"\x1f\x8b not really gzip")
    lines = [
        json.dumps({"id": "good", "html": "<p>ok</p>"}).encode(),
        b"",  # blank lines are not rows but do count as lines
        b"{not json",
        b"\xff\xfe binary",
        json.dumps({"id": "no-html"}).encode(),
        json.dumps({"id": None, "file": "missing.html"}).encode(),
        json.dumps({"id": "gz", "file": "broken.html.gz"}).encode(),
        b'{"id": "lone", "html": "<p>\\ud800 x</p>"}',  # a lone surrogate escape: valid JSON
        json.dumps(["not", "an", "object"]).encode(),
        b'{"id": "cut", "html": "<p>trunc',  # a writer killed mid-line
    ]
    path.write_bytes(b"\n".join(lines))
    return path


def test_bad_rows_name_the_right_line(tmp_path: Path) -> None:
    source = _mixed_jsonl(tmp_path / "mixed.jsonl")
    with pytest.raises(PageSourceError, match="line 3 is not JSON"):
        list(iter_pages(source))


def test_reported_bad_rows_keep_their_position(tmp_path: Path) -> None:
    pages = list(iter_pages(_mixed_jsonl(tmp_path / "mixed.jsonl"), bad_rows="report"))
    assert [p.id for p in pages] == ["good", "1", "2", "no-html", "4", "gz", "lone", "7", "8"]
    errors = [p.error for p in pages]
    assert errors[0] is None and pages[0].html == b"<p>ok</p>"
    # One U+FFFD, as the service reads the same JSON text (not three, one per byte of its UTF-8 form).
    assert errors[6] is None and decode_html(pages[6].html).text == "<p>\ufffd x</p>"
    expected = {
        1: "line 3 is not JSON",
        2: "line 4 is not JSON",
        3: "line 5 has neither 'html' nor 'file'",
        4: "line 6 names a missing file",
        5: "line 7: cannot read",
        7: "line 9 is not a JSON object",
        8: "line 10 is not JSON",
    }
    for index, fragment in expected.items():
        error = errors[index]
        assert error is not None and fragment in error, (index, error)
        assert pages[index].html == b""
    assert len(list(iter_pages(tmp_path / "mixed.jsonl", bad_rows="report", limit=3))) == 3


def test_a_corrupt_file_in_an_html_directory(tmp_path: Path) -> None:
    (tmp_path / "a.html").write_bytes(b"<p>a</p>")
    (tmp_path / "b.html.gz").write_bytes(b"\x1f\x8b\x08 truncated")
    with pytest.raises(PageSourceError, match="cannot read"):
        list(iter_pages(tmp_path))
    pages = list(iter_pages(tmp_path, bad_rows="report"))
    assert [(p.id, p.error is None) for p in pages] == [("a.html", True), ("b.html.gz", False)]


def test_a_page_file_that_cannot_be_read_is_input_unreadable_not_a_bad_page(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An OSError reading a page (EIO, permission denied, a file gone) was a `validation_error` row, as
    if the page were bad; and a directory's dangling symlink was skipped, its page lost without a word.
    (Root reads a chmod 000 file, so the failures here are a patched reader and a dangling symlink.)"""
    site = tmp_path / "site"
    site.mkdir()
    for name in ("a.html", "c.html"):
        (site / name).write_bytes(b"<p>a page</p>")
    (site / "b.html").symlink_to(tmp_path / "gone.html")
    (site / "d.html.gz").write_bytes(b"\x1f\x8b\x08 truncated")  # a bad page: still validation_error
    eio_for(monkeypatch, "c.html")
    rows = list(iter_pages(site, bad_rows="report"))
    assert [(p.id, p.error_code if p.error else None) for p in rows] == [
        ("a.html", None),
        ("b.html", ErrorCode.INPUT_UNREADABLE),
        ("c.html", ErrorCode.INPUT_UNREADABLE),
        ("d.html.gz", ErrorCode.VALIDATION),
    ]
    assert "No such file or directory" in str(rows[1].error) and "Input/output error" in str(rows[2].error)
    assert count_pages(site) == len(rows)
    with pytest.raises(PageUnreadableError, match=r"b\.html"):
        list(iter_pages(site))

    # A dangling WARC stopped the whole run, report or not: FastWARC raised from its constructor, and
    # its FileNotFoundError has no errno, so it was called a bad page (validation_error) too.
    crawl = tmp_path / "crawl"
    crawl.mkdir()
    (crawl / "a.html").write_bytes(b"<p>a page</p>")
    (crawl / "b.warc.gz").symlink_to(tmp_path / "gone.warc.gz")
    (crawl / "d.html").write_bytes(b"<p>a page after the WARC</p>")
    rows = list(iter_pages(crawl, bad_rows="report"))
    assert [(p.id, p.error_code if p.error else None) for p in rows] == [
        ("a.html", None),
        ("b.warc.gz@0", ErrorCode.INPUT_UNREADABLE),
        ("d.html", None),
    ]
    assert "b.warc.gz" in str(rows[1].error) and "No such file or directory" in str(rows[1].error)
    with pytest.raises(PageUnreadableError, match=r"b\.warc\.gz"):
        list(iter_pages(crawl))
    # The same link named as the source: the file system's too, not "does not exist" (validation_error).
    with pytest.raises(PageUnreadableError, match=r"gone\.warc\.gz, which is gone"):
        list(iter_pages(crawl / "b.warc.gz"))

    # A JSONL row naming a file that is gone or not a file, or whose file cannot be read; a single file.
    (tmp_path / "rows.jsonl").write_text(
        "".join(
            json.dumps({"id": i, "file": f}) + "\n"
            for i, f in enumerate(["site/b.html", "site", "site/c.html"])
        )
    )
    rows = list(iter_pages(tmp_path / "rows.jsonl", bad_rows="report"))
    assert [p.error_code for p in rows] == [ErrorCode.INPUT_UNREADABLE] * 3
    assert "names a missing file" in str(rows[0].error) and "which is not a file" in str(rows[1].error)
    assert [p.error_code for p in iter_pages(site / "c.html", bad_rows="report")] == [
        ErrorCode.INPUT_UNREADABLE
    ]

    # A row's file behind a directory this process may not enter: `Path.is_file` raised EACCES out of the
    # whole run. It is the row's input_unreadable, saying so. (Root enters any directory: stat is patched.)
    real_stat = Path.stat

    def locked_out(self: Path, **kwargs: Any) -> os.stat_result:
        if self.parent.name == "locked":
            raise PermissionError(errno.EACCES, "Permission denied", str(self))
        return real_stat(self, **kwargs)

    (tmp_path / "locked").mkdir()
    (tmp_path / "locked" / "x.html").write_bytes(b"<p>a page</p>")
    (tmp_path / "locked.jsonl").write_text(json.dumps({"id": "x", "file": "locked/x.html"}) + "\n")
    monkeypatch.setattr(Path, "stat", locked_out)
    (row,) = iter_pages(tmp_path / "locked.jsonl", bad_rows="report")
    assert row.error_code == ErrorCode.INPUT_UNREADABLE
    assert "x.html, which cannot be looked at: Permission denied" in str(row.error), row.error


def test_a_source_behind_a_closed_directory_is_input_unreadable_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A source under a directory of mode 000 (or a source directory of mode 000 itself): `Path.is_dir`
    raised a bare PermissionError out of `source_kind` (a traceback in `htmllm extract`, "[Errno 13]"
    without a code in `htmllm embed`). It is `input_unreadable`, naming the source and why, as a page
    file the file system will not give is. (Root searches any directory: the file system is patched.)"""
    closed = tmp_path / "noperm"
    (closed / "site").mkdir(parents=True)
    (closed / "site" / "a.html").write_bytes(b"<p>a page</p>")
    (closed / "pages.jsonl").write_text(json.dumps({"id": "a", "html": "<p>a</p>"}) + "\n")
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "manifest.jsonl").write_text(json.dumps({"id": "a", "html": "<p>a</p>"}) + "\n")
    closed_directory(monkeypatch, closed)
    closed_directory(monkeypatch, tmp_path / "corpus")  # the source directory itself of mode 000
    for source in (closed / "pages.jsonl", closed / "site", closed / "pages.ndjson", tmp_path / "corpus"):
        with pytest.raises(PageUnreadableError) as raised:
            list(iter_pages(source, bad_rows="report"))
        assert raised.value.code == ErrorCode.INPUT_UNREADABLE
        assert str(raised.value) == (
            f"page source {source} cannot be looked at: Permission denied "
            "(a directory on its path is closed to this user)"
        )
        assert count_pages(source) is None
    # What is really missing stays "does not exist", a bad option (validation_error), not the disk's.
    with pytest.raises(PageSourceError, match="does not exist") as missing:
        list(iter_pages(tmp_path / "typo.jsonl"))
    assert missing.value.code == ErrorCode.VALIDATION


@pytest.mark.skipif(os.geteuid() == 0, reason="root searches a directory of mode 000: patched above instead")
def test_a_source_under_a_directory_of_mode_000_is_input_unreadable(tmp_path: Path) -> None:
    closed = tmp_path / "noperm"
    closed.mkdir()
    (closed / "pages.jsonl").write_text(json.dumps({"id": "a", "html": "<p>a</p>"}) + "\n")
    closed.chmod(0)
    try:
        with pytest.raises(PageUnreadableError, match="cannot be looked at: Permission denied"):
            list(iter_pages(closed / "pages.jsonl"))
    finally:
        closed.chmod(0o700)


def test_a_jsonl_file_that_fails_mid_read_ends_with_an_input_unreadable_row(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """EIO past some line is the disk's failure; a gzip stream cut off there stays the file's
    (`validation_error`, `test_a_cut_off_jsonl_gz_ends_with_an_error_row`)."""
    source = tmp_path / "rows.jsonl"
    source.write_text("".join(json.dumps({"id": str(i), "html": "<p>x</p>"}) + "\n" for i in range(3)))
    opened = page_jsonl._open_jsonl

    class FailingAfterTwoLines:
        def __init__(self, handle: Any) -> None:
            self.handle, self.lines = handle, 0

        def readline(self, size: int = -1) -> bytes:
            self.lines += 1
            if self.lines > 2:
                raise OSError(errno.EIO, "Input/output error")
            return bytes(self.handle.readline(size))

        def __enter__(self) -> FailingAfterTwoLines:
            return self

        def __exit__(self, *_: object) -> None:
            self.handle.close()

    monkeypatch.setattr(page_jsonl, "_open_jsonl", lambda path: FailingAfterTwoLines(opened(path)))
    rows = list(iter_pages(source, bad_rows="report"))
    assert [(p.id, p.error_code if p.error else None) for p in rows] == [
        ("0", None),
        ("1", None),
        ("2", ErrorCode.INPUT_UNREADABLE),
    ]
    assert "cannot read past line 2" in str(rows[2].error)
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(gzip.compress(source.read_bytes())[:-12])
    monkeypatch.undo()
    assert list(iter_pages(cut, bad_rows="report"))[-1].error_code == ErrorCode.VALIDATION


def test_missing_source(tmp_path: Path) -> None:
    with pytest.raises(PageSourceError):
        list(iter_pages(tmp_path / "nope"))


CZECH = "Příliš žluťoučký kůň úpěl ďábelské ódy"


def test_inline_html_text_is_utf8_whatever_its_meta_says(tmp_path: Path) -> None:
    source = tmp_path / "rows.jsonl"
    html = f'<html><head><meta charset="windows-1250"></head><body><p>{CZECH}</p></body></html>'
    source.write_text(json.dumps({"id": "t", "html": html}) + "\n", encoding="utf-8")
    (page,) = iter_pages(source)
    assert decode_html(page.html).text.endswith(f"<p>{CZECH}</p></body></html>")
    assert prune_html(page.html) == f"<p>{CZECH}</p>"


def test_jsonl_gz_and_declared_file_encoding(tmp_path: Path) -> None:
    (tmp_path / "cz.html").write_bytes(f"<p>{CZECH}</p>".encode("iso-8859-2"))
    rows = [{"id": "cz", "file": "cz.html", "encoding": "iso-8859-2"}, {"id": "x", "html": "<p>x</p>"}]
    source = tmp_path / "rows.jsonl.gz"
    source.write_bytes(gzip.compress("".join(json.dumps(r) + "\n" for r in rows).encode()))
    cz, x = iter_pages(source)
    assert decode_html(cz.html).text == f"<p>{CZECH}</p>" and cz.meta == {}
    assert x.html == b"<p>x</p>"
    assert cz.encoding is None and x.encoding == "utf-8"  # a file as read: decode_html finds the codec
    # A declaration the page's <meta> contradicts: transcoded to UTF-8, and the codec it was read with
    # is kept, for an extraction to report (it said utf-8).
    (tmp_path / "cz.html").write_bytes(f'<meta charset="utf-8"><p>{CZECH}</p>'.encode("iso-8859-2"))
    (cz, _) = iter_pages(source)
    assert decode_html(cz.html).encoding == "utf-8" and cz.encoding == "iso8859-2"
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"file": "cz.html", "encoding": 1250}) + "\n")
    with pytest.raises(PageSourceError, match="'encoding' must be a charset name"):
        list(iter_pages(bad))


def test_a_cut_off_jsonl_gz_ends_with_an_error_row(tmp_path: Path) -> None:
    data = gzip.compress(
        b"".join(json.dumps({"id": str(i), "html": "<p>x</p>" * 50}).encode() + b"\n" for i in range(50))
    )
    source = tmp_path / "cut.jsonl.gz"
    source.write_bytes(data[: len(data) // 2])
    pages = list(iter_pages(source, bad_rows="report"))
    assert pages[-1].error is not None and "cannot read past line" in pages[-1].error
    assert all(p.error is None for p in pages[:-1]) and len(pages) > 1


def test_a_directory_of_warcs_and_html_files(tmp_path: Path) -> None:
    (tmp_path / "a.html").write_bytes(b"<p>a</p>")
    (tmp_path / "b.warc.gz").write_bytes(warc_gz([response("b1", HttpResponse(b"<p>b1</p>"))]))
    (tmp_path / "c.warc").write_bytes(b"WARC/1.1\r\nWARC-Type: resp")  # cut inside its first header
    (tmp_path / "d.warc").write_bytes(response("d1", HttpResponse(b"<p>d1</p>")))
    pages = list(iter_pages(tmp_path, bad_rows="report"))
    assert [(p.id, p.error is None) for p in pages] == [
        ("a.html", True),
        ("<urn:uuid:b1>", True),
        ("c.warc@0", False),
        ("<urn:uuid:d1>", True),
    ]


def _twelve_rows() -> bytes:
    return b"".join(json.dumps({"id": f"p{i}", "html": f"<p>{i}</p>"}).encode() + b"\n" for i in range(12))


@pytest.mark.parametrize(
    ("name", "before"), [("pages.ndjson", b""), ("pages.json.gz", b"\xef\xbb\xbf"), ("pages", b"\n \n")]
)
def test_a_jsonl_file_by_another_name_is_sniffed(tmp_path: Path, name: str, before: bytes) -> None:
    """Twelve rows must stay twelve pages, never collapse into one HTML page made of JSON."""
    data = before + _twelve_rows()  # a BOM or blank lines do not hide the first row
    source = tmp_path / name
    source.write_bytes(gzip.compress(data) if name.endswith(".gz") else data)
    assert [p.id for p in iter_pages(source)] == [f"p{i}" for i in range(12)]


def test_a_renamed_warc_is_sniffed(tmp_path: Path) -> None:
    source = tmp_path / "crawl.arc.gz"
    source.write_bytes(warc_gz([response(f"r{i}", HttpResponse(b"<p>x</p>")) for i in range(3)]))
    assert [p.id for p in iter_pages(source)] == [f"<urn:uuid:r{i}>" for i in range(3)]


def test_an_html_page_by_another_name_is_one_page(tmp_path: Path) -> None:
    source = tmp_path / "index.PHP"
    source.write_bytes(b"  <!doctype html><p>x</p>")
    assert [(p.id, p.html) for p in iter_pages(source)] == [("index.PHP", b"  <!doctype html><p>x</p>")]
    upper = tmp_path / "PAGE.HTM.GZ"  # a page suffix in any case is a page, whatever it starts with
    upper.write_bytes(gzip.compress(b"plain text"))
    assert [p.html for p in iter_pages(upper)] == [b"plain text"]


@pytest.mark.parametrize(
    "content",
    [b"[1, 2]\n", b"plain text\n", b"", gzip.compress(b"filedesc://old.arc", mtime=0), b"\x28\xb5\x2f\xfd.."],
    ids=["json array", "text", "empty", "gzipped ARC", "zstd"],
)
def test_an_unknown_single_file_is_refused(tmp_path: Path, content: bytes) -> None:
    source = tmp_path / "pages.dat"
    source.write_bytes(content)
    with pytest.raises(PageSourceError, match=r"cannot tell what .*pages\.dat holds.*JSONL file \(\.jsonl"):
        list(iter_pages(source, bad_rows="report"))


def test_a_directory_of_jsonl_shards_is_an_error_not_zero_pages(tmp_path: Path) -> None:
    (tmp_path / "part-0.jsonl.gz").write_bytes(gzip.compress(_twelve_rows()))
    (tmp_path / "README.txt").write_text("shards")
    with pytest.raises(PageSourceError, match="no HTML or WARC files but 1 JSONL file"):
        list(iter_pages(tmp_path, bad_rows="report"))
    (tmp_path / "a.html").write_bytes(b"<p>a</p>")  # with page files, the shards are skipped as before
    assert [p.id for p in iter_pages(tmp_path)] == ["a.html"]


def test_a_rows_html_text_reads_as_the_service_reads_the_same_json(tmp_path: Path) -> None:
    """A crawler that decoded a page with `surrogateescape` writes one `\\udcNN` escape per undecodable
    byte; the bulk command must see the text `POST /v1/embed` sees for that JSON (one U+FFFD per byte,
    as the raw bytes read as UTF-8 give), not three U+FFFD per byte, which changed the tokens."""
    from service.api.documents import parse_json
    from service.api.schemas import EmbedRequest

    raw = "<html><body><h1>Caf\u00e9 cr\u00e8me</h1><p>Tr\u00e8s \u00e9l\u00e9gant.</p></body></html>".encode(
        "cp1252"
    )
    text = raw.decode("utf-8", errors="surrogateescape")
    line = json.dumps({"id": "a", "html": text})  # ASCII: each surrogate as a "\\udcNN" escape
    source = tmp_path / "rows.jsonl"
    source.write_text(line + "\n", encoding="ascii")
    (page,) = iter_pages(source)
    served = (
        parse_json(EmbedRequest, json.dumps({"documents": [json.loads(line)]}).encode()).documents[0].html
    )
    assert decode_html(page.html).text == served == raw.decode("utf-8", errors="replace")
    assert served.count("\ufffd") == 5
    assert prune_html(page.html) == prune_html(served)


def test_every_string_a_page_carries_encodes_as_utf8(tmp_path: Path) -> None:
    """Lone surrogates (valid JSON escapes, or a file name's undecodable bytes) would crash a writer."""
    source = tmp_path / "rows.jsonl"
    rows = [
        b'{"id": "b\\ud800", "url": "https://x.example/\\udfff", "html": "<p>x</p>", "tag": ["\\ud83d"]}',
        b'{"id": "c\\udce9", "file": "missing\\ud800.html"}',
        b'{"id": "ok \\ud83d\\ude00", "html": "<p>y</p>"}',  # a surrogate pair is one character
    ]
    source.write_bytes(b"\n".join(rows))
    lone, missing, pair = iter_pages(source, bad_rows="report")
    assert (lone.id, lone.url, lone.meta) == ("b\ufffd", "https://x.example/\ufffd", {"tag": ["\ufffd"]})
    assert missing.id == "c\ufffd" and missing.error is not None and "missing\ufffd.html" in missing.error
    assert pair.id == "ok \U0001f600"

    html_dir = tmp_path / "dir"
    html_dir.mkdir()
    for raw in (b"caf\xe9.html", b"caf\xe8.html.gz"):
        (html_dir / os.fsdecode(raw)).write_bytes(
            b"<p>caf\xc3\xa9</p>" if raw.endswith(b"l") else b"\x1f\x8bcut"
        )
    broken, good = iter_pages(html_dir, bad_rows="report")
    assert (broken.id, good.id) == ("caf\\xe8.html.gz", "caf\\xe9.html")  # distinguishable, not both U+FFFD
    assert broken.error is not None and "caf\\xe8.html.gz" in broken.error
    for page in (lone, missing, pair, broken, good):
        json.dumps([page.id, page.url, page.error, page.meta], ensure_ascii=False).encode("utf-8")


@pytest.mark.parametrize(
    ("row", "fragment"),
    [
        ({"id": "n", "html": 123}, "'html' must be a string, not a number"),
        ({"id": "f", "file": ["a.html"]}, "'file' must be a path (a string), not an array"),
        ({"id": 1.5, "html": "<p>x</p>"}, "'id' must be a string or an integer, not a number"),
        ({"id": {"k": 1}, "html": "<p>x</p>"}, "'id' must be a string or an integer, not an object"),
        ({"id": True, "html": "<p>x</p>"}, "'id' must be a string or an integer, not a boolean"),
    ],
)
def test_fields_of_the_wrong_type_say_so(tmp_path: Path, row: dict[str, object], fragment: str) -> None:
    source = tmp_path / "rows.jsonl"
    source.write_text(json.dumps(row) + "\n")
    with pytest.raises(PageSourceError, match=re.escape(f"line 1: {fragment}")):
        list(iter_pages(source))
    (page,) = iter_pages(source, bad_rows="report")
    assert page.id in ("n", "f", "0")  # a refused id is never its Python repr: the row's position


def test_an_integer_id_is_its_decimal_text(tmp_path: Path) -> None:
    source = tmp_path / "rows.jsonl"
    source.write_text(json.dumps({"id": 17, "html": "<p>x</p>"}) + "\n")
    assert [p.id for p in iter_pages(source)] == ["17"]


def test_a_positional_fallback_id_can_equal_a_real_one(tmp_path: Path) -> None:
    """Documented, not refused: ids need not be unique, so the bulk commands key rows by `index`."""
    source = tmp_path / "rows.jsonl"
    lines = [json.dumps({"id": f"r{i}", "html": "<p>x</p>"}) for i in range(8)]
    lines[3], lines[7] = json.dumps({"id": 7, "html": "<p>x</p>"}), "not json"
    source.write_text("\n".join(lines) + "\n")
    pages = list(iter_pages(source, bad_rows="report"))
    assert [i for i, p in enumerate(pages) if p.id == "7"] == [3, 7]
    assert pages[3].error is None and pages[7].error is not None


def test_a_file_outside_the_manifests_directory_is_followed(tmp_path: Path) -> None:
    """A manifest is trusted like a command line: it may point at pages kept elsewhere."""
    (tmp_path / "pages").mkdir()
    (tmp_path / "pages" / "a.html").write_bytes(b"<p>a</p>")
    (tmp_path / "lists").mkdir()
    rows = [
        {"id": "up", "file": "../pages/a.html"},
        {"id": "abs", "file": str(tmp_path / "pages" / "a.html")},
    ]
    source = tmp_path / "lists" / "rows.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert [(p.id, p.html) for p in iter_pages(source)] == [("up", b"<p>a</p>"), ("abs", b"<p>a</p>")]


def test_count_pages_agrees_with_iter_pages_where_it_counts(tmp_path: Path) -> None:
    """The progress bar's total: exactly what `iter_pages` yields for JSONL (blank lines, gzip, a cut
    stream, a limit), manifests, HTML directories and single pages; None where only parsing can tell."""
    rows = b"".join(json.dumps({"id": str(i), "html": "<p>x</p>" * 50}).encode() + b"\n\n" for i in range(50))
    (tmp_path / "plain.jsonl").write_bytes(b"\n" + rows + b"   \n")
    (tmp_path / "rows.jsonl.gz").write_bytes(gzip.compress(rows))
    whole = gzip.compress(rows)
    (tmp_path / "cut.jsonl.gz").write_bytes(whole[: len(whole) // 2])
    (tmp_path / "html").mkdir()
    for name in ("a.html", "b.htm.gz", "notes.txt"):
        (tmp_path / "html" / name).write_bytes(
            gzip.compress(b"<p>x</p>") if name.endswith(".gz") else b"<p>x</p>"
        )
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "manifest.jsonl").write_text(
        '{"id": "a", "html": "<p>a</p>"}\n{"id": "b", "html": "b"}\n'
    )
    sources = ["plain.jsonl", "rows.jsonl.gz", "cut.jsonl.gz", "html", "corpus", "html/a.html"]
    for name in sources:
        for limit in (None, 1, 7):
            expected = len(list(iter_pages(tmp_path / name, limit=limit, bad_rows="report")))
            assert count_pages(tmp_path / name, limit=limit) == expected, (name, limit)
    (tmp_path / "html" / "c.warc").write_bytes(response("c1", HttpResponse(b"<p>c1</p>")))
    assert count_pages(tmp_path / "html") is None  # a WARC's pages are known only by reading it
    assert count_pages(tmp_path / "html" / "c.warc") is None
    assert count_pages(tmp_path / "missing.jsonl") is None
    stop = threading.Event()
    stop.set()
    assert count_pages(tmp_path / "plain.jsonl", stop=stop) is None


# ---------------------------------------------------------------------------------------------------
# The page cap: a page over it is that page's error row, found without reading or inflating it whole


def test_a_page_at_the_cap_is_read_and_one_byte_over_is_its_error_row(tmp_path: Path, cap_1_kib: int) -> None:
    at_cap, over = "x" * cap_1_kib, "x" * (cap_1_kib + 1)
    (tmp_path / "at.html").write_text(at_cap)
    (tmp_path / "over.html").write_text(over)
    (tmp_path / "over.html.gz").write_bytes(gzip.compress(over.encode()))
    rows = [{"id": "at", "html": at_cap}, {"id": "over", "html": over}, {"id": "file", "file": "over.html"}]
    (tmp_path / "manifest.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    read = list(iter_pages(tmp_path, bad_rows="report"))
    assert [(p.id, p.error_code if p.error else None) for p in read] == [
        ("at", None),
        ("over", ErrorCode.PAYLOAD_TOO_LARGE),
        ("file", ErrorCode.PAYLOAD_TOO_LARGE),
    ]
    assert read[0].html == at_cap.encode() and read[1].html == b""
    assert "over the cap of 1024" in (read[1].error or "")
    for single in ("at.html", "over.html", "over.html.gz"):
        (page,) = iter_pages(tmp_path / single, bad_rows="report")  # a single file: its one row
        assert (page.error is None) == (single == "at.html"), single
    with pytest.raises(PageTooLargeError) as raised:
        list(iter_pages(tmp_path / "over.html.gz"))
    assert raised.value.code == ErrorCode.PAYLOAD_TOO_LARGE


def test_a_gzip_bomb_file_is_refused_without_inflating_it(tmp_path: Path, cap_1_kib: int) -> None:
    # gzip.decompress held all 4 MiB (a 1 MB file inflating to 1 GiB took `htmllm prune` 2 GB); a file
    # too large to hold a page of the cap even gzipped is not read at all.
    (tmp_path / "a.html").write_bytes(b"<p>a</p>")
    bomb = gzip_bomb(b"<p>", 4 << 20)
    assert len(bomb) < 5 * cap_1_kib
    (tmp_path / "bomb.html.gz").write_bytes(bomb)
    (tmp_path / "c.html").write_bytes(b"<p>c</p>")
    (tmp_path / "d.html").write_bytes(b"<p>" + b"d" * (4 << 20))
    read, peak = traced_peak(lambda: list(iter_pages(tmp_path, bad_rows="report")))
    assert isinstance(read, list)
    assert [(p.id, p.error_code if p.error else None) for p in read] == [
        ("a.html", None),
        ("bomb.html.gz", ErrorCode.PAYLOAD_TOO_LARGE),
        ("c.html", None),
        ("d.html", ErrorCode.PAYLOAD_TOO_LARGE),
    ]
    assert "inflates to more than 1024 bytes" in (read[1].error or "")
    # The file's own size, not the reader's bound (it said "has more than 5120 bytes").
    assert f"d.html is too large: it has {(4 << 20) + 3} bytes, over the page cap of 1024 bytes" in (
        read[3].error or ""
    )
    assert peak < 1 << 20


def test_named_files_are_the_files_the_rows_read_from(tmp_path: Path, cap_1_kib: int) -> None:
    """What `input_identity` pins for a JSONL file: each row's `file` where the row is read from it, in
    row order, gzipped or not; a row with `html`, one that is no JSON or too long to read, names none."""
    lines = [
        json.dumps({"id": "a", "file": "pages/a.html"}),
        json.dumps({"id": "inline", "html": "<p>x</p>", "file": "pages/unread.html"}),
        json.dumps({"id": "long", "file": "pages/unread.html", "pad": "x" * 5000}),  # over the row bound
        '{"id": "cut", "file": "pages/unread.html"',
        json.dumps({"file": "../elsewhere/b.html"}),  # followed as written
    ]
    data = ("\n".join(lines) + "\n").encode()
    (tmp_path / "rows.jsonl").write_bytes(data)
    (tmp_path / "rows.jsonl.gz").write_bytes(gzip.compress(data))
    for name in ("rows.jsonl", "rows.jsonl.gz"):
        assert list(named_files(tmp_path / name)) == [
            ("pages/a.html", tmp_path / "pages/a.html"),
            ("../elsewhere/b.html", tmp_path / "../elsewhere/b.html"),
        ], name
    # A gzip stream cut off names what its rows before the cut name.
    (tmp_path / "cut.jsonl.gz").write_bytes(gzip.compress(data)[:-30])
    assert [name for name, _ in named_files(tmp_path / "cut.jsonl.gz")] == ["pages/a.html"]


def test_a_page_over_the_cap_read_from_a_stream_says_the_cap_it_is_over(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A stream has no size to tell (standard input for `htmllm prune`): it said "it has more than 1053824
    bytes", the reader's own bound, as if it were the page's size."""
    monkeypatch.setattr(pages, "MAX_PAGE_BYTES", 1 << 20)
    with pytest.raises(PageTooLargeError) as raised:
        read_page(io.BytesIO(b"<p>" + b"x" * (2 << 20)))
    assert str(raised.value) == "it holds more than the page cap of 1 MiB"


def test_a_row_over_the_row_bound_is_its_error_row_and_never_held(tmp_path: Path, cap_1_kib: int) -> None:
    """Rows are read at most 4x the cap at a time (room for JSON escapes): a longer line is one error row
    at its position, passed over unread; a line of blanks only stays a blank line, no row."""
    lines = [
        json.dumps({"id": "a", "html": "<p>a</p>"}),
        json.dumps({"id": "long", "html": "x" * 10_000}),  # over the row bound: its id is never read
        " " * 10_000,  # blank
        json.dumps({"id": "escaped", "html": "中" * 300}),  # 1,800 bytes of \uXXXX for 900 bytes of page
        json.dumps({"id": "big", "html": "é" * 600}),  # a row within the bound, a page over the cap
        json.dumps({"id": "b", "html": "<p>b</p>"}),
    ]
    data = ("\n".join(lines) + "\n").encode()
    (tmp_path / "rows.jsonl").write_bytes(data)
    (tmp_path / "rows.jsonl.gz").write_bytes(gzip.compress(data))
    for name in ("rows.jsonl", "rows.jsonl.gz"):
        read = list(iter_pages(tmp_path / name, bad_rows="report"))
        assert [(p.id, p.error_code if p.error else None) for p in read] == [
            ("a", None),
            ("1", ErrorCode.PAYLOAD_TOO_LARGE),
            ("escaped", None),
            ("big", ErrorCode.PAYLOAD_TOO_LARGE),
            ("b", None),
        ], name
        assert "line 2 has more than 4096 bytes" in (read[1].error or "")
        assert "line 5: the page has 1200 bytes" in (read[3].error or "")
        assert count_pages(tmp_path / name) == len(read)
    with pytest.raises(PageTooLargeError, match="line 2"):
        list(iter_pages(tmp_path / "rows.jsonl"))


def test_a_jsonl_gz_line_that_inflates_to_a_bomb_is_never_held(tmp_path: Path, cap_1_kib: int) -> None:
    # readline() without a bound held the whole line (1 GiB: `htmllm extract` took 5.2 GB and 43 s).
    source = tmp_path / "bomb.jsonl.gz"
    source.write_bytes(
        gzip.compress(b'{"id": "a", "html": "<p>a</p>"}\n')
        + gzip_bomb(b'{"id": "bomb", "html": "', 64 << 20, b'"}\n')
        + gzip.compress(b'{"id": "b", "html": "<p>b</p>"}\n')
    )
    read, peak = traced_peak(lambda: list(iter_pages(source, bad_rows="report")))
    assert isinstance(read, list)
    assert [(p.id, p.error_code if p.error else None) for p in read] == [
        ("a", None),
        ("1", ErrorCode.PAYLOAD_TOO_LARGE),
        ("b", None),
    ]
    assert peak < 8 << 20
    counted, peak = traced_peak(lambda: count_pages(source))
    assert counted == 3 and peak < 8 << 20


def test_symlinked_directories_are_followed_and_a_link_back_up_is_read_once(tmp_path: Path) -> None:
    """`Path.rglob` (Python 3.11) follows a symlinked file but not a symlinked directory: its pages were
    dropped without a word, and a directory whose shards were all links "held no pages". A link to a
    directory it is in must not loop."""
    (tmp_path / "store" / "2024").mkdir(parents=True)
    (tmp_path / "store" / "2024" / "b.html").write_bytes(b"<p>b</p>")
    site = tmp_path / "site"
    (site / "sub").mkdir(parents=True)
    (site / "a.html").write_bytes(b"<p>a</p>")
    (site / "sub" / "c.html").write_bytes(b"<p>c</p>")
    (site / "linked").symlink_to(tmp_path / "store")
    (site / "sub" / "up").symlink_to("..")  # a cycle: sub/up/sub/up/...
    (site / "sub" / "self").symlink_to(".")
    expected = ["a.html", "linked/2024/b.html", "sub/c.html"]
    assert [p.id for p in iter_pages(site)] == expected
    assert count_pages(site) == 3
    shards = tmp_path / "shards"
    shards.mkdir()
    (shards / "0").symlink_to(tmp_path / "store" / "2024")
    assert [p.id for p in iter_pages(shards)] == ["0/b.html"]


def test_a_subdirectory_that_cannot_be_listed_is_an_input_unreadable_row(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`Path.rglob` (Python 3.11) passes over a directory it may not list: its pages were missing from a
    run that ended with status 0. It is a row of its own, named by the directory (a trailing "/"), in
    its place. (Root lists any directory: `os.scandir` is patched.)"""
    site = tmp_path / "site"
    (site / "private").mkdir(parents=True)
    (site / "private" / "b.html").write_bytes(b"<p>b</p>")
    (site / "a.html").write_bytes(b"<p>a</p>")
    (site / "c.html").write_bytes(b"<p>c</p>")
    unlistable_directory(monkeypatch, site / "private")
    rows = list(iter_pages(site, bad_rows="report"))
    assert [(p.id, p.error_code if p.error else None) for p in rows] == [
        ("a.html", None),
        ("c.html", None),
        ("private/", ErrorCode.INPUT_UNREADABLE),
    ]
    assert f"cannot list the directory {site / 'private'}: Permission denied" in str(rows[2].error)
    assert count_pages(site) == 3
    with pytest.raises(PageUnreadableError, match="cannot list the directory"):
        list(iter_pages(site))
    # The source directory itself: the source's error, as for a file.
    with pytest.raises(PageUnreadableError, match=r"page source .*private cannot be read: Permission denied"):
        list(iter_pages(site / "private", bad_rows="report"))


@pytest.mark.parametrize(
    ("codec", "bom", "said"),
    [
        ("utf-16-le", b"\xff\xfe", "UTF-16LE"),  # Windows PowerShell 5's `>` and Out-File
        ("utf-16-be", b"\xfe\xff", "UTF-16BE"),
        ("utf-32-le", b"\xff\xfe\x00\x00", "UTF-32LE"),
        ("utf-16-le", b"", "UTF-16 or UTF-32"),
    ],
)
def test_a_jsonl_file_in_utf16_or_utf32_is_refused_not_misread(
    tmp_path: Path, codec: str, bom: bytes, said: str
) -> None:
    """Its lines were split on the byte 0x0A: a UTF-16LE file read as two bad rows, the second one
    a phantom made of the newline's NUL byte."""
    text = json.dumps({"id": "a", "html": "<p>a</p>"}) + "\r\n"
    for name in ("pages.jsonl", "pages.jsonl.gz", "pages.dat"):  # by its name, gzipped, sniffed
        data = bom + text.encode(codec)
        source = tmp_path / name
        source.write_bytes(gzip.compress(data) if name.endswith(".gz") else data)
        with pytest.raises(PageSourceError, match=f"{name} is {said} text .*a JSONL file is UTF-8"):
            list(iter_pages(source, bad_rows="report"))
        assert count_pages(source) is None
    # A UTF-16 HTML page by another name is the one page it is, read as its BOM says.
    page = tmp_path / "page.dat"
    page.write_bytes("\ufeff<p>une page</p>".encode("utf-16-le"))
    (read,) = iter_pages(page)
    assert read.html == page.read_bytes()
