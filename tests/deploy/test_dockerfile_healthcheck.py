"""The images' HEALTHCHECK, run against a server on each loopback: it follows HTMLLM_HOST's family.

HTMLLM_HOST="::" binds IPv6 only (tests/api/test_bind_address.py), so a probe of 127.0.0.1 would call a
healthy server unhealthy; the probe asks [::1] then, and 127.0.0.1 for every other bind.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from tests.api.live import ipv6_loopback
from tests.deploy.dockerfile_rules import stages


class _Ready(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/ready" else 404)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


class _Server6(HTTPServer):
    address_family = socket.AF_INET6


@contextmanager
def ready_server(address: str) -> Iterator[int]:
    """An HTTP server answering /ready on `address` alone; yields its port."""
    server = (_Server6 if ":" in address else HTTPServer)((address, 0), _Ready)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def probe(target: str) -> str:
    (check,) = stages()[target].of("HEALTHCHECK")
    command = json.loads(check.original.split("CMD", 1)[1].strip())
    assert command[:2] == ["python", "-c"]
    code: str = command[2]
    return code


def run_probe(code: str, port: int, host: str | None) -> int:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HTMLLM_")}
    env["HTMLLM_PORT"] = str(port)
    if host is not None:
        env["HTMLLM_HOST"] = host
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, timeout=30).returncode


@pytest.mark.parametrize("target", ["cpu", "cuda"])
@pytest.mark.parametrize("host", [None, "0.0.0.0", ""])
def test_the_probe_reaches_an_ipv4_bind(target: str, host: str | None) -> None:
    with ready_server("127.0.0.1") as port:
        assert run_probe(probe(target), port, host) == 0


@pytest.mark.skipif(not ipv6_loopback(), reason="no IPv6 loopback here")
@pytest.mark.parametrize("target", ["cpu", "cuda"])
def test_the_probe_reaches_an_ipv6_only_bind(target: str) -> None:
    with ready_server("::1") as port:
        assert run_probe(probe(target), port, "::") == 0
