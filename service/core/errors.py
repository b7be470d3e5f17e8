"""The closed error taxonomy shared by every layer.

Every error the service can report is an `HtmllmError` carrying one `ErrorCode`. The HTTP layer maps
codes to status codes in one table (`service.api.errors`); the core and engine never know about HTTP.
"""

from __future__ import annotations

import reprlib
from collections.abc import Iterable
from enum import StrEnum


class ErrorCode(StrEnum):
    """Machine-readable error codes; the `code` field of every error body."""

    VALIDATION = "validation_error"  # malformed request or options (422)
    EMPTY = "empty_input"  # nothing to embed (400)
    PAYLOAD_TOO_LARGE = "payload_too_large"  # body or document over the byte cap (413)
    HEADERS_TOO_LARGE = "headers_too_large"  # request line and headers over the parser's cap (431)
    # Bytes the HTTP parser refuses as no HTTP/1.1 request (a malformed request line, header or chunk,
    # the method PRI outside HTTP/2's preface): answered below the app, the connection closed (400)
    MALFORMED_REQUEST = "malformed_request"
    # A transfer coding other than chunked (`Transfer-Encoding: gzip, chunked`): RFC 9112 section 6.1's
    # answer for one the server does not implement; answered below the app, the connection closed (501)
    UNSUPPORTED_TRANSFER_CODING = "unsupported_transfer_coding"
    TOO_MANY_DOCUMENTS = "too_many_documents"  # more documents than allowed per request (422)
    TOO_MANY_TOKENS = "too_many_tokens"  # document longer than max length with truncate=false (422)
    UNSUPPORTED_MEDIA_TYPE = "unsupported_media_type"  # (415)
    UNKNOWN_HEAD = "unknown_head"  # a task head the model does not have (422)
    UNAUTHORIZED = "unauthorized"  # missing or wrong API key (401)
    NOT_FOUND = "not_found"  # (404)
    METHOD_NOT_ALLOWED = "method_not_allowed"  # a route called with the wrong HTTP method (405)
    OVERLOADED = "overloaded"  # queue full (429)
    TIMEOUT = "timeout"  # request deadline passed (504)
    BODY_TIMEOUT = "body_timeout"  # the request body did not arrive in time (408)
    HEAD_TIMEOUT = "head_timeout"  # the request line and headers did not arrive in time (408)
    SHUTTING_DOWN = "shutting_down"  # server draining, not accepting (503)
    # Model not loaded / warmed, its backend failing, or a page's preprocessing or extractor process
    # killed from outside (the OOM killer) in each try, stalled past its time limit (stopped, starved:
    # hardly on the CPU) or unable to start: the server's trouble, retryable (503)
    NOT_READY = "not_ready"
    UNHEALTHY = "unhealthy"  # liveness: the backend has failed (or hung) too long to recover (503)
    PREPROCESS_FAILED = "preprocess_failed"  # the page could not be pruned/decoded (422)
    EXTRACTION_FAILED = "extraction_failed"  # a text extractor failed or timed out (422)
    # A page file the bulk commands could not read (permission denied, gone, EIO): the file system's
    # failure, not the page's, so not `validation_error`. Never over HTTP, which reads no files (500).
    INPUT_UNREADABLE = "input_unreadable"
    CHECKPOINT_INVALID = "checkpoint_invalid"  # a checkpoint failed strict loading (500 at startup)
    BACKEND_FAILED = "backend_failed"  # the model runner raised (500)
    INTERNAL = "internal_error"  # an invariant broke (500)


def shown(names: Iterable[object], *, most: int = 5, width: int = 40) -> str:
    """Names a client sent, for an error message: the first `most` distinct ones, each cut to `width`
    characters (a message must not echo a request's megabytes back: one head name of 5 MB had made a
    5 MB answer). A library caller may send anything as a name (`heads=[1]`): the message about it
    must not fail itself, as slicing an int had, with a bare TypeError instead of the typed error."""
    distinct: dict[object, object] = {}
    for name in names:
        try:
            distinct.setdefault(name, name)
        except TypeError:  # unhashable (a list): each counts as itself
            distinct.setdefault(("unhashable", id(name)), name)
    values = list(distinct.values())
    listed = ", ".join(_shown_name(name, width) for name in values[:most])
    return listed + (f", ... ({len(values)} in all)" if len(values) > most else "")


def _shown_name(name: object, width: int) -> str:
    """One name as `shown` lists it: a str quoted and cut, anything else as reprlib abbreviates it."""
    if isinstance(name, str):
        return repr(name[:width])
    brief = reprlib.Repr()
    brief.maxlevel, brief.maxstring, brief.maxother, brief.maxlong = 2, width, width, width
    try:
        return brief.repr(name)
    except Exception:  # a repr that raises (an int past Python's 4300 digits): the type is enough
        return f"<{type(name).__name__}>"


class HtmllmError(Exception):
    """Base of every typed error; `code` says which kind, the message says why."""

    code: ErrorCode = ErrorCode.INTERNAL

    def __init__(self, message: str, *, code: ErrorCode | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code

    @property
    def message(self) -> str:
        return str(self)


class CheckpointError(HtmllmError):
    """A checkpoint that fails strict loading or cannot be written. Here, not in `service.core.checkpoint`:
    both that module and `service.core.heads_stage` (which it imports) raise it."""

    code = ErrorCode.CHECKPOINT_INVALID
