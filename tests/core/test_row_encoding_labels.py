"""A JSONL row's `encoding` is the charset its file was served with, read as that HTTP header's
`charset` parameter is (docs/engine.md): quoted, or followed by another parameter, it names the charset
it names there, and the page reads the same from the row as from a WARC record with that header.

Python's codec lookup, which reads quotes and punctuation as `_`, had taken `"windows-1251"`,
`'windows-1251'` and `windows-1251;` for labels it knows and a browser does not: no validation_error,
and the label ignored, the page read by its own <meta>. A label that names no charset once so read
(`'windows-1251'`, whose single quotes no header parse undoes) is a validation_error row.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from service.core.errors import ErrorCode
from service.core.pages import Page, iter_pages
from tests.factories.warc import HttpResponse, response

TEXT = "Привет, мир"
# windows-1251 bytes under a <meta> that says koi8-r: read by the <meta>, the text is other Cyrillic.
PAGE = f'<html><head><meta charset="koi8-r"></head><body><p>{TEXT}</p></body></html>'.encode("cp1251")


def _rows(tmp_path: Path, labels: list[str]) -> list[Page]:
    (tmp_path / "p.html").write_bytes(PAGE)
    source = tmp_path / "in.jsonl"
    rows = ({"id": str(n), "file": "p.html", "encoding": label} for n, label in enumerate(labels))
    source.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return list(iter_pages(source, bad_rows="report"))


def _warc(tmp_path: Path, labels: list[str]) -> list[Page]:
    path = tmp_path / "crawl.warc"
    records = (
        response(str(n), HttpResponse(PAGE, f"text/html; charset={label}")) for n, label in enumerate(labels)
    )
    path.write_bytes(b"".join(records))
    return list(iter_pages(path, bad_rows="report"))


HONOURED = [
    '"windows-1251"',
    ' "windows-1251" ',
    '"WINDOWS-1251"',
    "windows-1251;",
    "windows-1251; format=flowed",
    '"windows-1251";',
    "windows-1251,",
    "windows-1251",
]


@pytest.mark.parametrize("label", HONOURED)
def test_a_quoted_or_punctuated_label_reads_as_the_header_charset_it_is(tmp_path: Path, label: str) -> None:
    [page] = _rows(tmp_path, [label])
    assert page.error is None
    assert page.encoding == "cp1251" and TEXT.encode() in page.html


def test_a_row_reads_as_the_warc_record_with_that_header_does(tmp_path: Path) -> None:
    labels = [*HONOURED, "latin-1", '"latin-1"', "x-user-defined", "utf-8, text/html; charset=windows-1251"]
    rows = _rows(tmp_path, labels)
    records = _warc(tmp_path, labels)
    assert [page.error for page in rows] == [None] * len(labels)
    assert [(page.html, page.encoding) for page in rows] == [(page.html, page.encoding) for page in records]


@pytest.mark.parametrize(
    "label",
    [
        "'windows-1251'",
        "'utf-8'",
        "utf 8",
        "windows-1251 x",
        '""',
        ";",
        "windows-1251x;",
        "`utf-8`",
        "(utf-8)",
    ],
)
def test_a_label_that_names_no_charset_once_read_as_a_header_is_a_bad_row(tmp_path: Path, label: str) -> None:
    (bad,) = _rows(tmp_path, [label])
    assert bad.error_code == ErrorCode.VALIDATION
    assert f"'encoding' {label!r} names no charset" in (bad.error or "")


def test_a_python_only_label_is_still_ignored_as_a_header_is(tmp_path: Path) -> None:
    """`latin-1` and `utf_8` are no labels to a browser, which ignores them in a header: the page is
    read by its own <meta> (here koi8-r), with no error, as before (docs/preprocessing.md)."""
    pages = _rows(tmp_path, ["latin-1", '"latin_1"', "utf_8"])
    assert [page.error for page in pages] == [None, None, None]
    assert all(TEXT.encode() not in page.html for page in pages)


def test_a_label_too_long_to_be_a_charset_is_refused_unparsed(tmp_path: Path) -> None:
    """The header parser is quadratic in the parameters; a label longer than any charset's (here 20 KiB,
    over `page_jsonl.MAX_ENCODING_CHARS`) is refused before it is parsed, and quoted in part."""
    label = "windows-1251; " + "a=b; " * 4096
    bad, ok = _rows(tmp_path, [label, "windows-1251; " + "a=b; " * 10])
    assert bad.error_code == ErrorCode.VALIDATION and "names no charset" in (bad.error or "")
    assert len(bad.error or "") < 400
    assert ok.error is None and ok.encoding == "cp1251"
