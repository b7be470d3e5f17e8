"""A probe's 503 is its outcome (`htmllm_ready`), not a request failure.

The kubelet asks /ready every few seconds through each warm-up and drain: its 503s had been counted in
`htmllm_request_failures_total{code="not_ready"}` (and `shutting_down`), so an alert on that rate fired
at every rollout, and a client the server refused could not be told from the probes. The model routes'
refusals still count.
"""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from service.api import app as app_module
from service.api.app import create_app, load_engine
from service.api.runtime import Runtime
from service.engine.runners import PreparedBatch
from tests.api.conftest import SettingsFactory, serving
from tests.api.pages import page


async def _samples(client: httpx.AsyncClient) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of the app's /metrics, by name and sorted labels."""
    text = (await client.get("/metrics")).text
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def _failures(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], code: str) -> float | None:
    return samples.get(("htmllm_request_failures_total", (("code", code),)))


def _ready_probes(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], status: str) -> float:
    labels = (("method", "GET"), ("route", "/ready"), ("status", status))
    return samples.get(("htmllm_requests_total", labels), 0.0)


async def test_probe_503s_are_not_request_failures_and_a_model_routes_refusal_still_is(
    settings_for: SettingsFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(app_module, "WARMUP_RETRY_FIRST_S", 0.001)
    monkeypatch.setattr(app_module, "WARMUP_RETRY_MAX_S", 0.01)
    settings = settings_for(unhealthy_after_s=120)
    engine = load_engine(settings)
    working = engine._runner.run

    def full_batches_fail(prepared: PreparedBatch) -> object:
        """The warm-up's full-size batch fails (a start-up that stays unready); small passes work."""
        if prepared.tokens > 3:
            raise RuntimeError("CUDA out of memory (simulated)")
        return working(prepared)

    monkeypatch.setattr(engine._runner, "run", full_batches_fail)
    app = create_app(settings, engine)
    runtime: Runtime = app.state.runtime
    async with serving(app) as client:
        probes = 0
        while runtime.warmup_attempts < 3:  # the kubelet's readiness probe through a failing start
            answer = await client.get("/ready")
            assert answer.status_code == 503 and answer.json()["error"]["code"] == "not_ready"
            assert answer.headers["retry-after"] == str(settings.retry_after_s)  # as any 503 carries
            probes += 1
            await asyncio.sleep(0.005)
        later = time.monotonic() + 120
        runtime.clock = lambda: later  # the warm-up has failed for long enough: /health turns 503
        unhealthy = await client.get("/health")
        assert unhealthy.status_code == 503 and unhealthy.json()["error"]["code"] == "unhealthy"
        assert "retry-after" not in unhealthy.headers  # a restart cures it, not a wait
        assert (await client.head("/ready")).status_code == 503
        warming = await _samples(client)

        runtime.stopping = True  # shutdown began
        drained = await client.get("/ready")
        assert drained.status_code == 503 and drained.json()["error"]["code"] == "shutting_down"
        refused = await client.post("/v1/embed", json={"documents": [{"html": page(1)}]})
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "shutting_down"
        draining = await _samples(client)

    assert _failures(warming, "not_ready") == 0.0
    assert _failures(warming, "unhealthy") is None  # only a probe answers it: no series that never moves
    assert _ready_probes(warming, "503") == probes  # the probes are still requests, by route and status
    assert warming[("htmllm_ready", ())] == 0.0  # and their outcome is the readiness gauge
    assert _failures(draining, "shutting_down") == 1.0  # the client's request, not the probe's
