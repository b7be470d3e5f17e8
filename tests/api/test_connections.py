"""Bounded keep-alive connections: `Connection: close` after N requests or T seconds, and on 429/503.

A Service balances connections: a connection the server never closes stays on its pod however many
pods a scale-up adds. The live tests use a real uvicorn server and an httpx client that keeps its
connections alive, and tell connections apart by the client's local port.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import ValidationError
from starlette.types import Message, Receive, Scope, Send

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


@pytest.mark.parametrize("field", ["connection_max_requests", "connection_max_age_s"])
def test_connection_limits_are_validated(tiny_checkpoint: Path, field: str) -> None:
    with pytest.raises(ValidationError, match=field):
        tiny_settings(tiny_checkpoint, **{field: -1})
    assert getattr(tiny_settings(tiny_checkpoint, **{field: 0}), field) == 0
