"""A run of failed passes ends when the model's child process, started anew, has run a pass of its own.

Only a batch's pass had ended it: a pod whose inference child was killed in its pass, and replaced while
no traffic came, kept `htmllm_backend_consecutive_failures` (read from `health`) at 1 for as long as it
stayed idle, and the alert `> 0 for 2m` paged on a healthy pod. A restart's child now runs a three-token
pass before it serves; a restart that fails, or one that came before the latest failure, ends nothing.

Real children on a copy of the tiny checkpoint; a child is held "loading" by stopping it (SIGSTOP), so
that no assertion depends on how long a load takes. Waits are bounded polls.
"""

from __future__ import annotations

import os
import shutil
import signal
import time
from pathlib import Path

import pytest

from service.engine.batcher import Batcher
from service.engine.runners import PreparedBatch, RunnerOutput
from service.engine.runners.process import ProcessRunner
from service.engine.types import BackendError, EngineConfig
from tests.factories.runners import BlockingRunner
from tests.factories.waiting import until_async

DOC = [2, 7, 9, 3]
UNKNOWN_TOKEN = 10**6  # past any vocabulary: the child's embedding lookup raises, a pass that fails


async def _failed_pass(batcher: Batcher) -> None:
    with pytest.raises(BackendError):
        await batcher.submit([2, UNKNOWN_TOKEN, 3], deadline=None)


@pytest.fixture
def served(tiny_checkpoint: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "served"
    shutil.copytree(tiny_checkpoint, copy)
    return copy


async def test_a_child_started_anew_after_a_failed_pass_ends_the_run_without_traffic(served: Path) -> None:
    runner = ProcessRunner(served, EngineConfig(intra_op_threads=1))
    batcher = Batcher(runner, max_batch_tokens=1000, max_batch_requests=4, max_wait_ms=0)
    batcher.start()
    try:
        await batcher.submit(DOC, deadline=None)
        await _failed_pass(batcher)
        assert batcher.health.failures == 1
        dead = runner._process
        assert dead is not None
        os.kill(dead.pid, signal.SIGKILL)  # the OOM killer, while the pod is idle
        loading = await until_async(lambda: runner._starting, "a new child started")
        os.kill(loading.pid, signal.SIGSTOP)  # held while it loads: nothing has run on it yet
        try:
            assert batcher.health.failures == 1
        finally:
            os.kill(loading.pid, signal.SIGCONT)
        await until_async(lambda: runner.outage() is None, "the new child serves")
        health = batcher.health  # no batch since the failure: the child's own pass ended the run
        assert health.failures == 0 and health.failing_since is None and health.last_error is None
        assert runner.recovered_at is not None and runner.restarts == 1
        await _failed_pass(batcher)  # before any pass of ours succeeded: the run the restart ended goes on
        assert batcher.health.failures == 2
    finally:
        await batcher.close()
        runner.close()


async def test_a_restart_that_fails_ends_no_run(served: Path, tmp_path: Path) -> None:
    """A child that cannot load (its checkpoint gone) ran no pass: the failures stand."""
    runner = ProcessRunner(served, EngineConfig(intra_op_threads=1))
    batcher = Batcher(runner, max_batch_tokens=1000, max_batch_requests=4, max_wait_ms=0)
    batcher.start()
    away = tmp_path / "away"
    try:
        await _failed_pass(batcher)
        assert batcher.health.failures == 1
        served.rename(away)  # a volume unmounted
        dead = runner._process
        assert dead is not None
        os.kill(dead.pid, signal.SIGKILL)
        outage = await until_async(
            lambda: (o := runner.outage()) is not None and not o.loading and o, "the restart failed"
        )
        assert "restart 1 failed" in outage.reason
        assert batcher.health.failures == 1
        away.rename(served)
        await batcher.submit(DOC, deadline=None)  # its pass starts a child that serves
        assert batcher.health.failures == 0
    finally:
        if away.exists():
            away.rename(served)
        await batcher.close()
        runner.close()


class _RecoveringRunner(BlockingRunner):
    """Every pass fails while `failing`; `recovered_at` as a `ProcessRunner`'s, set by the test."""

    def __init__(self) -> None:
        super().__init__()
        self.recovered_at: float | None = None
        self.failing = True

    def run(self, prepared: PreparedBatch) -> RunnerOutput:
        if self.failing:
            raise RuntimeError("the inference process died during a forward pass")
        return super().run(prepared)


async def test_only_a_recovery_after_the_latest_failure_ends_the_run() -> None:
    runner = _RecoveringRunner()
    batcher = Batcher(runner, max_batch_tokens=1000, max_batch_requests=4, max_wait_ms=0)
    batcher.start()
    try:
        runner.recovered_at = time.monotonic()  # a restart, then two failed passes
        for _ in range(2):
            with pytest.raises(BackendError):
                await batcher.run_direct([DOC])
        assert batcher.health.failures == 2
        runner.recovered_at = time.monotonic()  # a restart after them
        assert batcher.health.failures == 0
        with pytest.raises(BackendError):
            await batcher.run_direct([DOC])
        assert batcher.health.failures == 3  # no pass of ours succeeded since: the run goes on
    finally:
        await batcher.close()


async def test_a_batch_that_kills_every_child_adds_up_though_each_restart_passes_its_check() -> None:
    """The OOM killer on every large batch: each child started anew passes its three-token check, and
    each run had ended there, the count never past 1 (never unready, the alert never firing). Only the
    first restart ends the run, until a pass of ours succeeds."""
    runner = _RecoveringRunner()
    batcher = Batcher(runner, max_batch_tokens=1000, max_batch_requests=4, max_wait_ms=0)
    batcher.start()
    try:
        counts = []
        for _ in range(4):
            with pytest.raises(BackendError):
                await batcher.run_direct([DOC])
            runner.recovered_at = time.monotonic()  # the child replaced, its check pass passed
            counts.append(batcher.health.failures)
        assert counts == [0, 2, 3, 4]
        runner.failing = False
        await batcher.run_direct([DOC])  # a pass of ours: the run is over
        runner.failing = True
        with pytest.raises(BackendError):
            await batcher.run_direct([DOC])
        runner.recovered_at = time.monotonic()
        assert batcher.health.failures == 0  # a new run, which a restart ends once again
    finally:
        await batcher.close()
