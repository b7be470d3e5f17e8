"""What /ready and /health say of the preprocessing pools (`PreprocessingReadiness`) beyond what
tests/api/test_runtime_preprocessing_start.py covers.

Refusals count once per try, not per page: one request of many pages, refused during a blip of the
forkserver, had turned /ready 503 on its own (each page counted towards `HTMLLM_UNREADY_AFTER_FAILURES`).
A job stuck on a preprocessing thread (an endless loop in C code, held here on an event) had left
/ready and /health 200 while every page behind it waited until its request timed out.

The processes and threads are real; ages are moved on through `Runtime.clock`.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from service.api import runtime as runtime_module
from service.api.app import create_app
from service.api.code_stamp import CodeStamp
from service.api.runtime import Runtime
from service.core.preparation import Prepared
from service.engine.types import Document
from tests.api.conftest import SettingsFactory, serving
from tests.api.pages import page
from tests.factories.waiting import ready_until

HELD_MARK = "held-on-its-thread"
HOLD_S = 60.0  # far past what the test needs: only keeps a broken test from hanging


def _no_process_starts(runtime: Runtime) -> None:
    """Kill the one preprocessing process and make every new one die while it starts."""
    assert runtime.engine is not None
    processes = runtime.engine._preprocessing._processes
    assert processes is not None
    (worker,) = processes._idle
    worker.process.kill()
    worker.process.join()
    preload, limit, initializer, _ = processes._worker_args
    processes._worker_args = (preload, limit, initializer, ("{not a tokenizer",))


async def _refused(client: httpx.AsyncClient, *seeds: int) -> None:
    refused = await client.post("/v1/embed", json={"documents": [{"html": page(seed)} for seed in seeds]})
    assert refused.status_code == 503, refused.text
    assert "a preprocessing process could not start" in refused.json()["error"]["message"]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="forkserver: Linux only")
async def test_pages_refused_together_count_once_towards_unready(
    settings_for: SettingsFactory, tmp_path: Path
) -> None:
    app = create_app(settings_for(preprocess_pool="process", preprocess_workers=1))
    runtime: Runtime = app.state.runtime
    (tmp_path / "code.py").write_text("A = 1\n", encoding="utf-8")
    runtime.code = CodeStamp(tmp_path)  # unchanged: a fault that may pass
    async with serving(app) as client:
        await ready_until(client, 200, "after the warm-up")
        _no_process_starts(runtime)
        assert runtime.engine is not None
        _at(runtime, 0)  # held still: no check probe (`start_check_due`) adds a try of its own

        # One request's eight pages, each refused in one blip (`report`: none is given up on the first).
        reported = await client.post(
            "/v1/embed", json={"documents": [{"html": page(seed)} for seed in range(8)], "on_error": "report"}
        )
        errors = [entry["error"] for entry in reported.json()["data"]]
        assert [error["code"] for error in errors] == ["not_ready"] * 8, reported.text
        assert runtime.engine.preprocessing_health.start_failures == 1
        ready = await client.get("/ready")
        assert ready.status_code == 200, ready.text  # one try failed: traffic decides

        await _refused(client, 8)
        assert (await client.get("/ready")).status_code == 200
        await _refused(client, 9, 10)  # the third try in a row: it lasts
        ready = await client.get("/ready")
        assert ready.status_code == 503, ready.text
        message = ready.json()["error"]["message"]
        assert "no preprocessing process could start for the last 3 tries" in message
        assert "died while starting" in message and "WorkerStartError" not in message  # no class name


def _hold_on_the_thread(runtime: Runtime, monkeypatch: pytest.MonkeyPatch) -> tuple[threading.Event, ...]:
    """Hold the page marked HELD_MARK on its preprocessing thread (a parse stuck in C code) until the
    second event; the first says it is held."""
    assert runtime.engine is not None
    preprocessing = runtime.engine._preprocessing
    started, release = threading.Event(), threading.Event()
    real = preprocessing._prepare

    def prepare(doc: Document, truncate: bool) -> Prepared:
        if isinstance(doc.html, str) and HELD_MARK in doc.html:
            started.set()
            release.wait(HOLD_S)
        return real(doc, truncate)

    monkeypatch.setattr(preprocessing, "_prepare", prepare)
    return started, release


def _at(runtime: Runtime, later_s: float) -> None:
    """Move the runtime's clock `later_s` on from now."""
    moved = time.monotonic() + later_s
    runtime.clock = lambda: moved


async def test_a_job_stuck_on_a_preprocessing_thread_turns_ready_and_then_health_503(
    settings_for: SettingsFactory, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    settings = settings_for(preprocess_pool="thread", preprocess_workers=1, unhealthy_after_s=300)
    app = create_app(settings)
    runtime: Runtime = app.state.runtime
    caplog.set_level(logging.INFO, logger="service.api.runtime")
    async with serving(app) as client:
        await ready_until(client, 200, "after the warm-up")
        started, release = _hold_on_the_thread(runtime, monkeypatch)
        held = page(1).replace("<p", f"<p>{HELD_MARK}</p><p", 1)
        request: asyncio.Task[Any] = asyncio.ensure_future(
            client.post("/v1/embed", json={"documents": [{"html": held}]})
        )
        try:
            assert await asyncio.to_thread(started.wait, HOLD_S)
            assert (await client.get("/ready")).status_code == 200  # a slow page, for all anyone knows

            _at(runtime, settings.request_timeout_s + 1)  # past its request's timeout: it serves no one
            for _ in range(2):  # each probe says it; the log says it once
                ready = await client.get("/ready")
                assert ready.status_code == 503 and ready.json()["error"]["code"] == "not_ready"
                assert "a preprocessing thread has run one job for 31 s" in ready.json()["error"]["message"]
            assert runtime.unready_reason() is not None  # what the connections and the gauge read
            said = [r for r in caplog.records if "a preprocessing job is stuck" in r.getMessage()]
            assert len(said) == 1 and said[0].levelno == logging.WARNING, said
            assert (await client.get("/health")).status_code == 200  # not for long enough yet

            _at(runtime, settings.unhealthy_after_s)  # a thread cannot be stopped: a restart frees it
            for _ in range(2):  # each probe says it; the log says it once, with the reason
                health = await client.get("/health")
                assert health.status_code == 503 and health.json()["error"]["code"] == "unhealthy"
                assert "a preprocessing thread has run one job for 300 s" in health.json()["error"]["message"]
            needed = [r for r in caplog.records if "a restart is needed" in r.getMessage()]
            assert len(needed) == 1 and needed[0].levelno == logging.ERROR, needed
            assert "a preprocessing thread has run one job" in needed[0].getMessage()
        finally:
            runtime.clock = time.monotonic
            release.set()
            answered = await request
        assert answered.status_code == 200, answered.text  # it was only held
        assert (await client.get("/ready")).status_code == 200
        assert (await client.get("/health")).status_code == 200
        assert any("no preprocessing job is stuck any more" in r.getMessage() for r in caplog.records)
        assert any("/health answers 200 again" in r.getMessage() for r in caplog.records)


async def _held_page(client: httpx.AsyncClient) -> asyncio.Task[Any]:
    held = page(1).replace("<p", f"<p>{HELD_MARK}</p><p", 1)
    return asyncio.ensure_future(client.post("/v1/embed", json={"documents": [{"html": held}]}))


async def test_a_slow_page_on_a_thread_is_held_to_the_pass_knob_not_the_request_timeout(
    settings_for: SettingsFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Big pages on few CPUs take longer than a short request timeout, legitimately: fixed at the request
    timeout, four 9.5 MB pages on a 2 s timeout had turned /ready 503 (and closed every connection). The
    operator raises `HTMLLM_UNREADY_AFTER_PASS_S`, the knob forward passes are held to."""
    settings = settings_for(preprocess_pool="thread", preprocess_workers=1, unready_after_pass_s=100)
    app = create_app(settings)
    runtime: Runtime = app.state.runtime
    async with serving(app) as client:
        await ready_until(client, 200, "after the warm-up")
        started, release = _hold_on_the_thread(runtime, monkeypatch)
        request = await _held_page(client)
        try:
            assert await asyncio.to_thread(started.wait, HOLD_S)
            _at(runtime, settings.request_timeout_s + 1)  # past the request timeout, within the knob
            assert (await client.get("/ready")).status_code == 200
            assert runtime.unready_reason() is None
            _at(runtime, 101)
            ready = await client.get("/ready")
            assert ready.status_code == 503, ready.text
            assert "the limit is 100 s, HTMLLM_UNREADY_AFTER_PASS_S" in ready.json()["error"]["message"]
        finally:
            runtime.clock = time.monotonic
            release.set()
            await request


async def test_with_the_pass_knob_off_a_stuck_thread_leaves_ready_alone_and_health_still_restarts(
    settings_for: SettingsFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`HTMLLM_UNREADY_AFTER_PASS_S=0`: /ready never turns 503 for a long job; a job that has run
    `HTMLLM_UNHEALTHY_AFTER_S` still asks for a restart, as a forward pass that long does."""
    settings = settings_for(
        preprocess_pool="thread", preprocess_workers=1, unready_after_pass_s=0, unhealthy_after_s=300
    )
    app = create_app(settings)
    runtime: Runtime = app.state.runtime
    async with serving(app) as client:
        await ready_until(client, 200, "after the warm-up")
        started, release = _hold_on_the_thread(runtime, monkeypatch)
        request = await _held_page(client)
        try:
            assert await asyncio.to_thread(started.wait, HOLD_S)
            _at(runtime, 299)
            assert (await client.get("/ready")).status_code == 200
            assert (await client.get("/health")).status_code == 200
            _at(runtime, 300)
            assert (await client.get("/ready")).status_code == 200
            health = await client.get("/health")
            assert health.status_code == 503, health.text
            assert "the limit is 300 s, HTMLLM_UNHEALTHY_AFTER_S" in health.json()["error"]["message"]
        finally:
            runtime.clock = time.monotonic
            release.set()
            await request


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="forkserver: Linux only")
async def test_a_refusal_below_the_threshold_is_checked_by_a_probe_page_that_ends_it(
    settings_for: SettingsFactory, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """With no traffic after it, a refusal had stayed counted until a page got a process: blips days apart
    added up to "tries in a row". Once the run has lasted the probes' interval, /ready sends a probe page
    (as the backend's check pass): refused, it counts; preprocessed, it ends the run. A probe refused
    again and again is one warning a minute, not one per probe."""
    monkeypatch.setattr(runtime_module, "PROBE_INTERVAL_S", 0.0)
    caplog.set_level(logging.DEBUG, logger="service.api.runtime")
    app = create_app(settings_for(preprocess_pool="process", preprocess_workers=1))
    runtime: Runtime = app.state.runtime
    async with serving(app) as client:
        await ready_until(client, 200, "after the warm-up")
        assert runtime.engine is not None
        processes = runtime.engine._preprocessing._processes
        assert processes is not None
        working = processes._worker_args
        _no_process_starts(runtime)
        await _refused(client, 1)
        for count in (2, 3, 4):  # each check refused: the idle pod goes unready, and stays so
            await client.get("/ready")
            probe = runtime._pool_probe.task
            assert probe is not None, "no check probe was started"
            await probe
            assert runtime.engine.preprocessing_health.start_failures == count
        failed = [r for r in caplog.records if "preprocessing probe failed" in r.getMessage()]
        assert [r.levelno for r in failed] == [logging.WARNING, logging.DEBUG, logging.DEBUG], failed
        assert (await client.get("/ready")).status_code == 503

        processes._worker_args = working  # the fault passed: the next probe page gets a process
        await ready_until(client, 200, "a probe page was preprocessed")
        assert runtime.engine.preprocessing_health.start_failures == 0

        _no_process_starts(runtime)
        await _refused(client, 2)  # one blip, then nothing
        processes._worker_args = working
        assert (await client.get("/ready")).status_code == 200
        probe = runtime._pool_probe.task
        assert probe is not None
        await probe
        assert runtime.engine.preprocessing_health.start_failures == 0  # the check ended the run
