"""service/api/http_protocol.py: a connection the client resets lets go of its keep-alive timer at once.

uvicorn cancels the keep-alive timer in `connection_lost` only for a close without error; a client that
resets its connection after the answer (RST) left the timer armed, and through it the protocol, its
request cycle and the request's charge against the body budget, for HTMLLM_KEEP_ALIVE_TIMEOUT_S (75 s).
"""

from __future__ import annotations

import asyncio
from typing import Any

import uvicorn
from uvicorn.server import ServerState

from service.api.http_protocol import protocol_class


class _Transport(asyncio.Transport):
    """What the protocol writes, and whether it closed, without a socket."""

    def __init__(self) -> None:
        super().__init__()
        self.written = b""
        self.closed = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written += bytes(data)

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


async def _ok(scope: Any, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


async def _answered_protocol() -> Any:
    """The service's protocol after answering one keep-alive request: its keep-alive timer armed."""
    protocol_type = protocol_class(head_timeout_s=None)
    assert not isinstance(protocol_type, str)
    config = uvicorn.Config(app=_ok, http=protocol_type, log_level="warning", lifespan="off")
    config.load()
    protocol: Any = protocol_type(  # type: ignore[call-arg]
        config=config, server_state=ServerState(), app_state={}, _loop=asyncio.get_running_loop()
    )
    transport = _Transport()
    protocol.connection_made(transport)
    protocol.data_received(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    for _ in range(1000):  # the app's task answers on the loop's next turns
        if protocol.timeout_keep_alive_task is not None:
            break
        await asyncio.sleep(0)
    assert transport.written.startswith(b"HTTP/1.1 200 "), transport.written
    assert protocol.timeout_keep_alive_task is not None, "no keep-alive timer after the answer"
    return protocol


async def test_a_connection_reset_after_its_answer_cancels_the_keep_alive_timer() -> None:
    protocol = await _answered_protocol()
    timer = protocol.timeout_keep_alive_task

    protocol.connection_lost(ConnectionResetError(104, "Connection reset by peer"))

    assert timer.cancelled(), "the timer keeps the protocol and its request for the keep-alive timeout"
    assert protocol.timeout_keep_alive_task is None
