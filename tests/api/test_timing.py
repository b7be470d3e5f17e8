"""`x-total-time` on every answer, errors included, and the stage headers where stages ran
(service.api.timing), over a real server; each answer also names its request (`x-request-id`)."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.types import Message, Receive, Scope, Send

from service.api.timing import HEADER, TimingMiddleware, total_time_header
from tests.api.conftest import tiny_settings
from tests.api.live import LiveServer, live_server
from tests.api.pages import page

pytestmark = pytest.mark.slow

KEY = {"authorization": "Bearer k1"}
EMBEDDING_STAGES = {"x-prune-time", "x-tokenize-time", "x-queue-time", "x-inference-time"}
ALL_STAGES = EMBEDDING_STAGES | {"x-preprocess-time", "x-extract-time"}
MAX_BODY = 4096


@pytest.fixture(scope="module")
def server(tiny_checkpoint: Path) -> Iterator[LiveServer]:
    settings = tiny_settings(tiny_checkpoint, max_body_bytes=MAX_BODY, api_key="k1", body_timeout_s=0.5)
    with live_server(settings) as live:
        yield live


def _timed(response: httpx.Response, request_id: str) -> float:
    """The answer's one `x-total-time` (milliseconds), after checking it names `request_id`."""
    assert response.headers["x-request-id"] == request_id, response.headers
    (total,) = response.headers.get_list("x-total-time")
    value = float(total)
    assert value >= 0, total
    return value


def _stages(response: httpx.Response) -> set[str]:
    return ALL_STAGES & set(response.headers)


def test_successful_answers_carry_the_total_and_the_stages_they_ran(server: LiveServer) -> None:
    html = page(1)
    expected = {
        ("/v1/embed", "json"): EMBEDDING_STAGES,
        ("/v1/embed", "raw"): EMBEDDING_STAGES,
        ("/v1/embeddings", "json"): EMBEDDING_STAGES,
        ("/embed", "json"): EMBEDDING_STAGES,
        ("/v1/preprocess", "json"): {"x-preprocess-time"},
        ("/v1/preprocess", "raw"): {"x-preprocess-time"},
        ("/v1/extract", "json"): {"x-extract-time"},
    }
    bodies = {
        "/v1/embed": {"documents": [{"html": html}]},
        "/v1/embeddings": {"input": html},
        "/embed": {"inputs": html},
        "/v1/preprocess": {"documents": [{"html": html}]},
        "/v1/extract": {"documents": [{"html": html}], "extractors": ["resiliparse"]},
    }
    with httpx.Client(base_url=server.url, timeout=60, headers=KEY) as client:
        for (route, kind), stages in expected.items():
            rid = f"ok-{route}-{kind}"
            if kind == "raw":
                headers = {"content-type": "text/html", "x-request-id": rid}
                answer = client.post(route, content=html.encode(), headers=headers)
            else:
                answer = client.post(route, json=bodies[route], headers={"x-request-id": rid})
            assert answer.status_code == 200, (route, answer.text)
            total = _timed(answer, rid)
            assert _stages(answer) == stages, (route, kind, answer.headers)
            for stage in stages:  # the stages ran within the request
                assert float(answer.headers[stage]) <= total, (route, stage, answer.headers)
        for path in ("/health", "/ready", "/info", "/metrics", "/openapi.json"):
            answer = client.get(path, headers={"x-request-id": f"get-{path}"})
            assert answer.status_code == 200, path
            _timed(answer, f"get-{path}")
            assert not _stages(answer), path


def test_every_error_carries_the_total_and_the_request_id(server: LiveServer) -> None:
    """The routes' typed errors, the body limit's refusals (before any route runs) and routing's."""
    html = page(2)
    docs = {"documents": [{"html": html}]}

    def chunked() -> Iterator[bytes]:  # no Content-Length: refused once the running total passes it
        yield b"{" + b" " * MAX_BODY
        yield b"}"

    media_type = {"content-type": "text/csv"}
    coding = {"content-encoding": "lzma"}
    requests: dict[str, tuple[int, str, str, dict[str, str], dict[str, Any]]] = {
        "empty": (400, "POST", "/v1/embed", {}, {"json": {"documents": []}}),
        "invalid": (422, "POST", "/v1/embed", {}, {"json": {"documents": [{"html": 1}]}}),
        "preprocess invalid": (422, "POST", "/v1/preprocess", {}, {"json": {"documents": "x"}}),
        "extract invalid": (422, "POST", "/v1/extract", {}, {"json": {**docs, "extractors": ["nope"]}}),
        "openai invalid": (422, "POST", "/v1/embeddings", {}, {"json": {"input": 5}}),
        "media type": (415, "POST", "/v1/embed", media_type, {"content": b"x"}),
        "coding": (415, "POST", "/v1/embed", coding, {"content": b"{}"}),
        "declared": (413, "POST", "/v1/embed", {}, {"content": b"x" * (MAX_BODY + 1)}),
        "chunked": (413, "POST", "/v1/preprocess", {}, {"content": chunked()}),
        "no key": (401, "POST", "/v1/extract", {"authorization": ""}, {"json": docs}),
        "no route": (404, "GET", "/nowhere", {}, {}),
        "method": (405, "GET", "/v1/embed", {}, {}),
        "head method": (405, "HEAD", "/v1/preprocess", {}, {}),
    }
    with httpx.Client(base_url=server.url, timeout=60, headers=KEY) as client:
        for name, (status, method, path, headers, options) in requests.items():
            rid = "err-" + name.replace(" ", "-")
            answer = client.request(method, path, headers={**headers, "x-request-id": rid}, **options)
            assert answer.status_code == status, (name, answer.status_code, answer.text)
            _timed(answer, rid)
            assert not _stages(answer), (name, answer.headers)
            if method != "HEAD":
                assert answer.json()["error"]["code"], name


def test_a_body_that_stalls_is_a_timed_408(server: LiveServer) -> None:
    """The body limit's 408, answered from the middleware while the route never ran."""
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(
            b"POST /v1/embed HTTP/1.1\r\nHost: x\r\nauthorization: Bearer k1\r\nx-request-id: stalled\r\n"
            b"content-type: text/html\r\ncontent-length: 500\r\n\r\n<p>stalled"
        )
        answer = b""
        while data := sock.recv(65536):  # until the server closes the connection
            answer += data
    head = answer.partition(b"\r\n\r\n")[0].decode("latin-1").lower().split("\r\n")
    assert head[0].startswith("http/1.1 408 "), head
    fields = dict(line.split(": ", 1) for line in head[1:])
    assert fields["x-request-id"] == "stalled"
    assert float(fields["x-total-time"]) >= 0


def test_a_bugs_500_carries_the_total_too(server: LiveServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """A bug's 500 leaves from outside the middleware stack: the error handler sets the header there."""
    from service.api.routers import embed as embed_router

    def broken(documents: object) -> object:
        raise RuntimeError("a bug")

    monkeypatch.setattr(embed_router, "to_documents", broken)
    with httpx.Client(base_url=server.url, timeout=60, headers=KEY) as client:
        failed = client.post(
            "/v1/embed", json={"documents": [{"html": page(3)}]}, headers={"x-request-id": "b"}
        )
    assert failed.status_code == 500 and failed.json()["error"]["code"] == "internal_error"
    _timed(failed, "b")


async def test_the_middleware_owns_the_header_and_passes_other_scopes_through() -> None:
    """An app's own `x-total-time` is replaced, never sent twice; a lifespan scope is passed on as is."""
    seen: list[Scope] = []
    sent: list[Message] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        seen.append(scope)
        if scope["type"] == "http":
            await send({"type": "http.response.start", "status": 200, "headers": [(HEADER, b"-1")]})
            await send({"type": "http.response.body", "body": b""})

    async def send(message: Message) -> None:
        sent.append(message)

    async def receive() -> Message:
        return {"type": "http.disconnect"}

    middleware = TimingMiddleware(app)
    await middleware({"type": "lifespan"}, receive, send)
    assert seen == [{"type": "lifespan"}] and not sent
    await middleware({"type": "http", "headers": []}, receive, send)
    (value,) = [value for name, value in sent[0]["headers"] if name == HEADER]
    assert float(value) >= 0
    assert total_time_header({"type": "http"}) == {}  # outside the middleware: no start to measure from
    assert set(total_time_header(seen[1])) == {"x-total-time"}
