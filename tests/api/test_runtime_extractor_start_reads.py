"""/health reads the extractor pool's run of refused starts once (`Runtime.unhealthy`).

It had read it three times (whether it was refused for the restart rule, then again whether it was
refused, then since when, for the outage rule); the run changes under it from other threads (a job
refused, a job that gets a worker), so two reads could disagree: refused by one and since when by
another. The pool is a real one that never started a process; its run is set as refused starts set it,
and its reads are counted, apart from those of the probe /health starts (`observe_start_trouble`, the
pool's own).
"""

from __future__ import annotations

import time

from service.api.app import create_app
from service.api.runtime import Runtime
from service.core.extract.pool import ExtractorPool
from service.core.worker_health import StartHealth
from tests.api.conftest import SettingsFactory, serving
from tests.factories.waiting import ready_until


class _CountedReads(ExtractorPool):
    """An extractor pool that counts the reads of its run (`start_health`) made from outside its probe."""

    def __init__(self) -> None:
        super().__init__(1)
        self.reads = 0
        self._observing = False

    @property
    def start_health(self) -> StartHealth:
        if not self._observing:
            self.reads += 1
        return super().start_health

    def observe_start_trouble(self, after_failures: int, now: float | None = None) -> str | None:
        self._observing = True
        try:
            return super().observe_start_trouble(after_failures, now)
        finally:
            self._observing = False


async def test_health_reads_the_extractor_pools_refused_starts_once(settings_for: SettingsFactory) -> None:
    app = create_app(settings_for(unhealthy_after_s=300))
    runtime: Runtime = app.state.runtime
    async with serving(app) as client:
        await ready_until(client, 200, "after the warm-up")
        pool = _CountedReads()
        runtime.extractor_pool = pool
        try:
            since = time.monotonic() - 400
            for _ in range(3):  # three tries in a row refused, the first 400 s ago
                pool._starts.refused(
                    "the extractor worker died while starting (exit code 1)", pool._starts.ticket(), since
                )
            pool._probe_started = time.monotonic()  # its probe job ran just now: none starts a process here
            pool.reads = 0
            reason = runtime.unhealthy()
            assert reason is not None and reason.startswith("no extractor process has started for 400 s"), (
                reason
            )
            assert "3 tries refused; the extractor worker died while starting" in reason
            assert pool.reads == 1
        finally:
            pool.close()
            runtime.extractor_pool = None
