"""The service's HTTP protocol (`service.api.http_protocol`) under test without the whole service: on a
fake transport, driven byte by byte, or in a real uvicorn in a thread, serving a test's own ASGI app."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn
from uvicorn.server import ServerState

from service.api.http_protocol import protocol_class
from tests.api.live import bound_socket, wait_ready


class FakeTransport(asyncio.Transport):
    """What the protocol writes, whether it reads, half-closed or closed, without a socket.
    `half_close`: whether it can half-close, as a TCP transport can (TLS's cannot)."""

    def __init__(self, half_close: bool = False) -> None:
        super().__init__()
        self.written = b""
        self.reading = True
        self.half_close = half_close
        self.eof = False
        self.closed = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self.eof:
            raise RuntimeError("Cannot call write() after write_eof()")  # (as asyncio's transports)
        self.written += bytes(data)

    def can_write_eof(self) -> bool:
        return self.half_close

    def write_eof(self) -> None:
        assert self.half_close
        self.eof = True

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True


async def read_body(receive: Any) -> bytes:
    """The request's body, read whole from an ASGI `receive`."""
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            return body


async def echo_app(scope: Any, receive: Any, send: Any) -> None:
    """An ASGI app that answers 200 with the request's body, read whole."""
    body = await read_body(receive)
    headers = [(b"content-length", b"%d" % len(body))]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def protocol_on_fake_transport(
    app: Any, head_timeout_s: float | None = None, half_close: bool = False, protocol_type: Any = None
) -> tuple[Any, FakeTransport]:
    """The protocol uvicorn would make for a connection, connected to a `FakeTransport`: of
    `protocol_type` where given (the service's own config's, `protocol_class()`'s defaults), else
    `protocol_class(head_timeout_s)`."""
    if protocol_type is None:
        protocol_type = protocol_class(head_timeout_s)
    assert not isinstance(protocol_type, str)
    config = uvicorn.Config(app=app, http=protocol_type, log_level="warning", lifespan="off")
    protocol: Any = protocol_type(  # type: ignore[call-arg]
        config=config, server_state=ServerState(), app_state={}, _loop=asyncio.get_running_loop()
    )
    transport = FakeTransport(half_close)
    protocol.connection_made(transport)
    return protocol, transport


@contextmanager
def threaded_server(app: Any, head_timeout_s: float | None = None, **config: Any) -> Iterator[int]:
    """uvicorn with the service's protocol in a thread on 127.0.0.1, serving `app`; its port. `config`:
    more of uvicorn.Config's settings (`timeout_keep_alive`)."""
    protocol_type = protocol_class(head_timeout_s)
    assert not isinstance(protocol_type, str)
    sock = bound_socket()
    port = sock.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            host="127.0.0.1",
            port=port,
            http=protocol_type,
            lifespan="off",
            log_level="warning",
            log_config=None,
            **config,
        )
    )
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        wait_ready(f"http://127.0.0.1:{port}", path="/")
        yield port
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()
