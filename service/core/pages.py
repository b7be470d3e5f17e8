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
"""

from __future__ import annotations

import codecs
import errno
import gzip
import heapq
import json
import os
import re
import stat
import threading
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, BinaryIO, Literal, NamedTuple

from service.core.content_coding import ContentCodingError, decode_content, undeclared_coding
from service.core.decoding import declared_codec, with_declared_encoding, without_lone_surrogates
from service.core.encoding_labels import known_label
from service.core.errors import ErrorCode, HtmllmError
from service.core.media_types import charset_parameter
from service.core.prune import DEFAULT_MAX_BYTES
from service.core.warc_frames import GZIP_MAGIC

_HTML_SUFFIXES = (".html", ".htm", ".html.gz", ".htm.gz")
# A corpus directory's manifest, by its one name, or gzipped as JSONL is read elsewhere; and the names
# of a manifest that is not read (`unused_manifests`): another case, another JSONL suffix, compressed.
MANIFEST_NAMES = ("manifest.jsonl", "manifest.jsonl.gz")
_MANIFEST_LIKE = re.compile(r"manifest\.(?:jsonl|ndjson|jsonlines)(?:\.[a-z0-9]+)?", re.IGNORECASE)
_JSONL_SUFFIXES = (".jsonl", ".jsonl.gz")
_WARC_SUFFIXES = (".warc", ".warc.gz", ".warc.zst", ".warc.lz4")
_SNIFF_BYTES = 4096  # enough to get past a BOM and leading blank lines to the first real byte
# Compressions no page source is read through, by the suffix a tool gives the file it writes (for the
# refusal of `x.jsonl.zst`, which had said its name "ends in no known suffix") and by the magic bytes it
# starts with (for a `.jsonl` file compressed under its plain name, whose lines split on the byte 0x0A had
# been one garbage error row each, and the run ended with status 0). Gzip is read wherever it is found;
# zstd and LZ4 only in a WARC file (`_WARC_SUFFIXES`).
_COMPRESSION_SUFFIXES = {
    ".zst": "zstd", ".zstd": "zstd", ".bz2": "bzip2", ".xz": "xz", ".lzma": "lzma", ".lz4": "LZ4",
    ".br": "brotli", ".zip": "zip", ".7z": "7-Zip", ".z": "compress",
}  # fmt: skip
_COMPRESSION_MAGIC = (
    # zstd's frame, or a skippable frame (a dictionary, metadata) before it; bzip2's stream header with its
    # block size and the magic of its first block (or of its end, for an empty stream); xz's and LZ4's
    # frame magic; a zip archive's first local file header.
    (re.compile(rb"\x28\xb5\x2f\xfd|[\x50-\x5f]\x2a\x4d\x18"), "zstd"),
    (re.compile(rb"BZh[1-9](?:1AY&SY|\x17rE8P\x90)"), "bzip2"),
    (re.compile(rb"\xfd7zXZ\x00"), "xz"),
    (re.compile(rb"\x04\x22\x4d\x18"), "LZ4"),
    (re.compile(rb"PK\x03\x04"), "zip"),
)
_MAGIC_BYTES = 10  # the longest of them, bzip2's
# How deep a JSONL row's arrays and objects may nest, the row itself 1 (`_nests_deeper`): the API's
# JSON parser's limit (pydantic's, 200). `json.loads` and `valid_json` recurse (`valid_json` two frames
# a level), and the RecursionError of a row nested some 450 deep had ended the run (and every resume of
# it); caught, where it struck depended on how deep the reader's caller was. A fixed depth, checked
# without recursion, is one rule for every caller: it is far above any real row's (a crawl's metadata
# nests a few levels) and leaves the recursion limit's 1,000 frames room for a caller 500 deep.
MAX_ROW_DEPTH = 200
# The end of a row's error for a row nested deeper; and for the recursion limit struck all the same (a
# caller hundreds of frames deep, a lowered limit). Such a row is JSON: "is not JSON" had said otherwise.
NESTED_TOO_DEEP = f"nests arrays and objects more than {MAX_ROW_DEPTH} deep (the limit for a row)"
TOO_DEEP_TO_READ = "nests arrays and objects too deeply to be read (recursion limit exceeded)"
_SURROGATE = re.compile("[\ud800-\udfff]")
_SOURCE_KINDS = (
    "a corpus directory with manifest.jsonl (or .jsonl.gz), a JSONL file (.jsonl, .jsonl.gz), a WARC file "
    "(.warc, .warc.gz, .warc.zst, .warc.lz4), a directory of HTML and WARC files, an HTML file "
    "(.html, .htm, optionally .gz)"
)
# A page's byte cap: the pruner's, so the reader never hands on a page the Engine would refuse for its
# size (nor refuses one it would take). Read at call time, here and as `pages.MAX_PAGE_BYTES` in
# `warc_pages` and `warc_record_page` (never imported by value), so a test lowers it for every source by
# patching it here.
MAX_PAGE_BYTES = DEFAULT_MAX_BYTES
# What may be read to find one page, as a multiple of the page cap: a JSONL row holds its page JSON-
# escaped (a Chinese character becomes a six-byte `\u4e2d` escape, twice its UTF-8; an emoji's two
# escapes triple it), a WARC record's block holds the HTTP head and a body still chunked or
# content-coded. A row or record over it is refused unread.
READ_FACTOR = 4
_SKIP_STEP = 1 << 20  # bytes read at a time to pass over the rest of a row too long to keep
# The longest JSONL `encoding` parsed as a charset parameter, as the API bounds a Content-Type header it
# parses: the longest label a browser knows has 19 characters, and the email parser took 8.5 s over a
# row's 1 MiB of `a=b; ` (it is quadratic in the parameters), which a longer label is refused without.
MAX_ENCODING_CHARS = 1024

BadRows = Literal["raise", "report"]


class PageSourceError(HtmllmError):
    """A page source that cannot be read: missing path, malformed row, unknown layout."""

    code = ErrorCode.VALIDATION


class PageTooLargeError(PageSourceError):
    """A page (or the row or record holding it) over the page cap, `MAX_PAGE_BYTES`."""

    code = ErrorCode.PAYLOAD_TOO_LARGE


class PageCompressedError(PageSourceError):
    """A page whose bytes are still compressed once the reader has undone what it knows of (a file's
    gzip, a WARC body's chunking and Content-Encoding): read on, it was binary noise embedded as a normal
    row. `unsupported_media_type`, as the API answers such a body (`check_not_compressed`)."""

    code = ErrorCode.UNSUPPORTED_MEDIA_TYPE


class PageUnreadableError(PageSourceError):
    """A page file (or the source holding pages) the file system would not give: permission denied, a
    file gone since it was listed or named, an I/O error. Told apart from a bad page (`validation_error`),
    since the page itself was never seen: fixing the mount or the permissions, not the input, fixes it."""

    code = ErrorCode.INPUT_UNREADABLE


# What the file system says of a path whatever the errno: FastWARC raises these with none (its
# FileNotFoundError for a dangling symlink has errno None), and they are never the content's.
_FILE_SYSTEM_ERRORS = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)


def read_error(message: str, exc: BaseException) -> PageSourceError:
    """The error for a read that raised `exc`, the one rule for "the file system's fault or the page's":
    an `OSError` with an errno, or one of `_FILE_SYSTEM_ERRORS`, is the file system's
    (`PageUnreadableError`); the content's (gzip's `BadGzipFile`, another `OSError` without an errno, a
    cut stream's `EOFError`, `zlib.error`) is a bad page, `PageSourceError`."""
    if isinstance(exc, _FILE_SYSTEM_ERRORS) or (isinstance(exc, OSError) and exc.errno is not None):
        return PageUnreadableError(message)
    return PageSourceError(message)


def valid_text(text: str) -> str:
    """`text` with every lone surrogate replaced, so it encodes as UTF-8: a surrogate from U+DC80 to
    U+DCFF (how Python spells a file-name byte that is not UTF-8) becomes that byte's `\\xNN` escape,
    any other U+FFFD."""
    return text if text.isascii() else _SURROGATE.sub(_surrogate_replacement, text)


def _surrogate_replacement(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code - 0xDC00:02x}" if 0xDC80 <= code <= 0xDCFF else "\ufffd"


def valid_json(value: Any) -> Any:
    """A decoded JSON value with U+FFFD for every lone surrogate (a `\\ud800` escape) in its strings
    and keys: a JSONL row's fields here, a request body in the API."""
    if isinstance(value, str):
        return without_lone_surrogates(value)
    if isinstance(value, list):
        return [valid_json(v) for v in value]
    if isinstance(value, dict):
        return {valid_json(k): valid_json(v) for k, v in value.items()}
    return value


@dataclass(frozen=True)
class Page:
    """One page; its `id`, `url` and `error` are made valid Unicode here (see `valid_text`), so no source
    can hand a writer a string it cannot encode."""

    id: str
    html: bytes
    url: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    error: str | None = None  # why the row could not be read (only with bad_rows="report"); html is b""
    error_code: ErrorCode = ErrorCode.VALIDATION  # what kind of failure `error` is, when it is set
    # The codec a declared charset (a JSONL row's `encoding`) had the bytes read with, when `html` was
    # transcoded from it to UTF-8 (`with_declared_encoding`), and utf-8 for a row's `html` text; None
    # when `html` is the bytes as read. A consumer reporting the page's encoding says this one, not the
    # UTF-8 it now reads.
    encoding: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "id", valid_text(self.id))
        if self.url is not None:
            object.__setattr__(self, "url", valid_text(self.url))
        if self.error is not None:
            object.__setattr__(self, "error", valid_text(self.error))


def gunzip_page(data: bytes) -> bytes:
    """A page's raw bytes, gunzipped when they are gzip (recognised by the magic bytes).

    A page over `MAX_PAGE_BYTES`, gzipped or not, raises `PageTooLargeError`, found without inflating
    more than the cap (a 1 MB gzip file can inflate to 1 GiB, which `gzip.decompress` held whole); a
    corrupt stream raises `PageSourceError`; bytes still compressed after that one gzip (zlib or zstd, or
    gzip in gzip) raise `PageCompressedError`: only the file's own gzip is undone, and what is left was
    binary noise embedded as a page.
    """
    limit = MAX_PAGE_BYTES
    gzipped = data[:2] == GZIP_MAGIC
    if gzipped:
        try:
            data = decode_content(data, "gzip", limit=limit)
        except ContentCodingError as exc:
            if exc.code == ErrorCode.PAYLOAD_TOO_LARGE:
                raise PageTooLargeError(f"it inflates to more than {limit} bytes, the page cap") from None
            raise PageSourceError(exc.message) from exc
    if len(data) > limit:
        raise PageTooLargeError(f"it has {len(data)} bytes, over the page cap of {_in_bytes(limit)}")
    coding = undeclared_coding(data)
    if coding is not None:
        # zlib, not HTTP's name for it: a file is no HTTP body, and `zlib-flate`/`pigz -z` wrote it.
        name, start = _FILE_CODING_NAMES.get(coding, coding), data[:4].hex(" ")
        if gzipped:
            raise PageCompressedError(
                f"the file holds {name}-compressed bytes once gunzipped (they start {start}): it was "
                "compressed twice; only one gzip, the file's own, is undone"
            )
        raise PageCompressedError(
            f"the file holds {name}-compressed bytes (they start {start}): decompress it first; gzip is "
            "the one compression a page file is read through"
        )
    return data


_FILE_CODING_NAMES = {"deflate": "zlib"}


def read_page(handle: BinaryIO) -> bytes:
    """One page's raw bytes from `handle` (a file, standard input), gunzipped when they are gzip; no
    more than about the page cap is read (`gunzip_page` says what it raises)."""
    # A gzipped page takes at most its size plus gzip's framing (5 bytes per 64 KiB stored block, a
    # header with the file's name): a file past that bound holds more than the cap.
    bound = MAX_PAGE_BYTES + MAX_PAGE_BYTES // 8192 + 4096
    data = handle.read(bound + 1)
    if len(data) > bound:
        # Said with the file's size where the file system knows it; `bound` is this reader's own figure,
        # which had passed for the page's ("it has more than 16783360 bytes").
        size, cap = _file_size(handle), _in_bytes(MAX_PAGE_BYTES)
        if size is None:  # a pipe: what it held past the bound was never read
            raise PageTooLargeError(f"it holds more than the page cap of {cap}")
        raise PageTooLargeError(f"it has {size} bytes, over the page cap of {cap}")
    return gunzip_page(data)


def _file_size(handle: BinaryIO) -> int | None:
    """The size of the regular file `handle` reads; None for a pipe or a stream without a file."""
    try:
        status = os.fstat(handle.fileno())
    except (OSError, ValueError, AttributeError):  # io.UnsupportedOperation is both of the first two
        return None
    return status.st_size if stat.S_ISREG(status.st_mode) else None


def _in_bytes(size: int) -> str:
    """`size` as a person reads it: "16 MiB" for the cap, else its bytes."""
    return f"{size >> 20} MiB" if size and size % (1 << 20) == 0 else f"{size} bytes"


def read_page_bytes(path: Path) -> bytes:
    """The raw bytes of one page file, gunzipped when the file is gzip (see `read_page`)."""
    with path.open("rb") as handle:
        return read_page(handle)


def _read_file(path: Path, where: str) -> bytes:
    try:
        return read_page_bytes(path)
    except PageTooLargeError as exc:
        raise PageTooLargeError(f"{where}: {path} is too large: {exc}") from None
    except PageCompressedError as exc:
        raise PageCompressedError(f"{where}: {path}: {exc}") from None
    except PageSourceError as exc:
        raise PageSourceError(f"{where}: cannot read {path}: {exc}") from exc
    except OSError as exc:
        raise read_error(f"{where}: cannot read {path}: {exc}", exc) from exc


def capped(html: bytes, where: str) -> bytes:
    """`html` if it is within the page cap, else `PageTooLargeError`."""
    if len(html) > MAX_PAGE_BYTES:
        raise PageTooLargeError(f"{where}: the page has {len(html)} bytes, over the cap of {MAX_PAGE_BYTES}")
    return html


def declared_page(raw: bytes, label: str | None, where: str) -> tuple[bytes, str | None]:
    """`raw` as `label` declares it read (`with_declared_encoding`), within the cap, and the codec it was
    transcoded from: None where the bytes stayed as read. The transcoded bytes are UTF-8, so a row
    reporting the page's encoding says this codec (a JSONL row's `encoding`, a WARC record's HTTP charset)."""
    html = with_declared_encoding(raw, label)
    return capped(html, where), (declared_codec(label) if html is not raw else None)


def error_page(page_id: str, exc: PageSourceError, **fields: Any) -> Page:
    """The row of a page that could not be read: no bytes, the error's message and code."""
    return Page(id=page_id, html=b"", error=str(exc), error_code=exc.code, **fields)


def _json_type(value: Any) -> str:
    """How JSON names a value's type, for messages about a field of the wrong type."""
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "an array"
    return "a string" if isinstance(value, str) else "null"


def _row_id(row: Any, index: int) -> str:
    """A row's `id` (an integer as its decimal text), or its position when it has none, it is not a
    string or an integer (`_row_page` refuses that row), or the row is not an object.

    The fallback can equal another row's real id (`"id": 7` at row 3, a bad line at row 7: both "7"),
    so ids need not be unique; the bulk commands' rows carry the position itself as `index`, the key
    that tells every row apart."""
    page_id = row.get("id") if isinstance(row, dict) else None
    if isinstance(page_id, str):
        return page_id
    if isinstance(page_id, int) and not isinstance(page_id, bool):
        return str(page_id)
    return str(index)


def _row_page(row: Any, base: Path, index: int, where: str) -> Page:
    if not isinstance(row, dict):
        raise PageSourceError(f"{where} is not a JSON object")
    raw_id = row.get("id")
    if raw_id is not None and (isinstance(raw_id, bool) or not isinstance(raw_id, str | int)):
        # A float or an object has no one obvious text: guessing one could merge two pages' ids.
        raise PageSourceError(f"{where}: 'id' must be a string or an integer, not {_json_type(raw_id)}")
    url = row.get("url")
    if url is not None and not isinstance(url, str):
        # As any other field of the wrong type: `"url": 12345` had become null in silence.
        raise PageSourceError(f"{where}: 'url' must be a string, not {_json_type(url)}")
    try:
        meta = {
            k: valid_json(v) for k, v in row.items() if k not in ("id", "html", "file", "url", "encoding")
        }
    except RecursionError:  # within `MAX_ROW_DEPTH`, but the caller's frames and these met the limit
        raise PageSourceError(f"{where} {TOO_DEEP_TO_READ}") from None
    page_id = valid_json(_row_id(row, index))
    html_text, file_name = row.get("html"), row.get("file")
    source_encoding: str | None = None
    if html_text is not None and file_name is not None:
        # Which one is the page is the writer's word, not ours: `html` was taken and `file` left unread
        # in silence (two dumps merged, a row whose text was meant to be dropped).
        raise PageSourceError(f"{where} has both 'html' and 'file': a row is one page, give one of them")
    if html_text is not None:
        if not isinstance(html_text, str):
            raise PageSourceError(f"{where}: 'html' must be a string, not {_json_type(html_text)}")
        # A lone surrogate ("\ud800" is valid JSON) cannot be UTF-8: one U+FFFD, as the API reads the
        # same text (`valid_json`); passed on as its three bad bytes it had read as three U+FFFD.
        # The text is UTF-8 now, whatever charset its <meta> names.
        html = capped(with_declared_encoding(valid_json(html_text).encode("utf-8"), "utf-8"), where)
        # Read as text, the page is UTF-8 whatever its <meta> says (which the parser would otherwise
        # follow where the bytes read the same either way, reporting that codec; the API's JSON routes
        # report utf-8 for the same string).
        source_encoding = "utf-8"
    elif file_name is not None:
        if not isinstance(file_name, str):
            raise PageSourceError(f"{where}: 'file' must be a path (a string), not {_json_type(file_name)}")
        path = base / file_name
        problem = _not_a_file(path)  # gone (a dangling symlink too), a directory: what reading it would say
        if problem is not None:
            raise PageUnreadableError(f"{where} names {problem}")
        _check_page_file(path, None, where)  # by its name, before a WARC of gigabytes is read
        encoding = row.get("encoding")
        if encoding is not None and not isinstance(encoding, str):
            raise PageSourceError(f"{where}: 'encoding' must be a charset name, not {encoding!r}")
        if isinstance(encoding, str) and not encoding.strip():
            encoding = None  # "": no charset was known to the row's writer, as a missing key says
        if encoding is not None:
            encoding = _row_charset(encoding, where)
        raw = _read_file(path, where)
        _check_page_file(path, raw, where)  # by its content, where its name says nothing
        html, source_encoding = declared_page(raw, encoding, where)
    else:
        raise PageSourceError(f"{where} has neither 'html' nor 'file'")
    return Page(
        id=page_id,
        html=html,
        url=None if url is None else valid_json(url),
        meta=meta,
        encoding=source_encoding,
    )


def _check_page_file(path: Path, content: bytes | None, where: str) -> None:
    """Refuse a row's `file` that is a page source of its own, a WARC or JSONL file: by its name's suffix,
    as a single file named as the input is told (`_kind_by_name`), else (given `content`, its bytes
    gunzipped) by a start only such a file has (`_source_by_content`). Read as one page, a WARC's bytes
    had been one page of WARC headers and its real pages lost. A file whose name or start says nothing
    is the page the row says it is."""
    kind = _kind_by_name(path.name)
    if kind is None and content is not None:
        kind = _source_by_content(content)
        how = "its content"
    else:
        how = "its name"
    if kind in ("warc", "jsonl"):
        what = "WARC" if kind == "warc" else "JSONL"
        raise PageSourceError(
            f"{where} names {path}, a {what} file (by {how}), not a page: a row's file is one HTML page; "
            f"pass the {what} file as the input itself"
        )


# A WARC file's first line, its version (`WARC/1.0`, `WARC/1.1`), as a WARC writer puts it at the start.
_WARC_VERSION_LINE = re.compile(rb"WARC/1\.[01]\r?\n")
_JSON_BLANKS = re.compile(rb"[ \t\r\n]*")  # JSON's white space


def _source_by_content(content: bytes) -> Literal["jsonl", "warc"] | None:
    """What page source a row's `file` is by its bytes: "warc" where they start with a WARC version line,
    "jsonl" where their first line that is not blank (after a UTF-8 byte order mark) is a JSON object;
    else None, a page.

    Stricter than the rule that tells a single file named as the input (`_kind_by_content`, a start of
    `{` or `WARC/`): the input must be some page source, where a row names a page and may be any page.
    That rule had refused a template's page starting `{{ header }}` and prose starting "WARC/ is"."""
    if _WARC_VERSION_LINE.match(content):
        return "warc"
    after_bom = 3 if content.startswith(codecs.BOM_UTF8) else 0
    blank = _JSON_BLANKS.match(content, after_bom)  # (always a match, empty or not)
    start = blank.end() if blank else after_bom
    if content[start : start + 1] != b"{":
        return None
    end = content.find(b"\n", start)
    try:
        row = json.loads(content[start : end if end >= 0 else len(content)])
    except (ValueError, RecursionError):  # not JSON (a template's `{{`), or nested too deep to tell
        return None
    return "jsonl" if isinstance(row, dict) else None


def _row_charset(label: str, where: str) -> str:
    """A row's `encoding`, the charset its file was served with, read as that header's `charset`
    parameter is (`charset_parameter`: `"windows-1252"` and `windows-1252;` are windows-1252, as in a
    WARC record's HTTP header), so that a page reads the same from a JSONL row as from the record it came
    in; they had been taken as labels Python knows and a browser does not, ignored, and the page read
    by its own <meta>. A label a browser ignores but Python knows (`latin-1`, `utf-7`) is ignored as a
    server's header is (`decoding.declared_codec`); one nobody knows (`'utf-8'`, `base64`, a label past
    `MAX_ENCODING_CHARS`, left unparsed) is a typo in the row, `PageSourceError`: it had been ignored as
    well, the page read by its own <meta> or by guess."""
    named = charset_parameter(label) if len(label) <= MAX_ENCODING_CHARS else None
    if named is None or not known_label(named):
        shown = label if len(label) <= 100 else f"{label[:100]}..."
        raise PageSourceError(
            f"{where}: 'encoding' {shown!r} names no charset (a label such as utf-8, windows-1252, shift_jis)"
        )
    return named


def _not_a_file(path: Path) -> str | None:
    """None where `path` is a file, else what is there instead. A path that cannot be looked at says
    why: `Path.is_file` raised EACCES on a parent directory out of the whole run, and "a missing file"
    would send the reader looking for a file that is there."""
    try:
        mode = _stat_mode(path)
    except OSError as exc:  # EACCES on a parent directory, ELOOP, EIO
        return f"{path}, which cannot be looked at: {exc.strerror or exc}"
    if mode is None:
        return f"a missing file {path}"
    return None if stat.S_ISREG(mode) else f"{path}, which is not a file"


def _stat_mode(path: Path) -> int | None:
    """`path`'s mode, following symlinks; None where nothing is there (a dangling symlink included);
    OSError where the file system will not say (EACCES on a directory above it, ELOOP, EIO)."""
    try:
        return path.stat().st_mode
    except (FileNotFoundError, NotADirectoryError, ValueError):  # ValueError: a NUL in the name
        return None


def _open_jsonl(path: Path) -> IO[bytes]:
    """`path`'s lines as bytes, gunzipped when it is gzip; `PageSourceError` for a file in UTF-16 or
    UTF-32 (`_wide_text`), whose lines split on the byte 0x0A would read as rows of garbage."""
    try:
        handle = path.open("rb")
    except OSError as exc:
        raise PageUnreadableError(f"cannot read {path}: {exc.strerror or exc}") from exc
    stream: IO[bytes] = handle
    try:
        if handle.read(2) == GZIP_MAGIC:
            handle.seek(0)
            stream = gzip.GzipFile(fileobj=handle)  # type: ignore[assignment]
        else:
            handle.seek(0)
        try:
            start = stream.peek(_MAGIC_BYTES)[:_MAGIC_BYTES]  # type: ignore[attr-defined]
        except (OSError, EOFError, zlib.error):
            start = b""  # a gzip stream broken from its start: `_lines` reports it as the row it is
        wide = _wide_text(start[:4])
        coding = compression_of(start)
    except BaseException:
        stream.close()
        handle.close()
        raise
    if wide is not None:
        stream.close()
        handle.close()
        raise PageSourceError(
            f"{path} is {wide} text (by the byte-order mark or NUL bytes at its start; Windows PowerShell "
            f"writes UTF-16 by default); a JSONL file is UTF-8: convert it first (iconv -f {wide[:6]} -t "
            "UTF-8, or PowerShell's Out-File -Encoding utf8)"
        )
    if coding is not None:
        stream.close()
        handle.close()
        inner = ", once gunzipped" if stream is not handle else ""
        raise PageCompressedError(
            f"{path} is compressed with {coding} (by its first bytes{inner}); a JSONL file is read as plain "
            "or gzipped UTF-8 text: decompress it first, or compress it with gzip"
        )
    return stream


def compression_of(start: bytes) -> str | None:
    """The compression (`_COMPRESSION_MAGIC`) whose magic bytes a file's content starts with, else None;
    never gzip, which the readers undo wherever they find it."""
    for pattern, name in _COMPRESSION_MAGIC:
        if pattern.match(start):
            return name
    return None


# The start of a file in a wide encoding: its byte-order mark and a first character in ASCII (a JSONL
# file starts with "{" or a blank, an HTML page with "<" or a blank), so that a line of other bytes
# that are not UTF-8 ("\xff\xfe\n") stays the bad row it is. UTF-32LE's mark starts with UTF-16LE's:
# it is tried first.
_WIDE_STARTS = (
    (re.compile(b"\xff\xfe\x00\x00"), "UTF-32LE"),
    (re.compile(b"\x00\x00\xfe\xff"), "UTF-32BE"),
    (re.compile(b"\xff\xfe[\x01-\x7f]\x00"), "UTF-16LE"),
    (re.compile(b"\xfe\xff\x00[\x01-\x7f]"), "UTF-16BE"),
)
_WIDE_WITHOUT_BOM = "UTF-16 or UTF-32"


def _wide_text(start: bytes) -> str | None:
    """The wide encoding (UTF-16 or UTF-32, with its byte order) a file starting with `start` (its
    first 4 bytes, when it has them) is written in, by its byte-order mark (`_WIDE_STARTS`); "UTF-16 or
    UTF-32" without one, for a NUL byte among them, which UTF-8 JSON never holds (U+0000 in a string is
    escaped); None for neither."""
    for pattern, name in _WIDE_STARTS:
        if pattern.match(start):
            return name
    return _WIDE_WITHOUT_BOM if b"\x00" in start[:4] else None


def _lines(handle: IO[bytes], path: Path) -> Iterator[tuple[int, bytes | PageSourceError]]:
    """(line number, line) in order; a line over the row bound comes as a `PageTooLargeError` (its
    bytes passed over, never held; one of blanks only is a blank line, no row); a gzip stream that
    breaks off ends with the error instead."""
    limit = READ_FACTOR * MAX_PAGE_BYTES
    line_number = 0
    while True:
        try:
            line = handle.readline(limit + 1)
            too_long = len(line) > limit and not line.endswith(b"\n")
            blank = too_long and line.isspace()
            while too_long:  # the rest of the line, a step at a time
                rest = handle.readline(_SKIP_STEP)
                blank = blank and (not rest or rest.isspace())
                if not rest or rest.endswith(b"\n"):
                    break
        except (OSError, EOFError, zlib.error) as exc:
            yield line_number + 1, read_error(f"{path}: cannot read past line {line_number}: {exc}", exc)
            return
        if not line:
            return
        line_number += 1
        if too_long and not blank:
            message = f"{path}: line {line_number} has more than {limit} bytes, too many for one page"
            yield line_number, PageTooLargeError(message)
        elif not too_long:
            yield line_number, line


def _iter_jsonl(path: Path) -> Iterator[Page]:
    """Rows in file order; `index` counts rows (blank lines are not rows), messages name the line. A bad
    row comes back as a Page with `error` set; `iter_pages` decides whether that raises."""
    with _open_jsonl(path) as handle:
        index = 0
        for line_number, line in _lines(handle, path):
            if isinstance(line, PageTooLargeError):  # a row, unread: named by its position
                yield error_page(str(index), line)
                index += 1
                continue
            if isinstance(line, PageSourceError):
                yield error_page(str(index), line)
                return
            if not line.strip():
                continue
            where = f"{path}: line {line_number}"
            row: Any = None
            try:
                row = _parsed_row(line, where)
                page = _row_page(row, path.parent, index, where)
            except PageSourceError as exc:
                page = error_page(valid_json(_row_id(row, index)), exc)
            yield page
            index += 1


def _parsed_row(line: bytes, where: str) -> Any:
    """A JSONL line's value; a line that is not JSON, or nests deeper than `MAX_ROW_DEPTH`, raises
    `PageSourceError`, the row's error. A row nested too deep is named by its position (`_row_id` of
    None), whether or not the parser got through it, so that its row is the same from any caller."""
    try:
        row = json.loads(line)  # from bytes: a line that is not UTF-8 is a bad row, not a crash
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError
        raise PageSourceError(f"{where} is not JSON: {exc}") from exc
    except RecursionError:
        # More than `MAX_ROW_DEPTH` deep, unless the caller is deeper than it may be: told by the line's
        # brackets, so that the row's error is the same from any caller that leaves the parser room.
        deep = _line_nests_deeper(line, MAX_ROW_DEPTH)
        raise PageSourceError(f"{where} {NESTED_TOO_DEEP if deep else TOO_DEEP_TO_READ}") from None
    if _nests_deeper(row, MAX_ROW_DEPTH):
        raise PageSourceError(f"{where} {NESTED_TOO_DEEP}")
    return row


def _nests_deeper(value: Any, limit: int) -> bool:
    """Whether a decoded JSON value's arrays and objects nest more than `limit` deep (`[]` is 1 deep),
    walked with a stack of its own, not recursion; a row's values other than arrays and objects (its
    page's text) cost nothing."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return False


# A JSON string (an escaped quote, `\"`, ends none) or a bracket: the brackets outside strings nest a value.
_STRING_OR_BRACKET = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]')


def _line_nests_deeper(line: bytes, limit: int) -> bool:
    """Whether a JSON line's brackets outside its strings nest more than `limit` deep, read from the
    line (`_nests_deeper` for one the parser could not get through); stops at the first bracket past
    the limit, so a line of 100,000 brackets costs `limit` steps."""
    depth = 0
    for match in _STRING_OR_BRACKET.finditer(line):
        mark = match[0]
        if mark in (b"[", b"{"):
            depth += 1
            if depth > limit:
                return True
        elif mark in (b"]", b"}"):
            depth -= 1
    return False


# What a line naming a page file holds: its key `"file"`, or a letter of it as a JSON escape (`"fil\u0065"`
# is the same key). Inside a JSON string a quote is escaped, so a page's text rarely matches; a line
# that does is only parsed, never taken for a row that names a file.
_FILE_KEY = re.compile(rb'"file"|\\u006[569cC]')


def _row_file(row: Any) -> str | None:
    """The page file a row is read from (`_row_page`): its `file`, when it has no `html`."""
    if isinstance(row, dict) and row.get("html") is None and isinstance(row.get("file"), str):
        return str(row["file"])
    return None


def named_files(path: Path) -> Iterator[tuple[str, Path]]:
    """The page files the rows of a JSONL file (or a corpus's manifest) name, in row order: (the name as
    the row writes it, the path `_row_page` reads), for the bulk commands' input identity
    (`resume_state.input_identity`), which looks at them with a stat each, never reads them. The lines
    are read as `_iter_jsonl` reads them, but a line is parsed only where it may hold a `file` key
    (`_FILE_KEY`): a dump of rows with their `html` inline is read through, not parsed. A line that is
    no row, or names no file, names nothing (its row is an error row, or holds its page); a stream
    that breaks off ends the list where its rows end."""
    with _open_jsonl(path) as handle:
        for _, line in _lines(handle, path):
            if isinstance(line, PageTooLargeError):  # a row, unread
                continue
            if isinstance(line, PageSourceError):
                return
            if not _FILE_KEY.search(line):
                continue
            try:
                name = _row_file(_parsed_row(line, ""))
            except PageSourceError:  # not JSON, or nested too deep: an error row
                continue
            if name is not None:
                yield name, path.parent / name


class Listed(NamedTuple):
    """One file of a directory of pages (`list_directory`), or what could not be looked at there."""

    path: Path  # as reached from the directory listed, through any symlinked directory
    # Why it could not be looked at (a directory that cannot be listed, an entry that cannot be looked
    # at): its pages are unknown, so it is a row of its own (`input_unreadable`), never skipped.
    problem: str | None = None
    directory: bool = False  # `problem` is a directory's, which cannot be listed


# Told what an entry of a directory of pages is, by its real location: the real path of the directory
# it is in (every symlink above it resolved), joined with its name. True: the entry is left out, as if
# it were not there (the bulk commands' own output, parts and temporaries, `resume_state.own_files`).
Skip = Callable[[Path], bool]


def list_directory(
    top: Path, skip: Skip | None = None, passed_over: list[Path] | None = None
) -> list[Listed]:
    """Every file under `top`, in the order it is read (sorted as paths: `a/b.html` before `a.html`),
    with what could not be looked at in its place; the one walk of a directory of pages, for its pages
    and for the bulk commands' input identity (`resume_state.input_identity`), so both see the same.

    Each directory is walked once, wherever links lead to it: its own subdirectories first, then those a
    symlink leads to, by their paths, so which path names a page does not depend on the file system's
    order. A symlink to a directory walked already (a link back up, a second link to one directory, a
    ladder of links that had made 65,535 pages of 16 files) is not followed again; one to another
    directory than those it is in (a second way to the same pages, where a link back up is a cycle, as
    ordinary as `..`) goes in `passed_over`, when given, for the commands to count. A dangling symlink
    counts as a file: one named
    as a page is read, and so becomes an `input_unreadable` row, where skipped its page was lost without a
    word. Hidden names (`.git/`, a macOS `._a.html` resource fork) and `__MACOSX/` (the resource forks of a
    zip made on a Mac) are no part of it (`hidden`): read as pages, resource forks were binary noise. A
    subdirectory that cannot be listed (permission denied, EIO) and an entry that cannot be looked at are
    `Listed` with a `problem`: `Path.rglob` passed over them in silence, its pages missing from a run that
    ended with status 0. `top` itself that cannot be listed raises `PageUnreadableError`.
    """
    try:
        top_stat = top.stat()
    except OSError as exc:
        raise PageUnreadableError(f"page source {top} cannot be read: {exc.strerror or exc}") from exc
    found: list[Listed] = []
    walked: set[tuple[int, int]] = set()  # the (device, inode) of every directory walked
    # (symlinks followed to reach it, the directory, its real path, its (device, inode), those of the
    # directories its path is in), taken fewest links first, then by path: a directory's own tree
    # before any link into it. (No two have one path, so the sets are never compared.)
    root = (top_stat.st_dev, top_stat.st_ino)
    queue = [(0, top, Path(os.path.realpath(top)), root, frozenset[tuple[int, int]]())]
    while queue:
        links, directory, real, key, ancestors = heapq.heappop(queue)
        if key in walked:
            if passed_over is not None and key not in ancestors:  # (a link back up: a cycle, no news)
                passed_over.append(directory)
            continue
        walked.add(key)
        try:
            with os.scandir(directory) as scan:
                entries = list(scan)
        except OSError as exc:
            why = exc.strerror or str(exc)
            if directory == top:
                raise PageUnreadableError(f"page source {top} cannot be read: {why}") from exc
            why = f"cannot list the directory {directory}: {why}; its pages were not read"
            found.append(Listed(directory, why, directory=True))
            continue
        for entry in entries:
            path = directory / entry.name
            if hidden(entry.name) or (skip is not None and skip(real / entry.name)):
                continue
            try:
                if entry.is_dir():  # through a symlink too
                    st = entry.stat()  # the directory's, as `entry.is_dir` followed the link
                    inner_key, inside = (st.st_dev, st.st_ino), ancestors | {key}
                    if entry.is_symlink():
                        inner = (links + 1, path, Path(os.path.realpath(path)), inner_key, inside)
                    else:
                        inner = (links, path, real / entry.name, inner_key, inside)
                    heapq.heappush(queue, inner)
                elif entry.is_file() or (entry.is_symlink() and not os.path.exists(path)):
                    found.append(Listed(path))  # a file, or a dangling symlink
            except OSError as exc:
                if entry.is_symlink() and exc.errno == errno.ELOOP:
                    found.append(Listed(path))  # a link to itself: dangling, as `Path.exists` says
                else:  # EACCES (in a directory readable but not searchable), EIO
                    found.append(Listed(path, f"cannot look at {path}: {exc.strerror or exc}"))
    found.sort(key=lambda listed: listed.path)
    if passed_over is not None:
        passed_over.sort()
    return found


def hidden_page_files(top: Path, most: int) -> list[Path]:
    """Up to `most` files under `top` that `list_directory` leaves out as hidden (`hidden`: under `.site/`,
    `.a.html`, `__MACOSX/`) and whose names a page or WARC file has, in walk order; for the refusal of a
    directory with no other pages, which had said it held no .html file. Symlinked directories are not
    followed: a cheap look for the message, not a walk of pages."""
    found: list[Path] = []
    for directory, subdirectories, files in os.walk(top):
        subdirectories.sort()
        in_hidden = any(hidden(part) for part in Path(directory).relative_to(top).parts)
        for name in sorted(files):
            if (in_hidden or hidden(name)) and name.lower().endswith(_HTML_SUFFIXES + _WARC_SUFFIXES):
                found.append(Path(directory) / name)
                if len(found) >= most:
                    return found
    return found


def hidden(name: str) -> bool:
    """Whether a directory of pages leaves a file or directory of this name out (`list_directory`): a
    hidden name (`.git`, `.DS_Store`, macOS's `._a.html` AppleDouble files) or `__MACOSX`, where a zip
    made on a Mac keeps such files."""
    return name.startswith(".") or name == "__MACOSX"


def _page_files(path: Path, skip: Skip | None) -> tuple[list[Listed], list[Path]]:
    """A directory's HTML and WARC files, in the order they are read, with what could not be looked at
    in its place (each a row); and all its files."""
    listed = list_directory(path, skip)
    page_files = [
        entry
        for entry in listed
        if entry.problem is not None or entry.path.name.lower().endswith(_HTML_SUFFIXES + _WARC_SUFFIXES)
    ]
    return page_files, [entry.path for entry in listed if entry.problem is None]


def page_files_of(source: Path) -> Iterator[Path]:
    """The files `iter_pages(source)` reads pages from, besides the source itself: a directory's HTML
    and WARC files (`list_directory` with nothing skipped, so a page named as a bulk command's output,
    which the command's `skip` leaves unread, is listed), or the page files a JSONL file's or corpus
    manifest's rows name (`named_files`; one missing included). For `htmllm extract`'s check that its
    output is none of them: replaced by the run's rows, the page was lost. What cannot be looked at is
    left out; a source that cannot be read at all raises as `source_kind` says."""
    kind, path = source_kind(source)
    if kind == "directory":
        listed, _ = _page_files(path, None)
        yield from (entry.path for entry in listed if entry.problem is None)
    elif kind == "jsonl":
        yield from (file for _, file in named_files(path))


def _iter_html_dir(path: Path, skip: Skip | None) -> Iterator[Page]:
    page_files, files = _page_files(path, skip)
    if not page_files:
        # JSONL shards are read one file at a time (their ids and `file` paths are per file), never as
        # a directory's pages; zero pages in silence would look like a finished run.
        shards = [f for f in files if f.name.lower().endswith(_JSONL_SUFFIXES)]
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
        elif entry.path.name.lower().endswith(_WARC_SUFFIXES):
            # Named by the same relative path, so two `crawl.warc.gz` in two subdirectories name their
            # rows apart (`a/crawl.warc.gz@161`, `b/crawl.warc.gz@161`).
            yield from _iter_warc(entry.path, page_id)
        else:
            yield _file_page(page_id, entry.path, str(path))


def _file_page(page_id: str, path: Path, where: str) -> Page:
    """The page of one HTML file, or its error row."""
    try:
        return Page(id=page_id, html=_read_file(path, where))
    except PageSourceError as exc:
        return error_page(page_id, exc)


def _head(path: Path) -> bytes:
    """The first bytes of a file's content, gunzipped when the file is gzip."""
    try:
        with path.open("rb") as handle:
            head = handle.read(_SNIFF_BYTES)
            if head[:2] == GZIP_MAGIC:
                handle.seek(0)
                with gzip.GzipFile(fileobj=handle) as unzipped:
                    head = unzipped.read(_SNIFF_BYTES)
    except (OSError, EOFError, zlib.error) as exc:
        raise read_error(f"cannot read {path}: {exc}", exc) from exc
    return head


def source_kind(path: Path) -> tuple[Literal["jsonl", "warc", "html", "directory"], Path]:
    """What a page source holds, and the path to read it from (a corpus directory's manifest); raises
    `PageSourceError` for a source that does not exist or a file of no kind it reads, and
    `PageUnreadableError` for one the file system will not let this process look at (see
    `_mode`). Cheap (a file's first bytes at most): commands call it to refuse an input before
    loading a model, and every reader of a source goes through it, so each command says the same."""
    mode = _mode(path, path)
    if mode is None:
        if path.is_symlink():  # dangling: the file system's, as the same link in a directory of pages is
            raise PageUnreadableError(
                f"page source {path} is a symlink to {os.readlink(path)}, which is gone"
            )
        raise PageSourceError(f"page source {path} does not exist")
    if stat.S_ISDIR(mode):
        manifest = _manifest(path)
        return ("directory", path) if manifest is None else ("jsonl", manifest)
    if stat.S_ISREG(mode):
        return _file_kind(path), path
    raise PageSourceError(f"page source {path} is neither a file nor a directory")


def _manifest(directory: Path) -> Path | None:
    """The manifest of a corpus directory, `manifest.jsonl`, else `manifest.jsonl.gz`; None for a
    directory with neither, read as a directory of pages. One that is there but cannot be read (a
    dangling symlink: a corpus whose manifest lives on a volume not mounted; not a file) refuses the
    source: read as a directory of pages, its ids had become file paths, its urls null, its rows'
    encodings ignored and the pages it names elsewhere lost, in a run that ended with status 0. Other
    names a manifest may be given (`MANIFEST.jsonl`) are not read: `unused_manifests` names them."""
    for name in MANIFEST_NAMES:
        manifest = directory / name
        mode = _mode(manifest, directory)
        if mode is not None and stat.S_ISREG(mode):
            return manifest
        if mode is not None:
            raise PageSourceError(
                f"page source {directory} cannot be read: its manifest {manifest} is no file"
            )
        if manifest.is_symlink():
            raise PageUnreadableError(
                f"page source {directory} cannot be read: its manifest {manifest} is a symlink to "
                f"{os.readlink(manifest)}, which is gone"
            )
    return None


def unused_manifests(directory: Path) -> list[str]:
    """The names in `directory` (a directory of pages, without a manifest) that look like a corpus
    manifest but are none of `MANIFEST_NAMES`: `MANIFEST.jsonl`, `manifest.ndjson`, `manifest.jsonl.zst`,
    in sorted order, for the bulk commands to say that they were not used. A site's `manifest.json` (a web
    app's) is no such name. What cannot be listed names nothing."""
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    return sorted(name for name in names if _MANIFEST_LIKE.fullmatch(name) and name not in MANIFEST_NAMES)


def _mode(path: Path, source: Path) -> int | None:
    """The mode of `path` (the source `source`, or its manifest), following symlinks; None where nothing
    is there. The one rule for a source the file system will not let this process look at: any other
    refusal is `PageUnreadableError` naming the source and why. EACCES (a directory on the path of mode
    000, or the source directory itself) was a traceback out of `Path.is_dir` in `htmllm extract` and a
    bare "[Errno 13]" line without a code in `htmllm embed`; ELOOP read as "does not exist"."""
    try:
        return _stat_mode(path)
    except OSError as exc:  # EACCES, ELOOP, EIO
        why = exc.strerror or str(exc)
        if exc.errno == errno.EACCES:  # stat's EACCES: search permission on a directory on the path
            why += " (a directory on its path is closed to this user)"
        raise PageUnreadableError(f"page source {source} cannot be looked at: {why}") from exc


def _file_kind(path: Path) -> Literal["jsonl", "warc", "html"]:
    """What a single file holds: by its name's suffix, else by its first bytes, else refused."""
    kind = _kind_by_name(path.name)
    if kind is not None:
        return kind
    head = _head(path)
    kind = _kind_by_content(head)
    if kind is not None:
        return kind
    coding, how = _compressed_name(path.name), "its name"
    if coding is None:
        coding, how = compression_of(head), "its first bytes"
    if coding is not None:
        # `x.jsonl.zst` had been told its name "ends in no known suffix", .zst being a WARC's.
        if how == "its name":
            inner = _kind_by_name(path.name[: path.name.rindex(".")])
            what = {"jsonl": "a JSONL file", "warc": "a WARC file", "html": "an HTML file"}.get(
                inner or "", "a file"
            )
            said = f"cannot read {path}: it is {what} compressed with {coding} (by its name)"
        else:
            said = f"cannot tell what {path} holds: it is compressed with {coding} (by its first bytes)"
        raise PageSourceError(
            f"{said}, which is not read here: JSONL and HTML files are read plain or gzipped, WARC files "
            "also compressed with zstd or LZ4 (.warc.zst, .warc.lz4): decompress it first, or compress it "
            f"with gzip; a page source is {_SOURCE_KINDS}"
        )
    raise PageSourceError(
        f"cannot tell what {path} holds: its name ends in no known suffix and its content (gunzipped "
        f"when gzip) starts with none of '{{' (JSONL), 'WARC/' (WARC), '<' (HTML); a page source is "
        f"{_SOURCE_KINDS}"
    )


def _kind_by_name(name: str) -> Literal["jsonl", "warc", "html"] | None:
    """What a file holds by its name's suffix (any case), the first half of the one rule for a file
    (`_file_kind`, a row's `file`); None for a name with none of the known suffixes."""
    name = name.lower()
    if name.endswith(_JSONL_SUFFIXES):
        return "jsonl"
    if name.endswith(_WARC_SUFFIXES):
        return "warc"
    if name.endswith(_HTML_SUFFIXES):
        return "html"
    return None


def _kind_by_content(head: bytes) -> Literal["jsonl", "warc", "html"] | None:
    """What a file holds by its first bytes (gunzipped, when it is gzip), the rule's second half:
    JSONL when it starts with `{`, WARC with `WARC/`, HTML with `<`, after a byte order mark and white
    space, in UTF-8 or in the UTF-16 or UTF-32 text it is (`_wide_text`); None for anything else."""
    wide = _wide_text(head[:4])
    if wide is not None:  # sniffed as the text it is: a UTF-16 page is one page, UTF-16 JSONL refused
        codec = wide[:6].lower()  # "utf-16", "utf-32": their BOM says the byte order
        if wide == _WIDE_WITHOUT_BOM:
            codec = "utf-16-be" if head[0] == 0 else "utf-16-le"
        head = head.decode(codec, "ignore").encode("utf-8", "ignore")
    start = head.removeprefix(b"\xef\xbb\xbf").lstrip()
    if start.startswith(b"{"):
        return "jsonl"
    if start.startswith(b"WARC/"):
        return "warc"
    if start.startswith(b"<"):
        return "html"
    return None


def _compressed_name(name: str) -> str | None:
    """The compression a file's name says it holds (`_COMPRESSION_SUFFIXES`), else None."""
    dot = name.rfind(".")
    return _COMPRESSION_SUFFIXES.get(name[dot:].lower()) if dot > 0 else None


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
        pages = _iter_jsonl(path)
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
            count = _count_rows(path, limit, stop)
        elif kind == "html":
            count = 1
        elif kind == "directory":
            page_files, _ = _page_files(path, skip)
            if any(f.path.name.lower().endswith(_WARC_SUFFIXES) for f in page_files):
                return None
            count = len(page_files)
        else:
            return None
    except (OSError, PageSourceError):
        return None
    if count is None:
        return None
    return count if limit is None else min(count, limit)


def _count_rows(path: Path, limit: int | None, stop: threading.Event | None) -> int | None:
    """Non-blank lines of a (gzipped) JSONL file, as `_iter_jsonl` counts rows; a stream that breaks
    off counts the error row it ends with."""
    rows = 0
    with _open_jsonl(path) as handle:
        for _, line in _lines(handle, path):
            if stop is not None and stop.is_set():
                return None
            if isinstance(line, PageTooLargeError):  # a row, unread
                line = b"{"
            elif isinstance(line, PageSourceError):
                return rows + 1
            if not line.isspace():
                rows += 1
                if limit is not None and rows >= limit:
                    break
    return rows


def _iter_warc(path: Path, name: str | None = None) -> Iterator[Page]:
    """The pages of a WARC file, read by `warc_pages`; `name` names it in its rows (`iter_warc`)."""
    # Imported here, not at the top: `warc_pages` builds its rows from this module's `Page`, errors and
    # page cap, so it imports this module, and an import back at load time would be circular.
    from service.core.warc_pages import iter_warc

    return iter_warc(path, name)
