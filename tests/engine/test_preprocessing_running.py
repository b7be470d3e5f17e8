"""`Preprocessing.running`: the jobs on the preprocessing threads now, what readiness reads to find a stuck
worker (`PreprocessingReadiness.stuck`). Kept by the job's own thread, so a caller that stops waiting
(its request timed out) does not clear it; with processes, a page's whole call to its process counts.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import threading

import pytest

from service.engine.preprocessing import Phase, Preprocessing
from service.engine.types import EngineConfig, ShuttingDownError
from tests.factories.tokenizer import build_tiny_tokenizer
from tests.factories.waiting import until_async
from tests.factories.worker_jobs import stop_self

HOLD_S = 60.0  # far past what the tests need: only keeps a broken test from hanging


async def test_a_job_counts_as_running_until_it_ends_though_its_caller_gave_up() -> None:
    pools = Preprocessing(build_tiny_tokenizer(), EngineConfig(preprocess_workers=2), max_length=64)
    await pools.start()
    try:
        threads = pools.threads
        assert threads is not None and pools.running.oldest() is None
        first, second = threading.Event(), threading.Event()
        waits = [
            asyncio.ensure_future(pools.off_loop(threads, event.wait, HOLD_S)) for event in (first, second)
        ]
        await until_async(lambda: len(pools.running._jobs[Phase.THREAD]) == 2, "both jobs run")
        oldest = pools.running.oldest()
        assert oldest is not None and oldest == min(pools.running._jobs[Phase.THREAD].values())

        waits[0].cancel()  # its caller's deadline: the thread goes on with the page
        await asyncio.gather(waits[0], return_exceptions=True)
        assert pools.running.oldest() == oldest

        first.set()
        await until_async(lambda: len(pools.running._jobs[Phase.THREAD]) == 1, "the first job ended")
        assert pools.running.oldest() is not None and pools.running.oldest() != oldest
        second.set()
        await waits[1]
        assert pools.running.oldest() is None
    finally:
        await pools.close()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="forkserver: Linux only")
async def test_a_page_held_in_its_process_counts_as_running_until_the_process_is_killed() -> None:
    config = EngineConfig(preprocess_workers=1, preprocess_pool="process", preprocess_timeout_s=HOLD_S)
    pools = Preprocessing(build_tiny_tokenizer(), config, max_length=64)
    await pools.start()
    try:
        held = asyncio.ensure_future(pools._in_process(stop_self))  # a worker stopped mid-page
        await until_async(lambda: pools.running.oldest() is not None, "the call runs")
    finally:
        await pools.close()  # kills the stopped worker: the call ends with it
    with pytest.raises(ShuttingDownError):
        await held
    assert pools.running.oldest() is None


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="forkserver: Linux only")
async def test_a_page_retried_after_its_process_was_killed_counts_from_its_new_try() -> None:
    """A process killed from outside under a page (the OOM killer) is replaced and the page tried again,
    each try with its own time limit (`LOST_PROCESS_RETRIES`): readiness holds a try, not the whole call,
    to the limit, or a page retried twice after OOM kills was taken for a stuck pool."""
    config = EngineConfig(preprocess_workers=1, preprocess_pool="process", preprocess_timeout_s=HOLD_S)
    pools = Preprocessing(build_tiny_tokenizer(), config, max_length=64)
    await pools.start()
    processes = pools._processes
    assert processes is not None
    try:
        held = asyncio.ensure_future(pools._in_process(stop_self))  # a worker stopped mid-page, each try
        first = await until_async(lambda: processes._busy and pools.running.oldest(), "the first try runs")
        (worker,) = processes._busy
        os.kill(worker.pid, signal.SIGKILL)  # from outside: the page is tried again in a fresh process
        await until_async(lambda: processes._busy and worker not in processes._busy, "the second try runs")
        retried = pools.running.oldest()
        assert retried is not None and retried > first
        assert len(pools.running._jobs[Phase.ON_PROCESS]) == 1  # still one job, its age from its latest try
    finally:
        await pools.close()
    with pytest.raises(ShuttingDownError):
        await held
    assert pools.running.oldest() is None
