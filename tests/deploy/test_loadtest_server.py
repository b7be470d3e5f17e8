"""The load test measures the server it started, and only while it lives: a port another server holds is
refused, /ready counts only from the started server's own socket, and a server that dies under the load
stops the run and fails it. The servers here are small stand-ins (no model), started by the test."""

from __future__ import annotations

import csv
import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import IO

import pytest

from loadtests import run as loadtest_run
from loadtests.launch import HOST, port_holder, port_in_use, wait_ready
from loadtests.procfs import listening_sockets, socket_inodes

ROOT = Path(__file__).resolve().parents[2]


class _Ready(BaseHTTPRequestHandler):
    """Someone else's server: 200 to everything, as any server's /ready may say."""

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("content-length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, format: str, *args: object) -> None:
        pass


@contextmanager
def _other_server(address: str = HOST) -> Iterator[int]:
    server = ThreadingHTTPServer((address, 0), _Ready)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def test_a_port_another_server_listens_on_is_refused_before_the_server_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--port P` with a server already on P had loaded that one and passed (exit 0), while its own
    server was stopped before it served (status 143)."""

    def no_server(*_: object) -> None:
        raise AssertionError("the server was started")

    monkeypatch.setattr(loadtest_run, "start_server", no_server)
    with _other_server() as port:
        assert loadtest_run.main(["--port", str(port), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert (
        err
        == f"loadtest: error: --port {port}: {HOST}:{port} is already in use (another server listens there)\n"
    )
    assert not (tmp_path / "out").exists()


def test_port_checks_see_listeners_on_every_address_too() -> None:
    with _other_server("0.0.0.0") as port:
        assert port_in_use(port) is not None  # the server could not bind 127.0.0.1 beside it
        assert port_holder(port, os.getpid()) == "ours"  # this process's socket
    with socket.socket() as sock:
        sock.bind((HOST, 0))  # bound, not listening: nobody answers, and uvicorn could bind it
        port = sock.getsockname()[1]
        assert port_holder(port, os.getpid()) == "none"
    assert port_in_use(port) is None


def test_the_port_holder_is_told_by_the_listening_sockets_process() -> None:
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        with _other_server() as port:
            listeners = listening_sockets(port)
            assert listeners is not None and set(listeners.values()) == {HOST}
            assert set(listeners) <= socket_inodes([os.getpid()])
            assert port_holder(port, os.getpid()) == "ours"
            assert port_holder(port, sleeper.pid) == "other"
    finally:
        sleeper.kill()
        sleeper.wait()


def test_ready_from_another_process_on_the_port_is_not_the_servers(tmp_path: Path) -> None:
    """A port taken between `free_port` and the server's bind, or given as --port: the other server's
    200 on /ready had started the run against it."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])  # loads, never binds
    try:
        with _other_server() as port, pytest.raises(SystemExit) as failed:
            wait_ready(f"http://{HOST}:{port}", port, child, timeout=60)
        assert "another process listens on" in str(failed.value.code)
        assert child.poll() is None  # refused at once, not after the timeout
    finally:
        child.kill()
        child.wait()


# A stand-in for `python -m service.api`: binds HTMLLM_PORT itself, answers /ready and /info, and
# POST /v1/embed: three of four at once with 429 (an error body whose message changes), the fourth after
# SLOW_S with a complete answer and stage headers. At the DIE_AT-th POST it kills itself (SIGKILL), as
# the out-of-memory killer would.
_FAKE_SERVER = r"""
import json, os, signal, threading, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

SLOW_S, DIE_AT = 0.3, 40
lock, posts = threading.Lock(), [0]


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def answer(self, status, body, headers=()):
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        for name, value in headers:
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path == "/info":
            info = {"model": "fake", "max_length": 8, "backend": "none", "device": "cpu"}
            self.answer(200, json.dumps(info).encode())
        else:
            self.answer(200, b"{}")

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("content-length", 0)))
        with lock:
            posts[0] += 1
            n = posts[0]
        if n >= DIE_AT:
            os.kill(os.getpid(), signal.SIGKILL)
        if n % 4:
            error = {"error": {"code": "overloaded", "message": f"{n} documents queued"}}
            self.answer(429, json.dumps(error).encode())
            return
        time.sleep(SLOW_S)
        if self.headers.get("content-type") == "application/json":
            ids = [d["id"] for d in json.loads(body)["documents"]]
        else:
            ids = parse_qs(urlparse(self.path).query)["id"]
        data = {"data": [{"id": i, "embedding": [0.5]} for i in ids]}
        stages = [(name, "1.5") for name in ("x-queue-time", "x-inference-time", "x-total-time")]
        self.answer(200, json.dumps(data).encode(), stages)

    def log_message(self, format, *args):
        pass


ThreadingHTTPServer(("127.0.0.1", int(os.environ["HTMLLM_PORT"])), Handler).serve_forever()
"""


def test_a_server_that_dies_under_the_load_stops_the_run_and_fails_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """locust had gone on posting to the closed port for the rest of the run, the report showing p50 1 ms
    and failures named `HTTP 0: `; 429s answered at once had pulled the latency percentiles down.

    Nothing here waits on time: the stand-in dies at its 40th POST, and locust would otherwise run its
    whole run time (the summary says which happened)."""
    script = tmp_path / "fake_server.py"
    script.write_text(_FAKE_SERVER)

    def fake_server(env: dict[str, str], log: IO[bytes]) -> subprocess.Popen[bytes]:
        return subprocess.Popen([sys.executable, str(script)], env=env, stdout=log, stderr=subprocess.STDOUT)

    monkeypatch.setattr(loadtest_run, "start_server", fake_server)
    out = tmp_path / "out"
    args = ["--users", "2", "--spawn-rate", "2", "--run-time", "90s", "--out", str(out)]
    args += ["--page-pool", "4", "--raw-share", "0.5", "--sample-interval", "0.5"]
    assert loadtest_run.main(args) == 1
    printed = capsys.readouterr()

    summary = json.loads((out / "summary.json").read_text())
    died = summary["server_exited_during_run"]
    assert died is not None and died["status"] == -9 and summary["server_exit_status"] == -9
    # Locust stopped with the server, not at the end of its run time; the rates are over the time it ran.
    assert died["seconds"] < summary["run_seconds"] and summary["wall_seconds"] < summary["run_seconds"]
    assert summary["requests_per_s"] == pytest.approx(summary["requests"] / died["seconds"])
    assert f"server exited with status -9 at {died['seconds']:.0f} s into the run" in printed.out
    # Latency of the answered requests only: each took the stand-in SLOW_S (0.3 s) at least.
    for endpoint in summary["endpoints"].values():
        assert endpoint["p50_ms"] is None or endpoint["p50_ms"] >= 300, endpoint
    assert any(endpoint["p50_ms"] for endpoint in summary["endpoints"].values())
    kinds = summary["failures_by_kind"]
    assert kinds["HTTP 429 overloaded"] >= 29  # 30 of the first 39 POSTs (some after the kill: refused)
    assert sum(kinds.values()) == summary["failures"]
    # No answer: the connection's error, never `HTTP 0: `.
    lost = [kind for kind in kinds if kind.startswith("HTTP 0")]
    assert lost and all(kind not in ("HTTP 0", "HTTP 0 no response") for kind in lost), kinds
    assert summary["failures_by_status"]["429"] == kinds["HTTP 429 overloaded"]
    assert "| failed: HTTP 429 overloaded |" in printed.out
    assert summary["stages"]["x-total-time"]["p50_ms"] == 2  # 1.5 ms, to the millisecond
    # Locust's own failures table: one row per kind, not one per message.
    with (out / "locust_failures.csv").open() as handle:
        errors = [row["Error"] for row in csv.DictReader(handle)]
    assert not any("queued" in error for error in errors), errors


def test_a_port_taken_between_free_port_and_the_bind_fails_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without --port, `free_port` gives the port back before the server binds it: another process may
    take it meanwhile, and its /ready would have started the run against it."""
    started: list[subprocess.Popen[bytes]] = []

    def loading_server(env: dict[str, str], log: IO[bytes]) -> subprocess.Popen[bytes]:
        started.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]))
        return started[-1]

    monkeypatch.setattr(loadtest_run, "start_server", loading_server)
    with _other_server() as port:
        monkeypatch.setattr(loadtest_run, "free_port", lambda: port)
        with pytest.raises(SystemExit) as failed:
            loadtest_run.main(["--out", str(tmp_path / "out"), "--ready-timeout", "60"])
    assert f"another process listens on {HOST}:{port}" in str(failed.value.code)
    assert started and started[0].returncode == -15  # this run's server was stopped, not left running
