"""The server's log lines: plain text for a terminal, or one JSON object per line for a log pipeline; and
the access log, one line per request (`HTMLLM_ACCESS_LOG`).

Kubernetes log collectors (Fluent Bit, Vector, Promtail, Cloud Logging) read a container's output line
by line: a Python traceback in text becomes a dozen unrelated entries, and fields must be parsed back
out of prose. With `HTMLLM_LOG_FORMAT=json` every record, uvicorn's included, is one line:
`{"time", "level", "logger", "message"}` plus `exception` (the whole traceback) when there is one, and
the fields a record names (`FIELDS`: the access log's, a refused request's) so a pipeline reads them
without parsing the message.

The shape of a JSON line is `service.core.log_lines`'s (`JsonFormatter`, `FIELDS`), which the workers'
forkserver writes its one line in too: it runs none of this set-up, and is told the format when it is
launched.

uvicorn's own access log is off (service.api.main): it came with `HTMLLM_LOG_LEVEL=debug` only, named
no request id and no latency, stayed prose under JSON logs, and wrote each query string, where a client
may put a key. This one is the app's (`AccessLogMiddleware`), through the same handler and format.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Literal

from service.api.connections import status_sent
from service.api.request_id import request_id
from service.core.log_lines import FIELDS as FIELDS  # (service.api.errors names its fields by it)
from service.core.log_lines import JsonFormatter as JsonFormatter  # (the handler's; tests read lines with it)

if TYPE_CHECKING:
    from starlette.types import ASGIApp, Message, Receive, Scope, Send

LogFormat = Literal["text", "json"]
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# The access log's logger: its level is its own (`configure_logging`), since HTMLLM_ACCESS_LOG decides.
ACCESS_LOGGER = "service.api.access"
# Characters of a path the access log writes; a scanner's path may be a header's 64 KiB.
_PATH_CHARS = 256
# The status of a request whose client left before any answer (nginx's, as service.api.metrics counts).
_CLIENT_CLOSED = 499


def configure_logging(level: str, log_format: LogFormat) -> None:
    """The root logger's handler, in `log_format` (uvicorn's own loggers: see main.uvicorn_config).

    The access log's lines are at info level, and written whatever `level` says: a server asked for them
    (`HTMLLM_ACCESS_LOG`) at `HTMLLM_LOG_LEVEL=warning` gets them."""
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT))
    logging.basicConfig(level=level.upper(), handlers=[handler])
    logging.getLogger(ACCESS_LOGGER).setLevel(logging.INFO)


def printable_path(path: str) -> str:
    """`path` as a log line may hold it: a client's bytes, so each character outside printable ASCII (a
    newline that would forge a line of its own in text logs, a space) percent-escaped, and at most
    `_PATH_CHARS` of them."""
    escaped = "".join(
        char if "!" <= char <= "~" else "".join(f"%{byte:02X}" for byte in char.encode("utf-8", "replace"))
        for char in path[:_PATH_CHARS]
    )
    return escaped + ("..." if len(path) > _PATH_CHARS else "")


class AccessLogMiddleware:
    """One info line per HTTP request once its answer has been sent: request id, method, path, status,
    milliseconds from arrival to the answer's last byte, client address (pure ASGI, streams untouched).

    Inside the request-id middleware (the id is the client's, or the one made for it) and outside the
    rest, so it sees every answer the app gives, refusals of the body limit included; where the protocol
    answered in the app's place (a malformed body's 400), its status is the one logged: the client's. The
    path never carries its query string; every route's path is static, so a route's path is its template."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.logger = logging.getLogger(ACCESS_LOGGER)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status: int | None = None

        async def send_and_note(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_and_note)
        except Exception:
            if status is None:
                status = 500  # a bug: answered 500 from outside the middleware stack, then re-raised
            raise
        finally:
            if status is None:
                status = _CLIENT_CLOSED  # no answer at all: the client left first
            status = status_sent(scope, status)  # (the protocol's 400 for a malformed body)
            client = scope.get("client")
            fields = {
                "request_id": request_id(scope),
                "method": str(scope.get("method", "")),
                "path": printable_path(str(scope.get("path", ""))),
                "status": status,
                "duration_ms": round((time.perf_counter() - started) * 1000.0, 3),
                "client": f"{client[0]}:{client[1]}" if client else None,
            }
            self.logger.info(
                "%s %s %d %.1f ms request %s client %s",
                fields["method"],
                fields["path"],
                status,
                fields["duration_ms"],
                fields["request_id"],
                fields["client"] or "-",
                extra={FIELDS: fields},
            )
