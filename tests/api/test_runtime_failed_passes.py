"""What the server says of a backend whose passes failed, and of one that refuses every pass.

A failed pass with the model in this process stayed counted on an idle pod until traffic came:
`htmllm_backend_consecutive_failures` at 1 (the alert `> 0 for 2m` paging on a healthy pod), and /ready's
count, which the next failure, days later, added to. Now, once no pass has run for `PROBE_INTERVAL_S`
since the latest failure, /ready and the /metrics scrape start a check pass, whose success ends the run
(kept aside for a failure before the next success to resume, as a model process started anew ends it).

A backend that refuses every pass (the model's process not started again on a checkpoint changed under
the server, `CheckpointChangedError`) answered each request 500 `backend_failed`; nothing is wrong with
the request and the pod waits for its restart, so it is 503 `not_ready` with Retry-After.

The backend is the real tiny model in process, made to fail on demand; the clock that ages the failures
is `Runtime.clock`, moved on instead of waited for.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable

import httpx
import pytest

from service.api import runtime as runtime_module
from service.api.app import create_app, load_engine
from service.api.runtime import Runtime
from service.engine.runners import PreparedBatch, RunnerOutput
from service.engine.runners.process import CheckpointChangedError
from tests.api.conftest import SettingsFactory, serving
from tests.api.pages import page
from tests.factories.waiting import ready_until, until_async

BODY = {"documents": [{"html": page(1)}]}
POLLS = 2000  # event-loop turns 5 ms apart: far more than a three-token pass needs


class _Backend:
    """The engine's runner's `run`, made to fail (`fail`) or refuse (`refuse`) on demand."""

    def __init__(self, working: Callable[[PreparedBatch], RunnerOutput]) -> None:
        self.working = working
        self.fail = False
        self.refuse = False

    def run(self, prepared: PreparedBatch) -> RunnerOutput:
        if self.refuse:
            raise CheckpointChangedError(
                "the checkpoint /models/x changed since the engine started (other weights); the inference "
                "process was not restarted on it: restart the server to serve the new model"
            )
        if self.fail:
            raise RuntimeError("CUDA error: an illegal memory access was encountered (simulated)")
        return self.working(prepared)


def _app(settings_for: SettingsFactory, monkeypatch: pytest.MonkeyPatch) -> tuple[object, _Backend]:
    settings = settings_for()
    engine = load_engine(settings)
    backend = _Backend(engine._runner.run)
    monkeypatch.setattr(engine._runner, "run", backend.run)
    return create_app(settings, engine), backend


def _gauge(metrics: str) -> float:
    found = re.search(r"^htmllm_backend_consecutive_failures (\S+)$", metrics, re.MULTILINE)
    assert found is not None, metrics
    return float(found.group(1))


async def _failed_request(client: httpx.AsyncClient, backend: _Backend) -> None:
    backend.fail = True
    try:
        failed = await client.post("/v1/embed", json=BODY)
    finally:
        backend.fail = False
    assert failed.status_code == 500 and failed.json()["error"]["code"] == "backend_failed", failed.text


async def test_a_failed_pass_on_an_idle_pod_is_checked_and_stops_counting(
    settings_for: SettingsFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    app, backend = _app(settings_for, monkeypatch)
    runtime: Runtime = app.state.runtime  # type: ignore[attr-defined]
    async with serving(app) as client:
        await ready_until(client, 200, "after the warm-up")
        engine = runtime.engine
        assert engine is not None
        await _failed_request(client, backend)
        assert engine.health.failures == 1 and _gauge((await client.get("/metrics")).text) == 1

        # Within PROBE_INTERVAL_S of the failure the traffic decides: no check yet.
        assert (await client.get("/ready")).status_code == 200
        assert runtime._probe.task is None and engine.health.failures == 1

        later = time.monotonic() + runtime_module.PROBE_INTERVAL_S
        runtime.clock = lambda: later  # the pod stays idle: no request comes
        assert (await client.get("/ready")).status_code == 200  # starts the check
        await until_async(lambda: engine.health.failures == 0, "the check ended the run", polls=POLLS)
        assert _gauge((await client.get("/metrics")).text) == 0

        # Kept aside: a failure before a pass of ours succeeds resumes the run.
        runtime.clock = time.monotonic
        await _failed_request(client, backend)
        assert engine.health.failures == 2
        # The scrape alone checks too (a pod without a readiness probe, its alert read from the gauge).
        runtime._probe.started_at = None  # the check above was moments ago: let the next one start at once
        later = time.monotonic() + runtime_module.PROBE_INTERVAL_S
        runtime.clock = lambda: later
        await client.get("/metrics")
        await until_async(lambda: engine.health.failures == 0, "the scrape's check", polls=POLLS)
        assert _gauge((await client.get("/metrics")).text) == 0
        runtime.clock = time.monotonic
        assert (await client.post("/v1/embed", json=BODY)).status_code == 200


async def test_an_idle_pod_whose_backend_broke_goes_unready_on_its_checks(
    settings_for: SettingsFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One failure, then no traffic: the checks fail and count, up to /ready's threshold (3)."""
    monkeypatch.setattr(runtime_module, "PROBE_INTERVAL_S", 0.0)
    app, backend = _app(settings_for, monkeypatch)
    runtime: Runtime = app.state.runtime  # type: ignore[attr-defined]
    async with serving(app) as client:
        await ready_until(client, 200, "after the warm-up")
        assert runtime.engine is not None
        await _failed_request(client, backend)
        backend.fail = True
        not_ready = await ready_until(client, 503, "the checks failed")
        assert "the last 3 forward passes failed" in not_ready.json()["error"]["message"]
        backend.fail = False
        await ready_until(client, 200, "a probe passed")


async def test_a_backend_that_refuses_every_pass_answers_a_retryable_503(
    settings_for: SettingsFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    app, backend = _app(settings_for, monkeypatch)
    runtime: Runtime = app.state.runtime  # type: ignore[attr-defined]
    async with serving(app) as client:
        await ready_until(client, 200, "after the warm-up")
        backend.refuse = True
        for _ in range(4):  # past /ready's threshold, had they counted as failed passes
            refused = await client.post("/v1/embed", json=BODY)
            assert refused.status_code == 503, refused.text
            error = refused.json()["error"]
            assert error["code"] == "not_ready" and "restart the server" in error["message"]
            assert refused.headers["retry-after"] == str(runtime.settings.retry_after_s)
        assert runtime.engine is not None and runtime.engine.health.failures == 0
        metrics = (await client.get("/metrics")).text
        assert _gauge(metrics) == 0
        assert 'htmllm_request_failures_total{code="not_ready"} 4.0' in metrics
        assert 'htmllm_request_failures_total{code="backend_failed"} 0.0' in metrics
        backend.refuse = False
        assert (await client.post("/v1/embed", json=BODY)).status_code == 200
