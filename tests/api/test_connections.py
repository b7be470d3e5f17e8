"""Bounded keep-alive connections: `Connection: close` after N requests or T seconds, on 429/503/504 and
500 `backend_failed`, and on every answer while the pod is not ready.

A Service balances connections: a connection the server never closes stays on its pod however many
pods a scale-up adds. The live tests use a real uvicorn server and an httpx client that keeps its
connections alive, and tell connections apart by the client's local port.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import ValidationError
from starlette.types import Message, Receive, Scope, Send

from service.api import runtime as runtime_module
from service.api.connections import CONNECTION_KEY, ConnectionAge, ConnectionLifetimeMiddleware
from service.engine import OverloadedError
from tests.api.conftest import SettingsFactory, app_client, tiny_settings
from tests.api.live import live_server
from tests.api.pages import page


def _get_many(url: str, count: int) -> list[tuple[int, str | None, int]]:
    """`count` GETs on one httpx client (a pool of keep-alive connections): each answer's status, its
    Connection header, and the client-side port of the connection it came on (read while it is open)."""
    ports: list[int] = []

    def record_port(response: httpx.Response) -> None:
        ports.append(response.extensions["network_stream"].get_extra_info("client_addr")[1])

    with httpx.Client(base_url=url, timeout=30, event_hooks={"response": [record_port]}) as client:
        answers = [client.get("/health") for _ in range(count)]
    return [
        (r.status_code, r.headers.get("connection"), port) for r, port in zip(answers, ports, strict=True)
    ]


def test_a_connection_closes_after_its_max_requests_and_the_next_request_opens_another(
    tiny_checkpoint: Path,
) -> None:
    settings = tiny_settings(tiny_checkpoint, connection_max_requests=3, connection_max_age_s=0)
    with live_server(settings) as live:
        answers = _get_many(live.url, 7)
    statuses, connection, ports = zip(*answers, strict=True)
    assert statuses == (200,) * 7  # no request lost to a closed connection
    assert connection == (None, None, "close", None, None, "close", None)
    assert ports[0] == ports[1] == ports[2] != ports[3] == ports[4] == ports[5] != ports[6]


def test_a_connection_past_its_max_age_closes_and_without_limits_it_stays(tiny_checkpoint: Path) -> None:
    """Every connection is older than a microsecond by its first answer: each request gets its own."""
    aged = tiny_settings(tiny_checkpoint, connection_max_requests=0, connection_max_age_s=1e-6)
    with live_server(aged) as live:
        answers = _get_many(live.url, 3)
    assert [(status, connection) for status, connection, _ in answers] == [(200, "close")] * 3
    assert len({port for _, _, port in answers}) == 3

    unbounded = tiny_settings(tiny_checkpoint, connection_max_requests=0, connection_max_age_s=0)
    with live_server(unbounded) as live:
        answers = _get_many(live.url, 5)
    assert [(status, connection) for status, connection, _ in answers] == [(200, None)] * 5
    assert len({port for _, _, port in answers}) == 1


async def test_a_queue_full_429_closes_its_connection(
    settings_for: SettingsFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The client's retry then opens a new connection, which the Service may send to another pod."""
    async with app_client(settings_for()) as client:
        transport = client._transport
        assert isinstance(transport, httpx.ASGITransport)
        engine = transport.app.state.runtime.engine  # type: ignore[attr-defined]

        def full(*args: Any, **kwargs: Any) -> Any:
            raise OverloadedError("the queue is full (1024 of 1024 documents)")

        monkeypatch.setattr(engine, "embed", full)
        response = await client.post("/v1/embed", json={"documents": [{"html": page(1)}]})
        assert response.status_code == 429 and response.headers["connection"] == "close"
        assert "connection" not in (await client.get("/health")).headers


async def _answer(
    middleware_for: Any, scope_extra: dict[str, Any], status: int, headers: list[tuple[bytes, bytes]]
) -> dict[bytes, bytes]:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": b""})

    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    async def receive() -> Message:
        return {"type": "http.disconnect"}

    await middleware_for(app)({"type": "http", **scope_extra}, receive, send)
    return dict(sent[0]["headers"])


@pytest.mark.parametrize(
    ("request_number", "now", "status", "closes"),
    [
        (1, 100.0, 200, False),
        (9, 399.9, 200, False),  # under both limits
        (10, 100.0, 200, True),  # the tenth request
        (1, 400.0, 200, True),  # 300 s old
        (1, 100.0, 429, True),
        (1, 100.0, 503, True),
        (1, 100.0, 504, True),  # timed out behind the queue or a stalled pass: retry elsewhere
        (1, 100.0, 500, False),  # errors.py closes a bug's connection itself
    ],
)
async def test_the_middleware_closes_by_count_age_and_status(
    request_number: int, now: float, status: int, closes: bool
) -> None:
    def middleware(app: Any) -> ConnectionLifetimeMiddleware:
        return ConnectionLifetimeMiddleware(app, max_requests=10, max_age_s=300, clock=lambda: now)

    age = {CONNECTION_KEY: ConnectionAge(opened=100.0, request=request_number)}
    headers = await _answer(middleware, age, status, [(b"connection", b"keep-alive")])
    assert headers[b"connection"] == (b"close" if closes else b"keep-alive")


async def test_without_a_connection_stamp_only_the_status_counts() -> None:
    """Another server (uvicorn's h11 fallback, an in-process client) stamps no connection age."""

    def middleware(app: Any) -> ConnectionLifetimeMiddleware:
        return ConnectionLifetimeMiddleware(app, max_requests=1, max_age_s=1e-9)

    assert b"connection" not in await _answer(middleware, {}, 200, [])
    assert (await _answer(middleware, {}, 429, []))[b"connection"] == b"close"


async def test_while_the_pod_is_unready_every_answer_closes_its_connection() -> None:
    """Readiness steers only new connections: a client already connected to a pod that turned unready
    kept sending there (504s behind a stalled pass, 500s from a failing backend) for the connection's
    whole max age. The middleware asks the runtime (`unready`) for every answer."""
    reason: str | None = "a forward pass has run for 30 s (the limit is 30 s)"

    def middleware(app: Any) -> ConnectionLifetimeMiddleware:
        return ConnectionLifetimeMiddleware(
            app, max_requests=10, max_age_s=300, clock=lambda: 100.0, unready=lambda: reason
        )

    age = {CONNECTION_KEY: ConnectionAge(opened=100.0, request=1)}
    assert (await _answer(middleware, age, 200, []))[b"connection"] == b"close"
    assert (await _answer(middleware, {}, 200, []))[b"connection"] == b"close"  # no stamp: still
    reason = None  # ready again: connections live out their limits
    assert b"connection" not in await _answer(middleware, age, 200, [])


async def test_a_failing_backend_closes_connections_until_it_serves_again(
    settings_for: SettingsFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 500 `backend_failed` closes its connection (the next pass likely fails too), a healthy answer
    does not while failures stay below `unready_after_failures`, and every answer does once /ready is
    503 for them, until a probe pass succeeds."""
    monkeypatch.setattr(runtime_module, "PROBE_INTERVAL_S", 0.0)
    async with app_client(settings_for(unready_after_failures=2)) as client:
        transport = client._transport
        assert isinstance(transport, httpx.ASGITransport)
        runner = transport.app.state.runtime.engine._runner  # type: ignore[attr-defined]
        working = runner.run

        def broken(prepared: object) -> object:
            raise RuntimeError("CUDA error: an illegal memory access was encountered (simulated)")

        monkeypatch.setattr(runner, "run", broken)
        body = {"documents": [{"html": page(1)}]}
        failed = await client.post("/v1/embed", json=body)
        assert failed.status_code == 500 and failed.json()["error"]["code"] == "backend_failed"
        assert failed.headers["connection"] == "close"
        assert "connection" not in (await client.get("/health")).headers  # one failure: still ready
        assert (await client.post("/v1/embed", json=body)).status_code == 500
        health = await client.get("/health")
        assert health.status_code == 200 and health.headers["connection"] == "close"  # unready now

        monkeypatch.setattr(runner, "run", working)
        for _ in range(600):  # /ready starts the probe pass that makes it ready again
            if (await client.get("/ready")).status_code == 200:
                break
            await asyncio.sleep(0.01)
        assert "connection" not in (await client.get("/health")).headers
        assert "connection" not in (await client.post("/v1/embed", json=body)).headers


@pytest.mark.parametrize("field", ["connection_max_requests", "connection_max_age_s"])
def test_connection_limits_are_validated(tiny_checkpoint: Path, field: str) -> None:
    with pytest.raises(ValidationError, match=field):
        tiny_settings(tiny_checkpoint, **{field: -1})
    assert getattr(tiny_settings(tiny_checkpoint, **{field: 0}), field) == 0
