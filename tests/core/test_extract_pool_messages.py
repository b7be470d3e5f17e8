"""An extractor failing past the workers' memory limit says it likely was the limit: the errors it
raises there ("XPathEvalError: unknown error", a bare MemoryError, resiliparse's abort) did not."""

from __future__ import annotations

import signal
from typing import Any

import lxml.etree
import pytest

from service.core.extract import ExtractionError, ExtractorPool
from service.core.workers import JobError, WorkerDiedError

LIMIT = 200 * 2**20


def _failure(pool: ExtractorPool, monkeypatch: pytest.MonkeyPatch, error: Exception) -> str:
    def call(*_: Any, **__: Any) -> Any:
        raise error

    monkeypatch.setattr(pool, "call", call)  # no worker: the message is built from the error
    with pytest.raises(ExtractionError) as failed:
        pool.run("trafilatura", "<p>x</p>", language=None, timeout_s=1.0)
    return failed.value.message


OUT_OF_MEMORY = [
    lxml.etree.XPathEvalError("unknown error"),  # trafilatura on 14 MB of one paragraph, 200 MiB
    lxml.etree.XMLSyntaxError("Memory allocation failed : growing buffer", 1, 1, 1),
    MemoryError(),  # trafilatura on 15 MB of paragraphs, 200 MiB
    JobError("MemoryError: ", type_name="MemoryError"),
    WorkerDiedError("crashed its extractor worker (exit code -6)", exit_code=-signal.SIGABRT),  # resiliparse
]
OTHER = [
    lxml.etree.XPathEvalError("Invalid expression"),
    ValueError("All strings must be XML compatible"),
    WorkerDiedError("crashed its extractor worker (exit code 1)", exit_code=1),
]


@pytest.mark.parametrize("error", OUT_OF_MEMORY, ids=lambda e: type(e).__name__)
def test_an_out_of_memory_failure_under_a_limit_names_the_limit(
    error: Exception, monkeypatch: pytest.MonkeyPatch
) -> None:
    with ExtractorPool(1, memory_limit_bytes=LIMIT) as pool:
        message = _failure(pool, monkeypatch, error)
    assert message.startswith("trafilatura")
    assert "likely the extractor processes' memory limit, 200 MiB" in message, message


@pytest.mark.parametrize("error", OUT_OF_MEMORY + OTHER, ids=lambda e: type(e).__name__)
def test_without_a_limit_or_for_other_failures_nothing_is_added(
    error: Exception, monkeypatch: pytest.MonkeyPatch
) -> None:
    with ExtractorPool(1) as pool:
        assert "memory limit" not in _failure(pool, monkeypatch, error)
    if error in OTHER:
        with ExtractorPool(1, memory_limit_bytes=LIMIT) as pool:
            assert "memory limit" not in _failure(pool, monkeypatch, error)
