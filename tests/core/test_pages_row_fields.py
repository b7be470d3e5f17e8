"""A JSONL row whose fields contradict or name nothing is a bad row (`validation_error`), reported in its
place as every bad row is, where one of its fields had been dropped in silence."""

from __future__ import annotations

import json
from pathlib import Path

from service.core.errors import ErrorCode
from service.core.pages import iter_pages

PAGE = "<html><body><p>A page.</p></body></html>"


def _rows(tmp_path: Path, *rows: dict[str, str]) -> Path:
    (tmp_path / "p.html").write_text(PAGE)
    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return source


def test_a_row_with_both_html_and_file_is_a_bad_row(tmp_path: Path) -> None:
    source = _rows(
        tmp_path, {"id": "both", "html": "<p>text</p>", "file": "p.html"}, {"id": "ok", "file": "p.html"}
    )
    both, ok = iter_pages(source, bad_rows="report")
    assert both.error_code == ErrorCode.VALIDATION
    assert both.error == f"{source}: line 1 has both 'html' and 'file': a row is one page, give one of them"
    assert ok.error is None and ok.html == PAGE.encode()


def test_an_encoding_nobody_knows_is_a_bad_row_one_python_knows_is_ignored_as_before(tmp_path: Path) -> None:
    source = _rows(
        tmp_path,
        {"id": "typo", "file": "p.html", "encoding": "windows-1252x"},
        {"id": "python-only", "file": "p.html", "encoding": "latin-1"},  # a browser ignores it: so do we
        {"id": "whatwg", "file": "p.html", "encoding": "Shift_JIS"},
    )
    typo, python_only, whatwg = iter_pages(source, bad_rows="report")
    assert typo.error_code == ErrorCode.VALIDATION and "'windows-1252x' names no charset" in (
        typo.error or ""
    )
    assert python_only.error is None and whatwg.error is None


def test_every_label_a_browser_knows_is_a_charset_and_a_codec_that_is_none_is_not(tmp_path: Path) -> None:
    # x-user-defined and the replacement encoding's labels are the Encoding Standard's, ignored on purpose
    # where declared; base64 and rot13 are Python codecs, but of no text; "" is no charset given at all.
    kept = ["x-user-defined", "ISO-2022-CN", "hz-gb-2312", "", "  "]
    refused = ["base64", "rot13", "zlib", "undefined"]
    rows = ({"id": label, "file": "p.html", "encoding": label} for label in kept + refused)
    source = _rows(tmp_path, *rows)
    pages = iter_pages(source, bad_rows="report")
    assert [page.error is None for page in pages] == [True] * len(kept) + [False] * len(refused)
