"""The inference process restarted after a crash: the pass that waited for the new child to load the
model is no measure of how fast the queue drains (`admission`).

A real child on the tiny checkpoint, held "loading" by stopping it (SIGSTOP), so that the wait is at
least the hold whatever a load takes; waits are bounded.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from service.engine.admission import DrainRate
from service.engine.batcher import Batcher
from service.engine.runners.process import ProcessRunner
from service.engine.types import EngineConfig

WAIT_S = 120.0  # a bound on every wait: a child's load takes seconds
HOLD_S = 2.0  # how long the new child is held while it loads: far longer than a pass of the tiny model


async def _until(condition: Callable[[], bool], what: str) -> None:
    """Poll `condition` until it holds, bounded by WAIT_S."""
    deadline = time.monotonic() + WAIT_S
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"never: {what}")
        await asyncio.sleep(0.005)


async def test_a_pass_that_waited_for_a_restarted_child_does_not_slow_the_drain_rate(
    tiny_checkpoint: Path,
) -> None:
    """In a load run, the 52.9 s a pass waited for the new child read as one pass that slow, and eight
    requests were refused with 429 ("52.9 s of work ... at 0.1 a second") once it served at full speed.
    The wait is the runner's `load_wait_s`, which the batcher leaves out of the drain rate."""
    runner = ProcessRunner(tiny_checkpoint, EngineConfig(intra_op_threads=1))
    drain = DrainRate()
    batcher = Batcher(runner, max_batch_tokens=1000, max_batch_requests=4, max_wait_ms=0, drain=drain)
    batcher.start()
    try:
        child = runner._process
        assert child is not None
        os.kill(child.pid, signal.SIGKILL)  # dies while idle: its watcher starts a new one at once
        await _until(lambda: runner._starting is not None, "a new child started")
        loading: Any = runner._starting
        os.kill(loading.pid, signal.SIGSTOP)
        try:
            answer = batcher.submit([2, 7, 9, 3], deadline=None)  # busy from here
            await _until(lambda: batcher.health.pass_started is not None, "the pass began")
            held_from = time.monotonic()
            await asyncio.sleep(HOLD_S)
        finally:
            os.kill(loading.pid, signal.SIGCONT)
        held_s = time.monotonic() - held_from
        row = await asyncio.wait_for(answer, WAIT_S)
        assert row.embedding.shape[0] > 0 and runner.restarts == 1
        assert runner.load_wait_s > 0  # the runner counted the wait
        # Busy from before the hold to after it: with the wait counted, this one document read as at
        # least `held_s` of work, and a queue of 30 such as 30 times that.
        per_document = drain.seconds_for(1)
        assert per_document is not None and per_document < held_s
    finally:
        await batcher.close()
        runner.close()
