"""Reading collections of raw pages: the one reader every command, benchmark and training step uses.

A page source is one of:
- a directory with `manifest.jsonl`, or else `manifest.jsonl.gz` (rows with `id`, `file`, optional `url`
  and metadata), as the shared corpus is laid out; a manifest there that cannot be read (a dangling
  symlink, not a file) refuses the directory, never read as a directory of pages instead;
- a JSONL file (`.jsonl`, or gzipped `.jsonl.gz`) whose rows carry `html` (a string) or `file` (a path
  relative to the JSONL file), plus optional `id` (a string, or an integer read as its decimal text;
  a row without one is named by its position), `url`, `encoding` (the charset a `file`'s bytes were
  served with, as an HTTP Content-Type would declare it) and any other fields (kept in `Page.meta`).
  A field of the wrong type (`"url": 12345`), a row nesting arrays and objects more than
  `MAX_ROW_DEPTH` deep, and a `file` that is a page source of its own (a WARC or JSONL file: by its
  name, as a single file is told, else by a start only such a file has, `_source_by_content`) are the
  row's error. A `file` that is absolute or climbs out with `..` is followed as
  written: a manifest is trusted like the command line that names it, and may point at pages kept
  elsewhere;
- a WARC file (`.warc`, `.warc.gz`, `.warc.zst`, `.warc.lz4`; read by `service.core.warc_pages`), as
  crawlers write them: every `response` record with an HTML payload (and every HTML `resource` record)
  is a page, with the WARC-Record-ID as its id, WARC-Target-URI as its url, the HTTP body with its
  chunked transfer and Content-Encoding undone, and the HTTP charset honoured; other records
  (requests, images, revisits, DNS, metadata) are skipped; an HTTP response with no body and no
  Content-Type (a bare redirect, a 204 or 304) is an empty page keeping its `http_status`. `meta` has
  `warc_file`, `warc_date`, `http_status`, `content_type` and, for a record the crawler cut short,
  `warc_truncated`;
- a directory of `*.html`, `*.htm` (optionally `.gz`) and WARC files, read recursively in sorted order
  (`list_directory`: symlinked subdirectories followed, each directory walked once however many links
  lead to it; hidden files and directories and `__MACOSX/` are no part of it; other files are
  skipped; a directory with JSONL files but no page files is an error, not zero pages; a subdirectory
  that cannot be listed is an `input_unreadable` row in its place);
- a single HTML file (`.html`, `.htm`, optionally `.gz`).
Gzip is recognised by its magic bytes, so raw bytes reach the decoder exactly as crawled. A single file
with any other name is sniffed, through gzip when gzipped: JSONL when its content starts with `{`, WARC
with `WARC/`, one HTML page with `<`; anything else is refused, so a `pages.ndjson` or a renamed WARC
is never read as one page made of twelve. JSONL is UTF-8: a JSONL file in UTF-16 or UTF-32 (a byte-order
mark, or NUL bytes, at its start: Windows PowerShell writes UTF-16 by default) is refused whole, where
its lines split on the byte 0x0A read as rows of garbage, and so is one compressed with zstd, bzip2, xz,
LZ4 or zip under a plain or `.gz` name (by its magic bytes: `PageCompressedError`).

Every string a page carries (`id`, `url`, `error`, the strings in a JSONL row's `meta`) is valid
Unicode, so consumers that write UTF-8 (Parquet, JSON) never fail on it: a lone surrogate from a JSON
`\\ud800` escape becomes U+FFFD, and a file-name byte that is not UTF-8 (which Python spells as a
surrogate from U+DC80 to U+DCFF) becomes a `\\xNN` escape, so `caf\\xe9.html` stays distinguishable
from `caf\\xe8.html`. A row's `html` text reads as the service reads the same JSON text
(`service.api.documents.parse_json`): each lone surrogate is one U+FFFD, so a crawler's text decoded with
`surrogateescape` (one `\\udcNN` escape per undecodable byte) has one U+FFFD per such byte, as the
raw page would, where its surrogates encoded as three invalid bytes each had read as three.

A declared charset must survive the trip to consumers that take bytes only (the Engine, the pruner,
the evaluation's content keys), so a page's bytes are made self-describing with
`with_declared_encoding`: unchanged when the declaration changes nothing (the common case), UTF-8
behind a BOM when it does (an HTTP charset that a `<meta>` contradicts; a row's `html` text, which is
UTF-8 whatever its `<meta charset>` says).

A row that cannot be read (not JSON, not UTF-8, no `html` or `file`, a missing or corrupt file; a WARC
record cut off or with a corrupt body) raises `PageSourceError` naming its line or record, unless the
caller asks for `bad_rows="report"`: then it is yielded as a `Page` with `error` set and no bytes, at its
position. The bulk commands report it in that page's output row and go on, since one truncated line at
the end of a crawler's JSONL must not sink a million-page run; training and the benchmarks keep the
default and stop. A WARC or gzipped JSONL file that cannot be read past some point ends with one such
row; a directory goes on with its next file. The row's code says whose fault it is: `validation_error`
for a bad row or page, `input_unreadable` (`PageUnreadableError`) for a file the file system would not
give (permission denied, gone since it was listed or named, including a dangling symlink, an I/O error),
which the page's content has no part in.

A page still compressed once the reader has undone what the source says or a page file may hold (a
WARC body's chunking and Content-Encoding, a file's one gzip) is such a row too, `unsupported_media_type`
(`PageCompressedError`), as the API refuses such a body (`content_coding.undeclared_coding` tells it,
conservatively: a verified checksum, or deflate data that inflates and looks random): a zlib or zstd
`.html` file, a gzip file gzipped twice, a WARC body compressed once more than its Content-Encoding
says. Read on, it was binary noise embedded as a page.

Every page is capped at `MAX_PAGE_BYTES`, the pruner's cap: a page over it is such a row, with
`PageTooLargeError` (`payload_too_large`), and so is a JSONL line or a WARC record over four times the
cap, which is passed over unread (a line's row is then named by its position). Nothing is read or
inflated much past the cap: a 1 MB gzip file that inflated to 1 GiB was held whole, 2 to 5 GB.

The readers live beside this module, each in its own: `page_row` (`Page` and the errors),
`page_files` (a single file's kind, a page file's bytes), `page_jsonl` (rows), `page_directories`
(a directory's walk and manifests) and `warc_pages` (WARC files); this module is their public face,
and every name callers use is importable from here.
"""

from __future__ import annotations

import os
import stat
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

from service.core.errors import ErrorCode
from service.core.page_directories import (
    MANIFEST_NAMES,
    Listed,
    Skip,
    corpus_manifest,
    directory_page_files,
    hidden_page_files,
    list_directory,
    unused_manifests,
)
from service.core.page_files import (
    JSONL_SUFFIXES,
    WARC_SUFFIXES,
    declared_page,
    file_kind,
    read_file,
    read_page,
    read_page_bytes,
    source_mode,
)
from service.core.page_jsonl import count_rows, iter_jsonl, named_files
from service.core.page_row import (
    Page,
    PageCompressedError,
    PageSourceError,
    PageTooLargeError,
    PageUnreadableError,
    error_page,
    read_error,
    valid_json,
    valid_text,
)
from service.core.prune import DEFAULT_MAX_BYTES

# The public face: the names callers import from here, wherever they are defined.
__all__ = [
    "MANIFEST_NAMES", "MAX_PAGE_BYTES", "READ_FACTOR", "BadRows", "Listed", "Page", "PageCompressedError",
    "PageSourceError", "PageTooLargeError", "PageUnreadableError", "Skip", "count_pages", "declared_page",
    "error_page", "hidden_page_files", "iter_pages", "list_directory", "named_files", "page_files_of",
    "read_error", "read_page", "read_page_bytes", "source_kind", "unused_manifests", "valid_json",
    "valid_text",
]  # fmt: skip

# A page's byte cap: the pruner's, so the reader never hands on a page the Engine would refuse for its
# size (nor refuses one it would take). Read at call time, here and as `pages.MAX_PAGE_BYTES` in
# `page_files`, `page_jsonl`, `warc_pages` and `warc_record_page` (never imported by value), so a test
# lowers it for every source by patching it here.
MAX_PAGE_BYTES = DEFAULT_MAX_BYTES
# What may be read to find one page, as a multiple of the page cap: a JSONL row holds its page JSON-
# escaped (a Chinese character becomes a six-byte `\u4e2d` escape, twice its UTF-8; an emoji's two
# escapes triple it), a WARC record's block holds the HTTP head and a body still chunked or
# content-coded. A row or record over it is refused unread.
READ_FACTOR = 4

BadRows = Literal["raise", "report"]


def page_files_of(source: Path) -> Iterator[Path]:
    """The files `iter_pages(source)` reads pages from, besides the source itself: a directory's HTML
    and WARC files (`list_directory` with nothing skipped, so a page named as a bulk command's output,
    which the command's `skip` leaves unread, is listed), or the page files a JSONL file's or corpus
    manifest's rows name (`named_files`; one missing included). For `htmllm extract`'s check that its
    output is none of them: replaced by the run's rows, the page was lost. What cannot be looked at is
    left out; a source that cannot be read at all raises as `source_kind` says."""
    kind, path = source_kind(source)
    if kind == "directory":
        listed, _ = directory_page_files(path, None)
        yield from (entry.path for entry in listed if entry.problem is None)
    elif kind == "jsonl":
        yield from (file for _, file in named_files(path))


def _iter_html_dir(path: Path, skip: Skip | None) -> Iterator[Page]:
    page_files, files = directory_page_files(path, skip)
    if not page_files:
        # JSONL shards are read one file at a time (their ids and `file` paths are per file), never as
        # a directory's pages; zero pages in silence would look like a finished run.
        shards = [f for f in files if f.name.lower().endswith(JSONL_SUFFIXES)]
        if shards:
            raise PageSourceError(
                f"{path} holds no HTML or WARC files but {len(shards)} JSONL file(s) "
                f"({shards[0].relative_to(path)}, ...): pass a JSONL file itself, "
                f"or name the corpus's manifest manifest.jsonl (or manifest.jsonl.gz)"
            )
    for entry in page_files:
        # A name's bytes that are not UTF-8 become \xNN (Page); a directory's ends in "/", which no
        # file's does.
        page_id = str(entry.path.relative_to(path))
        if entry.problem is not None:
            page_id += "/" if entry.directory else ""
            yield error_page(page_id, PageUnreadableError(f"{path}: {entry.problem}"))
        elif entry.path.name.lower().endswith(WARC_SUFFIXES):
            # Named by the same relative path, so two `crawl.warc.gz` in two subdirectories name their
            # rows apart (`a/crawl.warc.gz@161`, `b/crawl.warc.gz@161`).
            yield from _iter_warc(entry.path, page_id)
        else:
            yield _file_page(page_id, entry.path, str(path))


def _file_page(page_id: str, path: Path, where: str) -> Page:
    """The page of one HTML file, or its error row."""
    try:
        return Page(id=page_id, html=read_file(path, where))
    except PageSourceError as exc:
        return error_page(page_id, exc)


def source_kind(path: Path) -> tuple[Literal["jsonl", "warc", "html", "directory"], Path]:
    """What a page source holds, and the path to read it from (a corpus directory's manifest); raises
    `PageSourceError` for a source that does not exist or a file of no kind it reads, and
    `PageUnreadableError` for one the file system will not let this process look at (see
    `source_mode`). Cheap (a file's first bytes at most): commands call it to refuse an input before
    loading a model, and every reader of a source goes through it, so each command says the same."""
    mode = source_mode(path, path)
    if mode is None:
        if path.is_symlink():  # dangling: the file system's, as the same link in a directory of pages is
            raise PageUnreadableError(
                f"page source {path} is a symlink to {os.readlink(path)}, which is gone"
            )
        raise PageSourceError(f"page source {path} does not exist")
    if stat.S_ISDIR(mode):
        manifest = corpus_manifest(path)
        return ("directory", path) if manifest is None else ("jsonl", manifest)
    if stat.S_ISREG(mode):
        return file_kind(path), path
    raise PageSourceError(f"page source {path} is neither a file nor a directory")


def iter_pages(
    source: str | Path, *, limit: int | None = None, bad_rows: BadRows = "raise", skip: Skip | None = None
) -> Iterator[Page]:
    """Yield the pages of `source` in a stable order, at most `limit` of them (bad rows included).

    A source that does not exist always raises; a bad row raises or, with `bad_rows="report"`, comes
    back as a `Page` whose `error` says why. `skip`: what a directory of pages holds that is no page of
    it (`list_directory`), such as a bulk command's own output written inside it.
    """
    kind, path = source_kind(Path(source))
    if kind == "jsonl":
        pages = iter_jsonl(path)
    elif kind == "warc":
        pages = _iter_warc(path)
    elif kind == "directory":
        pages = _iter_html_dir(path, skip)
    else:
        pages = iter([_file_page(path.name, path, str(path))])
    for count, page in enumerate(pages):
        if limit is not None and count >= limit:
            return
        if page.error is not None and bad_rows == "raise":
            if page.error_code == ErrorCode.PAYLOAD_TOO_LARGE:
                raise PageTooLargeError(page.error)
            if page.error_code == ErrorCode.INPUT_UNREADABLE:
                raise PageUnreadableError(page.error)
            if page.error_code == ErrorCode.UNSUPPORTED_MEDIA_TYPE:
                raise PageCompressedError(page.error)
            raise PageSourceError(page.error, code=page.error_code)
        yield page


def count_pages(
    source: str | Path,
    *,
    limit: int | None = None,
    stop: threading.Event | None = None,
    skip: Skip | None = None,
) -> int | None:
    """How many pages `iter_pages(source, limit=limit, skip=skip)` yields, where that is knowable without
    parsing them: the rows of a JSONL file or manifest, the files of a directory of HTML pages (and what
    could not be looked at there, a row each), 1 for one page.
    None for WARC files (a record is a page only once its HTTP head is read), an unreadable source, or
    when `stop` is set first: for a progress bar's total, counted beside the run, never before it."""
    try:
        kind, path = source_kind(Path(source))
        if kind == "jsonl":
            count = count_rows(path, limit, stop)
        elif kind == "html":
            count = 1
        elif kind == "directory":
            page_files, _ = directory_page_files(path, skip)
            if any(f.path.name.lower().endswith(WARC_SUFFIXES) for f in page_files):
                return None
            count = len(page_files)
        else:
            return None
    except (OSError, PageSourceError):
        return None
    if count is None:
        return None
    return count if limit is None else min(count, limit)


def _iter_warc(path: Path, name: str | None = None) -> Iterator[Page]:
    """The pages of a WARC file, read by `warc_pages`; `name` names it in its rows (`iter_warc`)."""
    # Imported here, not at the top: `warc_pages` builds its rows from this module's `Page`, errors and
    # page cap, so it imports this module, and an import back at load time would be circular.
    from service.core.warc_pages import iter_warc

    return iter_warc(path, name)
