"""The end of the drain budget answers every request still waiting with a typed error, including those
whose pages are still being preprocessed behind a forward pass that outlasts the budget: the engine's
stop fails such pages at once (it had failed them only once past that pass), and should anything still
hold a request (`PendingAnswers`), the runtime answers it 503 itself. uvicorn's graceful timeout had
cancelled such a request: a bare plain-text 500."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx

from service.api.app import create_app, load_engine
from service.api.runtime import Runtime
from service.engine import Document, Engine
from service.engine.runners import PreparedBatch, RunnerOutput
from tests.api.conftest import SettingsFactory, serving
from tests.api.pages import page

# How long a pass or a page is held at most, so that a regression fails instead of hanging: never a timing.
HOLD_BOUND_S = 15


async def _until(condition: threading.Event, *pending: asyncio.Task[httpx.Response]) -> None:
    """Wait for `condition`, failing at once should a request end first (with what it answered)."""
    for _ in range(HOLD_BOUND_S * 100):
        if condition.is_set():
            return
        for task in pending:
            assert not task.done(), task.result().text
        await asyncio.sleep(0.01)
    raise AssertionError("the server never reached the state the test holds it in")


@dataclass
class Held:
    """A server with 3 documents in flight: `a` in a forward pass held until `release`, `b` held on the
    one preprocessing thread, `c` queued for that thread; `reported` (`a`, `b`, `on_error: report`) and
    `whole` (`c`, all-or-nothing) are their requests. `expired`: a hold ran out (a request waited for it)."""

    engine: Engine
    runtime: Runtime
    reported: asyncio.Task[httpx.Response]
    whole: asyncio.Task[httpx.Response]
    release: threading.Event
    expired: threading.Event
    pass_over: threading.Event = field(default_factory=threading.Event)


@asynccontextmanager
async def _held_server(settings_for: SettingsFactory, *, drain_timeout_s: float) -> AsyncIterator[Held]:
    settings = settings_for(
        warmup=False,
        drain_timeout_s=drain_timeout_s,
        max_batch_requests=1,
        max_wait_ms=0,
        request_timeout_s=60,
    )
    engine = load_engine(settings)
    run, prepare = engine._runner.run, engine._preprocessing._prepare
    in_pass, pass_over, in_prune, release, expired = (threading.Event() for _ in range(5))

    def hold() -> None:
        if not release.wait(HOLD_BOUND_S):
            expired.set()  # the request was not answered while the pass and the page were held

    def held_run(prepared: PreparedBatch) -> RunnerOutput:
        in_pass.set()
        hold()
        try:
            return run(prepared)
        finally:
            pass_over.set()

    def held_prepare(doc: Document, truncate: bool) -> Any:
        if doc.id == "b":
            in_prune.set()
            hold()
        return prepare(doc, truncate)

    engine._runner.run = held_run  # type: ignore[method-assign]
    engine._preprocessing._prepare = held_prepare  # type: ignore[method-assign]
    app = create_app(settings, engine)
    try:
        async with serving(app) as client:
            report = {"documents": [{"id": "a", "html": page(0)}, {"id": "b", "html": page(1)}]}
            reported = asyncio.create_task(client.post("/v1/embed", json={**report, "on_error": "report"}))
            await _until(in_pass, reported)
            await _until(in_prune, reported)
            whole = asyncio.create_task(
                client.post("/v1/embed", json={"documents": [{"id": "c", "html": page(2)}]})
            )
            for _ in range(HOLD_BOUND_S * 100):  # until `c` is accepted: queued for the preprocessing thread
                if engine.queue_size == 3:
                    break
                assert not whole.done(), whole.result().text
                await asyncio.sleep(0.01)
            yield Held(engine, app.state.runtime, reported, whole, release, expired, pass_over)
            release.set()
    finally:
        release.set()
        await asyncio.to_thread(pass_over.wait, HOLD_BOUND_S)  # the pass's thread ends before the loop does


def _is_503_shutting_down(response: httpx.Response) -> None:
    assert response.status_code == 503, response.text
    assert response.json()["error"]["code"] == "shutting_down"
    assert response.headers["retry-after"] == "1"
    assert response.headers["connection"] == "close"


async def test_requests_whose_pages_are_in_preprocessing_behind_a_held_pass_are_failed_at_the_cut_off(
    settings_for: SettingsFactory,
) -> None:
    """SIGTERM with `a` in a pass that outlasts the budget (a large batch on CPU), `b` being preprocessed,
    `c` waiting for the thread. The cut-off's stop fails `b` and `c` at once, not once past the pass: the
    report-mode request is answered 200 with each document's own `shutting_down` entry, the
    all-or-nothing one 503 `shutting_down`, both while the pass still runs. (The stop had failed them only
    after the pass; only the runtime's own 503 for the whole request, `PendingAnswers`, answered them.)"""
    async with _held_server(settings_for, drain_timeout_s=10) as held:
        runtime = held.runtime
        runtime.begin_shutdown()  # what SIGTERM does first; the cut-off is armed on the next loop turn
        # The budget's end brought forward to a second from now: the margin stays 1 s, and the runtime's
        # own answer to requests still waiting comes half of it after the cut-off, long after the stop's.
        runtime.drain_deadline = time.monotonic() + 1.0
        reported, whole = await asyncio.gather(held.reported, held.whole)
        assert not held.expired.is_set() and not held.pass_over.is_set()  # answered while the pass runs
        assert reported.status_code == 200, reported.text
        entries = {entry["id"]: entry for entry in reported.json()["data"]}
        assert sorted(entries) == ["a", "b"]
        for entry in entries.values():
            assert entry["embedding"] is None and entry["error"]["code"] == "shutting_down", entry
        _is_503_shutting_down(whole)
        assert runtime.answers.waiting == 0 and runtime.drain_cut_short


async def test_requests_still_waiting_halfway_through_the_margin_are_answered_503(
    settings_for: SettingsFactory,
) -> None:
    """Should the stop not fail the pages in preprocessing in time (here its close of the preprocessing
    pools is held, as a worker process in uninterruptible sleep holds it: SIGKILL ends it only once its
    I/O does), neither a report-mode request (which waits for every document) nor an all-or-nothing one
    waits for that: halfway through the margin both are answered 503 `shutting_down` for the whole
    request, while the pass still runs, as a request with a document still queued is."""
    async with _held_server(settings_for, drain_timeout_s=1) as held:
        preprocessing = held.engine._preprocessing
        close = preprocessing.close

        async def held_close() -> None:
            await asyncio.to_thread(held.release.wait, HOLD_BOUND_S)
            await close()

        preprocessing.close = held_close  # type: ignore[method-assign]
        held.runtime.begin_shutdown()  # what SIGTERM does first; the cut-off comes shortly before 1 s
        responses = await asyncio.gather(held.reported, held.whole)
        assert not held.expired.is_set(), [r.text for r in responses]  # answered while the pass runs
        for response in responses:
            _is_503_shutting_down(response)
        assert held.runtime.drain_cut_short  # the exit status says the drain was not complete
