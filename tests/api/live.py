"""Real servers for the API tests: uvicorn in a thread on 127.0.0.1, or `python -m service.api` as a child.

The thread server binds its socket before uvicorn starts (port 0, so the kernel picks a free port and
no other test can race for it). The child process gets a port found the same way, released before the
child binds it: should anything take it in between, the child exits with "address already in use" and is
started again on another port.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import IO

import httpx
import uvicorn

from service.api.app import create_app
from service.api.main import uvicorn_config
from service.api.settings import Settings

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class LiveServer:
    url: str
    server: uvicorn.Server


@dataclass
class ServerProcess:
    url: str
    proc: subprocess.Popen[bytes]
    log: IO[bytes]

    def output(self) -> str:
        """Everything the child wrote so far."""
        self.log.seek(0)
        return self.log.read().decode(errors="replace")


def bound_socket() -> socket.socket:
    """A TCP socket bound to a free port of 127.0.0.1, not yet listening: a server given it (uvicorn's
    `sockets=`) has its port with no window for another test, in this process or another, to take it."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    return sock


def free_port() -> int:
    with bound_socket() as sock:
        port: int = sock.getsockname()[1]
        return port


def ipv6_loopback() -> bool:
    """Whether this machine can bind the IPv6 loopback (containers and CI runners often cannot)."""
    if not socket.has_ipv6:
        return False
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as sock:
            sock.bind(("::1", 0))
    except OSError:
        return False
    return True


def wait_ready(
    url: str, *, timeout_s: float = 60.0, path: str = "/ready", alive: Callable[[], bool] = lambda: True
) -> None:
    """Poll `url + path` until it answers 200; stop early once `alive()` says the server is gone."""
    deadline = time.monotonic() + timeout_s
    last: object = None
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + path, timeout=2.0).status_code == 200:
                return
        except httpx.TransportError as exc:
            last = exc
        if not alive():
            raise ChildProcessError(f"{url} exited before it was ready (last: {last})")
        time.sleep(0.05)
    raise TimeoutError(f"{url}{path} not ready after {timeout_s} s (last: {last})")


@contextmanager
def live_server(settings: Settings) -> Iterator[LiveServer]:
    """uvicorn serving `create_app(settings)` in a thread, ready (model warmed) when entered."""
    sock = bound_socket()
    port = sock.getsockname()[1]
    config = uvicorn_config(create_app(settings), settings.model_copy(update={"log_level": "warning"}))
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url)
        yield LiveServer(url=url, server=server)
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()


def _running(proc: subprocess.Popen[bytes]) -> bool:
    return proc.poll() is None


@contextmanager
def server_process(
    env: Mapping[str, str], *, attempts: int = 3, script: str | None = None
) -> Iterator[ServerProcess]:
    """`python -m service.api` with `env` (HTMLLM_* settings) on a free port, ready when entered; or
    `python -c script`, a server with a test's hook in place (it ends by calling `main.main()`)."""
    child_env = {k: v for k, v in os.environ.items() if not k.startswith("HTMLLM_")}
    child_env.update({"HTMLLM_HOST": "127.0.0.1", "HTMLLM_LOG_LEVEL": "warning"})
    child_env.update(env)
    child_env["PYTHONPATH"] = str(ROOT)
    for attempt in range(1, attempts + 1):
        port = free_port()
        child_env["HTMLLM_PORT"] = str(port)
        # A file, not a pipe: a chatty server must never block on a full pipe nobody reads.
        log = tempfile.TemporaryFile()  # noqa: SIM115 (closed in the finally below, after the child)
        command = [sys.executable, "-m", "service.api"] if script is None else [sys.executable, "-c", script]
        proc = subprocess.Popen(command, cwd=ROOT, env=child_env, stdout=log, stderr=subprocess.STDOUT)
        server = ServerProcess(url=f"http://127.0.0.1:{port}", proc=proc, log=log)
        try:
            try:
                wait_ready(server.url, timeout_s=120, alive=partial(_running, proc))
            except (TimeoutError, ChildProcessError):
                proc.kill()
                proc.wait(timeout=30)
                output = server.output()
                if "address already in use" in output and attempt < attempts:
                    continue  # the released port was taken before the child bound it: another one
                raise TimeoutError(f"the server did not become ready; its output:\n{output}") from None
            yield server
            return
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=30)
            log.close()
