"""The one error table and the classification of every kind of failure."""

from __future__ import annotations

import json
import logging

import httpx
import pytest
from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException

from service.api.errors import STATUS, classify, install_error_handlers
from service.api.logs import JsonFormatter
from service.api.request_id import RequestIdMiddleware
from service.core.errors import ErrorCode, HtmllmError
from service.engine import DeadlineExceededError, OverloadedError, ShuttingDownError


def test_every_code_has_a_status() -> None:
    assert set(STATUS) == set(ErrorCode)
    assert all(400 <= status < 600 for status in STATUS.values())


def test_the_statuses_clients_rely_on() -> None:
    expected = {
        ErrorCode.VALIDATION: 422,
        ErrorCode.EMPTY: 400,
        ErrorCode.PAYLOAD_TOO_LARGE: 413,
        ErrorCode.HEADERS_TOO_LARGE: 431,
        ErrorCode.TOO_MANY_DOCUMENTS: 422,
        ErrorCode.UNAUTHORIZED: 401,
        ErrorCode.OVERLOADED: 429,
        ErrorCode.TIMEOUT: 504,
        ErrorCode.SHUTTING_DOWN: 503,
        ErrorCode.BACKEND_FAILED: 500,
    }
    assert {code: STATUS[code] for code in expected} == expected


def test_classify() -> None:
    assert classify(OverloadedError("full")) == (ErrorCode.OVERLOADED, "full", 429)
    assert classify(DeadlineExceededError("late"))[2] == 504
    assert classify(ShuttingDownError("bye"))[2] == 503
    assert classify(HtmllmError("x", code=ErrorCode.UNKNOWN_HEAD))[2] == 422
    code, message, status = classify(RequestValidationError([{"loc": ("body", "input"), "msg": "bad"}]))
    assert (code, status) == (ErrorCode.VALIDATION, 422) and "input: bad" in message
    assert classify(HTTPException(404, "gone"))[::2] == (ErrorCode.NOT_FOUND, 404)
    assert classify(HTTPException(405, "no"))[::2] == (ErrorCode.METHOD_NOT_ALLOWED, 405)
    assert classify(HTTPException(400, "bad"))[::2] == (ErrorCode.VALIDATION, 400)
    assert classify(RuntimeError("boom"))[::2] == (ErrorCode.INTERNAL, 500)


def _failing_app() -> FastAPI:
    """The error handlers and the request-id middleware around routes that fail with `code`."""
    app = FastAPI()
    install_error_handlers(app)

    @app.post("/fail/{code}")
    async def fail(code: str) -> None:
        raise HtmllmError(f"failed as {code}", code=ErrorCode(code))

    @app.get("/fail/{code}")
    async def probe(code: str) -> None:
        raise HtmllmError(f"failed as {code}", code=ErrorCode(code))

    app.add_middleware(RequestIdMiddleware)
    return app


async def _answer(method: str, code: ErrorCode, request_id: str) -> httpx.Response:
    transport = httpx.ASGITransport(app=_failing_app())
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
        return await client.request(
            method, f"/fail/{code.value}?key=sekrit", headers={"x-request-id": request_id}
        )


@pytest.mark.parametrize("code", [ErrorCode.TIMEOUT, ErrorCode.SHUTTING_DOWN, ErrorCode.NOT_READY])
async def test_a_request_the_server_did_not_serve_is_logged_with_its_request_id(
    code: ErrorCode, caplog: pytest.LogCaptureFixture
) -> None:
    """A 504 or 503 could not be tied to the x-request-id a client reports: the engine's line on a passed
    deadline names no request, and uvicorn's access log neither. A warning now names it, the method,
    path and code, and never the query string (a client may put a key there)."""
    caplog.set_level(logging.INFO, logger="service.api.errors")
    answer = await _answer("POST", code, "crawler-7")
    assert answer.status_code == STATUS[code]
    records = [r for r in caplog.records if r.name == "service.api.errors"]
    assert len(records) == 1 and records[0].levelno == logging.WARNING
    line = records[0].getMessage()
    assert f"POST /fail/{code.value} answered {STATUS[code]} {code.value} (request crawler-7)" in line
    assert "sekrit" not in caplog.text
    entry = json.loads(JsonFormatter().format(records[0]))  # the same fields, apart, under JSON logs
    assert entry["request_id"] == "crawler-7" and entry["code"] == code.value
    assert entry["path"] == f"/fail/{code.value}" and entry["status"] == STATUS[code]


@pytest.mark.parametrize(
    ("method", "code"),
    [
        ("POST", ErrorCode.OVERLOADED),  # a flood would flood the log: the failure counter has them
        ("GET", ErrorCode.NOT_READY),  # a readiness probe, every few seconds through a warm-up
        ("POST", ErrorCode.VALIDATION),  # the client's own mistake
    ],
)
async def test_429s_probes_and_client_errors_are_not_logged(
    method: str, code: ErrorCode, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="service.api.errors")
    answer = await _answer(method, code, "crawler-8")
    assert answer.status_code == STATUS[code]
    assert not [r for r in caplog.records if r.name == "service.api.errors"]


def test_a_logged_path_is_escaped_as_the_access_log_writes_it(caplog: pytest.LogCaptureFixture) -> None:
    """The body limits answer a request on any path (no key needed) 503 at the end of a drain, logged
    with the client's path as sent: `%0A` in it had written a forged line into text logs."""
    from service.api.errors import log_unserved

    caplog.set_level(logging.INFO, logger="service.api.errors")
    forged = "/x\n2026-12-06 16:00:00,000 ERROR service.api.auth: FORGED"
    log_unserved("POST", forged + "y" * 1000, ErrorCode.SHUTTING_DOWN, "r-1", "cut off")
    line = caplog.records[-1].getMessage()
    assert "\n" not in line and "/x%0A2026-12-06%2016:00:00,000%20ERROR" in line
    assert len(line) < 500
    entry = json.loads(JsonFormatter().format(caplog.records[-1]))
    assert "\n" not in entry["path"]
