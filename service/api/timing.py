"""`x-total-time` on every answer the app gives: milliseconds from the request's arrival to its answer.

Load tests and clients measure latency per answer, errors included: a 429 or a 413 back in 2 ms and
one back after 2 s of body upload say different things, and a header sent only on success leaves a
latency histogram blind to exactly the answers that matter. So the total is this middleware's, measured
from the moment the app is handed the request (its head parsed) until the answer's head leaves: the
body read, its decoding, the route's work and the response's compression are all in it, and so is every
answer, the body limit's refusals (401, 408, 413, 415, 429, 503) and routing's 404 and 405 included.
Routes add only what they alone know, the stages their work ran through (`x-prune-time`, ...).

A bug's 500 leaves from outside the middleware stack; the error handler sets the header there
(`total_time_header`), from the same start.
"""

from __future__ import annotations

import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

HEADER = b"x-total-time"
# Where the middleware stamps the request's arrival (`time.perf_counter()`) in its scope.
START_KEY = "htmllm.start"


def milliseconds(seconds: float) -> str:
    """A timing header's value: milliseconds, three decimals."""
    return f"{seconds * 1000.0:.3f}"


def total_time_header(scope: Scope) -> dict[str, str]:
    """`x-total-time` for an answer to the request of `scope` sent now; none outside the middleware."""
    started = scope.get(START_KEY)
    if not isinstance(started, float):
        return {}
    return {HEADER.decode("ascii"): milliseconds(time.perf_counter() - started)}


class TimingMiddleware:
    """Stamps `scope[START_KEY]` and sets `x-total-time` on the response (pure ASGI, streams untouched)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        scope[START_KEY] = started

        async def send_with_time(message: Message) -> None:
            if message["type"] == "http.response.start":
                value = milliseconds(time.perf_counter() - started).encode("ascii")
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != HEADER]
                message = {**message, "headers": [*headers, (HEADER, value)]}
            await send(message)

        await self.app(scope, receive, send_with_time)
