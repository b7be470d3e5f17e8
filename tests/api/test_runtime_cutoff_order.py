"""The drain budget's cut-off stops the extractions before it waits for the engine's stop, which returns
only once the forward pass in flight has ended: stopped after it, an extraction still running behind a
long pass (a large batch on CPU) was answered by the runtime's whole-request 503 (`PendingAnswers`)
instead of its own typed per-extractor error."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest

from service.api.app import load_engine
from service.api.metrics import ServiceMetrics
from service.api.runtime import Runtime
from service.core.errors import ErrorCode
from service.engine import Document, ShuttingDownError
from service.engine.runners import PreparedBatch, RunnerOutput
from tests.api.conftest import tiny_settings
from tests.api.pages import page
from tests.api.test_runtime import start_pathological_extraction

# How long the pass is held at most, so that a regression fails instead of hanging: never a timing.
HOLD_BOUND_S = 30


async def test_the_cut_off_stops_extractions_while_the_engine_still_waits_for_its_pass(
    tiny_checkpoint: Path,
) -> None:
    """A document in a held forward pass and an extraction running (a pathological page) at the cut-off:
    the extraction is stopped and answered as its typed per-extractor error while the pass still runs."""
    settings = tiny_settings(tiny_checkpoint, warmup=False, drain_timeout_s=0.5, max_wait_ms=0)
    engine = load_engine(settings)
    run = engine._runner.run
    in_pass, release, pass_over = threading.Event(), threading.Event(), threading.Event()

    def held_run(prepared: PreparedBatch) -> RunnerOutput:
        in_pass.set()
        release.wait(2 * HOLD_BOUND_S)  # past the test's bounds: what waits for the pass waits past them
        try:
            return run(prepared)
        finally:
            pass_over.set()

    engine._runner.run = held_run  # type: ignore[method-assign]
    runtime = Runtime(settings=settings, metrics=ServiceMetrics(), engine=engine)
    await engine.start()
    pool, threads = await runtime.extraction()
    cutting = None
    try:
        embedding = asyncio.ensure_future(engine.embed([Document(page(0), id="a")]))
        assert await asyncio.to_thread(in_pass.wait, HOLD_BOUND_S)
        job = await start_pathological_extraction(runtime, pool, threads)
        runtime.drain_deadline = time.monotonic()
        cutting = asyncio.ensure_future(runtime._fail_what_is_left())
        extraction = asyncio.wrap_future(job)
        done, _ = await asyncio.wait([extraction], timeout=HOLD_BOUND_S)
        assert extraction in done, "the extraction was stopped only once the engine's pass was over"
        assert not pass_over.is_set() and not cutting.done()  # the engine's stop still waits for the pass
        result = extraction.result()
        assert result.error is not None and result.error.code is ErrorCode.EXTRACTION_FAILED, result
        with pytest.raises(ShuttingDownError):
            await embedding
    finally:
        release.set()
        if cutting is not None:
            await asyncio.wait_for(cutting, 2 * HOLD_BOUND_S)
        await engine.stop(drain=False)
        engine.close()
        runtime.close_extraction()
    assert runtime.stopping and runtime.drain_cut_short and runtime.extraction_backlog == 0
