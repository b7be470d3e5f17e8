"""Failures of a page itself: what a preprocessing process's failure means for its page, which failures
say something of the page, and how the copies of it waiting in the result cache are told them.

Apart from the Engine because they are rules of their own, about a page rather than about the queue or
the lifecycle the Engine owns.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TypeVar

from service.core.errors import ErrorCode, HtmllmError
from service.core.preparation import PreprocessError
from service.core.workers import (
    WorkerDiedError,
    WorkerError,
    WorkerLostError,
    WorkerStartError,
    WorkerTimeoutError,
)
from service.engine.types import Document, TooManyTokensError

E = TypeVar("E", bound=HtmllmError)

# Where a failure of the page itself keeps the Document it failed on (`mark`), for the caller of an
# all-or-nothing call to say which of its documents that was (`naming`).
_DOCUMENT_ATTRIBUTE = "htmllm_failed_document"
_SHOWN_ID_CHARS = 100
# How a message names the preprocessing time limit, for a library caller (`EngineConfig`) and for a
# server's operator (the environment variable, which only the HTTP service's settings read).
TIMEOUT_SETTING = "EngineConfig.preprocess_timeout_s, HTMLLM_PREPROCESS_TIMEOUT_S in the service"


def document_name(doc_id: str | None, index: int | None) -> str:
    """How a message names a document: its id, and its index in the call where the caller knows it
    (the ids are the client's own and may repeat or be absent; the OpenAI and TEI routes have none)."""
    if doc_id is None:
        return f"the document at index {index}" if index is not None else "a document"
    shown = repr(doc_id[:_SHOWN_ID_CHARS]) + ("..." if len(doc_id) > _SHOWN_ID_CHARS else "")
    return f"document {shown}" + (f" (index {index})" if index is not None else "")


class OverLimitError(TooManyTokensError):
    """A page over the token limit with truncation off, named after its document. It keeps what it
    says of the page, so that a copy of the page waiting in the result cache is told in its own name."""

    def __init__(self, doc_id: str | None, count: str, max_length: int, index: int | None = None) -> None:
        super().__init__(
            f"{document_name(doc_id, index)} has {count} tokens, over the model's {max_length} "
            "(allow truncation to cut it)"
        )
        self.count, self.max_length = count, max_length

    def renamed(self, doc_id: str | None, index: int | None = None) -> OverLimitError:
        return OverLimitError(doc_id, self.count, self.max_length, index)


class ProcessLostError(HtmllmError):
    """The preprocessing process that held a page was killed from outside (the kernel's OOM killer,
    `kill -9`) in each of its tries: the server's trouble, not the page's. `not_ready` (503 with
    Retry-After), which a client retries and `htmllm embed` leaves for the next run; it had been
    `preprocess_failed`, a 422 that called a good page bad and a row a resume never redid."""

    code = ErrorCode.NOT_READY


class ProcessStartError(HtmllmError):
    """No preprocessing process could be started for the page (the forkserver unreachable, a process that
    died starting): the server's trouble, not the page's. `not_ready` (503 with Retry-After), which a
    client retries and `htmllm embed` leaves for the next run; it had been `internal_error`, a 500 that
    said neither, and before that an untyped FileNotFoundError."""

    code = ErrorCode.NOT_READY


class ProcessStalledError(HtmllmError):
    """The page's preprocessing process ran past the time limit without being busy with it (stopped,
    starved of CPU: `WorkerTimeoutError.stalled`): the server's trouble, as `ProcessLostError` is, so
    `not_ready`. A page that keeps its process busy for the whole limit is the page's: `preprocess_failed`."""

    code = ErrorCode.NOT_READY


# Failures of a page itself: the same bytes under the same policy fail the same way again, so the copies
# of a page that wait in the result cache get the failure instead of each trying in turn (a page that
# fails at the preprocessing time limit had cost every copy the whole limit, one after another). A
# deadline, a cancellation, the shutdown or a backend failure says nothing of the page: copies retry.
PAGE_FAILURES = frozenset(
    {
        ErrorCode.PREPROCESS_FAILED,
        ErrorCode.TOO_MANY_TOKENS,
        ErrorCode.PAYLOAD_TOO_LARGE,
        ErrorCode.VALIDATION,
    }
)


def for_copy(failure: HtmllmError, doc: Document) -> HtmllmError:
    """The failure of a page's first copy, as `doc`'s own error: a new exception (one object raised in
    many tasks would pile up their tracebacks), named after `doc` where the message names a document."""
    if isinstance(failure, OverLimitError):
        return mark(failure.renamed(doc.id), doc)
    return mark(_own_copy(failure), doc)


def _own_copy(failure: HtmllmError, message: str | None = None) -> HtmllmError:
    """A new exception of `failure`'s class and attributes (a caller catches `NestingTooDeepError`), saying
    `message` where one is given; a plain `HtmllmError` of the same code where the class's constructor
    takes other arguments than a message."""
    try:
        own = copy.copy(failure)
    except Exception:
        return HtmllmError(failure.message if message is None else message, code=failure.code)
    if message is not None:
        own.args = (message,)
    return own


def mark(failure: E, doc: Document) -> E:
    """`failure`, marked as `doc`'s own where it is a failure of the page itself (`PAGE_FAILURES`):
    an all-or-nothing call raises the first failure of its documents, and without the mark its caller
    could not tell a crawler which of 64 pages nests too deep or needs too much memory."""
    if failure.code in PAGE_FAILURES:
        setattr(failure, _DOCUMENT_ATTRIBUTE, doc)
    elif hasattr(failure, _DOCUMENT_ATTRIBUTE):  # (a copy of another's failure: not this page's own)
        delattr(failure, _DOCUMENT_ATTRIBUTE)
    return failure


def failed_document(failure: BaseException) -> Document | None:
    """The document a failure of the page itself was marked with (`mark`), if any."""
    doc = getattr(failure, _DOCUMENT_ATTRIBUTE, None)
    return doc if isinstance(doc, Document) else None


def naming(failure: HtmllmError, documents: Sequence[Document]) -> HtmllmError:
    """An all-or-nothing call's failure as its caller answers it: a failure of one of `documents`
    (the call's, in order) names that document by its id and index, in its own class and code; any other
    failure (one not marked, or marked with a document of another call) is `failure` itself.

    The named failure is not marked: it is named once, by the Engine for a call of several documents or
    by the HTTP layer (`naming_failures` around the Engine's call), never by both."""
    doc = failed_document(failure)
    index = next((i for i, candidate in enumerate(documents) if candidate is doc), None)
    if doc is None or index is None:
        return failure
    if isinstance(failure, OverLimitError):  # its message names the document already: by id alone
        return failure.renamed(doc.id, index)
    return _unmarked(_own_copy(failure, f"{document_name(doc.id, index)}: {failure.message}"))


def _unmarked(failure: E) -> E:
    if hasattr(failure, _DOCUMENT_ATTRIBUTE):
        delattr(failure, _DOCUMENT_ATTRIBUTE)
    return failure


@contextmanager
def naming_failures(documents: Sequence[Document]) -> Iterator[None]:
    """A failure of one of `documents` (all or nothing: the call's error) raised named after that
    document, by id and index (`naming`): a crawler that sent 64 pages learns which one to drop."""
    try:
        yield
    except HtmllmError as exc:
        named = naming(exc, documents)
        try:
            if named is exc:
                raise
            raise named from exc
        finally:
            # The error raised keeps this frame in its traceback: a local still naming it is a cycle,
            # which held the page it was marked with until a full collection (service.engine.collector).
            del named


def worker_failure(exc: WorkerError, timeout_s: float | None) -> HtmllmError:
    """What a preprocessing process's failure (past its time limit, crashed, killed from outside, never
    started) says to the caller of its page; a pool that `stop` closed under the page is the Engine's to
    answer. Only what the page did (our time limit, spent busy with it; a crash) is `preprocess_failed`."""
    if isinstance(exc, WorkerTimeoutError) and exc.stalled:  # the process was stopped, not the page slow
        return ProcessStalledError(
            f"this page was not preprocessed: its process was stalled past the {timeout_s} s limit "
            f"({TIMEOUT_SETTING}), on the CPU for {exc.cpu_s or 0:.2f} s of it; try it again later"
        )
    if isinstance(exc, WorkerTimeoutError):
        return PreprocessError(
            f"preprocessing this page took more than {timeout_s} s ({TIMEOUT_SETTING}); "
            "its worker was stopped"
        )
    if isinstance(exc, WorkerStartError):  # not the page's fault: a retryable 503, not a 422
        return ProcessStartError(
            f"a preprocessing process could not start: {exc.message}; try it again later"
        )
    if isinstance(exc, WorkerLostError):  # before WorkerDiedError, its base: not the page's fault either
        return ProcessLostError(f"this page was not preprocessed: {exc.message}; try it again later")
    if isinstance(exc, WorkerDiedError):
        return PreprocessError(f"this page crashed its preprocessing process (exit code {exc.exit_code})")
    return PreprocessError(f"preprocessing failed: {exc.message}")
