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


@pytest.mark.parametrize("content", ["not json\n", json.dumps({"id": "1"}) + "\n", "[1, 2]\n"])
def test_bad_rows_raise_typed_errors(tmp_path: Path, content: str) -> None:
    source = tmp_path / "bad.jsonl"
    source.write_text(content)
    with pytest.raises(PageSourceError):
        list(iter_pages(source))


def test_missing_source(tmp_path: Path) -> None:
    with pytest.raises(PageSourceError):
        list(iter_pages(tmp_path / "nope"))
