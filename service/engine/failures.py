"""Failures of a page itself: what a preprocessing process's failure means for its page, which failures
say something of the page, and how the copies of it waiting in the result cache are told them.

Apart from the Engine because they are rules of their own, about a page rather than about the queue or
the lifecycle the Engine owns.
"""

from __future__ import annotations

import copy

from service.core.errors import ErrorCode, HtmllmError
from service.core.preparation import PreprocessError
from service.core.workers import WorkerDiedError, WorkerError, WorkerStartError, WorkerTimeoutError
from service.engine.types import Document, TooManyTokensError


class OverLimitError(TooManyTokensError):
    """A page over the token limit with truncation off, named after its document. It keeps what it
    says of the page, so that a copy of the page waiting in the result cache is told in its own name."""

    def __init__(self, doc_id: str | None, count: str, max_length: int) -> None:
        name = f"document {doc_id!r}" if doc_id is not None else "a document"
        super().__init__(
            f"{name} has {count} tokens, over the model's {max_length} (allow truncation to cut it)"
        )
        self.count, self.max_length = count, max_length

    def renamed(self, doc_id: str | None) -> OverLimitError:
        return OverLimitError(doc_id, self.count, self.max_length)


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
        return failure.renamed(doc.id)
    try:
        return copy.copy(failure)
    except Exception:  # a class whose constructor takes other arguments: the same code and message
        return HtmllmError(failure.message, code=failure.code)


def worker_failure(exc: WorkerError, timeout_s: float | None) -> HtmllmError:
    """What a preprocessing process's failure (past its time limit, crashed, never started) says to the
    caller of its page; a pool that `stop` closed under the page is the Engine's to answer."""
    if isinstance(exc, WorkerTimeoutError):
        return PreprocessError(
            f"preprocessing this page took more than {timeout_s} s "
            "(HTMLLM_PREPROCESS_TIMEOUT_S); its worker was stopped"
        )
    if isinstance(exc, WorkerStartError):  # not the page's fault: a 500, not a 422
        return HtmllmError(f"a preprocessing process could not start: {exc.message}", code=ErrorCode.INTERNAL)
    if isinstance(exc, WorkerDiedError):
        return PreprocessError(f"this page crashed its preprocessing process (exit code {exc.exit_code})")
    return PreprocessError(f"preprocessing failed: {exc.message}")
