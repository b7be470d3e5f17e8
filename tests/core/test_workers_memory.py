"""A job's error raised by `WorkerPool.call` is freed by reference counting alone.

The engine marks a page's preprocessing error with the page (`service.engine.failures.mark`), and a
serving process collects reference cycles all but never (service.engine.collector): an error left in a
cycle kept its refused page, one per failed request, in a soak that grew the server by gigabytes. Here
the collector is off; the error must die as soon as its caller lets go of it.
"""

from __future__ import annotations

import weakref

import pytest

from service.core.errors import ErrorCode, HtmllmError
from service.core.workers import WorkerPool


def refuse(message: str) -> None:
    raise HtmllmError(message, code=ErrorCode.PREPROCESS_FAILED)


def _error_of_a_job(pool: WorkerPool) -> weakref.ref[HtmllmError]:
    """A weak reference to the error `refuse` raised through the pool; the error itself is let go."""
    try:
        pool.call(refuse, ("the page nests too deep",), timeout_s=60)
    except HtmllmError as exc:
        assert exc.code is ErrorCode.PREPROCESS_FAILED and exc.message == "the page nests too deep"
        return weakref.ref(exc)
    raise AssertionError("the job's error was not raised")


@pytest.mark.usefixtures("no_collector")
def test_a_jobs_error_is_freed_without_a_collection() -> None:
    with WorkerPool(1, name="test") as pool:
        error = _error_of_a_job(pool)
        assert error() is None, "the job's error outlived its caller: a reference cycle holds it"
        assert _error_of_a_job(pool)() is None  # the worker that raised serves on, and so again
