"""Bounded keep-alive connections: past an age or a request count, on a 429, 503 or 504, and while the
pod is not ready, the answer carries `Connection: close`.

A Kubernetes Service (kube-proxy) balances connections, not requests, and crawler workers post back to
back on pooled keep-alive connections that this server never closed: pods added by a scale-up got only
new connections, while the old ones stayed pinned to pods that kept answering 429. Bounding each
connection's life (`HTMLLM_CONNECTION_MAX_AGE_S`, `HTMLLM_CONNECTION_MAX_REQUESTS`) makes every client
reconnect now and then, and each reconnection is balanced afresh. A 429 (queue full), 503 (shutting
down, not ready) or 504 (the request timed out behind the queue or a stalled pass) closes its
connection at once, so the client's retry opens a new one, likely to another pod; so does a 500
`backend_failed`, which the error handler (service.api.errors) marks itself, since only it knows the
code.

Readiness only steers new connections: a client already connected to a pod that turned unready (a
stalled pass, a failing backend) would keep sending there, and keep getting 504s or 500s, for up to
the connection's max age. So while `unready` (the runtime's `unready_reason`, the condition /ready
answers by) gives a reason, every answer closes its connection. A healthy pod never meets it, however
loaded, so connections do not flap.

`Connection: close` on a response makes uvicorn close the connection once the response is sent (its
httptools protocol drops keep-alive when the app's headers say `close`; h11 does the same), and an
HTTP/1.1 client then sends its next request on a new connection: nothing in flight is lost, since the
close comes after a complete response. (A client that pipelined more requests behind that one must
send them again, as after any server close: RFC 9112, 9.3.2.)

ASGI gives an app no handle on its connection, so the protocol (service.api.http_protocol) stamps
each request's scope with its connection's `ConnectionAge` under `CONNECTION_KEY`. Served by another
protocol (uvicorn's h11 fallback, an in-process test client) a request has no stamp: only the
status and readiness rules apply then.

The protocol also answers some requests in their app's place: a request whose body turns out malformed
(a bad chunk size) gets the protocol's 400 while its app is told that the client left, and whatever the
app then answers never reaches the client. The protocol puts that status in the request's scope
(`PROTOCOL_STATUS_KEY`), so that the access log and the request metrics record what the client got
(`status_sent`), not a 499 or the app's answer that was never written.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from starlette.types import ASGIApp, Message, Receive, Scope, Send

# The scope key under which the HTTP protocol puts the request's `ConnectionAge`.
CONNECTION_KEY = "htmllm.connection"
# The scope key under which the protocol puts the status it answered a request with in its app's place.
PROTOCOL_STATUS_KEY = "htmllm.protocol_status"
# Answers that send the client elsewhere: its retry should open a new connection (likely another pod).
_RETRY_ELSEWHERE = frozenset({429, 503, 504})


@dataclass(frozen=True)
class ConnectionAge:
    """The connection a request came on: when it was made, and which of its requests this one is."""

    opened: float  # time.monotonic() when the connection was made
    request: int  # 1 for the connection's first request


class ConnectionLifetimeMiddleware:
    """Adds `Connection: close` to the answer that ends a connection's allowed life (pure ASGI: it
    touches only the response head, never the body), and to every answer while `unready` gives a
    reason."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        max_requests: int,
        max_age_s: float,
        clock: Callable[[], float] = time.monotonic,
        unready: Callable[[], str | None] | None = None,
    ) -> None:
        self.app = app
        self.max_requests = max_requests  # 0: no limit
        self.max_age_s = max_age_s  # 0: no limit
        self.clock = clock
        self.unready = unready  # why the pod is not ready, or None (called for every answer: cheap)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_closing(message: Message) -> None:
            if message["type"] == "http.response.start" and self.should_close(scope, message["status"]):
                headers = [(k, v) for k, v in message.get("headers", ()) if k.lower() != b"connection"]
                message = {**message, "headers": [*headers, (b"connection", b"close")]}
            await send(message)

        await self.app(scope, receive, send_closing)

    def should_close(self, scope: Scope, status: int) -> bool:
        """Whether the answer with `status` to the request of `scope` ends its connection."""
        if status in _RETRY_ELSEWHERE:
            return True
        if self.unready is not None and self.unready() is not None:
            return True
        age = scope.get(CONNECTION_KEY)
        if not isinstance(age, ConnectionAge):
            return False
        if self.max_requests and age.request >= self.max_requests:
            return True
        return bool(self.max_age_s) and self.clock() - age.opened >= self.max_age_s


def status_sent(scope: Scope, status: int) -> int:
    """The status the client got for the request of `scope`, whose app answered `status` (or none: a 499):
    the protocol's own where it answered in the app's place (the module's docstring)."""
    sent = scope.get(PROTOCOL_STATUS_KEY)
    return sent if isinstance(sent, int) else status
