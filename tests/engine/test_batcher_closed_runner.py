"""A runner closed under the batcher: its passes fail as the shutdown they are, in the queue and outside it.

Every runner raises ShuttingDownError once closed (the Runner protocol), so that a pass queued behind the
close "fails as the shutdown it is, not as a backend failure". The batcher's queued passes did not honour
it: the error became a BackendError (`backend_failed` to clients), counted as a failed pass in `health`
(three batches turned /ready 503) and was logged with a traceback, while the same error in a pass outside
the queue (`run_direct`: warm-up, probe) reached its caller as ShuttingDownError and counted nothing.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from service.core.checkpoint import load_checkpoint
from service.engine.batcher import Batcher
from service.engine.runners import PreparedBatch, RunnerOutput
from service.engine.runners.torch import TorchRunner
from service.engine.types import BackendHealth, ShuttingDownError
from tests.factories.runners import HOLD_BOUND_S


class _HeldTorchRunner(TorchRunner):
    """The real torch runner, whose next pass once `hold` is set waits on the inference thread for
    `release`, before the runner looks at whether it was closed (a pass the thread took as the close
    came); `passes` counts them."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.hold = False
        self.started = threading.Event()
        self.release = threading.Event()
        self.passes = 0

    def run(self, prepared: PreparedBatch) -> RunnerOutput:
        self.passes += 1
        if self.hold:
            self.hold = False
            self.started.set()
            self.release.wait(HOLD_BOUND_S)
        return super().run(prepared)


async def test_batches_on_a_runner_closed_under_them_are_shutting_down_not_backend_failures(
    tiny_checkpoint: Path, caplog: pytest.LogCaptureFixture
) -> None:
    runner = _HeldTorchRunner(load_checkpoint(tiny_checkpoint).model)
    batcher = Batcher(runner, max_batch_tokens=1000, max_batch_requests=1, max_wait_ms=0)
    batcher.start()
    try:
        assert (await batcher.run_direct([[2, 5, 3]])).embeddings.shape[0] == 1  # the runner works
        runner.hold, runner.passes = True, 0
        in_pass = batcher.submit([2, 5, 3], deadline=None)
        assert await asyncio.to_thread(runner.started.wait, HOLD_BOUND_S)
        queued = batcher.submit([2, 5, 3, 7], deadline=None)  # the next batch, behind the held pass
        await asyncio.to_thread(runner.close)  # off the loop, as the engine releases its runner
        runner.release.set()
        done, _ = await asyncio.wait([in_pass, queued], timeout=HOLD_BOUND_S)
        assert len(done) == 2
        for future in (in_pass, queued):
            with pytest.raises(ShuttingDownError, match="the torch runner has been closed"):
                future.result()
        assert runner.passes == 2
        with pytest.raises(ShuttingDownError):  # outside the queue, as before
            await batcher.run_direct([[2, 5, 3]])
        assert batcher.health == BackendHealth()  # no failed pass counted
        assert "a forward pass failed" not in caplog.text
    finally:
        runner.release.set()
        await batcher.close()
