"""The shutdown budget: uvicorn's graceful wait and the engine drain share one timeout from the signal."""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest

from service.api.metrics import ServiceMetrics
from service.api.runtime import Runtime
from service.core.errors import ErrorCode, HtmllmError
from tests.api.conftest import tiny_settings


def test_drain_budget_counts_from_the_first_signal(tiny_checkpoint: Path) -> None:
    runtime = Runtime(settings=tiny_settings(tiny_checkpoint, drain_timeout_s=10), metrics=ServiceMetrics())
    assert runtime.drain_time_left() == 10.0  # no signal: the whole timeout (tests, programmatic stops)
    runtime.begin_shutdown()
    first = runtime.drain_deadline
    time.sleep(0.05)
    runtime.begin_shutdown()  # a second SIGTERM does not extend the budget
    assert runtime.drain_deadline == first
    assert 9.0 < runtime.drain_time_left() < 9.96
    runtime.drain_deadline = time.monotonic() - 1
    assert runtime.drain_time_left() == 0.0


def test_extraction_backlog_counts_jobs_until_they_end(tiny_checkpoint: Path) -> None:
    runtime = Runtime(
        settings=tiny_settings(tiny_checkpoint, max_queue_documents=3), metrics=ServiceMetrics()
    )
    runtime.admit_extraction(2)
    with pytest.raises(HtmllmError) as refused:
        runtime.admit_extraction(2)
    assert refused.value.code is ErrorCode.OVERLOADED
    job: Future[object] = Future()
    job.add_done_callback(runtime.extraction_done)
    job.cancel()  # a job cancelled before it ran frees its slot too
    assert runtime.extraction_backlog == 1
    runtime.admit_extraction(2)
    assert runtime.extraction_backlog == 3
    with pytest.raises(HtmllmError) as never:  # more than the whole queue: retrying cannot help
        runtime.admit_extraction(4)
    assert never.value.code is ErrorCode.TOO_MANY_DOCUMENTS and runtime.extraction_backlog == 3


async def test_the_extractor_workers_get_the_memory_limit(tiny_checkpoint: Path) -> None:
    for limit_mb, limit_bytes in ((2048, 2048 * 2**20), (0, None)):
        settings = tiny_settings(tiny_checkpoint, extract_memory_limit_mb=limit_mb)
        runtime = Runtime(settings=settings, metrics=ServiceMetrics())
        pool, _ = await runtime.extraction()
        try:
            assert pool.memory_limit_bytes == limit_bytes
        finally:
            runtime.close_extraction()


async def start_pathological_extraction(runtime: Runtime, pool: Any, threads: Any) -> Future[Any]:
    """Admit and submit one justext extraction of a pathological page, as /v1/extract does, and return
    once a worker holds it: what a cut-off finds still running."""
    from service.api.routers.extract import _extract_one
    from service.engine import Document
    from tests.core.test_extract import pathological_page

    runtime.admit_extraction(1)
    future: Future[Any] = threads.submit(
        _extract_one,
        Document(html=pathological_page(), id="p"),
        "justext",
        min_words=50,
        language=None,
        timeout_s=60,
        pool=pool,
        metrics=runtime.metrics,
    )
    future.add_done_callback(runtime.extraction_done)
    while not pool._busy:
        if future.done():  # it never reached a worker: say why, instead of waiting for ever
            pytest.fail(f"the extraction ended before it started: {future.exception()!r}")
        await asyncio.sleep(0.01)
    return future


async def test_the_drain_deadline_ends_running_extractions_typed(tiny_checkpoint: Path) -> None:
    """At the cut-off an extraction still running (a pathological page) is stopped and answered as a
    typed per-extractor error, instead of its request being dropped when the server exits."""
    runtime = Runtime(settings=tiny_settings(tiny_checkpoint, drain_timeout_s=0.5), metrics=ServiceMetrics())
    pool, threads = await runtime.extraction()
    try:
        future = await start_pathological_extraction(runtime, pool, threads)
        runtime.drain_deadline = time.monotonic()
        started = time.monotonic()
        await runtime._cut_off()
        result = await asyncio.wrap_future(future)
        assert time.monotonic() - started < 10
        assert result.error is not None and result.error.code is ErrorCode.EXTRACTION_FAILED
        assert runtime.stopping and runtime.extraction_backlog == 0
    finally:
        runtime.close_extraction()
