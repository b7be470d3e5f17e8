"""What /ready and /health say about a backend that hangs in a pass or fails its warm-up.

The backend is faked by replacing the engine's runner's `run`: one that waits on an event (a wedged
device) or raises on demand. Ages are read through `Runtime.clock`, which the tests move on instead of
waiting: no test here depends on how fast the machine is.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest

from service.api import app as app_module
from service.api import runtime as runtime_module
from service.api.app import create_app, load_engine
from service.api.metrics import ServiceMetrics
from service.api.runtime import Runtime
from service.api.settings import Settings
from service.core.errors import ErrorCode
from service.engine import ShuttingDownError
from service.engine.runners import PreparedBatch
from tests.api.conftest import SettingsFactory, serving
from tests.api.pages import page


async def _until(client: httpx.AsyncClient, path: str, status: int) -> httpx.Response:
    """Poll `path` until it answers `status` (a bounded number of event-loop turns, not a time)."""
    for _ in range(2000):
        response = await client.get(path)
        if response.status_code == status:
            return response
        await asyncio.sleep(0.005)
    raise AssertionError(f"{path} never answered {status}; last: {response.status_code} {response.text}")


@asynccontextmanager
async def _wedged_pass(
    client: httpx.AsyncClient, runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[float]:
    """A forward pass that hangs until the block ends (its request is answered 200 then); yields when
    the pass began, on `runtime.clock`'s scale."""
    assert runtime.engine is not None
    runner = runtime.engine._runner
    working = runner.run
    entered, release = threading.Event(), threading.Event()

    def wedged(prepared: object) -> object:
        entered.set()
        release.wait(60)
        return working(prepared)

    monkeypatch.setattr(runner, "run", wedged)
    embed = asyncio.ensure_future(client.post("/v1/embed", json={"documents": [{"html": page(1)}]}))
    try:
        assert await asyncio.to_thread(entered.wait, 60)
        started = runtime.engine.health.pass_started
        assert started is not None
        yield started
    finally:
        release.set()
    assert (await embed).status_code == 200


async def test_a_hung_pass_turns_ready_503_past_the_request_timeout_and_back_when_it_ends(
    settings_for: SettingsFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pass that never finishes failed nothing, so /ready stayed 200 (only failures counted) until
    /health's 300 s: minutes of 504s for the pod's share of traffic. Past the request timeout every
    document of that pass has timed out, so /ready leaves the load balancer then; below it (a slow
    full-size batch) it stays in; once passes complete again it is back."""
    app = create_app(settings_for(request_timeout_s=30))
    async with serving(app) as client:
        await _until(client, "/ready", 200)
        runtime: Runtime = app.state.runtime
        async with _wedged_pass(client, runtime, monkeypatch) as started:
            runtime.clock = lambda: started + 29.9  # a slow pass, within the request timeout
            assert (await client.get("/ready")).status_code == 200
            runtime.clock = lambda: started + 30.0
            ready = await client.get("/ready")
            assert ready.status_code == 503 and ready.json()["error"]["code"] == "not_ready"
            assert "a forward pass has run for 30 s" in ready.json()["error"]["message"]
            assert (await client.get("/health")).status_code == 200  # a restart is /health's, at 300 s
        await _until(client, "/ready", 200)  # the clock still says 30 s: no pass runs now


async def test_a_failed_warm_up_is_retried_until_it_succeeds(
    settings_for: SettingsFactory, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A warm-up that failed once left the server live and never ready, with the runner called once."""
    monkeypatch.setattr(app_module, "WARMUP_RETRY_FIRST_S", 0.001, raising=False)
    settings = settings_for()
    engine = load_engine(settings)
    working = engine._runner.run
    calls = 0

    def flaky(prepared: object) -> object:
        nonlocal calls
        calls += 1
        if calls <= 2:
            raise RuntimeError("CUDA error: transient (simulated)")
        return working(prepared)

    monkeypatch.setattr(engine._runner, "run", flaky)
    caplog.set_level(logging.ERROR, logger="service.api.app")
    app = create_app(settings, engine)
    async with serving(app) as client:
        ready = await _until(client, "/ready", 200)
        assert ready.json()["model"]
        assert (await client.get("/health")).status_code == 200
        runtime: Runtime = app.state.runtime
        assert (runtime.warmup_attempts, runtime.warmup_error, runtime.warmup_failing_since) == (
            3,
            None,
            None,
        )
    failures = [r.getMessage() for r in caplog.records if "warm-up attempt" in r.getMessage()]
    assert len(failures) == 2 and "transient (simulated)" in failures[0], failures
    assert "retrying in 0.0" in failures[0] and "retrying in 0.0" in failures[1]  # 1 ms, then 2 ms


async def test_a_warm_up_that_keeps_failing_turns_health_503_until_one_succeeds(
    settings_for: SettingsFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No traffic reaches a server that never got ready, so nothing counted its backend as failing
    long enough: /health stayed 200 and the kubelet never restarted it. Now a warm-up failing for
    `unhealthy_after_s` makes /health 503; a warm-up that later succeeds makes it ready (and live)."""
    monkeypatch.setattr(app_module, "WARMUP_RETRY_FIRST_S", 0.001, raising=False)
    monkeypatch.setattr(app_module, "WARMUP_RETRY_MAX_S", 0.01, raising=False)
    # Full-size batches fail, three-token passes work: a backend that would pass a probe (none runs
    # while the warm-up retries) but cannot run a batch.
    settings: Settings = settings_for(unhealthy_after_s=120)
    engine = load_engine(settings)
    working = engine._runner.run
    broken = True

    def full_batches_fail(prepared: PreparedBatch) -> object:
        if broken and prepared.tokens > 3:  # the probe runs three tokens
            raise RuntimeError("CUDA out of memory (simulated)")
        return working(prepared)

    monkeypatch.setattr(engine._runner, "run", full_batches_fail)
    app = create_app(settings, engine)
    runtime: Runtime = app.state.runtime
    async with serving(app) as client:
        for _ in range(2000):
            not_ready = await client.get("/ready")
            if "warm-up failed" in not_ready.text:
                break
            await asyncio.sleep(0.005)
        assert not_ready.status_code == 503 and "out of memory" in not_ready.json()["error"]["message"]
        assert (await client.get("/health")).status_code == 200  # not for long enough yet
        later = time.monotonic() + 120
        runtime.clock = lambda: later
        unhealthy = await client.get("/health")
        assert unhealthy.status_code == 503 and unhealthy.json()["error"]["code"] == "unhealthy"
        assert "the warm-up has failed for 12" in unhealthy.json()["error"]["message"]
        assert "out of memory" in unhealthy.json()["error"]["message"]

        broken = False  # the fault is gone: the next retry warms the model
        await _until(client, "/ready", 200)
        assert (await client.get("/health")).status_code == 200
        runtime.clock = time.monotonic
        body = {"documents": [{"html": page(2)}]}
        assert (await client.post("/v1/embed", json=body)).status_code == 200


async def test_while_a_pass_is_stalled_every_answer_closes_its_connection(
    settings_for: SettingsFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Clients already connected to a pod /ready took out of rotation kept sending there, each request
    a 504 behind the stalled pass, for up to the connection's max age (300 s). While /ready says the
    pass has stalled every answer closes its connection, and no answer does once passes end."""
    app = create_app(settings_for(request_timeout_s=30))
    async with serving(app) as client:
        await _until(client, "/ready", 200)
        runtime: Runtime = app.state.runtime
        async with _wedged_pass(client, runtime, monkeypatch) as started:
            runtime.clock = lambda: started + 29.9  # slow, not stalled: connections stay
            assert "connection" not in (await client.get("/health")).headers
            runtime.clock = lambda: started + 30.0
            for path in ("/health", "/info"):
                answer = await client.get(path)
                assert answer.status_code == 200 and answer.headers["connection"] == "close", path
        await _until(client, "/ready", 200)
        assert "connection" not in (await client.get("/health")).headers


async def test_a_stalled_pass_is_logged_once_when_ready_turns_503_and_once_when_it_ends(
    settings_for: SettingsFactory, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The kubelet's event for a failed readiness probe has no body: a pod that left rotation for a
    stalled pass said nothing about it in its logs. One warning per episode, not one per probe."""
    caplog.set_level(logging.INFO, logger="service.api.runtime")
    app = create_app(settings_for(request_timeout_s=30))
    async with serving(app) as client:
        await _until(client, "/ready", 200)
        runtime: Runtime = app.state.runtime
        async with _wedged_pass(client, runtime, monkeypatch) as started:
            runtime.clock = lambda: started + 30.0
            for _ in range(3):
                assert (await client.get("/ready")).status_code == 503
            runtime.clock = lambda: started + 45.0
            assert (await client.get("/ready")).status_code == 503
        await _until(client, "/ready", 200)
        assert (await client.get("/ready")).status_code == 200
    logged = [(r.levelno, r.getMessage()) for r in caplog.records if "stalled" in r.getMessage()]
    assert [level for level, _ in logged] == [logging.WARNING, logging.INFO], logged
    assert "a forward pass has run for 30 s (the limit is 30 s)" in logged[0][1]


async def test_health_starts_no_probe_pass_while_the_warm_up_is_retrying(
    settings_for: SettingsFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Failed warm-ups count as failed passes, so /health (the liveness probe) started three-token
    probe passes between the warm-up's retries, and logged "backend probe succeeded" for a pod that
    was not ready. The warm-up loop exercises the backend already; /health reports its failures."""
    monkeypatch.setattr(app_module, "WARMUP_RETRY_FIRST_S", 0.001, raising=False)
    monkeypatch.setattr(app_module, "WARMUP_RETRY_MAX_S", 0.01, raising=False)
    monkeypatch.setattr(runtime_module, "PROBE_INTERVAL_S", 0.0)
    settings: Settings = settings_for(unready_after_failures=2, unhealthy_after_s=120)
    engine = load_engine(settings)
    probes = 0
    probe = engine.probe

    async def counted_probe() -> None:
        nonlocal probes
        probes += 1
        await probe()

    def broken(prepared: object) -> object:
        raise RuntimeError("CUDA error: an illegal memory access was encountered (simulated)")

    monkeypatch.setattr(engine, "probe", counted_probe)
    monkeypatch.setattr(engine._runner, "run", broken)
    app = create_app(settings, engine)
    runtime: Runtime = app.state.runtime
    async with serving(app) as client:
        for _ in range(2000):
            if runtime.warmup_attempts >= 3 and engine.health.failures >= 2:
                break
            await asyncio.sleep(0.005)
        else:
            raise AssertionError("the warm-up did not fail twice")
        for _ in range(3):
            assert (await client.get("/health")).status_code == 200
            await asyncio.sleep(0)
        later = time.monotonic() + 120
        runtime.clock = lambda: later
        unhealthy = await client.get("/health")
        assert unhealthy.status_code == 503 and "the warm-up has failed for" in unhealthy.text
        await asyncio.sleep(0)
        assert probes == 0


async def test_the_warm_up_stops_retrying_once_shutdown_begins(
    settings_for: SettingsFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After SIGTERM uvicorn drains its connections before the lifespan cancels the warm-up: a retry
    started then ran a full-size pass on the inference thread the drain needs."""
    monkeypatch.setattr(app_module, "WARMUP_RETRY_FIRST_S", 0.0, raising=False)
    runtime = Runtime(settings=settings_for(), metrics=ServiceMetrics())
    attempts = 0

    class FailingEngine:
        async def warmup(self) -> None:
            nonlocal attempts
            attempts += 1
            if attempts == 1:
                runtime.begin_shutdown()  # SIGTERM while the first attempt runs
            if attempts < 5:
                raise RuntimeError("CUDA error: transient (simulated)")
            raise ShuttingDownError("the engine stopped")  # ends the loop of a warm-up that kept going

    engine: Any = FailingEngine()
    await app_module._warm_up(runtime, engine)
    assert attempts == 1 and not runtime.ready


def test_ready_and_the_connection_rule_refuse_for_the_same_reasons_before_the_backend_counts(
    settings_for: SettingsFactory,
) -> None:
    """Not warmed yet, or shutting down: `not_serving` is /ready's answer, and `unready_reason` (which
    closes every connection meanwhile) says the same; both held the two conditions apart before."""
    runtime = Runtime(settings=settings_for(), metrics=ServiceMetrics())
    refused = runtime.not_serving()
    assert refused is not None and refused.code is ErrorCode.NOT_READY
    assert runtime.unready_reason() == refused.message == "the model is not ready"
    runtime.warmup_failed("CUDA error: out of memory (simulated)")
    refused = runtime.not_serving()
    assert refused is not None and "warm-up failed: CUDA error: out of memory" in refused.message
    assert runtime.unready_reason() == refused.message
    runtime.stopping = True
    refused = runtime.not_serving()
    assert refused is not None and refused.code is ErrorCode.SHUTTING_DOWN
    assert runtime.unready_reason() == refused.message
