"""Errors over HTTP: one table from `ErrorCode` to status, one handler, one JSON body shape.

Every failure a client sees is `{"error": {"code": ..., "message": ...}}` with the status from `STATUS`,
and every one increments `htmllm_request_failures_total{code=...}`, but the probes' own (`PROBE_PATHS`).
The core and engine raise `HtmllmError`s and never know about HTTP; FastAPI's own validation and routing
errors are folded into the same codes here.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import BaseRoute, Match, Route

from service.api.logs import FIELDS, printable_path
from service.api.metrics import CLIENT_CLOSED_STATUS
from service.api.request_id import request_id
from service.api.timing import total_time_header
from service.core.errors import ErrorCode, HtmllmError

if TYPE_CHECKING:
    from service.api.metrics import ServiceMetrics

logger = logging.getLogger(__name__)

# The one mapping of error codes to HTTP statuses (after text-embeddings-inference's ErrorType).
STATUS: dict[ErrorCode, int] = {
    ErrorCode.VALIDATION: 422,
    ErrorCode.EMPTY: 400,
    ErrorCode.PAYLOAD_TOO_LARGE: 413,
    ErrorCode.HEADERS_TOO_LARGE: 431,
    ErrorCode.MALFORMED_REQUEST: 400,
    ErrorCode.UNSUPPORTED_TRANSFER_CODING: 501,
    ErrorCode.TOO_MANY_DOCUMENTS: 422,
    ErrorCode.TOO_MANY_TOKENS: 422,
    ErrorCode.UNSUPPORTED_MEDIA_TYPE: 415,
    ErrorCode.UNKNOWN_HEAD: 422,
    ErrorCode.UNAUTHORIZED: 401,
    ErrorCode.NOT_FOUND: 404,
    ErrorCode.METHOD_NOT_ALLOWED: 405,
    ErrorCode.OVERLOADED: 429,
    ErrorCode.TIMEOUT: 504,
    ErrorCode.BODY_TIMEOUT: 408,
    ErrorCode.HEAD_TIMEOUT: 408,
    ErrorCode.SHUTTING_DOWN: 503,
    ErrorCode.NOT_READY: 503,
    ErrorCode.UNHEALTHY: 503,
    ErrorCode.PREPROCESS_FAILED: 422,
    ErrorCode.EXTRACTION_FAILED: 422,
    ErrorCode.INPUT_UNREADABLE: 500,  # the bulk commands' only: the service reads no page files
    ErrorCode.CHECKPOINT_INVALID: 500,
    ErrorCode.BACKEND_FAILED: 500,
    ErrorCode.INTERNAL: 500,
}

# Where the app keeps its routes (`app.state`) for a 405's `Allow`: FastAPI's own `app.routes` hold
# included routers as opaque branches.
ROUTES_STATE = "method_routes"

# Codes in the taxonomy that no HTTP answer carries (the bulk commands' own); the API description
# leaves them out.
NOT_OVER_HTTP = frozenset({ErrorCode.INPUT_UNREADABLE})

# Codes a client may retry after waiting; they get a Retry-After header.
RETRYABLE = frozenset({ErrorCode.OVERLOADED, ErrorCode.SHUTTING_DOWN, ErrorCode.NOT_READY})

# Starlette's routing errors (unknown path, wrong method, unparsable body) carry only a status.
_CODE_FOR_HTTP_STATUS: dict[int, ErrorCode] = {
    401: ErrorCode.UNAUTHORIZED,
    404: ErrorCode.NOT_FOUND,
    405: ErrorCode.METHOD_NOT_ALLOWED,
    413: ErrorCode.PAYLOAD_TOO_LARGE,
    415: ErrorCode.UNSUPPORTED_MEDIA_TYPE,
    429: ErrorCode.OVERLOADED,
    503: ErrorCode.NOT_READY,
}

# Answers that end their connection (ConnectionLifetimeMiddleware closes by status; only here is the code
# known): a backend that fails one pass likely fails the next, so the client's retry should open a new
# connection, which the Service may send to another pod.
_CLOSE_CONNECTION = frozenset({ErrorCode.BACKEND_FAILED})

# Failures that are the server's fault and worth a traceback in the log (not 503 / 504: load, not bugs).
_SERVER_FAULTS = frozenset({ErrorCode.CHECKPOINT_INVALID, ErrorCode.BACKEND_FAILED, ErrorCode.INTERNAL})

# Requests the server did not serve for its own state (a deadline passed, shutting down, not ready):
# load, not bugs, so no traceback, but a warning naming the request id, so that the answer a client
# reports can be found, and told from its neighbours' (the engine's own line on a passed deadline has no
# request context). Not 429 `overloaded`: a flood would flood the log with them, and
# htmllm_request_failures_total{code="overloaded"} counts them. Not a probe's 503 either (`_PROBES`).
_UNSERVED = frozenset({ErrorCode.TIMEOUT, ErrorCode.SHUTTING_DOWN, ErrorCode.NOT_READY})
# Probes and the information routes are GET/HEAD, every model route a POST: the kubelet asks /ready
# every few seconds through a warm-up or a shutdown, whose transitions are logged already.
_PROBES = frozenset({"GET", "HEAD"})
# The probes' paths (service/api/routers/health.py): their 503s are their outcome (`htmllm_ready`), not
# request failures. Counted, the kubelet's asks through each warm-up and drain had dominated
# `htmllm_request_failures_total{code="not_ready"}` and fired an alert on its rate at every rollout, and
# a client refused for the same reason could not be told from them.
PROBE_PATHS = frozenset({"/ready", "/health", "/", "/ping"})


def log_unserved(method: str, path: str, code: ErrorCode, rid: str | None, message: str) -> None:
    """The warning for a request the server did not serve for its own state (`_UNSERVED`), from the
    exception handler or from the middleware that answers before it (a body cut off by the drain).
    `path` without its query string: a client may put a key or a page's URL there; and escaped as the
    access log writes it: the body limits answer any path, an unauthenticated client's `%0A` included,
    which had written a forged line of its own into text logs."""
    status = STATUS[code]
    path = printable_path(path)
    logger.warning(
        "%s %s answered %d %s (request %s): %s",
        method,
        path,
        status,
        code.value,
        rid,
        message,
        extra={
            FIELDS: {"request_id": rid, "method": method, "path": path, "status": status, "code": code.value}
        },
    )


class ClientDisconnectedError(Exception):
    """The client went away before its answer was ready; its queued documents were cancelled."""


def _validation_message(exc: RequestValidationError) -> str:
    parts = []
    for error in exc.errors()[:5]:
        location = ".".join(str(p) for p in error.get("loc", ()) if p != "body")
        parts.append(f"{location}: {error.get('msg', 'invalid')}" if location else str(error.get("msg")))
    return "; ".join(parts) or "invalid request"


def classify(exc: BaseException) -> tuple[ErrorCode, str, int]:
    """The code, message and HTTP status a failure is reported with."""
    if isinstance(exc, HtmllmError):
        return exc.code, exc.message, STATUS[exc.code]
    if isinstance(exc, RequestValidationError):
        return ErrorCode.VALIDATION, _validation_message(exc), STATUS[ErrorCode.VALIDATION]
    if isinstance(exc, StarletteHTTPException):
        code = _CODE_FOR_HTTP_STATUS.get(exc.status_code)
        if code is None:
            # 400 and friends: a client error without a code of its own keeps its status.
            code = ErrorCode.VALIDATION if exc.status_code < 500 else ErrorCode.INTERNAL
            return code, str(exc.detail), exc.status_code
        return code, str(exc.detail), STATUS[code]
    return ErrorCode.INTERNAL, f"internal error: {type(exc).__name__}", STATUS[ErrorCode.INTERNAL]


def error_response(
    code: ErrorCode,
    message: str,
    status: int,
    *,
    metrics: ServiceMetrics | None,
    retry_after_s: int | None = None,
    headers: Mapping[str, str] | None = None,
) -> JSONResponse:
    """The JSON error response, with the failure counted and retry/auth headers set."""
    if metrics is not None:
        metrics.failures.labels(code=code.value).inc()
    headers = dict(headers or {})
    if code in RETRYABLE and retry_after_s is not None:
        headers["Retry-After"] = str(retry_after_s)
    if code is ErrorCode.UNAUTHORIZED:
        headers["WWW-Authenticate"] = "Bearer"
    return JSONResponse(
        {"error": {"code": code.value, "message": message}}, status_code=status, headers=headers
    )


def _app_context(app: Any) -> tuple[ServiceMetrics | None, int | None]:
    runtime = getattr(app.state, "runtime", None)
    if runtime is None:
        return None, None
    return runtime.metrics, runtime.settings.retry_after_s


async def handle_error(request: Request, exc: Exception) -> Response:
    """The one exception handler: every error type the app can raise ends here."""
    if isinstance(exc, ClientDisconnectedError):
        return Response(status_code=CLIENT_CLOSED_STATUS)
    code, message, status = classify(exc)
    rid = request_id(request.scope)
    if code in _SERVER_FAULTS:
        # A bug is re-raised by Starlette after this response and its traceback logged by the server;
        # this line ties that traceback to the request id the client saw.
        typed = isinstance(exc, HtmllmError)
        logger.error(
            "%s %s failed (request %s): %s",
            request.method,
            printable_path(request.url.path),
            rid,
            message,
            exc_info=exc if typed else None,
        )
    elif code in _UNSERVED and request.method not in _PROBES:
        log_unserved(request.method, request.url.path, code, rid, message)
    metrics, retry_after_s = _app_context(request.app)
    # Routing errors carry headers a client needs (a 405's `Allow`); keep them.
    headers = dict(exc.headers or {}) if isinstance(exc, StarletteHTTPException) else {}
    if code is ErrorCode.METHOD_NOT_ALLOWED:
        named = next((v for k, v in headers.items() if k.lower() == "allow"), "")
        headers = {k: v for k, v in headers.items() if k.lower() != "allow"}
        headers["Allow"] = _allowed_methods(request, named)
    if rid is not None:
        # A bug's 500 is sent from outside the middleware stack, past the request-id and timing
        # middleware; inside it they set these headers again.
        headers["x-request-id"] = rid
    headers.update(total_time_header(request.scope))
    if not isinstance(exc, _HANDLED_INSIDE) or code in _CLOSE_CONNECTION:
        # Starlette re-raises a bug after this response and uvicorn then closes the connection: saying
        # so lets a keep-alive client open a new one, instead of losing its next request to the reset.
        # A failing backend's answer closes too (_CLOSE_CONNECTION).
        headers["connection"] = "close"
    if request.method in _PROBES and request.url.path in PROBE_PATHS:
        metrics = None  # a probe's outcome, not a request failure
    return error_response(
        code, message, status, metrics=metrics, retry_after_s=retry_after_s, headers=headers
    )


def _allowed_methods(request: Request, named: str) -> str:
    """Every method some route takes at the request's path (`named`: Starlette's list, when the app did
    not register its routes). Starlette's 405 names only the methods of the first route there, and `/`
    has two: GET/HEAD (a probe) and POST (TEI's embed)."""
    routes: Sequence[BaseRoute] = getattr(request.app.state, ROUTES_STATE, ())
    methods: set[str] = set()
    for route in routes:
        if isinstance(route, Route) and route.methods and route.matches(request.scope)[0] is not Match.NONE:
            methods |= route.methods
    return ", ".join(sorted(methods)) if methods else named


# Errors Starlette's exception middleware answers and swallows; anything else reaches
# `ServerErrorMiddleware`, which answers and re-raises.
_HANDLED_INSIDE = (HtmllmError, RequestValidationError, StarletteHTTPException, ClientDisconnectedError)


def install_error_handlers(app: FastAPI) -> None:
    """Route typed errors, FastAPI's validation errors, routing errors and bugs to `handle_error`."""
    for exc_type in (*_HANDLED_INSIDE, Exception):
        app.add_exception_handler(exc_type, handle_error)
