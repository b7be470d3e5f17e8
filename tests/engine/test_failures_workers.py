"""What a preprocessing process's failure says of its page: only what the page did is its own."""

from __future__ import annotations

from service.core.errors import ErrorCode
from service.core.preparation import PreprocessError
from service.core.workers import WorkerStartError, WorkerTimeoutError
from service.engine.failures import PAGE_FAILURES, ProcessStalledError, ProcessStartError, worker_failure


def test_a_page_that_kept_its_process_busy_for_the_limit_is_the_pages_failure() -> None:
    for cpu_s in (19.5, None):  # busy, or how busy unknown (no /proc): the page's, as before
        failure = worker_failure(WorkerTimeoutError("ran past", elapsed_s=20.01, cpu_s=cpu_s), 20.0)
        assert isinstance(failure, PreprocessError) and failure.code in PAGE_FAILURES


def test_a_process_stalled_past_the_limit_is_not_the_pages_failure() -> None:
    """Stopped or starved (on the CPU for under a tenth of the limit): the server's trouble, retryable."""
    failure = worker_failure(WorkerTimeoutError("ran past", elapsed_s=20.01, cpu_s=0.4), 20.0)
    assert isinstance(failure, ProcessStalledError) and failure.code is ErrorCode.NOT_READY
    assert failure.code not in PAGE_FAILURES
    assert "stalled past the 20.0 s limit" in failure.message and "on the CPU for 0.40 s" in failure.message


def test_a_process_that_cannot_start_is_retryable_not_internal() -> None:
    failure = worker_failure(WorkerStartError("preprocessing worker could not be launched"), 20.0)
    assert isinstance(failure, ProcessStartError) and failure.code is ErrorCode.NOT_READY
    assert failure.message == (
        "a preprocessing process could not start: preprocessing worker could not be launched; "
        "try it again later"
    )
