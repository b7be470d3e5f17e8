"""HTMLLM_HOST as the server binds it: which address families each documented value accepts.

What the chart's `server.host` and docs/deployment.md say, checked on the server uvicorn_config builds
(uvloop's loop, as in production): 0.0.0.0 takes IPv4 only; "::" IPv6 only, since uvloop (and asyncio)
set IPV6_V6ONLY on the socket whatever net.ipv6.bindv6only says, so "::" is no dual-stack bind; and
the empty string binds both families, one socket each. Skipped where this machine has no IPv6 loopback.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import uvicorn

from service.api.main import uvicorn_config
from service.api.settings import Settings
from tests.api.live import ipv6_loopback

pytestmark = pytest.mark.skipif(not ipv6_loopback(), reason="no IPv6 loopback here")


async def _app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """The least ASGI app with a lifespan (uvicorn_config turns the lifespan on): a bind is under test."""
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b""})


def _port_free_in_both_families() -> int:
    with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        sock.bind(("::", 0))
        port: int = sock.getsockname()[1]
        return port


@contextmanager
def serving(host: str) -> Iterator[tuple[uvicorn.Server, int]]:
    port = _port_free_in_both_families()
    settings = Settings(host=host, port=port, log_level="warning")
    server = uvicorn.Server(uvicorn_config(_app, settings))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.01)
    try:
        yield server, port
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def accepts(address: str, port: int) -> bool:
    try:
        socket.create_connection((address, port), timeout=5).close()
    except ConnectionRefusedError:
        return False
    return True


@pytest.mark.parametrize(
    ("host", "ipv4", "ipv6"),
    [("0.0.0.0", True, False), ("::", False, True), ("", True, True)],
    ids=["ipv4", "ipv6-only", "both"],
)
def test_each_host_accepts_the_families_the_docs_say(host: str, ipv4: bool, ipv6: bool) -> None:
    with serving(host) as (server, port):
        assert (accepts("127.0.0.1", port), accepts("::1", port)) == (ipv4, ipv6)
        listening = [sock for each in server.servers for sock in each.sockets]
        v6 = [sock for sock in listening if sock.family == socket.AF_INET6]
        # Never one dual-stack socket: an IPv6 one is IPv6-only, IPv4 has its own.
        assert all(sock.getsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY) == 1 for sock in v6)
        assert len(listening) == ipv4 + ipv6
