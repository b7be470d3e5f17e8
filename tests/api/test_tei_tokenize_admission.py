"""`POST /tokenize` lists a page's tokens under the engine's admission (`Engine.tokenize`): held in the
bounded queue until its list is made, on the preprocessing threads. Listed on the API's own threads after
its page's preprocessing had left the queue, any number of /tokenize calls of big pages ran there at once,
and a full queue's 429 never reached them. A page's listing is held here (its tokenizer's offsets read
waits on an event) to see where it runs and what it holds meanwhile."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from service.api.app import create_app
from service.api.runtime import Runtime
from service.core.tokenizer import HtmlTokenizer, OffsetEncoding
from tests.api.conftest import SettingsFactory, serving
from tests.api.pages import page
from tests.factories.waiting import ready_until

HOLD_S = 60.0  # far past what the test needs: only keeps a broken test from hanging


def _hold_listing(
    tokenizer: HtmlTokenizer, monkeypatch: pytest.MonkeyPatch
) -> tuple[threading.Event, threading.Event, list[str]]:
    """Hold each page's token listing until the second event; the first says one is held, the list names
    the threads that list."""
    started, release, threads = threading.Event(), threading.Event(), []
    real = tokenizer.encode_with_offsets

    def held(text: str, *, max_length: int) -> OffsetEncoding:
        threads.append(threading.current_thread().name)
        started.set()
        release.wait(HOLD_S)
        return real(text, max_length=max_length)

    monkeypatch.setattr(tokenizer, "encode_with_offsets", held)
    return started, release, threads


@pytest.mark.parametrize("pool", ["thread", "process"])
async def test_a_listing_holds_its_place_in_the_queue_on_a_preprocessing_thread(
    settings_for: SettingsFactory, monkeypatch: pytest.MonkeyPatch, pool: str
) -> None:
    app = create_app(settings_for(preprocess_pool=pool, preprocess_workers=1, max_queue_documents=1))
    runtime: Runtime = app.state.runtime
    async with serving(app) as client:
        await ready_until(client, 200, "after the warm-up")
        assert runtime.engine is not None
        started, release, threads = _hold_listing(runtime.engine.tokenizer, monkeypatch)
        listing: asyncio.Task[Any] = asyncio.ensure_future(client.post("/tokenize", json={"inputs": page(1)}))
        try:
            assert await asyncio.to_thread(started.wait, HOLD_S)
            assert threads[0].startswith("htmllm-preprocess_")  # not the API's threads
            assert runtime.engine.preprocessing_running_since is not None  # a job readiness watches
            assert runtime.engine.queue_size == 1  # its page holds its place until its list is made

            for path, body in (
                ("/tokenize", {"inputs": page(2)}),
                ("/v1/preprocess", {"documents": [{"html": page(2)}]}),
            ):
                refused = await client.post(path, json=body)
                assert refused.status_code == 429, refused.text  # the queue is full: as /v1/preprocess
                assert refused.json()["error"]["code"] == "overloaded"
        finally:
            release.set()
            answered = await listing
        assert answered.status_code == 200, answered.text
        assert runtime.engine.queue_size == 0
        again = await client.post("/tokenize", json={"inputs": page(1)})
        assert again.status_code == 200 and again.content == answered.content
