"""The server's start: a port in use is refused before the model loads, and Ctrl-C during the start is
one line and status 130.

A second `make serve` on a port the first still served loaded the model, started its workers, printed
"Application startup complete", and only then failed to bind (uvicorn's error log, its status 3). Ctrl-C
while the model loaded printed a KeyboardInterrupt traceback of some 30 lines from inside transformers'
imports, where SIGTERM gave one log line and 143.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from service.api import app as api_app
from service.api import main as api_main
from service.api import start_checks
from service.api.listeners import bind_listeners
from tests.api.conftest import tiny_settings
from tests.api.live import free_port, ipv6_loopback

ROOT = Path(__file__).resolve().parents[2]
SIGINT_LINE = "SIGINT before the server started serving: exiting (status 130)"


def in_use(port: int) -> str:
    """The line a server on 127.0.0.1:`port` says when something else listens there."""
    return (
        f"htmllm serve: invalid settings: port {port} on 127.0.0.1 is in use (address already in use): "
        "another server listens there; stop it or choose another HTMLLM_PORT / --port\n"
    )


@contextmanager
def listening_elsewhere() -> Iterator[int]:
    """A port on 127.0.0.1 that another server (this test's socket) listens on."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as holder:
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield holder.getsockname()[1]


def server_env(tiny_checkpoint: Path, port: int, **more: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HTMLLM_")}
    env.update(
        {
            "PYTHONPATH": str(ROOT),
            "HTMLLM_MODEL_PATH": str(tiny_checkpoint),
            "HTMLLM_HOST": "127.0.0.1",
            "HTMLLM_PORT": str(port),
            "HTMLLM_LOG_LEVEL": "info",
            "HTMLLM_PREPROCESS_POOL": "thread",
            "HTMLLM_PREPROCESS_WORKERS": "1",
            "HTMLLM_EXTRACT_WORKERS": "1",
        }
    )
    env.update(more)
    return env


ENTRIES = {
    "python-m-service-api": [sys.executable, "-m", "service.api"],
    "htmllm-serve": [sys.executable, "-m", "service.cli", "serve"],
}


@pytest.mark.parametrize("entry", list(ENTRIES))
def test_a_port_in_use_is_one_line_and_exit_2_before_the_model_loads(
    tiny_checkpoint: Path, entry: str
) -> None:
    with listening_elsewhere() as port:
        proc = subprocess.run(
            ENTRIES[entry],
            cwd=ROOT,
            env=server_env(tiny_checkpoint, port),
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 2, output
    assert "Application startup complete" not in output
    assert output == in_use(port)


def test_serve_binds_before_it_loads(
    tiny_checkpoint: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    loads: list[object] = []
    monkeypatch.setattr(api_app, "load_engine", loads.append)
    with listening_elsewhere() as port:
        assert api_main.serve(tiny_settings(tiny_checkpoint, port=port)) == 2
    assert loads == []
    assert capsys.readouterr().err == in_use(port)


def test_a_port_taken_during_the_load_is_one_line_and_releases_the_engine(
    tiny_checkpoint: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two servers started together: Linux lets both bind (SO_REUSEADDR, neither listening yet), and
    the first to listen has the port. The other says so in one line, its engine closed, rather than
    failing inside uvicorn once its lifespan had started."""
    port = free_port()
    closed: list[bool] = []
    real_load = api_app.load_engine
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as other:

        def load_engine(settings: Any) -> Any:
            other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            other.bind(("127.0.0.1", port))  # allowed: this server's socket does not listen yet
            other.listen()
            engine = real_load(settings)
            monkeypatch.setattr(engine, "close", lambda: closed.append(True))
            return engine

        monkeypatch.setattr(api_app, "load_engine", load_engine)
        assert api_main.serve(tiny_settings(tiny_checkpoint, port=port, log_level="warning")) == 2
    assert capsys.readouterr().err == in_use(port)
    assert closed == [True]


def test_a_host_that_resolves_to_nothing_is_one_line() -> None:
    with pytest.raises(
        start_checks.InvalidSettingsError, match=r"^cannot bind port 8000 on no-such-host\.invalid \("
    ):
        bind_listeners("no-such-host.invalid", 8000)


@pytest.mark.skipif(not ipv6_loopback(), reason="no IPv6 loopback here")
@pytest.mark.parametrize(
    ("host", "families"),
    [("127.0.0.1", [socket.AF_INET]), ("::", [socket.AF_INET6]), ("", [socket.AF_INET, socket.AF_INET6])],
    ids=["ipv4", "ipv6-only", "both"],
)
def test_the_sockets_are_those_uvicorn_would_bind(host: str, families: list[socket.AddressFamily]) -> None:
    """As asyncio's create_server (tests/api/test_bind_address.py): an IPv6 socket IPv6-only, '' both
    families, SO_REUSEADDR on each; bound, not yet listening."""
    listeners = bind_listeners(host, 0)
    try:
        assert sorted(sock.family for sock in listeners) == families
        for sock in listeners:
            assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR) == 1
            assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN) == 0
            if sock.family == socket.AF_INET6:
                assert sock.getsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY) == 1
    finally:
        for sock in listeners:
            sock.close()


@pytest.mark.slow
def test_port_0_serves_and_says_which_port(tiny_checkpoint: Path, tmp_path: Path) -> None:
    """uvicorn names the address only for sockets it bound itself; the server names them instead, so
    `--port 0` still says where it serves."""
    with (tmp_path / "output").open("w+b") as output:
        proc = subprocess.Popen(
            ENTRIES["python-m-service-api"],
            cwd=ROOT,
            env=server_env(tiny_checkpoint, 0),
            stdout=output,
            stderr=output,
        )
        try:
            deadline = time.monotonic() + 240
            found = None
            while found is None:
                assert proc.poll() is None, "the server ended"
                assert time.monotonic() < deadline, "no 'Uvicorn running on' line"
                time.sleep(0.05)
                text = (tmp_path / "output").read_text(errors="replace")
                found = re.search(
                    r"Uvicorn running on http://127\.0\.0\.1:(\d+) \(Press CTRL\+C to quit\)", text
                )
            port = int(found.group(1))
            assert port != 0
            assert httpx.get(f"http://127.0.0.1:{port}/health", timeout=30).status_code == 200
            proc.send_signal(signal.SIGTERM)
            status = proc.wait(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
        output.seek(0)
        text = output.read().decode(errors="replace")
    assert status == 0, text
    # uvicorn's own lines in the one text format (a time, the logger), as every other line: under its
    # own handler they had none, and the lines that bracket a drain could not be timed.
    for message in ("Uvicorn running on", "Shutting down", "Finished server process"):
        assert re.search(
            rf"^\d{{4}}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ INFO uvicorn\.error: {message}", text, re.M
        ), text


# `python -m service.api` with Python's own SIGINT handler, as a terminal starts it (a shell's background
# job would have SIGINT ignored), whose model load announces itself in the file LOAD_BEGAN, then takes
# two minutes; or that SIGINTs itself the moment its start first imports transformers.
SIGINT_DURING_START = """
import os, signal, sys
from service.api import main

signal.signal(signal.SIGINT, signal.default_int_handler)

def at_import(event, args):
    if event == "import" and args[0] == "transformers" and not os.path.exists(os.environ["LOAD_BEGAN"]):
        open(os.environ["LOAD_BEGAN"], "w").close()
        os.kill(os.getpid(), signal.SIGINT)

def load_engine(settings):
    import time
    open(os.environ["LOAD_BEGAN"], "w").close()
    time.sleep(120)
    raise AssertionError("the load was not stopped")

if sys.argv[1] == "at-import":
    sys.addaudithook(at_import)
else:
    from service.api import app  # imports transformers: after the audit hook would be in place

    app.load_engine = load_engine
sys.exit(main.main([]))
"""


@pytest.mark.parametrize("when", ["at-import", "during-load"])
def test_ctrl_c_during_the_start_is_one_line_and_130(
    tiny_checkpoint: Path, tmp_path: Path, when: str
) -> None:
    began = tmp_path / "began"
    env = server_env(tiny_checkpoint, 0, LOAD_BEGAN=str(began), HTMLLM_LOG_LEVEL="warning")
    with (tmp_path / "output").open("w+b") as output:
        proc = subprocess.Popen(
            [sys.executable, "-c", SIGINT_DURING_START, when], cwd=ROOT, env=env, stdout=output, stderr=output
        )
        try:
            deadline = time.monotonic() + 120
            while not began.exists() and proc.poll() is None:  # at-import: it SIGINTs itself
                assert time.monotonic() < deadline, "the load never began"
                time.sleep(0.02)
            assert began.exists(), "the server ended before its load began"
            if when == "during-load":
                proc.send_signal(signal.SIGINT)
            status = proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
        output.seek(0)
        text = output.read().decode(errors="replace")
    assert status == 130, text
    lines = text.splitlines()
    assert len(lines) == 1 and SIGINT_LINE in lines[0], text


@contextmanager
def sigint_caught() -> Iterator[None]:
    """Within, a SIGINT left to the handler from before fails the test instead of ending pytest's run."""

    def left_to_default(*_: object) -> None:
        raise AssertionError("SIGINT reached the default handler: a KeyboardInterrupt traceback")

    previous = signal.signal(signal.SIGINT, left_to_default)
    try:
        yield
        assert signal.getsignal(signal.SIGINT) is left_to_default  # given back
    finally:
        signal.signal(signal.SIGINT, previous)


def test_serve_returns_130_on_sigint_during_the_load(
    tiny_checkpoint: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def load_engine(settings: object) -> object:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(30)  # the handler interrupts this
        raise AssertionError("the load was not stopped")

    monkeypatch.setattr(api_app, "load_engine", load_engine)
    with sigint_caught():
        assert api_main.serve(tiny_settings(tiny_checkpoint, log_level="warning")) == 130
    assert SIGINT_LINE in caplog.text


def test_an_ignored_sigint_stays_ignored_during_the_start(
    tiny_checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A shell starts a background job with SIGINT ignored; Python leaves it so, and so does the start."""
    seen: list[object] = []

    def load_engine(settings: object) -> object:
        seen.append(signal.getsignal(signal.SIGINT))
        raise PermissionError(13, "Permission denied", "/somewhere")  # ends the start: status 1

    monkeypatch.setattr(api_app, "load_engine", load_engine)
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        assert api_main.serve(tiny_settings(tiny_checkpoint, log_level="warning")) == 1
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)
    assert seen == [signal.SIG_IGN]
