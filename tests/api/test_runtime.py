"""The shutdown budget: uvicorn's graceful wait and the engine drain share one timeout from the signal."""

from __future__ import annotations

import time
from pathlib import Path

from service.api.metrics import ServiceMetrics
from service.api.runtime import Runtime
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
