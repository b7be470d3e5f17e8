"""The one error table and the classification of every kind of failure."""

from __future__ import annotations

from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException

from service.api.errors import STATUS, classify
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
