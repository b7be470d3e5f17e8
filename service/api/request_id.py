"""`x-request-id`: one id per request, the client's when it sends a usable one, on every response.

Crawlers and gateways (nginx, Envoy, ingress controllers) tag requests with an id; echoing it, and
naming it in the log line of a server fault, lets an operator find one failed page among millions.
A client id is kept only if it is short printable ASCII from a safe set, so it cannot forge log
lines or response headers; otherwise, or without one, the service makes a uuid4.
"""

from __future__ import annotations

import re
import uuid

from starlette.types import ASGIApp, Message, Receive, Scope, Send

HEADER = b"x-request-id"
SCOPE_KEY = "htmllm.request_id"
_USABLE = re.compile(rb"[A-Za-z0-9._:@/+=-]{1,128}")


def request_id(scope: Scope) -> str | None:
    """The id the middleware gave this request (None outside it)."""
    value = scope.get(SCOPE_KEY)
    return value if isinstance(value, str) else None


class RequestIdMiddleware:
    """Sets `scope[SCOPE_KEY]` and adds `x-request-id` to the response (pure ASGI, streams untouched)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = next((v for k, v in scope["headers"] if k == HEADER), None)
        value = given.decode("ascii") if given and _USABLE.fullmatch(given) else uuid.uuid4().hex
        scope[SCOPE_KEY] = value
        encoded = value.encode("ascii")

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != HEADER]
                message = {**message, "headers": [*headers, (HEADER, encoded)]}
            await send(message)

        await self.app(scope, receive, send_with_id)
