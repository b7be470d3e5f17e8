"""Reading collections of raw pages: the one reader every command, benchmark and training step uses.

A page source is one of:
- a directory with `manifest.jsonl` (rows with `id`, `file`, optional `url` and metadata), as the
  shared corpus is laid out;
- a JSONL file whose rows carry `html` (a string) or `file` (a path relative to the JSONL file), plus
  optional `id`, `url` and any other fields (kept in `Page.meta`);
- a directory of `*.html`, `*.htm` (optionally `.gz`) files, read recursively in sorted order;
- a single HTML file.
Gzip is recognised by its magic bytes, so raw bytes reach the decoder exactly as crawled.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from service.core.errors import ErrorCode, HtmllmError

_HTML_SUFFIXES = (".html", ".htm", ".html.gz", ".htm.gz")
_GZIP_MAGIC = b"\x1f\x8b"


class PageSourceError(HtmllmError):
    """A page source that cannot be read: missing path, malformed row, unknown layout."""

    code = ErrorCode.VALIDATION


@dataclass(frozen=True)
class Page:
    id: str
    html: bytes
    url: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)


def read_page_bytes(path: Path) -> bytes:
    """The raw bytes of one page file, gunzipped when the file is gzip."""
    data = path.read_bytes()
    return gzip.decompress(data) if data[:2] == _GZIP_MAGIC else data


def _row_page(row: dict[str, Any], base: Path, index: int, origin: str) -> Page:
    if not isinstance(row, dict):
        raise PageSourceError(f"{origin}: row {index + 1} is not a JSON object")
    meta = {k: v for k, v in row.items() if k not in ("id", "html", "file", "url")}
    page_id = str(row.get("id", index))
    url = row.get("url")
    if isinstance(row.get("html"), str):
        html = row["html"].encode("utf-8")
    elif isinstance(row.get("file"), str):
        path = base / row["file"]
        if not path.is_file():
            raise PageSourceError(f"{origin}: row {index + 1} names a missing file {path}")
        html = read_page_bytes(path)
    else:
        raise PageSourceError(f"{origin}: row {index + 1} has neither 'html' nor 'file'")
    return Page(id=page_id, html=html, url=url if isinstance(url, str) else None, meta=meta)


def _iter_jsonl(path: Path) -> Iterator[Page]:
    with path.open(encoding="utf-8") as handle:
        index = 0
        for line in handle:
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise PageSourceError(f"{path}: line {index + 1} is not JSON: {exc}") from exc
            yield _row_page(row, path.parent, index, str(path))
            index += 1


def _iter_html_dir(path: Path) -> Iterator[Page]:
    for file in sorted(p for p in path.rglob("*") if p.is_file() and p.name.lower().endswith(_HTML_SUFFIXES)):
        yield Page(id=str(file.relative_to(path)), html=read_page_bytes(file))


def iter_pages(source: str | Path, *, limit: int | None = None) -> Iterator[Page]:
    """Yield the pages of `source` in a stable order, at most `limit` of them."""
    path = Path(source)
    if path.is_dir():
        manifest = path / "manifest.jsonl"
        pages = _iter_jsonl(manifest) if manifest.is_file() else _iter_html_dir(path)
    elif path.is_file():
        if path.suffix == ".jsonl":
            pages = _iter_jsonl(path)
        else:
            pages = iter([Page(id=path.name, html=read_page_bytes(path))])
    else:
        raise PageSourceError(f"page source {path} does not exist")
    for count, page in enumerate(pages):
        if limit is not None and count >= limit:
            return
        yield page
