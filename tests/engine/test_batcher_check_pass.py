"""How a run of failed passes ends, and what is no failed pass at all.

A check pass (`run_direct(check=True)`, the server's look at a backend whose last passes failed) ends the
run as a model process started anew ends it with its own pass: with the model in this process a failed
pass on an idle pod had stayed counted until traffic came (`htmllm_backend_consecutive_failures` at 1
and its alert paging; /ready's count, which the next failure, days later, added to). The run is kept
aside, not forgotten: a failure before a pass of ours succeeds resumes it.

A runner that refuses every pass with a typed `not_ready` (a model process not started again on a
checkpoint changed under it, `CheckpointChangedError`) ran nothing: its batches are answered `not_ready`
(503 with Retry-After), and nothing counts in `health`. They had been `backend_failed` (500) and
counted as failed passes.

The real torch runner on the tiny checkpoint, made to fail or refuse on demand.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from service.core.checkpoint import load_checkpoint
from service.core.errors import ErrorCode
from service.engine.batcher import Batcher
from service.engine.runners import PreparedBatch, RunnerOutput
from service.engine.runners.process import CheckpointChangedError
from service.engine.runners.torch import TorchRunner
from service.engine.types import BackendError, BackendHealth, NotReadyError

DOC = [2, 7, 9, 3]


class _FlakyTorchRunner(TorchRunner):
    """The torch runner, whose passes fail while `fail` is set and are refused while `refuse` is."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.fail = False
        self.refuse = False

    def run(self, prepared: PreparedBatch) -> RunnerOutput:
        if self.refuse:
            raise CheckpointChangedError(
                "the checkpoint changed since the engine started: restart the server"
            )
        if self.fail:
            raise RuntimeError("CUDA error: an illegal memory access was encountered (simulated)")
        return super().run(prepared)


@pytest.fixture
async def batcher_and_runner(tiny_checkpoint: Path) -> AsyncIterator[tuple[Batcher, _FlakyTorchRunner]]:
    runner = _FlakyTorchRunner(load_checkpoint(tiny_checkpoint).model)
    batcher = Batcher(runner, max_batch_tokens=1000, max_batch_requests=4, max_wait_ms=0)
    batcher.start()
    try:
        yield batcher, runner
    finally:
        await batcher.close()
        runner.close()


async def _failed_batch(batcher: Batcher, runner: _FlakyTorchRunner) -> None:
    runner.fail = True
    try:
        with pytest.raises(BackendError):
            await batcher.submit(DOC, deadline=None)
    finally:
        runner.fail = False


async def test_a_check_pass_ends_a_run_that_a_later_failure_resumes(
    batcher_and_runner: tuple[Batcher, _FlakyTorchRunner],
) -> None:
    batcher, runner = batcher_and_runner
    await _failed_batch(batcher, runner)
    failed = batcher.health
    assert failed.failures == 1 and failed.last_failed_at is not None and failed.failing_since is not None

    await batcher.run_direct([[2, 5, 3]], check=True)  # the server's check of an idle pod
    assert batcher.health == BackendHealth()  # no batch since the failure: the check ended the run

    await _failed_batch(batcher, runner)  # before a pass of ours succeeded: the run goes on
    resumed = batcher.health
    assert resumed.failures == 2 and resumed.failing_since == failed.failing_since
    await batcher.run_direct([[2, 5, 3]], check=True)  # ended again, kept aside again (with both)
    assert batcher.health.failures == 0
    await _failed_batch(batcher, runner)
    assert batcher.health.failures == 3  # so a backend failing every real batch still adds up

    await batcher.submit(DOC, deadline=None)  # a pass of ours succeeds: the run is over for good
    await _failed_batch(batcher, runner)
    assert batcher.health.failures == 1


async def test_a_failed_check_counts_and_a_check_with_nothing_failed_changes_nothing(
    batcher_and_runner: tuple[Batcher, _FlakyTorchRunner],
) -> None:
    batcher, runner = batcher_and_runner
    await batcher.run_direct([[2, 5, 3]], check=True)
    assert batcher.health == BackendHealth()
    await _failed_batch(batcher, runner)
    runner.fail = True
    with pytest.raises(BackendError):
        await batcher.run_direct([[2, 5, 3]], check=True)  # an idle pod whose backend broke
    runner.fail = False
    assert batcher.health.failures == 2


async def test_a_runner_that_refuses_every_pass_fails_no_pass(
    batcher_and_runner: tuple[Batcher, _FlakyTorchRunner], caplog: pytest.LogCaptureFixture
) -> None:
    batcher, runner = batcher_and_runner
    runner.refuse = True
    with pytest.raises(NotReadyError, match="restart the server") as refused:
        await batcher.submit(DOC, deadline=None)
    assert refused.value.code is ErrorCode.NOT_READY
    with pytest.raises(NotReadyError) as probe:  # outside the queue too (a probe, the warm-up)
        await batcher.run_direct([[2, 5, 3]])
    assert probe.value.code is ErrorCode.NOT_READY
    assert batcher.health == BackendHealth()  # nothing ran, nothing failed
    assert "a forward pass failed" not in caplog.text  # no traceback: the server's state, not a bug
    runner.refuse = False
    await batcher.submit(DOC, deadline=None)
