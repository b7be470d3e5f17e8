"""The end of the drain budget answers every request still waiting with a typed error, including one whose
documents nothing can fail in time: a page on a preprocessing thread behind a forward pass that the stop
waits for. uvicorn's graceful timeout had cancelled such a request: a bare plain-text 500."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import httpx

from service.api.app import create_app, load_engine
from service.api.runtime import Runtime
from service.engine import Document
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


async def test_requests_waiting_behind_a_held_pass_are_answered_503_before_the_budget_ends(
    settings_for: SettingsFactory,
) -> None:
    """3 documents in flight at SIGTERM: `a` in a forward pass that outlasts the budget (a large batch on
    CPU), `b` being preprocessed on the one thread, `c` queued for that thread. The cut-off fails `a`, but
    `b` and `c` are failed only once the stop is past that pass. Neither a report-mode request (`a`, `b`:
    it waits for every document) nor an all-or-nothing one (`c`) may wait for that: both are answered 503
    `shutting_down` while the pass still runs, as a request with a document still queued is."""
    settings = settings_for(
        warmup=False, drain_timeout_s=1, max_batch_requests=1, max_wait_ms=0, request_timeout_s=60
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
    runtime: Runtime = app.state.runtime
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
            runtime.begin_shutdown()  # what SIGTERM does first; the cut-off comes shortly before 1 s
            responses = await asyncio.gather(reported, whole)
            assert not expired.is_set(), [r.text for r in responses]  # answered while the pass runs
            for response in responses:
                assert response.status_code == 503, response.text
                assert response.json()["error"]["code"] == "shutting_down"
                assert response.headers["retry-after"] == "1"
                assert response.headers["connection"] == "close"
            assert runtime.drain_cut_short  # the exit status says the drain was not complete
            release.set()
    finally:
        release.set()
        await asyncio.to_thread(pass_over.wait, HOLD_BOUND_S)  # the pass's thread ends before the loop does
