"""The page-source reader, on sources the test writes itself."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from service.core.pages import PageSourceError, iter_pages


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
    assert errors[6] is None and pages[6].html == b"<p>\xed\xa0\x80 x</p>"  # passed on as bad bytes
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


def test_missing_source(tmp_path: Path) -> None:
    with pytest.raises(PageSourceError):
        list(iter_pages(tmp_path / "nope"))
