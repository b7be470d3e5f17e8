"""One page as every reader of page sources hands it on (`Page`, an error row `error_page`), the errors
a page source raises (`PageSourceError` and its kinds, `read_error`'s rule of whose fault a failed read
is) and the text rules that keep a page's strings valid Unicode (`valid_text`, `valid_json`).

Kept apart from `service.core.pages` so that the readers it is built from (`page_files`, `page_jsonl`,
`page_directories`) import these without importing `pages`, which imports them; `pages` re-exports every
name here, and callers import them from there.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from service.core.decoding import without_lone_surrogates
from service.core.errors import ErrorCode, HtmllmError

_SURROGATE = re.compile("[\ud800-\udfff]")


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


def error_page(page_id: str, exc: PageSourceError, **fields: Any) -> Page:
    """The row of a page that could not be read: no bytes, the error's message and code."""
    return Page(id=page_id, html=b"", error=str(exc), error_code=exc.code, **fields)
