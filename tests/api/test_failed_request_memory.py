"""A failed request's page is freed by reference counting alone, through the real HTTP server.

A serving process collects reference cycles all but never (service.engine.collector): a soak posting
refused 12 MB pages grew a server from 1.66 to 4.04 GB in two minutes, each failed request's page kept by
a cycle through its error. Here uvicorn serves the app on 127.0.0.1 with the automatic collections off
and the app's periodic collection (the net) not running: a page still alive after its request was
answered is held by a cycle, wherever on the request's way it was made (the route, `answer_or_cancel`,
the preprocessing processes' pool).
"""

from __future__ import annotations

import gc
import sys
import time
from dataclasses import dataclass

import httpx
import pytest

from service.engine import collector
from service.engine.types import Document
from tests.api.conftest import SettingsFactory
from tests.api.live import live_server

# Over the pruner's 16 MiB cap (a 413 of the page itself, not of the body: the body limit is raised).
TOO_LARGE = b" " * (16 * 1024 * 1024 + 1)
TOO_MANY_TOKENS = "<p>" + "word " * 4000 + "</p>"
NESTED_TOO_DEEP = "<div>" * 9000
GOOD = "<p>a page that embeds</p>"
# How long an answered request's last references may take to go (the handler's task ends after it sent
# the answer): a bound for a poll, never a measured time.
SETTLE_S = 10.0


@dataclass(frozen=True)
class Refusal:
    """One failed request: where it goes, what it sends, what it is answered."""

    name: str
    path: str
    status: int
    code: str
    raw: bytes | None = None
    json: object = None


REFUSALS = [
    Refusal("413 too large", "/v1/embed", 413, "payload_too_large", raw=TOO_LARGE),
    Refusal(
        "422 too many tokens",
        "/v1/embed?truncate=false",
        422,
        "too_many_tokens",
        raw=TOO_MANY_TOKENS.encode(),
    ),
    Refusal("422 nested too deep", "/v1/embed", 422, "preprocess_failed", raw=NESTED_TOO_DEEP.encode()),
    Refusal(
        "422 one of two documents",
        "/v1/embed",
        422,
        "preprocess_failed",
        json={"documents": [{"id": "good", "html": GOOD}, {"id": "deep", "html": NESTED_TOO_DEEP}]},
    ),
    Refusal("preprocess 413 too large", "/v1/preprocess", 413, "payload_too_large", raw=TOO_LARGE),
    Refusal(
        "preprocess 422 one of two documents",
        "/v1/preprocess",
        422,
        "preprocess_failed",
        json={"documents": [{"id": "deep", "html": NESTED_TOO_DEEP}, {"id": "good", "html": GOOD}]},
    ),
]


@pytest.fixture
def no_collector(no_collector: None, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The automatic collections off (tests/conftest.py) and the app's periodic one replaced by nothing
    (the list says the app got that far)."""
    started: list[str] = []

    async def no_periodic_collections(*args: object, **kwargs: object) -> None:
        started.append("collect_cycles")

    monkeypatch.setattr(collector, "collect_cycles", no_periodic_collections)
    return started


def _documents_alive() -> int:
    return sum(1 for obj in gc.get_objects() if type(obj) is Document)


def _held_by() -> str:
    """What keeps the first page still alive, a referrer or two deep: the chain to read on a failure."""
    me = sys._getframe()
    alive: list[object] = [obj for obj in gc.get_objects() if type(obj) is Document]
    if not alive:
        return "nothing"
    level: list[object] = alive[-1:]
    lines = []
    for depth in range(1, 4):
        referrers = [r for o in level for r in gc.get_referrers(o) if r is not me and r is not level]
        lines.append(f"{depth}: {', '.join(sorted({type(r).__name__ for r in referrers}))}")
        level = referrers[:8]
    return "; ".join(lines)


def _send(client: httpx.Client, refusal: Refusal) -> httpx.Response:
    if refusal.raw is not None:
        return client.post(refusal.path, content=refusal.raw, headers={"content-type": "text/html"})
    return client.post(refusal.path, json=refusal.json)


def _assert_pages_freed(client: httpx.Client, before: int) -> None:
    """Each refusal answered with its code, and its pages gone by the time the server is done with it."""
    leaks = []
    for refusal in REFUSALS:
        response = _send(client, refusal)
        assert response.status_code == refusal.status, (refusal.name, response.text)
        assert response.json()["error"]["code"] == refusal.code, (refusal.name, response.text)
        del response
        deadline = time.monotonic() + SETTLE_S
        while _documents_alive() > before and time.monotonic() < deadline:
            time.sleep(0.02)
        if _documents_alive() > before:
            leaks.append(f"{refusal.name}: {_documents_alive() - before} pages kept ({_held_by()})")
            before = _documents_alive()  # the next refusal is judged on its own
    assert not leaks, "failed requests left their pages in reference cycles: " + "; ".join(leaks)


@pytest.mark.parametrize("pool", ["thread", "process"])
def test_failed_requests_leave_no_page_behind_without_a_collection(
    settings_for: SettingsFactory, no_collector: list[str], pool: str
) -> None:
    settings = settings_for(
        preprocess_pool=pool, preprocess_workers=1, max_body_bytes=len(TOO_LARGE) + 1024, truncate=True
    )
    with live_server(settings) as server, httpx.Client(base_url=server.url, timeout=60.0) as client:
        assert no_collector == ["collect_cycles"], "the app's periodic collection would have run"
        assert client.post("/v1/embed", json={"documents": [{"html": GOOD}]}).status_code == 200
        before = _documents_alive()
        _assert_pages_freed(client, before)
