"""Reading collections of raw pages: the one reader every command, benchmark and training step uses.

A page source is one of:
- a directory with `manifest.jsonl` (rows with `id`, `file`, optional `url` and metadata), as the
  shared corpus is laid out;
- a JSONL file whose rows carry `html` (a string) or `file` (a path relative to the JSONL file), plus
  optional `id`, `url` and any other fields (kept in `Page.meta`);
- a directory of `*.html`, `*.htm` (optionally `.gz`) files, read recursively in sorted order;
- a single HTML file.
Gzip is recognised by its magic bytes, so raw bytes reach the decoder exactly as crawled.

A row that cannot be read (not JSON, not UTF-8, no `html` or `file`, a missing or corrupt file) raises
`PageSourceError` naming its line, unless the caller asks for `bad_rows="report"`: then it is yielded as
a `Page` with `error` set and no bytes, at its position. The bulk commands report it in that page's output
row and go on, since one truncated line at the end of a crawler's JSONL must not sink a million-page run;
training and the benchmarks keep the default and stop.
"""

from __future__ import annotations

import gzip
import json
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from service.core.errors import ErrorCode, HtmllmError

_HTML_SUFFIXES = (".html", ".htm", ".html.gz", ".htm.gz")
_GZIP_MAGIC = b"\x1f\x8b"

BadRows = Literal["raise", "report"]


class PageSourceError(HtmllmError):
    """A page source that cannot be read: missing path, malformed row, unknown layout."""

    code = ErrorCode.VALIDATION


@dataclass(frozen=True)
class Page:
    id: str
    html: bytes
    url: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    error: str | None = None  # why the row could not be read (only with bad_rows="report"); html is b""


def read_page_bytes(path: Path) -> bytes:
    """The raw bytes of one page file, gunzipped when the file is gzip."""
    data = path.read_bytes()
    return gzip.decompress(data) if data[:2] == _GZIP_MAGIC else data


def _read_file(path: Path, where: str) -> bytes:
    try:
        return read_page_bytes(path)
    except (OSError, EOFError, zlib.error) as exc:  # gzip.BadGzipFile is an OSError
        raise PageSourceError(f"{where}: cannot read {path}: {exc}") from exc


def _row_id(row: Any, index: int) -> str:
    """A row's `id`, or its position when it has none (or is not an object)."""
    page_id = row.get("id") if isinstance(row, dict) else None
    return str(index) if page_id is None else str(page_id)


def _row_page(row: Any, base: Path, index: int, where: str) -> Page:
    if not isinstance(row, dict):
        raise PageSourceError(f"{where} is not a JSON object")
    meta = {k: v for k, v in row.items() if k not in ("id", "html", "file", "url")}
    page_id = _row_id(row, index)
    url = row.get("url")
    if isinstance(row.get("html"), str):
        # A lone surrogate ("\ud800" is valid JSON) cannot be UTF-8: pass it on as the invalid bytes
        # it is, which the page decoder replaces like any other bad byte.
        html = row["html"].encode("utf-8", errors="surrogatepass")
    elif isinstance(row.get("file"), str):
        path = base / row["file"]
        if not path.is_file():
            raise PageSourceError(f"{where} names a missing file {path}")
        html = _read_file(path, where)
    else:
        raise PageSourceError(f"{where} has neither 'html' nor 'file'")
    return Page(id=page_id, html=html, url=url if isinstance(url, str) else None, meta=meta)


def _iter_jsonl(path: Path) -> Iterator[Page]:
    """Rows in file order; `index` counts rows (blank lines are not rows), messages name the line. A bad
    row comes back as a Page with `error` set; `iter_pages` decides whether that raises."""
    with path.open("rb") as handle:
        index = 0
        for line_number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            where = f"{path}: line {line_number}"
            row: Any = None
            try:
                try:
                    row = json.loads(line)  # from bytes: a line that is not UTF-8 is a bad row, not a crash
                except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError
                    raise PageSourceError(f"{where} is not JSON: {exc}") from exc
                page = _row_page(row, path.parent, index, where)
            except PageSourceError as exc:
                page = Page(id=_row_id(row, index), html=b"", error=str(exc))
            yield page
            index += 1


def _iter_html_dir(path: Path) -> Iterator[Page]:
    for file in sorted(p for p in path.rglob("*") if p.is_file() and p.name.lower().endswith(_HTML_SUFFIXES)):
        page_id = str(file.relative_to(path))
        try:
            page = Page(id=page_id, html=_read_file(file, str(path)))
        except PageSourceError as exc:
            page = Page(id=page_id, html=b"", error=str(exc))
        yield page


def iter_pages(
    source: str | Path, *, limit: int | None = None, bad_rows: BadRows = "raise"
) -> Iterator[Page]:
    """Yield the pages of `source` in a stable order, at most `limit` of them (bad rows included).

    A source that does not exist always raises; a bad row raises or, with `bad_rows="report"`, comes
    back as a `Page` whose `error` says why.
    """
    path = Path(source)
    if path.is_dir():
        manifest = path / "manifest.jsonl"
        pages = _iter_jsonl(manifest) if manifest.is_file() else _iter_html_dir(path)
    elif path.is_file():
        if path.suffix == ".jsonl":
            pages = _iter_jsonl(path)
        else:
            pages = iter([Page(id=path.name, html=_read_file(path, str(path)))])
    else:
        raise PageSourceError(f"page source {path} does not exist")
    for count, page in enumerate(pages):
        if limit is not None and count >= limit:
            return
        if page.error is not None and bad_rows == "raise":
            raise PageSourceError(page.error)
        yield page
