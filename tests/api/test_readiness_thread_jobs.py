"""With `preprocess_pool="process"`, what still runs on a preprocessing thread (a /tokenize listing, the
result cache's key hash) is judged as a job on a thread is with threads (`Phase.THREAD`): held to
`HTMLLM_UNREADY_AFTER_PASS_S` and named as a thread that cannot be stopped, while a page's try on a
process keeps its own rule (its time limit, the kill and the reaping).

Counted with the tries on processes, such a job had been held to a process's time limit and named as a
stuck process pool: the knob did not bound it (0 did not turn it off), and /ready named the wrong cause.
The processes and threads are real, each held job waits on an event (the try on a process is stopped);
ages are moved on through `Runtime.clock`.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import threading
import time
from typing import Any

import httpx
import pytest

from service.api.app import create_app
from service.api.preprocessing_readiness import PROCESS_KILL_GRACE_S
from service.api.runtime import Runtime
from service.core.tokenizer import HtmlTokenizer, OffsetEncoding
from service.engine.result_cache import cache_key
from service.engine.types import Document
from tests.api.conftest import SettingsFactory, serving
from tests.api.pages import page
from tests.factories.waiting import ready_until, until_async
from tests.factories.worker_jobs import stop_self

HOLD_S = 60.0  # far past what the test needs: only keeps a broken test from hanging
THREAD_STUCK = "a preprocessing thread has run one job for "
PROCESS_STUCK = "a page's try on a preprocessing process has run for "

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="forkserver: Linux only")


def _at(runtime: Runtime, later_s: float) -> None:
    """Move the runtime's clock `later_s` on from now."""
    moved = time.monotonic() + later_s
    runtime.clock = lambda: moved


def _hold_listing(tokenizer: HtmlTokenizer, monkeypatch: pytest.MonkeyPatch) -> tuple[threading.Event, ...]:
    """Hold each token listing (its tokenizer's offsets, read on a preprocessing thread in either pool) until
    the second event; the first says one is held."""
    started, release = threading.Event(), threading.Event()
    real = tokenizer.encode_with_offsets

    def held(text: str, *, max_length: int) -> OffsetEncoding:
        started.set()
        release.wait(HOLD_S)
        return real(text, max_length=max_length)

    monkeypatch.setattr(tokenizer, "encode_with_offsets", held)
    return started, release


def _hold_cache_key(monkeypatch: pytest.MonkeyPatch) -> tuple[threading.Event, ...]:
    """Hold each page's result cache key (hashed on a preprocessing thread) until the second event; the
    first says one is held."""
    started, release = threading.Event(), threading.Event()

    def held(doc: Document, truncate: bool) -> bytes:
        started.set()
        release.wait(HOLD_S)
        return cache_key(doc, truncate)

    monkeypatch.setattr("service.engine.engine.cache_key", held)  # where the engine calls it
    return started, release


async def _stuck_message(client: httpx.AsyncClient) -> str:
    ready = await client.get("/ready")
    assert ready.status_code == 503, ready.text
    assert ready.json()["error"]["code"] == "not_ready"
    message: str = ready.json()["error"]["message"]
    return message


@pytest.mark.parametrize("pool", [pytest.param("thread"), pytest.param("process", marks=linux_only)])
async def test_a_listing_stuck_on_its_thread_is_held_to_the_pass_knob_in_either_pool(
    settings_for: SettingsFactory, monkeypatch: pytest.MonkeyPatch, pool: str
) -> None:
    settings = settings_for(preprocess_pool=pool, preprocess_workers=1, unready_after_pass_s=5)
    app = create_app(settings)
    runtime: Runtime = app.state.runtime
    async with serving(app) as client:
        await ready_until(client, 200, "after the warm-up")
        assert runtime.engine is not None
        started, release = _hold_listing(runtime.engine.tokenizer, monkeypatch)
        listing: asyncio.Task[Any] = asyncio.ensure_future(client.post("/tokenize", json={"inputs": page(1)}))
        try:
            assert await asyncio.to_thread(started.wait, HOLD_S)
            _at(runtime, 4)
            assert (await client.get("/ready")).status_code == 200  # within the knob
            _at(runtime, 6)  # past the knob, well within a process's time limit and the kill
            message = await _stuck_message(client)
            assert THREAD_STUCK in message and PROCESS_STUCK not in message
            assert "(the limit is 5 s, HTMLLM_UNREADY_AFTER_PASS_S" in message
            assert "a thread cannot be stopped" in message
        finally:
            runtime.clock = time.monotonic
            release.set()
            answered = await listing
        assert answered.status_code == 200, answered.text
        assert (await client.get("/ready")).status_code == 200


@linux_only
async def test_with_processes_a_cache_hash_stuck_on_its_thread_follows_the_thread_rules_off_knob_and_health(
    settings_for: SettingsFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`HTMLLM_UNREADY_AFTER_PASS_S=0` leaves /ready alone for a job on a thread, with processes too (it
    had been held to a process's time limit and the kill); one that has run `HTMLLM_UNHEALTHY_AFTER_S`
    asks for a restart, named as the thread it is."""
    settings = settings_for(
        preprocess_pool="process",
        preprocess_workers=1,
        result_cache_documents=8,
        request_timeout_s=30,
        unready_after_pass_s=0,
        unhealthy_after_s=300,
    )
    app = create_app(settings)
    runtime: Runtime = app.state.runtime
    async with serving(app) as client:
        await ready_until(client, 200, "after the warm-up")
        started, release = _hold_cache_key(monkeypatch)
        request: asyncio.Task[Any] = asyncio.ensure_future(
            client.post("/v1/embed", json={"documents": [{"html": page(1)}]})
        )
        try:
            assert await asyncio.to_thread(started.wait, HOLD_S)
            _at(runtime, settings.request_timeout_s + PROCESS_KILL_GRACE_S + 1)  # past a process's rule
            ready = await client.get("/ready")
            assert ready.status_code == 200, ready.text
            assert runtime.unready_reason() is None

            _at(runtime, settings.unhealthy_after_s)
            health = await client.get("/health")
            assert health.status_code == 503, health.text
            message = health.json()["error"]["message"]
            assert THREAD_STUCK in message and PROCESS_STUCK not in message
            assert "the limit is 300 s, HTMLLM_UNHEALTHY_AFTER_S" in message
        finally:
            runtime.clock = time.monotonic
            release.set()
            answered = await request
        assert answered.status_code == 200, answered.text
        assert (await client.get("/health")).status_code == 200


@linux_only
async def test_with_processes_a_thread_job_and_a_try_on_a_process_are_each_held_to_their_own_rule(
    settings_for: SettingsFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both at once, the listing older: it turns /ready 503 at the pass knob, named as a thread; once it
    ends, the try on its process is not held to the knob but to its time limit and the kill."""
    settings = settings_for(
        preprocess_pool="process", preprocess_workers=1, request_timeout_s=30, unready_after_pass_s=5
    )
    app = create_app(settings)
    runtime: Runtime = app.state.runtime
    async with serving(app) as client:
        await ready_until(client, 200, "after the warm-up")
        engine = runtime.engine
        assert engine is not None
        processes = engine._preprocessing._processes
        assert processes is not None
        started, release = _hold_listing(engine.tokenizer, monkeypatch)
        listing: asyncio.Task[Any] = asyncio.ensure_future(client.post("/tokenize", json={"inputs": page(1)}))
        held = None
        pid = None
        try:
            assert await asyncio.to_thread(started.wait, HOLD_S)  # its page was pruned on the process
            held = asyncio.ensure_future(engine._preprocessing._in_process(stop_self))  # stopped mid-page
            await until_async(lambda: processes._busy, "a try runs on the process")
            (worker,) = processes._busy
            pid = worker.pid

            _at(runtime, 6)
            message = await _stuck_message(client)
            assert THREAD_STUCK in message and "(the limit is 5 s, HTMLLM_UNREADY_AFTER_PASS_S" in message

            release.set()
            answered = await listing
            assert answered.status_code == 200, answered.text
            assert (await client.get("/ready")).status_code == 200  # the try is not held to the knob
            _at(runtime, settings.request_timeout_s + PROCESS_KILL_GRACE_S + 1)
            message = await _stuck_message(client)
            assert PROCESS_STUCK in message and THREAD_STUCK not in message
            assert "(the limit is 40 s: its time limit, the kill and the reaping)" in message
        finally:
            runtime.clock = time.monotonic
            release.set()
            if pid is not None:
                os.kill(pid, signal.SIGCONT)  # the page goes on, and its try ends
            if not listing.done():
                await listing
        assert held is not None and await held == pid
        assert (await client.get("/ready")).status_code == 200
