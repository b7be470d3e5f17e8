"""A backend that stays broken: its failed probe and check passes are one warning a minute, not one per probe.

/ready starts a pass at most every `PROBE_INTERVAL_S` while passes fail; each failure had been a warning
("backend probe failed"), one every 5 s for as long as the backend stayed broken, where the pools' failed
probes were said once a minute (`RecurringWarning`). The first is a warning, the rest debug lines until a
pass succeeds; the next fault's first failure is a warning again. The backend is the real tiny model in
process, made to fail on demand.
"""

from __future__ import annotations

import logging

import httpx
import pytest

from service.api import runtime as runtime_module
from service.api.app import create_app, load_engine
from service.api.runtime import Runtime
from service.engine.runners import PreparedBatch, RunnerOutput
from tests.api.conftest import SettingsFactory, serving
from tests.api.pages import page
from tests.factories.waiting import ready_until

BODY = {"documents": [{"html": page(1)}]}


def _failed_passes(caplog: pytest.LogCaptureFixture) -> list[int]:
    """The levels of the lines that said a probe or check pass failed, in order."""
    said = ("backend probe failed", "backend check failed")
    return [r.levelno for r in caplog.records if r.getMessage().startswith(said)]


async def _probe_once(client: httpx.AsyncClient, runtime: Runtime) -> None:
    """Ask /ready, and wait for the probe or check pass it started."""
    await client.get("/ready")
    probe = runtime._probe.task
    assert probe is not None and not probe.cancelled(), "no probe pass was started"
    await probe


async def test_failed_probe_passes_are_one_warning_a_minute_while_the_backend_stays_broken(
    settings_for: SettingsFactory, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(runtime_module, "PROBE_INTERVAL_S", 0.0)
    settings = settings_for()
    engine = load_engine(settings)
    working = engine._runner.run
    broken = False

    def run(prepared: PreparedBatch) -> RunnerOutput:
        if broken:
            raise RuntimeError("CUDA error: an illegal memory access was encountered (simulated)")
        return working(prepared)

    monkeypatch.setattr(engine._runner, "run", run)
    app = create_app(settings, engine)
    runtime: Runtime = app.state.runtime
    caplog.set_level(logging.DEBUG, logger="service.api.runtime")
    async with serving(app) as client:
        await ready_until(client, 200, "after the warm-up")
        broken = True
        failed = await client.post("/v1/embed", json=BODY)
        assert failed.status_code == 500, failed.text
        for _ in range(5):  # two checks (below the threshold), then probes: each fails
            await _probe_once(client, runtime)
        assert engine.health.failures == 6
        assert _failed_passes(caplog) == [logging.WARNING] + [logging.DEBUG] * 4

        broken = False  # the backend serves again: a probe says so, and the next fault is new
        await ready_until(client, 200, "a probe pass succeeded")
        assert any("the backend serves again" in r.getMessage() for r in caplog.records)
        broken = True
        assert (await client.post("/v1/embed", json=BODY)).status_code == 500
        await _probe_once(client, runtime)
        assert _failed_passes(caplog)[5:] == [logging.WARNING]
